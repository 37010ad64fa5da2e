"""The XTuner backend: discovery, refusals, the generated mmengine config, and a real run."""

from __future__ import annotations

import ast
import json
import subprocess
from pathlib import Path

import pytest

import backend_helpers as helpers
from backend_helpers import CPU, H100x8, tiny
from fbench_fixtures import backend_env_or_skip

from framework_bench.envs import venvs as envs
from framework_bench.run.launchers import executor_for
from framework_bench.plugins import registry as plugins
from framework_bench.scenario import scenario
from framework_bench.plugins.contract import BackendEnv, Job
from framework_bench.worker.files import read_metrics

@pytest.fixture(scope="module")
def xtuner():
    return plugins.get("xtuner")


def ready_env(flavour: str, *extra: str) -> BackendEnv:
    return helpers.ready_env("xtuner", {"xtuner": "0.2.0", "mmengine": "0.10.6"}, flavour, *extra)


def make_job(tmp_path: Path, scn: scenario.Scenario) -> Job:
    return helpers.make_job("xtuner", tmp_path, scn)


def top_level(config: Path) -> dict:
    """The config's top-level literal assignments (it holds imports and literals only)."""
    tree = ast.parse(config.read_text())
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            out[node.targets[0].id] = node.value
    return out


def call_kwargs(node: ast.expr) -> dict:
    assert isinstance(node, ast.Call) and node.func.id == "dict", ast.dump(node)
    return {k.arg: k.value for k in node.keywords}


def test_discovered_through_entry_point(xtuner):
    assert "xtuner" in plugins.backends()
    info = xtuner.info
    assert info.env.framework_package == "xtuner"
    assert all(p.exists() for p in info.env.requirements.values())
    assert "torch==2.13.0" in info.env.requirements["cpu"].read_text().splitlines()


def test_sequence_parallel_on_cpu_is_unsupported(xtuner):
    scn = tiny(cluster={"device": "cpu", "gpus_per_node": 2}, sequence_parallel=2)
    # Even with the engines installed: XTuner's SP runs only through DeepSpeed on GPUs.
    reason = xtuner.check(scn, CPU, ready_env("cpu", "flash_attn", "deepspeed"))
    assert reason and "sequence_parallel 2" in reason and "GPU" in reason


def test_silently_ignored_settings_are_refused_on_gpu(xtuner):
    sp = tiny(cluster={"device": "cuda", "gpus_per_node": 8}, sequence_parallel=4, precision="bf16")
    reason = xtuner.check(sp, H100x8, ready_env("cuda", "deepspeed"))
    assert reason and "(flash_attn not installed" in reason
    varlen = tiny(cluster={"device": "cuda"}, attention="varlen", precision="bf16")
    assert "flash_attn" in xtuner.check(varlen, H100x8, ready_env("cuda", "deepspeed"))
    zero = tiny(cluster={"device": "cuda", "gpus_per_node": 2}, zero_stage=2, precision="bf16")
    assert "deepspeed" in xtuner.check(zero, H100x8, ready_env("cuda"))
    assert xtuner.check(sp, H100x8, ready_env("cuda", "flash_attn", "deepspeed")) is None


def test_other_refusals(xtuner):
    assert "bf16" in xtuner.check(tiny(precision="bf16"), CPU, ready_env("cpu"))
    two_cpus = {"device": "cpu", "gpus_per_node": 2}
    assert "device_ids=[LOCAL_RANK]" in xtuner.check(tiny(cluster=two_cpus), CPU, ready_env("cpu"))
    # with ZeRO, several CPU processes run through XTuner's DeepSpeed strategy (it needs deepspeed)
    assert "needs deepspeed" in xtuner.check(tiny(cluster=two_cpus, zero_stage=3), CPU, ready_env("cpu"))
    assert xtuner.check(tiny(cluster=two_cpus, zero_stage=3), CPU, ready_env("cpu", "deepspeed")) is None
    assert "no" in xtuner.check(tiny(cluster={"device": "cuda"}, precision="bf16"), CPU, ready_env("cuda"))
    assert "CPU flavour" in xtuner.check(tiny(cluster={"device": "cuda"}, precision="bf16"), H100x8, ready_env("cpu"))
    not_made = envs.inspect("xtuner-that-was-never-made")
    assert "not created" in xtuner.check(tiny(), CPU, not_made)
    assert xtuner.check(tiny(), CPU, ready_env("cpu")) is None


