"""The executor interface every launcher implements, and what all of them share: how a run
ended (`Outcome`), how one was handed to a scheduler (`Submission`), and the tail of its log.
The environment a plan gives its processes is `framework_bench/plugins/plan_env.py` (a
backend's plan builds it).

An executor takes a prepared run (the host's `Job` and the backend's `LaunchPlan`) and
`start`s it: here, waiting for its end (`local`, `torchrun`: an `Outcome`), or by handing it
to a scheduler (`slurm`: a `Submission`, whose `Outcome` is read back when its job ends, see
`framework_bench/run/collect.py`). `framework_bench/run/pipeline.py`, `submit.py` and
`dry_run.py` beside it drive them all through this interface alone.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol

from pydantic import BaseModel, Field

from framework_bench.plugins.contract import Job, LaunchPlan
from framework_bench.run.refusals import Refusals
from framework_bench.scenario.scenario import Scenario

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


SUBMISSION = "slurm.json"


class Submission(BaseModel):
    """A run handed to a scheduler (what `slurm.json` in its run folder records); `job_id` None:
    written but not submitted, `note` says why (the script is to be submitted by hand)."""

    job_id: str | None
    backend: str
    scenario: str
    run_dir: Path
    submitted_at: str
    time_limit: str
    gpu_name: str | None = Field(None, description="GPU the plan targets (the time estimate's; MFU uses the node's)")
    result_id: int | None = None
    db: str | None = Field(None, description="the results file the run was submitted for; its row goes there")
    reference: Path | None = Field(None, description=(
        "the run folder of the reference's run on the same scenario and seed, submitted beside it: "
        "the run is judged for parity with it when collected"))
    judging: dict[str, Path] = Field(default_factory=dict, description=(
        "run folders of the reference trained with another loss in the same job, by `JudgingLoss.key` "
        "(`Job.loss_scheme`, `Job.labels_rolled`): trained only where a run of the round showed it, to judge "
        "that run at every step"))
    round_runs: int = Field(1, description="the runs its job holds, one after another (a SLURM round): how each "
                                           "ended is its own exit status, not the job's")
    compare_id: str | None = None
    trial_round: int | None = None
    trial_position: int | None = None
    note: str | None = Field(None, description="what to know about the submission: node-local paths, why not submitted")

    @classmethod
    def load(cls, run_dir: Path) -> "Submission":
        return cls.model_validate_json((run_dir / SUBMISSION).read_text())

    def save(self) -> None:
        (self.run_dir / SUBMISSION).write_text(self.model_dump_json(indent=2))


class LaunchOptions(Protocol):
    """What a launcher reads of the command's `RunOptions` (framework_bench/run/options.py, which
    imports the launchers: hence a protocol, not that class)."""

    timeout: float | None
    db: Path | None
    sbatch: Any
    projection_round: int
    pinned_seed: bool


class Executor(ABC):
    """One launcher: which refusals stop it, the command that starts a planned run, the files it
    writes to start it, and the start itself."""

    name: ClassVar[Launcher]

    def refusal(self, refusals: Refusals) -> str | None:
        """What of the refusals stops a run on this launcher: every one, for a run started here."""
        return refusals.reason

    @abstractmethod
    def argv(self, plan: LaunchPlan, job: Job) -> list[str]:
        """The one command that starts the run, as a dry run shows it."""

    def node_argvs(self, plan: LaunchPlan, job: Job) -> list[list[str]]:
        """The commands this machine starts: one per node."""
        return [self.argv(plan, job)]

    def time_limit(self, scenario: Scenario, gpu_name: str | None) -> BaseModel | None:
        """The limit a scheduler is given for the run, with how it was estimated (none here)."""
        return None

    def write(self, plan: LaunchPlan, job: Job, options: LaunchOptions, gpu_name: str | None) -> dict[str, Path]:
        """The files, by role, this launcher writes to start the plan (a batch script); `gpu_name`:
        the GPU of the nodes the run targets."""
        return {}

    @abstractmethod
    def start(self, plan: LaunchPlan, job: Job, options: LaunchOptions, gpu_name: str | None,
              poll: Callable[[], None]) -> Outcome | Submission:
        """Start the run: here, returning its `Outcome` once it ended (`poll` is called about twice
        a second meanwhile), or by submitting it, returning the `Submission`."""


def default_launcher(scenario: Scenario) -> Launcher:
    return "torchrun" if scenario.cluster.gpus > 1 else "local"


def tail(path: Path, lines: int = 30) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 64 * 1024))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
