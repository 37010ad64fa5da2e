"""One GPU's settings: one process is never DDP-wrapped, one AdamW table per backend and
settings mode, the CUDA allocator configuration. CUDA rows are proven on the plans (host side, no GPU);
CPU rows by real runs of each backend's trainer, `ddp_wrapped` and `optimizer_impl` read
by the workers from the live model and optimizer."""

from __future__ import annotations

import ast
import json
import subprocess

import pytest

from backend_helpers import CPU, make_job, ready_env, tiny
from fbench_fixtures import backend_env_or_skip
from framework_bench.plugins import plan_env
from framework_bench.plugins import registry as plugins
from framework_bench.run import pipeline
from framework_bench.run.options import RunOptions
from framework_bench.scenario import scenario

VERSIONS = {"xtuner": {"xtuner": "0.2.0"}, "llamafactory": {"llamafactory": "0.9.5"}, "torch": {"torch": "2.13.0"}}
BACKENDS = sorted(VERSIONS)
ONE_GPU_BF16 = dict(cluster={"device": "cuda"}, precision="bf16")


def cuda_plan(backend: str, tmp_path, mode: str, **fields):
    job = make_job(backend, tmp_path / mode, tiny(**(ONE_GPU_BF16 | fields))).model_copy(update={"settings_mode": mode})
    job.write()
    return job, plugins.get(backend).plan(job, ready_env(backend, VERSIONS[backend], "cuda"))


def xtuner_adamw_kwargs(plan) -> dict:
    tree = ast.parse(plan.files["mmengine_config"].read_text())
    wrapper = next(n.value for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "optim_wrapper")
    optimizer = next(k.value for k in wrapper.keywords if k.arg == "optimizer")
    return {k.arg: ast.unparse(k.value) for k in optimizer.keywords}


@pytest.mark.parametrize("mode", ["matched", "native"])
def test_cuda_plans_follow_the_declared_adamw_table(mode, tmp_path):
    """matched: fused for every backend on CUDA; native: each framework's default (XTuner's
    unflagged AdamW runs foreach on CUDA, transformers >= 2.8 defaults to adamw_torch_fused).
    The declaration the memory estimate reads is what the generated files ask for."""
    declared = {b: plugins.get(b).info.memory.adamw[mode].cuda for b in BACKENDS}
    assert declared == {"xtuner": "fused" if mode == "matched" else "foreach", "llamafactory": "fused", "torch": "fused"}

    _, plan = cuda_plan("xtuner", tmp_path, mode)
    assert ("fused" in xtuner_adamw_kwargs(plan)) == (mode == "matched")
    assert xtuner_adamw_kwargs(plan).get("fused", "True") == "True"

    _, plan = cuda_plan("llamafactory", tmp_path / "lf", mode)
    args = json.loads(plan.files["train_args"].read_text())
    # native leaves transformers' default, adamw_torch_fused with torch 2.13 (read off the
    # optimizer in the native CPU run of test_backend_llamafactory)
    assert args.get("optim") == ("adamw_torch_fused" if mode == "matched" else None)


def test_cpu_plans_leave_adamw_to_torch(tmp_path):
    """On CPU matched mode is torch's own choice (the for-loop) for every backend."""
    job = make_job("xtuner", tmp_path / "x", tiny())
    assert "fused" not in xtuner_adamw_kwargs(plugins.get("xtuner").plan(job, ready_env("xtuner", VERSIONS["xtuner"], "cpu")))
    job = make_job("llamafactory", tmp_path / "l", tiny())
    plan = plugins.get("llamafactory").plan(job, ready_env("llamafactory", VERSIONS["llamafactory"], "cpu"))
    assert json.loads(plan.files["train_args"].read_text())["optim"] == "adamw_torch"
    assert all(plugins.get(b).info.memory.adamw["matched"].cpu == "for-loop" for b in BACKENDS)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["matched", "native"])
