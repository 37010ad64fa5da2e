"""The torch backend, the plain-PyTorch reference: discovery, refusals, its plan, a real
single-process run and a real two-process (DDP over gloo) run of its loop on tiny_cpu, a
real ZeRO-3 run (FSDP2 over gloo, two processes) and a real sequence-parallel one (Ulysses)."""

from __future__ import annotations

import statistics
import subprocess
from pathlib import Path

import pytest

import backend_helpers as helpers
from backend_helpers import CPU, H100x8, tiny
from fbench_fixtures import MULTIPROCESS_TIMEOUT, backend_env_or_skip

from framework_bench.measure import clock_checks
from framework_bench.run.launchers import executor_for
from framework_bench.plugins import registry as plugins
from framework_bench.run import pipeline
from framework_bench.run.options import RunOptions
from framework_bench.scenario import scenario
from framework_bench.plugins.contract import BackendEnv, Job
from framework_bench.worker.files import read_metrics, read_worker_report


@pytest.fixture(scope="module")
def torch_backend():
    return plugins.get("torch")


def ready_env(flavour: str) -> BackendEnv:
    return helpers.ready_env("torch", {"transformers": "5.6.0"}, flavour)


def test_discovered_through_entry_point(torch_backend):
    info = torch_backend.info
    assert info.name == "torch" and info.framework == "PyTorch" and info.env.framework_package == "torch"
    assert torch_backend.package == "fbench_torch"
    caps = info.capabilities
    assert caps.cpu and caps.gpu and caps.sequence_parallel and not caps.varlen and caps.zero_stages == [0, 2, 3]
    assert info.memory.sequence_parallel == "fsdp2"  # Ulysses over FSDP2's fp32 shards, as its ZeRO
    cpu, cuda = (info.env.requirements[f].read_text().splitlines() for f in ("cpu", "cuda"))
    assert "torch==2.13.0" in cpu and "torch==2.13.0, !=2.13.0+cpu" in cuda
    assert "transformers==5.6.0" in cpu and "transformers==5.6.0" in cuda


def test_refusals_name_what_the_reference_does_not_do(torch_backend):
    env = ready_env("cpu")
    assert torch_backend.check(tiny(), CPU, env) is None
    # what the loop does not implement, it declares: the host refuses it before the plugin's check
    declared = torch_backend.info.capabilities
    assert "ZeRO stages 0/2/3; the scenario asks for 1" in declared.refusal(tiny(zero_stage=1), "torch")
    assert declared.refusal(tiny(sequence_parallel=2, cluster={"device": "cpu", "gpus_per_node": 2}), "torch") is None
    assert "no varlen attention" in declared.refusal(tiny(attention="varlen"), "torch")
    gpu = scenario.load("llama2_7b_8k")
    assert "CPU flavour" in torch_backend.check(gpu, H100x8, env)
    assert torch_backend.check(gpu.model_copy(update={"zero_stage": 0}), H100x8, ready_env("cuda")) is None
    assert "has none" in torch_backend.check(gpu, CPU, ready_env("cuda"))
    missing = BackendEnv(name="torch", path=Path("/x"), python=Path("/x/bin/python"), problem="not created")
    assert "not created" in torch_backend.check(tiny(), CPU, missing)
    # FSDP2 shards full fine-tuning only
    assert torch_backend.check(tiny(zero_stage=3), CPU, env) is None
    lora = {"method": "lora", "rank": 8, "alpha": 16, "targets": ["q_proj", "v_proj"]}
    assert "lora with ZeRO stage 2 is not implemented" in torch_backend.check(tiny(zero_stage=2, finetune=lora), CPU, env)


def test_host_refuses_outside_the_declared_capabilities(torch_backend, fbench_home):
    """The host asks the declared capabilities before the plugin's own check."""
    r = pipeline.run_one("torch", tiny(zero_stage=1), machine=CPU)
    assert r.status == "unsupported" and r.reason == "torch: the torch backend declares ZeRO stages 0/2/3; the scenario asks for 1"


