"""Run one backend on one scenario: check, pack, plan, launch, read back, compute figures.

Every outcome is a `RunResult`; unsupported settings, crashes, OOMs and timeouts are
results with a status and a reason, never a traceback in the host.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, Field

from framework_bench import envs, flops, launch, metrics, plugins
from framework_bench.backend import Job, Machine
from framework_bench.data import tokenizer
from framework_bench.data.packing import PackedData, pack, packed_dir
from framework_bench.packed import TOKENIZER_DIR
from framework_bench.machine import detect
from framework_bench.memory import estimate
from framework_bench.metrics import RunResult
from framework_bench.scenario import Scenario
from framework_bench.worker_io import read_metrics

StepCallback = Callable[[int, int, float | None], None]  # (steps done, steps total, last step seconds)


def runs_root() -> Path:
    return envs.fbench_home() / "runs"


def check(backend: plugins.Backend, scenario: Scenario, machine: Machine):
    """(env, reason): reason is None when the backend can run the scenario here."""
    env = envs.inspect(backend.name, backend.info.env)
    return env, machine_shortfall(scenario, machine) or backend.check(scenario, machine, env)


def machine_shortfall(scenario: Scenario, machine: Machine) -> str | None:
    """Why this machine cannot host the scenario's processes (any backend), or None."""
    c = scenario.cluster
    if c.device == "cuda" and (c.nodes > 1 or machine.gpus < c.gpus_per_node):
        have = f"{machine.gpus} x {machine.gpu_name} ({machine.gpu_memory_gib} GiB)" if machine.gpus else "no GPU"
        need = estimate(scenario, gpu=scenario.reference.hardware if scenario.reference else None).total_gib
        return (f"needs {c.nodes} node(s) x {c.gpus_per_node} GPUs ({c.gpus} in all, ~{need:.0f} GiB each by the "
                f"memory estimate); this machine has {have}: see the plans with --dry-run, or write and submit "
                "them with --launcher slurm")
    return None


def memory_shortfall(scenario: Scenario, machine: Machine, framework: str) -> str | None:
    """Refuse before launch when the per-GPU memory estimate exceeds this machine's GPUs."""
    if scenario.cluster.device != "cuda" or not machine.gpu_memory_gib:
        return None
    e = estimate(scenario, framework=framework, gpu_memory_gib=machine.gpu_memory_gib)
    return None if e.fits else f"would not fit: {e.summary()}; --force runs it anyway"


def make_job(backend: str, scenario: Scenario, data: PackedData, machine: Machine, root: Path | None) -> Job:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir = (root or runs_root()) / f"{stamp}-{scenario.name}-{backend}-{time.monotonic_ns() % 10**6:06d}"
    return Job(backend=backend, scenario=scenario, data_dir=data.dir, data_sha256=data.sha256, run_dir=run_dir,
               device=scenario.cluster.device, nprocs=scenario.cluster.gpus_per_node, nnodes=scenario.cluster.nodes)


