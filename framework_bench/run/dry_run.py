"""`--dry-run`: what a run would do, judged and planned exactly as `framework_bench/run/pipeline.py`
prepares it for real, without packing or launching anything; on GPU scenarios, what `--repeat`
would cost."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from framework_bench.data import tokenizer
from framework_bench.data.packing import PackedData, packed_dir
from framework_bench.measure import memory
from framework_bench.plugins import registry as plugins
from framework_bench.plugins.contract import Machine
from framework_bench.run import design, pipeline, twin
from framework_bench.run.refusals import Refusals, fit_refusal, refusals_for, target_machine
from framework_bench.run.launchers.slurm_time import TimeEstimate, duration, estimate_time
from framework_bench.run.options import RunOptions
from framework_bench.scenario.scenario import Scenario
from framework_bench.worker.packed import TOKENIZER_DIR


class DryRun(BaseModel):
    """What `run_one` (or `submit`) would do, without packing or launching anything."""

    backend: str
    scenario: str
    launcher: str
    check: str | None = Field(description="why it would be refused on this machine; None if it would run")
    refusals: Refusals | None = Field(None, description="each refusal on its own: machine, env, backend, memory")
    time: TimeEstimate | None = Field(None, description="the SLURM time limit estimate (slurm launcher)")
    plan_error: str | None = Field(None, description="fbench_plan raised: its error (no argv, env or files then)")
    argv: list[str]
    env: dict[str, str]
    files: dict[str, Path]
    run_dir: Path


def dry_run(backend_name: str, scenario: Scenario, options: RunOptions | None = None,
            machine: Machine | None = None, gpu: str | None = None) -> DryRun:
    """`prepare` without packing, described: the refusals, the command, its environment and the
    files the plan and the launcher wrote. The run folder is under `options.root`, or
    FBENCH_HOME/runs/dry-run. `gpu` (--gpu, a `gpus.MODELS` name): the memory and the time are
    judged on it instead of the scenario's nodes' GPU (`on_gpu`)."""
    options = options or RunOptions()
    options = options.model_copy(update={"root": options.root or pipeline.runs_root() / "dry-run"})
    p = pipeline.prepare(backend_name, scenario, options, machine=machine, data=unpacked(scenario, options.root),
                         dry=True)
    refusals, refusal, gpu_name = p.refusals, p.refusal, gpu or p.gpu_name
    if gpu and refusals is not None:
        refusals = on_gpu(refusals, scenario, options, gpu)
        refusal = p.executor.refusal(refusals)
    files = {"job": p.job.job_file}
    head = dict(backend=backend_name, scenario=scenario.name, launcher=p.executor.name, check=refusal,
                refusals=refusals, run_dir=p.job.run_dir)
    if p.plan is None:
        return DryRun(**head, plan_error=p.plan_error, argv=[], env={}, files=files)
    files |= p.plan.files | p.executor.write(p.plan, p.job, options, gpu_name)
    return DryRun(**head, time=p.executor.time_limit(scenario, gpu_name), argv=p.executor.argv(p.plan, p.job),
                  env=p.plan.env, files=files)


def on_gpu(refusals: Refusals, scenario: Scenario, options: RunOptions, gpu: str) -> Refusals:
    """The refusals with their memory judged on `gpu` (the backend's own estimate, and its refusal
    unless --force) where `refusals.refusals_for` judged the scenario's nodes' GPU: the question a
    dry run with --gpu asks. The rest stands as judged; a CPU scenario has no GPU to judge on."""
    if refusals.estimate is None:
        return refusals
    e = memory.estimate(scenario, declared=plugins.get(refusals.backend).info.memory,
                        settings_mode=options.settings_mode, gpu=gpu)
    refused = not options.force and refusals.check is None and e.fits is False
    return refusals.model_copy(update={"estimate": e, "memory": fit_refusal(e, gpu) if refused else None})


def unpacked(scenario: Scenario, root: Path) -> PackedData:
    """A stand-in data folder under `root` holding only the scenario's tokenizer: what a plan
    reads of the data, with no packed rows."""
    directory = root / f"unpacked-{packed_dir(scenario).name}"
    tokenizer.save_for_transformers(tokenizer.load(scenario.dataset.tokenizer), directory / TOKENIZER_DIR,
                                    scenario.context_length)
    return PackedData(directory, {"sha256": "(not packed in a dry run)"})


def plans(
    scenarios: list[Scenario],
    backend_names: list[str],
    options: RunOptions,
    machine: Machine,
    gpu: str | None = None,
) -> list[DryRun]:
    """`--dry-run`: every backend's plan on every scenario, in the order given, judged on `gpu`
    where named (--gpu); nothing is packed, launched or submitted."""
    return [dry_run(name, s, options, machine, gpu) for s in scenarios for name in backend_names]


class TrialCost(BaseModel):
    """What --repeat and the warm-up rounds multiply on one GPU scenario, for `--dry-run`."""
    scenario: str
    trials: tuple[int, int] = Field(description="the fewest and the most counted rounds (apart: --repeat auto)")
    warmup: int
    backends: list[str] = Field(description="those whose own check takes the scenario, the reference among them "
                                            "(one that refuses it is stored at once, for nothing)")
    reference: str | None = Field(description="the reference, when it takes the scenario: it runs in every round, "
                                              "chosen or not, to judge the others")
    training_s: float = Field(description="one run's expected training: its steps at the estimated step time")
    source: str = Field(description="where the step time comes from")
    twin_steps: int = Field(0, description="the steps of each fp32 twin a round runs (0: none, an fp32 scenario)")

    def summary(self) -> str:
        fewest, most = self.trials
        trials = f"{fewest}" if fewest == most else f"{fewest} to {most} (--repeat auto)"
        rounds = [(n + self.warmup) * len(self.backends) for n in (fewest, most)]
        runs = f"{rounds[0]}" if fewest == most else f"{rounds[0]} to {rounds[1]}"
        hours = " to ".join(dict.fromkeys(duration(n * self.training_s) for n in rounds))
        names = ", ".join(f"{b} (the reference)" if b == self.reference else b for b in self.backends)
        judged = len(self.backends) - 1 if self.reference else 0
        judging = [(n + self.warmup) * judged for n in (fewest, most)]
        more = f"{judging[0]}" if fewest == most else f"{judging[0]} to {judging[1]}"
        return (f"{trials} trials + {self.warmup} warm-up of {len(self.backends)} backend(s) ({names}): {runs} runs, "
                f"~{hours} of training ({runs} x {duration(self.training_s)}: steps x the step time of the "
                f"{self.source}) plus each run's start-up"
                + (f"; up to {more} more of {self.reference}, one a round for each run whose loss normalisation or "
                   "native adapters differ from its own (it judges that run, and is not stored)" if judged else "")
                + (f"; and each round an fp32 twin of each judged run and of {self.reference}, {self.twin_steps} steps "
                   "each (the training step judged at fp32's tolerances; not stored; not under SLURM)"
                   if judged and self.twin_steps else ""))


def trial_cost(scenario: Scenario, planned: list[DryRun], machine: Machine, repeat: int | Literal["auto"],
               warmup_rounds: int | None, *, reference: str | None, gpu: str | None = None) -> TrialCost | None:
    """The cost of --repeat on a GPU scenario (None on CPU, or for a single run each): the runs of
    every backend whose own check takes the scenario, and of `reference` (None: --no-reference),
    which every round runs whether chosen or not, times one run's expected training (the estimate
    the SLURM time limit starts from, before its margin and start-up) on `gpu` (--gpu), or the
    scenario's nodes' GPU."""
    first, last = design.round_range(repeat)
    warm = design.warmup_default(first, scenario) if warmup_rounds is None else warmup_rounds
    if scenario.cluster.device != "cuda" or last + warm <= 1:
        return None
    # A backend's own check refuses the scenario wherever it runs (stored unsupported at once, for
    # nothing); this machine, the env's flavour and memory are judged here, not on the GPU node.
    running = [d.backend for d in planned if d.refusals is not None and not d.refusals.check and not d.plan_error]
    if reference is not None and reference not in (d.backend for d in planned):
        if refusals_for(plugins.get(reference), scenario, machine)[1].check is None:
            running.append(reference)
    estimate = estimate_time(scenario, gpu or target_machine(scenario, machine).gpu_name)
    return TrialCost(scenario=scenario.name, trials=(first, last), warmup=warm, backends=running,
                     reference=reference if reference in running else None,
                     training_s=estimate.steps * estimate.step_seconds, source=estimate.source,
                     twin_steps=twin_scenario.steps.total if (twin_scenario := twin.twin_of(scenario)) else 0)