def test_plan_runs_the_worker_on_the_host_job(torch_backend, tmp_path):
    job = helpers.make_job("torch", tmp_path, tiny())
    job.write()
    plan = torch_backend.plan(job, ready_env("cpu"))
    assert plan.module == "fbench_torch.worker" and plan.args == [str(job.job_file)]
    assert plan.python == Path("/nonexistent/bin/python") and plan.files == {"job": job.job_file}
    assert "MASTER_ADDR" not in plan.env
    # ZeRO is FSDP2, which shards over a process group, a world of one's too; no DeepSpeed ops to name
    zero = torch_backend.plan(helpers.make_job("torch", tmp_path / "zero", tiny(zero_stage=3)), ready_env("cpu")).env
    assert zero["WORLD_SIZE"] == "1" and zero["MASTER_ADDR"] == "127.0.0.1" and "TORCH_EXTENSIONS_DIR" not in zero


@pytest.mark.slow  # starts a framework's or the host's own process
def test_worker_refuses_data_other_than_the_job_names(torch_backend, tmp_path):
    from framework_bench.data.packing import pack

    env = backend_env_or_skip("torch")
    scn = scenario.load("tiny_cpu")
    data = pack(scn, progress=False, say=lambda msg: None)
    job = Job(backend="torch", scenario=scn, data_dir=data.dir, data_sha256="0" * 64, run_dir=tmp_path / "run",
              device="cpu")
    job.write()
    plan = torch_backend.plan(job, env)
    out = subprocess.run(executor_for("local").argv(plan, job), capture_output=True, text=True)
    assert out.returncode != 0
    assert f"has sha256 {data.sha256}, the host expected {'0' * 64}" in out.stderr
    assert not read_metrics(job.run_dir)


@pytest.mark.slow
def test_tiny_cpu_trains_with_the_torch_loop(torch_backend, tmp_path, tiny_cpu_run):
    env = backend_env_or_skip("torch")
    scn, result = helpers.train_tiny_cpu("torch", tmp_path, env.version("torch"), shared=tiny_cpu_run)
    report = read_worker_report(result.run_dir)
    assert report["transformers_version"] == "5.6.0" and report["param_dtype"] == "float32"
    # The loop's own clock (its measured span, data preparation between steps included) agrees
    # with the steps the host read: the same tokens over the same seconds, give or take the gaps.
    # (Against the median step, as TGS is, a busy machine's uneven steps would part the two.)
    measured = [s for s in read_metrics(result.run_dir) if s["step"] > scn.steps.warmup]
    steps_rate = sum(s["tokens"] for s in measured) / sum(s["seconds"] for s in measured)
    assert 0.75 < steps_rate / result.framework_throughput["tokens_per_sec"] < 1.33
    losses = [s["loss"] for s in read_metrics(result.run_dir)]
    assert losses[-1] < losses[0]  # AdamW at lr 2e-5 on the same rows: the loss goes down


@pytest.mark.slow
def test_two_cpu_processes_train_with_ddp(torch_backend):
    backend_env_or_skip("torch")
    s = scenario.load("multiproc_tiny_cpu_1x2")
    r = pipeline.run_one("torch", s, RunOptions(timeout=MULTIPROCESS_TIMEOUT))
    assert r.status == "ok", r.reason
    assert "DDP over 2 processes (gloo)" in r.notes
    # read from the model that trained, in a process group of two
    assert r.settings["ddp_wrapped"] is True and r.settings["process_group_size"] == 2
    steps = read_metrics(r.run_dir)
    by_rank = {rank: [m for m in steps if m["rank"] == rank] for rank in (0, 1)}
    assert [len(v) for v in by_rank.values()] == [s.steps.total] * 2
    assert all(m["tokens"] == s.context_length for m in steps)
    # Each rank trained other rows: their losses differ at step 1 (same weights, other data).
    assert by_rank[0][0]["loss"] != by_rank[1][0]["loss"]
    # each step's time: the slower rank's, each rank's the longer of its claim and the host's window
    seen = clock_checks.host_seconds(clock_checks.load_stamps(r.run_dir))

    def step(m: dict) -> float:
        return max(m["seconds"], seen.get((m["rank"], m["step"]), 0.0))
    expected = statistics.median(s.context_length / max(step(by_rank[0][i]), step(by_rank[1][i]))
                                 for i in range(s.steps.warmup, s.steps.total))
    assert r.tgs == pytest.approx(expected)