def test_published_yi34b_128k_config(xtuner, tmp_path):
    scn = scenario.load("yi34b_128k")
    job = make_job(tmp_path, scn)
    plan = xtuner.plan(job, ready_env("cuda", "flash_attn", "deepspeed"))
    config = plan.files["mmengine_config"]
    values = top_level(config)
    assert ast.literal_eval(values["sequence_parallel_size"]) == 8
    assert ast.literal_eval(values["max_length"]) == 131072
    assert ast.literal_eval(values["batch_size"]) == 1
    assert ast.literal_eval(values["accumulative_counts"]) == scn.grad_accum
    strategy = call_kwargs(values["strategy"])
    ds = ast.literal_eval(strategy["config"])
    assert ds["zero_optimization"]["stage"] == 3 and ds["bf16"]["enabled"] is True
    assert ds["gradient_clipping"] == 1 and ds["train_micro_batch_size_per_gpu"] == 1
    assert ast.literal_eval(values["runner_type"]) == "FlexibleRunner"
    optimizer = call_kwargs(call_kwargs(values["optim_wrapper"])["optimizer"])
    assert ast.literal_eval(optimizer["lr"]) == 2e-5 and ast.literal_eval(optimizer["betas"]) == (0.9, 0.999)
    assert ast.literal_eval(call_kwargs(values["train_cfg"])["max_iters"]) == scn.steps.total * scn.grad_accum
    model_cfg = json.loads((plan.files["model_dir"] / "config.json").read_text())
    assert model_cfg["hidden_size"] == 7168 and model_cfg["num_key_value_heads"] == 8
    # Several GPUs: the host wraps the worker in torchrun (mmengine's "pytorch" launcher).
    argv = executor_for("torchrun").argv(plan, job)
    assert argv[1:3] == ["-m", "torch.distributed.run"] and "--nproc-per-node" in argv
    assert argv[-3:] == ["-m", "fbench_xtuner.worker", str(job.job_file)]


def test_precision_picks_the_optim_wrapper(xtuner, tmp_path):
    """bf16 autocast on one GPU without ZeRO; fp32 on CPU (AmpOptimWrapper refuses CPU)."""
    gpu = make_job(tmp_path / "gpu", tiny(cluster={"device": "cuda"}, precision="bf16"))
    wrapper = call_kwargs(top_level(xtuner.plan(gpu, ready_env("cuda")).files["mmengine_config"])["optim_wrapper"])
    assert wrapper["type"].id == "AmpOptimWrapper" and ast.literal_eval(wrapper["dtype"]) == "bfloat16"
    cpu = make_job(tmp_path / "cpu", tiny(grad_accum=4))
    values = top_level(xtuner.plan(cpu, ready_env("cpu")).files["mmengine_config"])
    wrapper = call_kwargs(values["optim_wrapper"])
    assert wrapper["type"].id == "OptimWrapper" and ast.literal_eval(wrapper["accumulative_counts"]) == 4
    assert "strategy" not in values


