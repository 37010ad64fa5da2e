"""A campaign: the chosen backends over the chosen scenarios, round after round, as one request.
The one library entry of `fbench run` and `fbench compare`: it picks the dry run (every plan,
nothing launched), the local rounds (`compare.py`) or SLURM (`submit.py`, then `collect.py` when
asked to wait), and says what happens through `Events`, which the CLI renders; `collect_jobs`
is `fbench results collect`'s."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from framework_bench.measure.metrics import RunResult
from framework_bench.plugins.contract import Machine
from framework_bench.run import collect, compare, dry_run, pipeline, preflight, submit
from framework_bench.run.compare import AutoStop
from framework_bench.run.launchers.base import Submission
from framework_bench.run.launchers.slurm_queue import JobState
from framework_bench.run.options import RunOptions
from framework_bench.scenario.scenario import Scenario
from framework_bench.store.results import ResultStore


class Request(BaseModel):
    """What to run: each option checked by the caller (the CLI, as it parses it); the request as a
    whole by the campaign, before anything runs (`preflight.refusal`)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    scenarios: list[Scenario]
    backends: list[str]
    options: RunOptions = Field(default_factory=RunOptions)
    repeat: int | Literal["auto"] = 1
    warmup_rounds: int | None = None
    precision: float | None = None
    budget_s: float | None = Field(None, description="with repeat='auto': the most seconds its rounds may take")
    no_reference: bool = False
    dry_run: bool = False
    gpu: str | None = Field(None, description="--dry-run only: the GPU the plans' memory and time are judged on")
    wait: bool = Field(False, description="SLURM: wait for the jobs and store each run as its job ends")
    poll: float = 30.0
    out: Path | None = Field(None, description="where the charts and report go (--out): checked writable first")


class Events:
    """What a campaign says as it goes; each a no-op here, the CLI's subclass renders them."""

    def recovered(self, line: str) -> None: ...

    def env(self, line: str) -> None: ...

    def run_started(self, backend: str, scenario: Scenario) -> None: ...

    def step(self, done: int, total: int, secs: float | None) -> None: ...

    def result(self, result: RunResult, scenario: Scenario) -> None: ...

    def kept(self, path: Path) -> None: ...

    def scenario_submitted(self, scenario: Scenario) -> None: ...

    def round_submitted(self, scenario: Scenario, number: int, order: list[str]) -> None: ...

    def planned(self, backend: str, scenario: Scenario, planned: submit.Planned) -> None: ...

    def jobs_waited(self, subs: list[Submission]) -> None: ...

    def collected(self, result: RunResult, submission: Submission) -> None: ...

    def waiting(self, submission: Submission, state: JobState) -> None: ...

    def problem(self, submission: Submission, why: str) -> None: ...