def run_one(
    backend_name: str,
    scenario: Scenario,
    *,
    data: PackedData | None = None,
    timeout: float | None = None,
    launcher: launch.Launcher | None = None,
    root: Path | None = None,
    machine: Machine | None = None,
    on_step: StepCallback = lambda done, total, secs: None,
    force: bool = False,
) -> RunResult:
    backend = plugins.get(backend_name)
    machine = machine or detect()
    env, reason = check(backend, scenario, machine)
    if reason is None and not force:
        reason = memory_shortfall(scenario, machine, backend.info.framework)
    base = dict(backend=backend_name, scenario=scenario.name, framework_version=env.version(backend.info.env.framework_package))
    if reason:
        return RunResult(**base, status="unsupported", reason=reason)
    data = data or pack(scenario, progress=False, say=lambda msg: None)
    job = make_job(backend_name, scenario, data, machine, root)
    job.write()
    plan = backend.plan(job, env)
    launcher = launcher or launch.default_launcher(job)
    argvs = launch.node_argvs(plan, job, launcher)
    (job.run_dir / "plan.json").write_text(json.dumps(
        {"launcher": launcher, "argv": argvs, "env": plan.env, "files": {k: str(v) for k, v in plan.files.items()}},
        indent=2))

    total = scenario.steps.total
    seen = [0]

    def poll() -> None:
        steps = read_metrics(job.run_dir)
        done = len({s["step"] for s in steps})
        if done != seen[0]:
            seen[0] = done
            on_step(done, total, steps[-1]["seconds"] if steps else None)

    outcome = launch.execute(argvs, plan.env, job.run_dir, job.run_dir / "worker.log", timeout, poll)
    result = RunResult(**base, status=outcome.status, run_dir=job.run_dir, wall_seconds=round(outcome.seconds, 2),
                       data_sha256=data.sha256)
    if outcome.status != "ok":
        result.reason = f"exit code {outcome.returncode}\n{outcome.log_tail}" if outcome.returncode else outcome.log_tail
        _save(result)
        return result
    try:
        report = backend.read_report(job)
    except FileNotFoundError as e:
        result.status, result.reason = "failed", f"the worker wrote no metrics: {e}"
        _save(result)
        return result
    result.data_sha256 = report.data_sha256
    result.attention_used = report.attention_used
    result.framework_version = report.framework_version or result.framework_version
    result.framework_throughput = report.framework_throughput
    result.startup_seconds = report.startup_seconds
    if report.data_sha256 != data.sha256:
        result.status = "failed"
        result.reason = f"the worker trained on data {report.data_sha256}, not the packed stream {data.sha256}"
    figures = metrics.figures(scenario, report.steps, flops.gpu_peak_tflops(machine.gpu_name))
    result = result.model_copy(update=figures)
    if result.status == "ok" and result.steps_measured == 0:
        result.status, result.reason = "failed", "no measured steps in the metrics file"
    _save(result)
    return result


def _save(result: RunResult) -> None:
    if result.run_dir:
        (result.run_dir / "result.json").write_text(result.model_dump_json(indent=2))


class DryRun(BaseModel):
    """What `run_one` would do, without packing or launching anything."""

    backend: str
    scenario: str
    launcher: str
    check: str | None = Field(description="why it would be refused on this machine; None if it would run")
    argv: list[str]
    env: dict[str, str]
    files: dict[str, Path]
    run_dir: Path


def dry_run(backend_name: str, scenario: Scenario, launcher: launch.Launcher | None = None,
            machine: Machine | None = None, root: Path | None = None, pack_data: bool = False) -> DryRun:
    """Plan without launching. Without `pack_data` no rows are packed (a 1M-token scenario's
    stream is gigabytes): the plan gets a stand-in data folder holding only the tokenizer."""
    backend = plugins.get(backend_name)
    machine = machine or detect()
    env, reason = check(backend, scenario, machine)
    root = root or runs_root() / "dry-run"
    data = pack(scenario, progress=False, say=lambda msg: None) if pack_data else _unpacked(scenario, root)
    job = make_job(backend_name, scenario, data, machine, root)
    job.write()
    plan = backend.plan(job, env)
    launcher = launcher or launch.default_launcher(job)
    files = {"job": job.job_file, **plan.files}
    if launcher == "slurm":
        files["sbatch"] = launch.write_sbatch(plan, job)
    return DryRun(backend=backend_name, scenario=scenario.name, launcher=launcher, check=reason,
                  argv=launch.argv_for(plan, job, launcher), env=plan.env, files=files, run_dir=job.run_dir)


def _unpacked(scenario: Scenario, root: Path) -> PackedData:
    directory = root / f"unpacked-{packed_dir(scenario).name}"
    tokenizer.save_for_transformers(tokenizer.load(scenario.dataset.tokenizer), directory / TOKENIZER_DIR,
                                    scenario.context_length)
    return PackedData(directory, {"sha256": "(not packed in a dry run)"})
