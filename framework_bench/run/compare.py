"""`fbench compare` (and `fbench run`, with one backend): the round loop. Every chosen backend on
every chosen scenario, round after round, each round a `Round` (`round.py`) that runs them beside
the reference, judges and stores them.

Runs are sequential (they would compete for the same devices). Each finished run is stored once
judged, so Ctrl-C or a crash loses only the run in flight.
"""

from __future__ import annotations

import fnmatch
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from framework_bench.measure import statistics, update
from framework_bench.measure.metrics import RunResult
from framework_bench.measure.statistics import Trial
from framework_bench.plugins import registry as plugins
from framework_bench.run import design, readback
from framework_bench.run.options import RunOptions
from framework_bench.run.reference import absent_reason, reference_backend
from framework_bench.run.round import Round
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
    budget_s: float | None = Field(None, description="with a budget: the seconds this scenario had of it")
    out_of_budget: bool = Field(False, description="stopped because its next round would have ended past the budget")

    @property
    def capped(self) -> bool:
        """Stopped by AUTO_MAX_ROUNDS, not by the precision (nor by having nothing to narrow, nor by
        the budget)."""
        return self.widest is not None and self.widest > self.precision and not self.out_of_budget


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
    budget_s: float | None = None,
) -> list[RunResult]:
    """Every backend on every scenario, `repeat` rounds (after `warmup_rounds`, by default
    `design.warmup_default`): each trial a full run with every check, tagged with the compare's id,
    its round (warm-up rounds are 0 and below: stored, never counted) and its place in the round.

    Each round is a `Round` (`round.py`): the reference backend runs in every round, added when not
    chosen, in its place of the round's order (`design.trial_orders`: last in the first round,
    rotated with the others after), and each other run of the round is judged against it once
    the round's runs have ended; `no_reference` leaves them `unverified`. Each run is then stored
    in `store` (or in a file `on_kept` hears of when the store cannot take it now) and handed to
    `on_result`: the reference's first, then the round's others. Interrupted, the round's finished
    runs are judged against its reference if it ran (no judging run is started after the
    interrupt), else kept `unverified`.

    `repeat="auto"`: from AUTO_MIN_ROUNDS rounds on, stop once every pair's 95% interval is within
    ±`precision` percent (`statistics.widest_half_width`), or at AUTO_MAX_ROUNDS, said through
    `on_auto`; with `budget_s`, each scenario has an equal share of what is left of it when its
    rounds begin, and no round starts that would end past its share by the longest round so far
    (its first round always runs)."""
    found = plugins.backends(pinned=backend_names)
    missing = [b for b in backend_names if b not in found]
    broken = [f"the backend {b!r} is installed but broken: {plugins.load_errors[b]}" for b in missing
              if b in plugins.load_errors]
    if broken:
        raise plugins.UnknownBackend("\n".join(broken))
    if missing:
        raise plugins.UnknownBackend(f"no backend named {', '.join(missing)}; installed: {', '.join(found)}")
    if (repeat == "auto") != (precision is not None):
        raise ValueError("repeat='auto' goes with a precision, and a precision with repeat='auto'")
    if budget_s is not None and repeat != "auto":
        raise ValueError("a budget goes with repeat='auto'")
    began = time.monotonic()
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
    round_: Round | None = None
    try:
        for k, s in enumerate(scenarios):
            warm = design.warmup_default(first, s) if warmup_rounds is None else warmup_rounds
            trials: list[RunResult] = []  # this scenario's, for the auto stop
            share = None if budget_s is None else (budget_s - (time.monotonic() - began)) / (len(scenarios) - k)
            started, longest = time.monotonic(), 0.0
            for i, number in enumerate(range(1 - warm, last + 1)):
                if share is not None and i and time.monotonic() - started + longest > share:
                    on_auto(AutoStop(scenario=s.name, rounds=max(number - 1, 0), precision=precision,
                                     widest=_widest(trials, reference_name), budget_s=share, out_of_budget=True))
                    break
                round_began = time.monotonic()
                # A projection vector of the round's own: a run cannot pass with an earlier round's
                # reference projection, read from its folder (framework_bench/measure/update.py).
                round_options = options.model_copy(update={"projection_round": update.new_round(),
                                                           "seed": design.round_seed(seed, i)})
                order = orders[i % len(orders)]
                round_ = Round(s, round_options, reference=reference_name, absent=absent, order=order, store=store,
                               compare_id=compare_id, number=number, on_kept=on_kept, on_result=on_result)
                for name in order:
                    on_start(name, s)
                    # run_one packs only when the backend can run the scenario; the packed data is
                    # cached by its inputs, so every trial reads the very same files.
                    result = round_.run(name, on_step=on_step)
                    if options.seed is not None:
                        result.notes.append(design.PINNED_SEED_NOTE)
                    elif older:
                        result.notes.append(design.older_plugin_note(older))
                    results.append(result)
                    trials.append(result)
                    if result.status == "interrupted":
                        raise Interrupted(results)
                done, round_ = round_, None
                done.close()
                if done.stopped:  # Ctrl-C while a run judged the round's others: they are kept, nothing more runs
                    raise Interrupted(results)
                longest = max(longest, time.monotonic() - round_began)
                if precision is not None and number >= first:
                    widest = _widest(trials, reference_name)
                    if widest is None or widest <= precision or number == last:
                        on_auto(AutoStop(scenario=s.name, rounds=number, precision=precision, widest=widest))
                        break
    finally:  # stopped inside a round: its finished runs are stored, judged if its reference ran
        if round_ is not None:
            round_.close(interrupted=True, why=f"the round stopped before the reference {reference_name} ran")
    return results


def _widest(trials: list[RunResult], reference: str | None) -> float | None:
    return statistics.widest_half_width([Trial.from_record(r.model_dump(mode="json")) for r in trials], reference)