class Outcome(BaseModel):
    """What a campaign ran (or, dry, would run)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    results: list[RunResult] = Field(default_factory=list, description="every run stored, whatever ended it")
    stops: list[AutoStop] = Field(default_factory=list, description="why --repeat auto stopped, per scenario")
    interrupted: bool = False
    plans: list[dry_run.DryRun] = Field(default_factory=list)
    costs: dict[str, dry_run.TrialCost] = Field(default_factory=dict, description="--dry-run: by scenario, on GPUs")
    submitted: list[Submission] = Field(default_factory=list, description="SLURM: jobs not yet collected")
    waited: bool = Field(False, description="SLURM: the jobs were waited for (a Ctrl-C then stopped the waiting)")
    store: ResultStore | None = Field(None, description="where the runs were stored (None: a dry run)")


def campaign(request: Request, events: Events | None = None, machine: Machine | None = None,
             reference: str | None = None) -> Outcome:
    """Run `request`, storing each run in the results store `request.options.db` (opened first, the
    runs earlier commands could not store stored then, each said through `events.recovered`; a dry
    run stores nothing); `reference`: the reference backend, whose run folders are checked too and
    whose trial cost a dry run counts beside the backends. Raises `preflight.Refused` when the
    request cannot start, before anything is written."""
    if problem := preflight.refusal(request, reference):
        raise preflight.Refused(problem)
    events = events or Events()
    if request.dry_run:
        return _dry(request, machine, reference)
    store = ResultStore(request.options.db)
    for line in pipeline.recover(store):
        events.recovered(line)
    if problem := preflight.unwritable_places(store, request.out if request.options.launcher != "slurm" else None):
        raise preflight.Refused(problem)
    options = request.options.model_copy(update={"db": store.path})
    _version_envs(request.backends, events)
    if options.launcher == "slurm":
        return _slurm(request, options, store, events)
    outcome = Outcome(store=store)
    try:
        compare.compare(request.scenarios, request.backends, options, store=store, repeat=request.repeat,
                        warmup_rounds=request.warmup_rounds, precision=request.precision,
                        no_reference=request.no_reference, on_start=events.run_started, on_step=events.step,
                        on_result=lambda r, s: (outcome.results.append(r), events.result(r, s)),
                        on_auto=outcome.stops.append, on_kept=events.kept, budget_s=request.budget_s)
    except (compare.Interrupted, KeyboardInterrupt):
        outcome.interrupted = True
    return outcome


def _version_envs(names: list[str], events: Events) -> None:
    """The env of each backend at a version (`plugins/pins.py`) that has none yet, made now, with
    progress: the user asked for that version. One outside its plugin's releases is left to its
    runs, `unsupported`."""
    from framework_bench.envs import venvs
    from framework_bench.envs.creation import create_backend
    from framework_bench.envs.errors import EnvError
    from framework_bench.plugins import pins, registry

    for name in (n for n in names if pins.SEP in n):
        backend = registry.get(name)
        if backend.outside or venvs.inspect(name, backend.info.env).ready:
            continue
        try:
            create_backend(backend, say=events.env)
        except EnvError as e:
            raise preflight.Refused(f"{name}: its env could not be made: {e}") from None


def _dry(request: Request, machine: Machine | None, reference: str | None) -> Outcome:
    """Every plan, judged as a run would be, and on GPU scenarios what --repeat would cost."""
    from framework_bench.measure.machine import detect

    machine = machine or detect()
    plans = dry_run.plans(request.scenarios, request.backends, request.options, machine, request.gpu)
    costs = {}
    for s in request.scenarios:
        cost = dry_run.trial_cost(s, [d for d in plans if d.scenario == s.name], machine, request.repeat,
                                  request.warmup_rounds, reference=reference, gpu=request.gpu)
        if cost is not None:
            costs[s.name] = cost
    return Outcome(plans=plans, costs=costs)


def _slurm(request: Request, options: RunOptions, store: ResultStore, events: Events) -> Outcome:
    """Each round submitted as one job (refusals stored at once by their round); with `wait`, every
    job waited for and each run stored as its job ends."""
    outcome = Outcome(store=store)

    def planned(name: str, s: Scenario, p: submit.Planned) -> None:
        if p.result is not None:
            outcome.results.append(p.result)
        elif p.submission:
            outcome.submitted.append(p.submission)
        events.planned(name, s, p)

    try:
        submit.submit_all(request.scenarios, request.backends, options, store, repeat=request.repeat,
                          no_reference=request.no_reference, on_scenario=events.scenario_submitted,
                          on_round=events.round_submitted, on_planned=planned, on_kept=events.kept)
    except KeyboardInterrupt:  # while judging, packing or submitting: what was submitted stays recorded
        outcome.interrupted = True
        return outcome
    if not request.wait or not outcome.submitted:
        return outcome
    results, left = collect_jobs(outcome.submitted, lambda sub: store, events, wait=True, poll=request.poll)
    outcome.results += results
    outcome.waited = True
    outcome.submitted, outcome.interrupted = [sub for sub, _ in left], bool(left)
    return outcome


def collect_jobs(subs: list[Submission], store_for: Callable[[Submission], ResultStore], events: Events,
                 wait: bool = False, poll: float = 30.0) -> tuple[list[RunResult], list[tuple[Submission, JobState]]]:
    """Every submitted run whose job has ended, judged in its resumed round and stored in
    `store_for(sub)` (`collect.py`); with `wait`, polled every `poll` seconds until every job has
    ended or Ctrl-C. Returns (the runs stored, the jobs left waiting with their state)."""
    results: list[RunResult] = []

    def collected(r: RunResult, sub: Submission) -> None:
        results.append(r)
        events.collected(r, sub)

    if not wait:
        return results, collect.collect(subs, store_for, collect.scenario_of, collected, events.problem)
    events.jobs_waited(subs)
    left = collect.wait(subs, store_for, poll, collected, events.problem, events.waiting)
    return results, [(sub, JobState(state="waiting")) for sub in left]