@pytest.mark.slow
def test_zero3_trains_with_fsdp2_on_two_cpu_processes(torch_backend, torch_zero_run):
    """ZeRO-3 as FSDP2: each rank trains its own rows every step, and the ledger, read from the
    live model, says the sharding (every decoder layer resharded after its forward). The run is
    the session's (`torch_zero_run`), the reference the frameworks' ZeRO-3 runs are judged against."""
    s = scenario.load("multiproc_tiny_cpu_zero3")
    r = torch_zero_run(3)
    assert r.status == "ok", r.reason
    assert "FSDP2 (ZeRO-3) over 2 processes (gloo)" in r.notes
    assert {k: r.settings[k] for k in ("trainer", "zero_stage", "fsdp_reshard_after_forward", "ddp_wrapped",
                                       "process_group_size", "deepspeed_version")} == {
        "trainer": "torch-loop+fsdp2", "zero_stage": 3, "fsdp_reshard_after_forward": True, "ddp_wrapped": False,
        "process_group_size": 2, "deepspeed_version": None}
    assert r.settings["fsdp_units"] == s.arch.num_hidden_layers + 1  # each decoder layer, then the root
    steps = read_metrics(r.run_dir)
    assert sorted((m["rank"], m["step"]) for m in steps) == [(k, i) for k in (0, 1) for i in range(1, s.steps.total + 1)]
    # the initial weights and the update were read whole from the shards (DTensor.full_tensor)
    assert {c.name: c.status for c in r.checks if c.name in ("parameters", "initial_weights", "update")} == {
        "parameters": "pass", "initial_weights": "pass", "update": "pass"}