def test_cuda_plans_set_expandable_segments_unless_the_user_did(backend, mode, tmp_path, monkeypatch):
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    _, plan = cuda_plan(backend, tmp_path, mode)
    assert plan.env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:512")
    _, plan = cuda_plan(backend, tmp_path / "user", mode)
    assert "PYTORCH_CUDA_ALLOC_CONF" not in plan.env  # the user's value reaches the worker as it is
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF")
    job = make_job(backend, tmp_path / "cpu", tiny())
    assert "PYTORCH_CUDA_ALLOC_CONF" not in plugins.get(backend).plan(job, ready_env(backend, VERSIONS[backend], "cpu")).env


@pytest.mark.slow  # starts a framework's or the host's own process
def test_torch_reference_adamw_is_fused_for_cuda(tmp_path):
    """The torch reference has no generated file: its worker's own `adamw`, asked for a CUDA
    run (on CPU tensors, which fused AdamW also takes), read back as the host reads it."""
    env = backend_env_or_skip("torch")
    code = ("import torch; from fbench_torch.worker import adamw; from framework_bench.worker.settings import "
            "optimizer_settings as s; p = [torch.nn.Parameter(torch.ones(4))]; "
            "print(s(adamw(p, cuda=True))['optimizer_impl'], s(adamw(p, cuda=False))['optimizer_impl'])")
    out = subprocess.run([str(env.python), "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["fused", "for-loop"]


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_one_process_in_a_process_group_is_not_ddp_wrapped(backend, tmp_path, monkeypatch):
    """What a one-GPU plan gives every backend (a world of one with its rendezvous
    variables), on CPU: each worker trains in a process group of one and the model that
    trains is not DDP-wrapped; its AdamW is the table's CPU row."""
    backend_env_or_skip(backend)
    s = scenario.load("tiny_cpu")
    job = make_job(backend, tmp_path / "pg", s)
    for key, value in plan_env.process_group_env(job).items():
        monkeypatch.setenv(key, value)
    r = pipeline.run_one(backend, s, RunOptions(root=tmp_path), machine=CPU)
    assert r.status == "ok", r.reason
    assert r.settings["process_group_size"] == 1
    assert r.settings["ddp_wrapped"] is False
    assert r.settings["optimizer_impl"] == plugins.get(backend).info.memory.adamw["matched"].cpu == "for-loop"
    assert r.settings["cuda_alloc_conf"] is None  # a CPU plan sets no allocator configuration
    # start-up by phase, as a note beside the stored start-up seconds
    note = next(n for n in r.notes if n.startswith("start-up "))
    assert r.startup_seconds > 0 and note.startswith(f"start-up {r.startup_seconds:.1f} s: ")
    assert all(phase in note for phase in ("imports", "data", "model_build", "framework_setup"))


def test_dry_run_and_show_give_the_memory_phases(fbench_home, monkeypatch):
    """The estimate per phase: in the dry run per backend (its declared AdamW in the chosen
    mode), in `fbench show` for the common case (fused AdamW)."""
    from typer.testing import CliRunner

    from framework_bench.cli import app

    monkeypatch.setenv("COLUMNS", "400")  # one line per message
    res = CliRunner().invoke(app, ["run", "--scenario", "llama2_7b_8k_1gpu", "--backend", "xtuner", "--dry-run",
                                   "--settings", "native"])
    assert res.exit_code == 0, res.output
    assert ("memory: ~127.5 GiB at the optimizer step (forward 96.3 / backward 105.0 / optimizer step 127.5 GiB; "
            "foreach AdamW, not DDP-wrapped)") in res.stdout
    res = CliRunner().invoke(app, ["show", "llama2_7b_32k_1gpu"])
    assert res.exit_code == 0, res.output
    assert "~115.6 GiB per GPU at the forward (forward 115.6 / backward 111.8 / optimizer step 102.4 GiB" in res.stdout
