"""The twins' host side: the torch backend under another name, not the reference, on the
torch env (benchmarks/aa_false_alarm.py links it under each twin's name)."""

from __future__ import annotations

from pathlib import Path

from fbench_torch.plugin import TorchBackend, backend_info

from framework_bench.plugins.contract import BackendEnv, BackendInfo, Job

HERE = Path(__file__).resolve().parent


class TwinBackend(TorchBackend):
    """`torch` itself, worker included: what an A/A compare of the reference against it shows is
    the harness's noise and order effects, nothing else."""

    name = "torch_twin"

    def info(self) -> BackendInfo:
        return backend_info().model_copy(update={
            "name": self.name, "reference": False, "description": f"{self.name}: a copy of the torch reference"})

    @property
    def worker_module(self) -> str:
        return "fbench_torch.worker"


class SlowBackend(TwinBackend):
    """`torch` with real extra arithmetic after each optimizer step (fbench_twins.slow_worker):
    a slowdown the verdict must find, of the size SLOWDOWN_EXTRA sets."""

    name = "torch_slow"

    @property
    def worker_module(self) -> str:
        return "fbench_twins.slow_worker"

    def run_env(self, job: Job, env: BackendEnv) -> dict[str, str]:
        # the torch env reaches fbench_torch and framework_bench through its .pth; this package
        # is on no path there, so the worker is given it
        return super().run_env(job, env) | {"PYTHONPATH": str(HERE.parent)}
