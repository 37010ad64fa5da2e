"""CONTRIBUTING.md's example plugin as it stood in release 0.1.0 (dcebcb8), before the Backend base class:
the four module-level hooks, no contract declared (contract 1, which 0.3.0 runs until 0.4.0). Kept as
written then but for its imports: 0.1.0's `framework_bench.backend`, `framework_bench.hookspecs` and
`framework_bench.worker_io` went in 0.3.0, as 0.2.0 announced, so these name their homes. A plugin of
this form is still tested (tests/test_public_surface.py, tests/test_plugin_outside_repo.py,
backends/torch/tests/test_backend_torch.py); do not edit it otherwise.
"""

from pathlib import Path

from framework_bench.plugins.contract import BackendInfo, Capabilities, EnvSpec, LaunchPlan, StepMetric, WorkerReport
from framework_bench.plugins.hookspecs import hookimpl
from framework_bench.worker import files as worker_io
from framework_bench.worker.rows import read_consumed

HERE = Path(__file__).resolve().parent


@hookimpl
def fbench_backend_info():
    return BackendInfo(name="mybackend", framework="PyTorch (minimal loop)",
                       capabilities=Capabilities(cpu=True, gpu=False, sequence_parallel=False, varlen=False),
                       env=EnvSpec(requirements={"cpu": HERE / "requirements-cpu.txt"}, framework_package="torch"))


@hookimpl
def fbench_check(scenario, machine, env):
    if not env.ready:
        return f"the mybackend env is {env.problem}"
    if scenario.cluster.gpus > 1 or scenario.grad_accum > 1 or scenario.precision != "fp32":
        return "the minimal loop runs one process, one fp32 micro-batch per optimizer step"
    return None


@hookimpl
def fbench_plan(job, env):
    return LaunchPlan(python=env.python, module="fbench_mybackend.worker", args=[str(job.job_file)])


@hookimpl
def fbench_read_report(job):
    records, worker = worker_io.read_metrics(job.run_dir), worker_io.read_worker_report(job.run_dir)
    if not records:
        raise FileNotFoundError(f"the worker wrote no metrics in {job.run_dir}")
    return WorkerReport(steps=[StepMetric.model_validate(r) for r in records], notes=worker.get("notes", []),
                        data_sha256=worker.get("data_sha256"), framework_version=worker.get("framework_version"),
                        attention_used=worker.get("attention_used"), framework_throughput=worker.get("throughput", {}),
                        settings=worker.get("settings"), param_count=worker.get("param_count"),
                        consumed_rows=read_consumed(job.run_dir))
