"""`--dry-run`: what a run would do, judged and planned exactly as `framework_bench/run/pipeline.py`
prepares it for real, without packing or launching anything."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

from framework_bench.data import tokenizer
from framework_bench.data.packing import PackedData, packed_dir
from framework_bench.plugins.contract import Machine
from framework_bench.run import pipeline, verdicts
from framework_bench.run.launchers.slurm import TimeEstimate
from framework_bench.run.options import RunOptions
from framework_bench.spec.scenario import Scenario
from framework_bench.worker.packed import TOKENIZER_DIR


class DryRun(BaseModel):
    """What `run_one` (or `submit`) would do, without packing or launching anything."""

    backend: str
    scenario: str
    launcher: str
    check: str | None = Field(description="why it would be refused on this machine; None if it would run")
    verdict: verdicts.Verdict | None = Field(None, description="each refusal on its own: machine, env, backend, memory")
    time: TimeEstimate | None = Field(None, description="the SLURM time limit estimate (slurm launcher)")
    plan_error: str | None = Field(None, description="fbench_plan raised: its error (no argv, env or files then)")
    argv: list[str]
    env: dict[str, str]
    files: dict[str, Path]
    run_dir: Path


def dry_run(backend_name: str, scenario: Scenario, options: RunOptions | None = None,
            machine: Machine | None = None) -> DryRun:
    """`prepare` without packing, described: the verdict, the command, its environment and the
    files the plan and the launcher wrote. The run folder is under `options.root`, or
    FBENCH_HOME/runs/dry-run."""
    options = options or RunOptions()
    options = options.model_copy(update={"root": options.root or pipeline.runs_root() / "dry-run"})
    p = pipeline.prepare(backend_name, scenario, options, machine=machine, data=unpacked(scenario, options.root),
                         dry=True)
    files = {"job": p.job.job_file}
    head = dict(backend=backend_name, scenario=scenario.name, launcher=p.executor.name, check=p.refusal,
                verdict=p.verdict, run_dir=p.job.run_dir)
    if p.plan is None:
        return DryRun(**head, plan_error=p.plan_error, argv=[], env={}, files=files)
    files |= p.plan.files | p.executor.write(p.plan, p.job, options, p.gpu_name)
    return DryRun(**head, time=p.executor.time_limit(scenario, p.gpu_name), argv=p.executor.argv(p.plan, p.job),
                  env=p.plan.env, files=files)


def unpacked(scenario: Scenario, root: Path) -> PackedData:
    """A stand-in data folder under `root` holding only the scenario's tokenizer: what a plan
    reads of the data, with no packed rows."""
    directory = root / f"unpacked-{packed_dir(scenario).name}"
    tokenizer.save_for_transformers(tokenizer.load(scenario.dataset.tokenizer), directory / TOKENIZER_DIR,
                                    scenario.context_length)
    return PackedData(directory, {"sha256": "(not packed in a dry run)"})
