"""The executor interface every launcher implements, and what all of them share: how a run
ended (`Outcome`) and the tail of its log. The environment a plan gives its processes is
`framework_bench/plugins/plan_env.py` (a backend's plan builds it).

An executor takes a prepared run (the host's `Job` and the backend's `LaunchPlan`) and
either runs it here and waits (`local`, `torchrun`: `run` returns an `Outcome`) or hands it
to a scheduler (`slurm`: the run's `Outcome` is read back when its job ends, see
`framework_bench/run/collect.py`). `framework_bench/run/pipeline.py` drives them all.
"""

from __future__ import annotations

import os
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