@pytest.mark.slow
def test_sequence_parallel_trains_each_row_as_the_unsplit_loop_does(torch_backend):
    """Ulysses SP 2 over FSDP2 (ZeRO-3), one SP group of two CPU processes: each rank trains half
    of every row (its tokens), both read the group's rows, and the losses and the update agree
    with one process training the whole rows unsplit (same name: the same projection vector)."""
    from framework_bench.run import referee

    backend_env_or_skip("torch")
    s = scenario.load("multiproc_tiny_cpu_sp2")
    r = pipeline.run_one("torch", s, RunOptions(launcher="torchrun", timeout=MULTIPROCESS_TIMEOUT))
    assert r.status == "ok", r.reason
    assert "FSDP2 (ZeRO-3) over 2 processes (gloo), Ulysses sequence parallel over groups of 2" in r.notes
    assert (r.settings["sequence_parallel"], r.settings["zero_stage"], r.settings["process_group_size"]) == (2, 3, 2)
    assert all(m["tokens"] == s.context_length // 2 for m in read_metrics(r.run_dir))
    unsplit = s.model_dump()
    unsplit.update(sequence_parallel=1, zero_stage=0)
    unsplit["cluster"].update(gpus_per_node=1, gpus=1)
    whole = pipeline.run_one("torch", scenario.Scenario.model_validate(unsplit), RunOptions(timeout=MULTIPROCESS_TIMEOUT))
    # One process's two steps can take under the 0.2 s the CPU share needs: that check alone may say `unverified`.
    short_of = {c.name for c in whole.checks if c.status in ("fail", "unverified")}
    assert whole.status in ("ok", "unverified") and short_of <= {"cpu"}, whole.reason
    assert whole.settings["sequence_parallel"] == 1
    judged = {c.name: c for c in referee.judge(r, whole, s).checks}
    assert judged["parity"].status == judged["update_parity"].status == "pass", [judged["parity"], judged["update_parity"]]
    assert "every step judged" in judged["parity"].detail
    print(f"\nparity: {judged['parity'].detail}\nupdate parity: {judged['update_parity'].detail}")  # docs/calibration.md


@pytest.fixture(scope="module")
def minimal_worker_run(tmp_path_factory):
    """The ~50-line worker CONTRIBUTING.md shows, run once in the torch env on tiny_cpu (both
    plugin forms read back the same worker's run): (scenario, packed data, job)."""
    from framework_bench.measure import update
    from framework_bench.data.packing import pack

    env = backend_env_or_skip("torch")
    tmp_path = tmp_path_factory.mktemp("minimal-worker")
    worker = helpers.contributing_backend()[0]
    assert len(worker.strip().splitlines()) <= 65  # with the initial-weights and loss claims
    (tmp_path / "minimal_worker.py").write_text(worker)
    scn = scenario.load("tiny_cpu")
    data = pack(scn, progress=False, say=lambda msg: None)
    job = Job(backend="mybackend", scenario=scn, data_dir=data.dir, data_sha256=data.sha256, run_dir=tmp_path / "run",
              device="cpu")
    job_file = job.write()
    reveal = update.Reveal(after_step=scn.steps.total, ranks=1, seed=777, initial_seed=778, warmup_seed=779)
    # as the host's watcher would (no watcher here); a seed left unwritten holds the worker for its whole wait
    reveal.write_initial(job.run_dir), reveal.write_warmup(job.run_dir), reveal.write(job.run_dir)
    out = subprocess.run([str(env.python), str(tmp_path / "minimal_worker.py"), str(job_file)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    return scn, data, job


@pytest.mark.parametrize("form", helpers.PLUGIN_FORMS)
@pytest.mark.slow  # starts a framework's or the host's own process
def test_contributings_minimal_backend_conforms_on_tiny_cpu(tmp_path, form, minimal_worker_run):
    """The ~50-line worker CONTRIBUTING.md shows is real code: run in the torch env, its
    report read back by the plugin CONTRIBUTING shows (and by the module-hook plugin it showed
    before the base class) passes every host verification."""
    import importlib.util

    from framework_bench.measure import metrics, update
    from framework_bench.measure import verify
    from framework_bench.plugins.contract import WorkerReport

    env = backend_env_or_skip("torch")
    scn, data, job = minimal_worker_run
    plugin_code = helpers.PLUGIN_FORMS[form][1]()
    (tmp_path / "minimal_plugin.py").write_text(plugin_code)
    spec = importlib.util.spec_from_file_location("minimal_plugin", tmp_path / "minimal_plugin.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    plugin = helpers.hooks_of(module)
    assert plugin.fbench_check(scn, CPU, env) is None
    assert "one process" in plugin.fbench_check(scenario.load("multiproc_tiny_cpu_1x2"), CPU, env)
    report = WorkerReport.model_validate(plugin.fbench_read_report(job))
    assert report.data_sha256 == data.sha256 and report.settings["trainer"] == "minimal-loop"
    checks = verify.verify(scn, report, data.dir, metrics.figures(scn, report.steps, None)["tgs"], job)
    assert {c.name for c in checks} == {"tokens", "steps", "rows", "throughput", "parameters", "settings",
                                        "initial_weights"}
    assert all(c.status == "pass" for c in checks), [c for c in checks if c.status != "pass"]
    assert update.check(job.run_dir, {"reveal": {"seed": 777}}).status == "pass"
    assert update.check(job.run_dir, {"warmup_reveal": {"seed": 779}}, of=update.WARMUP_UPDATE).status == "pass"


@pytest.mark.slow
def test_bf16_autocast_checkpointing_and_accumulation_paths(torch_backend, tmp_path):
    """bf16 autocast over fp32 weights, activation checkpointing, two micro-batches a step;
    at 128 tokens the stream's first row holds a prompt only (no labelled token), which must
    not turn the step's loss into 0/0."""
    backend_env_or_skip("torch")
    s = tiny(context_length=128, precision="bf16", activation_checkpointing=True, grad_accum=2,
             steps={"warmup": 0, "measured": 6})  # measured steps long enough for the host to read their CPU share
    r = pipeline.run_one("torch", s, RunOptions(root=tmp_path), machine=CPU)
    assert r.status == "ok", r.reason
    from framework_bench.worker.packed import IGNORE_INDEX, PackedRows
    from framework_bench.worker.job import load_job

    rows = PackedRows(load_job(r.run_dir / "job.json")["data_dir"])
    assert (rows.labels[0, 1:] == IGNORE_INDEX).all()  # the premise: step 1's first micro-batch is unlabelled
    steps = read_metrics(r.run_dir)
    assert [(m["step"], m["tokens"]) for m in steps] == [(k, 256) for k in range(1, 7)]
    assert all(m["loss"] is not None and m["loss"] == m["loss"] for m in steps)  # finite, not NaN
    assert read_worker_report(r.run_dir)["param_dtype"] == "float32"  # autocast: fp32 master weights