def test_settings_modes_pick_the_precision_recipe(xtuner, tmp_path):
    """matched: bf16 autocast without a loss scaler over fp32 weights (as the HF Trainer runs
    bf16); native: the published AmpOptimWrapper's dynamic GradScaler, XTuner's weight dtype."""
    scn = tiny(cluster={"device": "cuda"}, precision="bf16")
    configs = {}
    for mode in ("matched", "native"):
        job = make_job(tmp_path / mode, scn).model_copy(update={"settings_mode": mode})
        configs[mode] = top_level(xtuner.plan(job, ready_env("cuda", "flash_attn")).files["mmengine_config"])
    matched, native = (call_kwargs(configs[m]["optim_wrapper"]) for m in ("matched", "native"))
    loss_scale = call_kwargs(matched["loss_scale"])
    assert list(loss_scale) == ["enabled"] and ast.literal_eval(loss_scale["enabled"]) is False
    assert "loss_scale" not in native  # mmengine's default: 'dynamic'
    llms = {m: call_kwargs(call_kwargs(configs[m]["model"])["llm"]) for m in configs}
    assert ast.literal_eval(llms["matched"]["keep_fp32_weights"]) is True
    assert ast.literal_eval(llms["native"]["keep_fp32_weights"]) is False


@pytest.mark.slow  # starts a framework's or the host's own process
def test_matched_builder_keeps_fp32_weights_when_xtuner_asks_for_bf16(xtuner, tmp_path):
    env = backend_env_or_skip("xtuner")
    job = make_job(tmp_path, tiny())
    model_dir = xtuner.plan(job, env).files["model_dir"]
    probe = ("import sys, torch; from fbench_xtuner.model_builder import build_random_llm; "
             "print(*[next(build_random_llm(sys.argv[1], 1024, keep_fp32_weights=k, torch_dtype=torch.bfloat16)"
             ".parameters()).dtype for k in (True, False)])")
    out = subprocess.run([str(env.python), "-c", probe, str(model_dir)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["torch.float32", "torch.bfloat16"]


@pytest.mark.slow  # starts a framework's or the host's own process
def test_published_config_parses_in_mmengine(xtuner, tmp_path):
    """mmengine's lazy-import mode rejects any call at parse time: parse it for real."""
    env = backend_env_or_skip("xtuner")
    job = make_job(tmp_path, scenario.load("yi34b_128k"))
    config = xtuner.plan(job, env).files["mmengine_config"]
    probe = ("import sys, json; from mmengine.config import Config; c = Config.fromfile(sys.argv[1]); "
             "print(json.dumps([c.sequence_parallel_size, c.train_dataloader.batch_size, "
             "c.strategy.config['zero_optimization']['stage'], c.train_cfg.max_iters]))")
    out = subprocess.run([str(env.python), "-c", probe, str(config)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [8, 1, 3, 56]


@pytest.mark.slow  # starts a framework's or the host's own process
def test_worker_refuses_data_other_than_the_job_names(xtuner, tmp_path):
    from framework_bench.data.packing import pack

    env = backend_env_or_skip("xtuner")
    scn = scenario.load("tiny_cpu")
    data = pack(scn, progress=False, say=lambda msg: None)
    job = Job(backend="xtuner", scenario=scn, data_dir=data.dir, data_sha256="0" * 64, run_dir=tmp_path / "run",
              device="cpu")
    job.write()  # the host's, before the plan (the plan writes its own files only)
    plan = xtuner.plan(job, env)
    out = subprocess.run(executor_for("local").argv(plan, job), capture_output=True, text=True)
    assert out.returncode != 0
    assert f"has sha256 {data.sha256}, the host expected {'0' * 64}" in out.stderr  # the SDK's one check
    assert not read_metrics(job.run_dir)


@pytest.mark.slow
def test_tiny_cpu_trains_with_xtuner(xtuner, tmp_path, tiny_cpu_run):
    backend_env_or_skip("xtuner")
    scn, result = helpers.train_tiny_cpu("xtuner", tmp_path, "0.2.0", shared=tiny_cpu_run)
    # XTuner's own ThroughputHook log is kept, and agrees with the host's figure: a token
    # miscount (x2, /SP) on either side would be far outside this band.
    own = result.framework_throughput
    assert own["iters"] == scn.steps.measured
    assert 0.75 < result.tgs / own["tokens_per_sec_median"] < 1.33
    assert 0.75 < result.tflops / own["tflops_median"] < 1.33
