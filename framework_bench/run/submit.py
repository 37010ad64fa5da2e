"""`--launcher slurm`: runs prepared as `framework_bench/run/pipeline.py` prepares every run, then
handed to SLURM (`submit_all`: every backend on every scenario, the reference first);
`framework_bench/run/collect.py` finishes each when its job ends."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, Field

from framework_bench.measure.metrics import RunResult
from framework_bench.plugins.contract import Machine
from framework_bench.run import design, orphans, pipeline, verdicts
from framework_bench.run.launchers.base import Submission
from framework_bench.run.launchers.slurm import SBATCH_FILE
from framework_bench.run.launchers.slurm_time import TimeEstimate
from framework_bench.run.options import RunOptions
from framework_bench.run.reference import reference_first
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


def submit_all(
    scenarios: list[Scenario],
    backend_names: list[str],
    options: RunOptions,
    *,
    on_scenario: Callable[[Scenario], None] = lambda s: None,
    on_planned: Callable[[str, Scenario, Planned], None] = lambda b, s, p: None,
) -> None:
    """`compare --launcher slurm`: every backend on every scenario written and submitted, the
    reference first (jobs run side by side there, in no order of ours); each other run records the reference's run folder, so `results collect`
    judges it for parity with the reference's result."""
    ordered, reference_name = reference_first(backend_names)
    options = options.model_copy(update={"seed": design.compare_seed(options.seed)})  # one round: every job's
    for s in scenarios:
        on_scenario(s)
        reference = None
        for name in ordered:
            planned = submit(name, s, options, reference=reference)
            if name == reference_name and planned.submission is not None:
                reference = planned.submission.run_dir
            on_planned(name, s, planned)
