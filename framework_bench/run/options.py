"""How a command's runs are carried out: chosen once on the command line, carried whole
through the pipeline instead of a parameter per choice."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

from framework_bench.run.launchers.base import Launcher
from framework_bench.run.launchers.slurm import SbatchOptions
from framework_bench.worker.job import SettingsMode
from framework_bench.worker.loss_schemes import JudgingLoss


class Trial(BaseModel):
    """Which compare, round and place in it a run is a trial of (set by its round): the run's claim
    on its folder records it, so that a run whose fbench died is stored as the trial it was."""

    compare_id: str | None = None
    trial_round: int | None = None
    trial_position: int | None = None


class RunOptions(BaseModel):
    launcher: Launcher | None = Field(None, description="None: local for one process, torchrun for several")
    timeout: float | None = Field(None, description="seconds before a run is stopped (runs here only)")
    force: bool = Field(False, description="run even where the memory estimate says it won't fit")
    settings_mode: SettingsMode = Field("matched", description="matched or native (framework_bench/worker/job.py)")
    seed: int | None = Field(None, description=(
        "the initial weights' seed; None: a compare draws a fresh one per round (`design.round_seed`), "
        "a run outside a compare (check-backend) takes SEED"))
    pinned_seed: bool = Field(False, description=(
        "the seed was pinned with --seed: the trained weights start from it, not from a seed the host reveals "
        "at the first step (framework_bench/measure/update.py: initial_seed)"))
    db: Path | None = Field(None, description="the results file the runs are stored in; None: nobody stores them")
    root: Path | None = Field(None, description="the folder of the run folders; None: FBENCH_HOME/runs")
    sbatch: SbatchOptions = Field(default_factory=SbatchOptions, description="slurm: the batch script's options")
    loss_scheme: str | None = Field(None, description="the loss normalisation a reference run trains with "
                                                      "(`Job.loss_scheme`): set by the referee only")
    labels_rolled: bool = Field(False, description="a reference run trains each row's labels rolled "
                                                   "(`Job.labels_rolled`): set by the referee only")
    projection_round: int = Field(0, description="the round whose update-projection vector the runs share "
                                                 "(framework_bench/measure/update.py): set by compare per round")
    trial: Trial = Field(default_factory=Trial, description="the trial a run is (set by its round)")

    def trained_with(self, loss: JudgingLoss, **update) -> RunOptions:
        """These options for a judging run of the reference trained with `loss` (and `update`)."""
        return self.model_copy(update={"loss_scheme": loss.scheme, "labels_rolled": loss.rolled, **update})
