"""The executor interface every launcher implements, and what all of them share: how a run
ended (`Outcome`), the tail of its log, and the environment a plan gives its processes.

An executor takes a prepared run (the host's `Job` and the backend's `LaunchPlan`) and
either runs it here and waits (`local`, `torchrun`: `run` returns an `Outcome`) or hands it
to a scheduler (`slurm`: the run's `Outcome` is read back when its job ends, see
`framework_bench/run/collect.py`). `framework_bench/run/pipeline.py` drives them all.
"""

from __future__ import annotations

import os
import socket
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

from framework_bench.plugins.backend import Job, LaunchPlan

Launcher = Literal["local", "torchrun", "slurm"]
LAUNCHERS: tuple[Launcher, ...] = ("local", "torchrun", "slurm")
RDZV_PORT = 29500
OOM_MARKERS = ("CUDA out of memory", "OutOfMemoryError", "torch.OutOfMemoryError", "Cannot allocate memory")


@dataclass
class Outcome:
    status: Literal["ok", "failed", "oom", "timeout", "interrupted"]
    returncode: int | None
    seconds: float
    log_tail: str


class Executor(ABC):
    """One launcher: the command that starts a planned run, and how it is started."""

    name: ClassVar[Launcher]

    @abstractmethod
    def argv(self, plan: LaunchPlan, job: Job) -> list[str]:
        """The one command that starts the run, as a dry run shows it."""

    def node_argvs(self, plan: LaunchPlan, job: Job) -> list[list[str]]:
        """The commands this machine starts: one per node."""
        return [self.argv(plan, job)]

    def run(self, plan: LaunchPlan, job: Job, timeout: float | None, poll: Callable[[], None]) -> Outcome:
        """Start the run here and wait for its end; `poll` is called about twice a second. A
        launcher whose runs a scheduler starts (slurm) has none."""
        raise NotImplementedError(f"the {self.name} launcher does not run jobs here")


def default_launcher(job: Job) -> Launcher:
    return "torchrun" if job.nprocs * job.nnodes > 1 else "local"


def executor_for(launcher: Launcher) -> Executor:
    """The executor of a launcher; imported on use, so choosing one loads only its module."""
    if launcher == "local":
        from framework_bench.run.launchers.local import LocalExecutor
        return LocalExecutor()
    if launcher == "torchrun":
        from framework_bench.run.launchers.torchrun import TorchrunExecutor
        return TorchrunExecutor()
    from framework_bench.run.launchers.slurm import SlurmExecutor
    return SlurmExecutor()


def tail(path: Path, lines: int = 30) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 64 * 1024))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------------------
# The environment a plan gives its processes, whatever launcher starts them.

def process_group_env(job: Job) -> dict[str, str]:
    """The variables torchrun would set, for a run started as one process without it.

    Both frameworks need an initialised process group on a GPU or with DeepSpeed even for
    one process (DeepSpeed otherwise falls back to MPI discovery; XTuner's dispatched
    attention calls `dist.get_rank()`): a one-process job is a world of one on a free port.
    Several processes get these from torchrun, so nothing is returned for them."""
    if job.nprocs * job.nnodes > 1:
        return {}
    return {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}


def visible_gpus_env(job: Job, environ: dict[str, str] | None = None) -> dict[str, str]:
    """`CUDA_VISIBLE_DEVICES` naming the job's GPUs per node: the first `nprocs` of those
    already visible (the user's or the scheduler's choice), else 0..nprocs-1. Without it a
    one-process job on an 8-GPU host sees 8 GPUs (LLaMA-Factory's HF Trainer then raises)."""
    if job.device != "cuda":
        return {}
    environ = os.environ if environ is None else environ
    visible = [d.strip() for d in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    chosen = visible[:job.nprocs] if len(visible) >= job.nprocs else [str(i) for i in range(job.nprocs)]
    return {"CUDA_VISIBLE_DEVICES": ",".join(chosen)}


CUDA_ALLOC_CONF = "expandable_segments:True"


def cuda_allocator_env(job: Job, environ: dict[str, str] | None = None) -> dict[str, str]:
    """`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` for every CUDA plan, both settings
    modes, unless the user set the variable (theirs then reaches the worker unchanged).
    Expandable segments grow one mapping instead of caching fixed blocks, so a step whose
    tensor sizes change between phases (activations, then the optimizer's temporaries)
    leaves little reserved-but-unusable memory: the same allocator for every backend. The
    workers record the value in effect (`cuda_alloc_conf` in their settings)."""
    environ = os.environ if environ is None else environ
    if job.device != "cuda" or "PYTORCH_CUDA_ALLOC_CONF" in environ:
        return {}
    return {"PYTORCH_CUDA_ALLOC_CONF": CUDA_ALLOC_CONF}
