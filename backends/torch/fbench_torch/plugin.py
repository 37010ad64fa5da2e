"""The torch backend (host side): the no-framework reference, a plain PyTorch loop.

Whatever a framework adds on top of PyTorch (its trainer, hooks, data pipeline, wrappers)
shows as the gap between its TGS and this backend's on the same scenario. Nothing here
imports torch: the worker (`fbench_torch.worker`) runs in the env `.fbench/envs/torch`.
"""

from __future__ import annotations

from pathlib import Path

from framework_bench.worker import files as worker_io
from framework_bench.plugins.backend import (
    CONTRACT,
    BackendEnv,
    BackendInfo,
    Capabilities,
    EnvSpec,
    Job,
    LaunchPlan,
    Machine,
    StepMetric,
    WorkerReport,
)
from framework_bench.run.launchers import base as launch
from framework_bench.plugins.hookspecs import hookimpl
from framework_bench.measure.memory import AdamWImpl, MemoryScheme
from framework_bench.worker.rows import read_consumed
from framework_bench.worker.startup import startup_note
from framework_bench.spec.scenario import Scenario

NAME = "torch"
HERE = Path(__file__).resolve().parent


@hookimpl
def fbench_backend_info() -> BackendInfo:
    return BackendInfo(
        name=NAME,
        framework="PyTorch",
        description="the reference: a plain PyTorch loop (HF model from config, AdamW, autocast, DDP) "
        "on the shared packed rows",
        capabilities=Capabilities(cpu=True, gpu=True, sequence_parallel=False, varlen=False, zero_stages=[0]),
        env=EnvSpec(
            requirements={"cpu": HERE / "requirements-cpu.txt", "cuda": HERE / "requirements-cuda.txt"},
            framework_package="torch",
        ),
        # The reference has no framework default to keep: fused AdamW on CUDA in both modes
        # (the worker sets `fused=True` there), torch's own choice on CPU.
        memory=MemoryScheme(adamw={"matched": AdamWImpl(cuda="fused"), "native": AdamWImpl(cuda="fused")}),
        contract=CONTRACT,  # every claim made: the step timer's clock lines included
        reference=True,
    )


@hookimpl
def fbench_check(scenario: Scenario, machine: Machine, env: BackendEnv) -> str | None:
    if not env.ready:
        return f"the torch env is {env.problem}"
    device = scenario.cluster.device
    if device == "cuda" and not machine.gpus:
        return "the scenario runs on CUDA GPUs; this machine has none"
    if device == "cuda" and env.flavour != "cuda":
        return "the torch env is the CPU flavour (CPU torch build): create it with --flavour cuda"
    # The reference is one plain loop: what it does not implement it refuses, rather than
    # run something else under the scenario's name.
    if scenario.zero_stage:
        return (f"ZeRO stage {scenario.zero_stage}: the torch reference replicates the model on every "
                "process (DDP) and shards nothing")
    if scenario.sequence_parallel > 1:
        return (f"sequence_parallel {scenario.sequence_parallel}: the torch reference has no sequence "
                "parallel; every process trains whole rows")
    if scenario.attention == "varlen":
        return ("varlen attention: the torch reference runs SDPA causal attention over the whole packed "
                "row, with no per-document kernel")
    return None


@hookimpl
def fbench_plan(job: Job, env: BackendEnv) -> LaunchPlan:
    # Nothing to generate: the worker reads everything from job.json, which the host writes.
    return LaunchPlan(
        python=env.python,
        module="fbench_torch.worker",
        args=[str(job.job_file)],
        env={"PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false", **launch.cuda_allocator_env(job)},
        files={"job": job.job_file},
    )


@hookimpl
def fbench_read_report(job: Job) -> WorkerReport:
    records = worker_io.read_metrics(job.run_dir)
    worker = worker_io.read_worker_report(job.run_dir)
    if not records and not worker:
        raise FileNotFoundError(f"the torch worker wrote no metrics in {job.run_dir}")
    return WorkerReport(
        steps=[StepMetric.model_validate(r) for r in records],
        data_sha256=worker.get("data_sha256"),
        framework_version=worker.get("framework_version"),
        attention_used=worker.get("attention_used"),
        framework_throughput=worker.get("loop_throughput", {}),
        notes=list(worker.get("notes", [])) + startup_note(worker.get("startup_seconds"), worker.get("startup_breakdown")),
        settings=worker.get("settings"),
        param_count=worker.get("param_count"),
        consumed_rows=read_consumed(job.run_dir),
        startup_seconds=worker.get("startup_seconds"),
        startup_breakdown=worker.get("startup_breakdown"),
    )
