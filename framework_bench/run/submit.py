"""`--launcher slurm`: a run prepared as `framework_bench/run/pipeline.py` prepares every run,
then handed to SLURM; `framework_bench/run/collect.py` finishes it when its job ends."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

from framework_bench.measure.metrics import RunResult
from framework_bench.plugins.contract import Machine
from framework_bench.run import orphans, pipeline, verdicts
from framework_bench.run.launchers.base import Submission
from framework_bench.run.launchers.slurm import SBATCH_FILE, TimeEstimate
from framework_bench.run.options import RunOptions
from framework_bench.spec.scenario import Scenario


class Planned(BaseModel):
    """One backend x scenario for SLURM: refused or failed (result), or written (and maybe submitted)."""

    verdict: verdicts.Verdict
    result: RunResult | None = Field(None, description="the unsupported or failed result: nothing submitted")
    sbatch: Path | None = None
    time: TimeEstimate | None = None
    submission: Submission | None = None
    note: str | None = None


def submit(backend_name: str, scenario: Scenario, options: RunOptions, machine: Machine | None = None,
           reference: Path | None = None) -> Planned:
    """Prepare and start on SLURM: write the sbatch script, submitted where sbatch exists here.
    Nothing is written or submitted for a backend that refused, or whose hooks raised (a
    result then, as on every launcher); the job ends on the cluster and
    `framework_bench/run/collect.py` finishes it, judged for parity with the run in `reference`."""
    options = options.model_copy(update={"launcher": "slurm"})
    heard: list[verdicts.Verdict] = []
    p = pipeline.prepare(backend_name, scenario, options, machine=machine, on_verdict=heard.append)
    if isinstance(p, RunResult):  # the caller stores it, which releases its claim
        return Planned(verdict=heard[0] if heard else verdicts.Verdict(backend=backend_name, check=p.reason), result=p)
    sub = p.executor.start(p.plan, p.job, options, p.gpu_name, lambda: None)
    orphans.release(p.job.run_dir)  # its job is `results collect`'s to store now
    if sub.job_id is not None and reference is not None:
        sub.reference = reference
        sub.save()
    return Planned(verdict=p.verdict, sbatch=p.job.run_dir / SBATCH_FILE, time=p.executor.time_limit(scenario, p.gpu_name),
                   submission=sub if sub.job_id else None, note=sub.note)
