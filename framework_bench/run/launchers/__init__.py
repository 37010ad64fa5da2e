"""The launchers by name (`--launcher`): here, apart from `base.py`, which each of them builds
on, so that no launcher module imports another's caller."""

from __future__ import annotations

from framework_bench.run.launchers.base import Executor, Launcher
from framework_bench.run.launchers.local import LocalExecutor
from framework_bench.run.launchers.slurm import SlurmExecutor
from framework_bench.run.launchers.torchrun import TorchrunExecutor

EXECUTORS: dict[Launcher, type[Executor]] = {"local": LocalExecutor, "torchrun": TorchrunExecutor, "slurm": SlurmExecutor}


def executor_for(launcher: Launcher) -> Executor:
    return EXECUTORS[launcher]()
