"""`fbench compare` (and `fbench run`, with one backend): the round loop. Every chosen backend on
every chosen scenario, round after round, the reference in each round to judge the others; each
run handed to its life's owner (`framework_bench/run/pipeline.py`) to be judged and stored.

Runs are sequential (they would compete for the same devices). Each finished run is stored once
judged, so Ctrl-C or a crash loses only the run in flight.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from framework_bench.measure import statistics, update
from framework_bench.measure.metrics import RunResult
from framework_bench.measure.statistics import Trial
from framework_bench.plugins import registry as plugins
from framework_bench.run import design, pipeline, readback, referee, sealing, twin
from framework_bench.run.options import RunOptions
from framework_bench.run.reference import judging_reference, reference_backend, absent_reason
from framework_bench.scenario import scenario as scenarios_
from framework_bench.scenario.scenario import Scenario, ScenarioError
from framework_bench.store.results import ResultStore


def expand(patterns: list[str]) -> list[Scenario]:
    """Scenario names, globs over the names in scenarios/ (`tiny_cpu*`), or file paths; in order, no
    repeats. Two different files with one name are refused: their runs would share one name."""
    names = [p.stem for p in scenarios_.scenario_paths()]
    chosen: list[str] = []
    for pattern in patterns:
        if any(ch in pattern for ch in "*?["):
            hits = fnmatch.filter(names, pattern)
            if not hits:
                raise ScenarioError(f"no scenario matches {pattern!r}")
            chosen += hits
        else:
            chosen.append(pattern)
    seen: dict[str, tuple[Path, Scenario]] = {}
    for name in chosen:
        path = scenarios_.source_path(name)
        s = scenarios_.load(name)
        if s.name in seen and seen[s.name][0] != path:
            raise ScenarioError(f"two scenarios named {s.name!r}: {seen[s.name][0]} and {path}; rename one")
        seen.setdefault(s.name, (path, s))
    return sorted((s for _, s in seen.values()), key=lambda s: (s.model.preset or "", s.context_length))


class Interrupted(Exception):
    """Ctrl-C during a compare: the results finished so far are kept."""


class AutoStop(BaseModel):
    """Why `--repeat auto` stopped adding rounds on one scenario."""
    scenario: str
    rounds: int = Field(description="counted rounds run (warm-up rounds not included)")
    precision: float = Field(description="the half-width asked for, in percent")
    widest: float | None = Field(description="the widest interval's half-width then, in percent (inf: one had "
                                             "no interval; None: no trial counted)")

    @property
    def capped(self) -> bool:
        """Stopped by AUTO_MAX_ROUNDS, not by the precision (nor by having nothing to narrow)."""
        return self.widest is not None and self.widest > self.precision


def compare(
    scenarios: list[Scenario],
    backend_names: list[str],
    options: RunOptions | None = None,
    *,
    store: ResultStore | None = None,
    repeat: int | Literal["auto"] = 1,
    warmup_rounds: int | None = None,
    precision: float | None = None,
    no_reference: bool = False,
    on_result: Callable[[RunResult, Scenario], None] = lambda r, s: None,
    on_start: Callable[[str, Scenario], None] = lambda b, s: None,
    on_step: readback.StepCallback = lambda done, total, secs: None,
    on_auto: Callable[[AutoStop], None] = lambda stop: None,
    on_kept: Callable[[Path], None] = lambda path: None,
) -> list[RunResult]:
    """Every backend on every scenario, `repeat` rounds (after `warmup_rounds`, by default
    `design.warmup_default`): each trial a full run with every check, tagged with the compare's id,
    its round (warm-up rounds are 0 and below: stored, never counted) and its place in the round.

    No verdict without a reference: the reference backend runs in every round, added when not
    chosen, in its place of the round's order (`design.trial_orders`: last in the first round,
    rotated with the others after), and each other run of the round is judged against it once
    the round's runs have ended (`referee.judge`); until then a reference that ran before others
    is held off the disk (`sealing`). `no_reference` leaves them `unverified`. Each run is then
    kept (`pipeline.keep`: stored in `store`, or in a file `on_kept` hears of when the store
    cannot take it now) and handed to `on_result`: the reference's first, then the round's others.
    Interrupted, the round's finished runs are judged against its reference if it ran (no judging
    reference is started after the interrupt), else kept `unverified`.

    `repeat="auto"`: from AUTO_MIN_ROUNDS rounds on, stop once every pair's 95% interval is within
    ±`precision` percent (`statistics.widest_half_width`), or at AUTO_MAX_ROUNDS, said through
    `on_auto`."""
    found = plugins.backends()
    missing = [b for b in backend_names if b not in found]
    broken = [f"the backend {b!r} is installed but broken: {plugins.load_errors[b]}" for b in missing
              if b in plugins.load_errors]
    if broken:
        raise plugins.UnknownBackend("\n".join(broken))
    if missing:
        raise plugins.UnknownBackend(f"no backend named {', '.join(missing)}; installed: {', '.join(found)}")
    if (repeat == "auto") != (precision is not None):
        raise ValueError("repeat='auto' goes with a precision, and a precision with repeat='auto'")
    first, last = design.round_range(repeat)
    options = options or RunOptions()
    if older := design.older_than_reveal(found, backend_names):
        options = options.model_copy(update={"pinned_seed": True})  # the older workers cannot wait for a reveal
    seed = design.compare_seed(options.seed)
    results: list[RunResult] = []
    reference_name = None if no_reference else reference_backend()
    absent = "--no-reference" if no_reference else absent_reason()
    orders = design.trial_orders(backend_names, reference_name)
    compare_id = design.new_compare_id()
    pending: list[tuple[RunResult, Scenario]] = []  # the round's runs waiting for its end
    held: list[tuple[RunResult, Scenario]] = []  # the round's reference run, once it ended
    sealed: list[sealing.Sealed] = []  # its folder, while runs after it in the round still run
    judging: dict[tuple, RunResult] = {}  # the round's reference runs trained as a run says it trained
    twins: dict[tuple, RunResult] = {}  # the round's fp32 twins (framework_bench/run/twin.py)

    stopped: list[RunResult] = []  # a judging run a Ctrl-C interrupted: the compare ends with its round

    def judging_run(backend: str, trained: Scenario, scheme: str | None, round_options: RunOptions,
                    interrupted: bool, made: dict[tuple, RunResult]) -> RunResult:
        """A run that judges only (not stored, not a trial), made once per round."""
        key = (backend, trained.model_dump_json(), scheme)
        if key not in made:
            if interrupted or stopped:  # nothing new starts after a Ctrl-C
                return RunResult(backend=backend, scenario=trained.name, status="interrupted",
                                 reason="the compare was interrupted before it ran")
            made[key] = pipeline.run_one(backend, trained, round_options.model_copy(
                update={"loss_scheme": scheme, "db": None}))
            if made[key].status == "interrupted":
                stopped.append(made[key])
        return made[key]

    def hand_on(result: RunResult, s: Scenario, reference: RunResult | None, round_options: RunOptions,
                why: str = absent, interrupted: bool = False) -> None:
        if result.backend != reference_name:
            def run_reference(trained: Scenario, scheme: str | None) -> RunResult:
                return judging_run(reference.backend, trained, scheme, round_options, interrupted, {})

            def run_twin(backend: str, trained: Scenario, scheme: str | None) -> RunResult:
                return judging_run(backend, trained, scheme, round_options, interrupted, twins)
            referee.judge(result, judging_reference(result, reference, s, run_reference, judging), s, why, run_twin)
        if kept := pipeline.keep(store, result, s):
            on_kept(kept)
        on_result(result, s)

    def end_round(round_options: RunOptions, why: str = absent, interrupted: bool = False) -> None:
        """The round's runs have ended: its reference's folder back on the disk, the reference
        handed on, then the others judged against it."""
        while sealed:
            sealed.pop().restore()
        reference = held[0][0] if held else None
        while held:
            hand_on(*held.pop(), None, round_options)
        if reference is not None and reference.status in ("ok", "unverified") and not interrupted:
            # every backend's fp32 twin before the reference's: no twin runs beside a reference twin's files
            for result, s in pending:
                if (twin_scenario := twin.twin_of(s)) and result.status in ("ok", "unverified"):
                    judging_run(result.backend, twin_scenario, None, round_options, interrupted, twins)
        while pending:
            hand_on(*pending.pop(0), reference, round_options, why, interrupted)
        twins.clear()

    try:
        for s in scenarios:
            warm = design.warmup_default(first, s) if warmup_rounds is None else warmup_rounds
            trials: list[RunResult] = []  # this scenario's, for the auto stop
            for i, round_ in enumerate(range(1 - warm, last + 1)):
                # A projection vector of the round's own: a run cannot pass with an earlier round's
                # reference projection, read from its folder (framework_bench/measure/update.py).
                round_options = options.model_copy(update={"projection_round": update.new_round(),
                                                           "seed": design.round_seed(seed, i)})
                order = orders[i % len(orders)]
                for position, name in enumerate(order, 1):
                    on_start(name, s)
                    # run_one packs only when the backend can run the scenario; the packed data is
                    # cached by its inputs, so every trial reads the very same files.
                    result = pipeline.run_one(name, s, round_options, on_step=on_step)
                    result.compare_id, result.trial_round, result.trial_position = compare_id, round_, position
                    if options.seed is not None:
                        result.notes.append(design.PINNED_SEED_NOTE)
                    elif older:
                        result.notes.append(design.older_plugin_note(older))
                    results.append(result)
                    trials.append(result)
                    if name == reference_name:
                        held.append((result, s))
                        if position < len(order) and result.run_dir is not None and result.run_dir.is_dir():
                            sealed.append(sealing.seal(result.run_dir))  # out of reach of the runs after it
                    elif reference_name is None:
                        hand_on(result, s, None, round_options)
                    else:
                        pending.append((result, s))
                    if result.status == "interrupted":
                        raise Interrupted(results)
                end_round(round_options)
                if stopped:  # Ctrl-C while a run judged the round's others: they are kept, nothing more runs
                    raise Interrupted(results)
                if precision is not None and round_ >= first:
                    widest = statistics.widest_half_width(
                        [Trial.from_record(r.model_dump(mode="json")) for r in trials], reference_name)
                    if widest is None or widest <= precision or round_ == last:
                        on_auto(AutoStop(scenario=s.name, rounds=round_, precision=precision, widest=widest))
                        break
    finally:  # stopped inside a round: its finished runs are stored, judged if its reference ran
        end_round(options, f"the round stopped before the reference {reference_name} ran", interrupted=True)
    return results
