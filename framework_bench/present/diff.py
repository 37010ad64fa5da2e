"""`fbench diff`: two stored compares side by side ("did the upgrade slow us down?"). Per backend
and scenario run in both: the later compare's TGS over the earlier's, with its interval and
verdict (`statistics.between`); what changed between their runs (the framework's version, the
settings in effect); and where their loss curves part, where runs of both started from one seed.
A scenario whose definition changed between them is not compared: its TGS measures another run.
"""

from __future__ import annotations

from collections import defaultdict
from itertools import combinations

from framework_bench.measure import statistics
from framework_bench.measure.losses import PARITY_TOLERANCE, relative_difference
from framework_bench.measure.statistics import Ratio, Trial
from framework_bench.plugins.pins import plugin_name
from framework_bench.present.verdict import between_sentence, definition, family, word

def compares(rows: list[dict]) -> dict[str, list[dict]]:
    """Stored runs by their compare's id, the oldest compare first (a run outside any compare: none)."""
    out: dict[str, list[dict]] = defaultdict(list)
    for r in sorted(rows, key=lambda r: r["id"]):
        if r.get("compare_id"):
            out[r["compare_id"]].append(r)
    return dict(out)


def pick(found: dict[str, list[dict]], wanted: str) -> str:
    """The compare id `wanted` names: whole, or a start of it that only one id has."""
    if wanted in found:
        return wanted
    matches = [c for c in found if c.startswith(wanted)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise ValueError(f"{wanted!r} starts {len(matches)} compares' ids: {', '.join(matches[-5:])}; give more of it")
    newest = ", ".join(list(found)[-5:]) or "none"
    raise ValueError(f"no compare {wanted!r} in the store (the newest: {newest})")


def chosen(found: dict[str, list[dict]], before: str | None, after: str | None, scenario: str | None) -> tuple[str, str]:
    """The two compares `fbench diff` sets side by side: the ones named (whole ids or starts of
    them), else the newest two (both named or neither); ValueError saying why there are not two."""
    if before is None:
        if len(found) < 2:
            raise ValueError(f"{len(found)} stored compare(s)" + (f" ran {scenario}" if scenario else "")
                             + ": diff needs two (run `fbench compare` again)")
        return list(found)[-2], list(found)[-1]
    before, after = pick(found, before), pick(found, after)
    if before == after:  # its trials against themselves: an interval that says nothing
        raise ValueError(f"both ids name the compare {before}: diff compares one against another, not itself")
    return before, after


def _changes(old: dict, new: dict) -> list[str]:
    """What differs between two runs of one point: framework version, settings in effect."""
    out = []
    if old.get("framework_version") != new.get("framework_version"):
        out.append(f"framework version {old.get('framework_version')} -> {new.get('framework_version')}")
    before, after = old.get("settings") or {}, new.get("settings") or {}
    for key in sorted(before.keys() | after.keys()):
        if before.get(key) != after.get(key):
            out.append(f"{key} {before.get(key)} -> {after.get(key)}")
    return out


def losses_part(old_runs: list[dict], new_runs: list[dict], precision: str) -> str:
    """Where the canonical loss curves part (relative difference over the parity tolerance of
    the scenario's precision), between the first runs of the two compares that started from one
    seed (a round of each, under one pinned `--seed`)."""
    pair = next(((old, new) for old in old_runs for new in new_runs
                 if old.get("seed") is not None and old.get("seed") == new.get("seed")), None)
    if pair is None:
        return "no run of one compare started from a seed of the other's: loss curves not compared"
    old, new = pair
    a, b = ({int(k): v for k, v in (r.get("loss_curve") or {}).items()} for r in (old, new))
    steps = sorted(a.keys() & b.keys())
    if not steps:
        return "no loss curve in both: not compared"
    tolerance = PARITY_TOLERANCE[precision]
    for step in steps:
        if a[step] is None or b[step] is None or relative_difference(a[step], b[step]) > tolerance:
            return f"loss curves part at step {step}: {a[step]} vs {b[step]} (seed {new['seed']})"
    return f"loss curves agree over {len(steps)} steps (seed {new['seed']}, within {tolerance:g})"


def version_losses(records: list[dict], scenarios: dict) -> list[str]:
    """Per scenario, each two backends of one plugin in a compare (`trl`, `trl@transformers==5.23.0`:
    `plugins/pins.py`): where their loss curves part, their runs of one round starting from one
    seed (`scenarios`: the compare's, by name)."""
    runs: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        runs[r["scenario"]][r["backend"]].append(r)
    return [f"{scenario}: {a} and {b}: {losses_part(by[a], by[b], scenarios[scenario].precision)}"
            for scenario, by in sorted(runs.items()) for a, b in combinations(sorted(by), 2)
            if plugin_name(a) == plugin_name(b)]


class Diff:
    """Compare `after` against compare `before` (their stored runs)."""

    def __init__(self, before: str, before_runs: list[dict], after: str, after_runs: list[dict]):
        self.before, self.after = before, after
        newest = [{(r["scenario"], r["backend"]): r for r in runs} for runs in (before_runs, after_runs)]
        points = sorted(newest[0].keys() & newest[1].keys())
        self.redefined = [p for p in points if definition(newest[0][p]["scenario_json"]) != definition(newest[1][p]["scenario_json"])]
        self.only = {name: sorted(set(mine) - set(other)) for name, mine, other in
                     ((before, newest[0], newest[1]), (after, newest[1], newest[0]))}
        kept = [p for p in points if p not in self.redefined]
        trials = [[Trial.from_record(r) for r in runs if (r["scenario"], r["backend"]) in kept]
                  for runs in (before_runs, after_runs)]
        self.pairs: list[Ratio] = statistics.between(*trials)
        self.changes = {p: _changes(newest[0][p], newest[1][p]) for p in kept}
        self.losses = {p: losses_part(*([r for r in runs if (r["scenario"], r["backend"]) == p]
                                        for runs in (before_runs, after_runs)),
                                      newest[1][p]["scenario_json"].get("precision", "bf16")) for p in kept}

    def lines(self) -> list[str]:
        """Each pair's verdict, then per point what changed and the loss curves; then what was not compared."""
        out = family(self.pairs)
        for r in self.pairs:
            out.append(f"{r.scenario}: {between_sentence(r)}")
        for (scenario, backend), changes in self.changes.items():
            said = "; ".join(changes) if changes else "no change in version or settings"
            out.append(f"{scenario}: {backend}: {said}; {self.losses[scenario, backend]}")
        for scenario, backend in self.redefined:
            out.append(f"{scenario}: {backend}: not compared: the scenario's definition changed between the compares")
        for name, points in self.only.items():
            if points:
                out.append(f"only in {name}: " + ", ".join(f"{b} on {s}" for s, b in points))
        return out

    def data(self) -> dict:
        """The diff as data (`--json`)."""
        return {
            "before": self.before, "after": self.after,
            "pairs": [{"scenario": r.scenario, "backend": r.backend, "trials": list(r.trials), "ratio": r.ratio,
                       "low": r.low, "high": r.high, "level": r.level, "verdict": word(r),
                       "sentence": between_sentence(r)} for r in self.pairs],
            "points": [{"scenario": s, "backend": b, "changes": c, "losses": self.losses[s, b]}
                       for (s, b), c in self.changes.items()],
            "redefined": [{"scenario": s, "backend": b} for s, b in self.redefined],
            "only": {name: [{"scenario": s, "backend": b} for s, b in points] for name, points in self.only.items()},
            "verdicts": self.lines(),
        }

    def slower_than(self, percent: float) -> list[Ratio]:
        """Each pair whose verdict is `slower` in the later compare by more than `percent`."""
        return [r for r in self.pairs if word(r) == "slower" and (1 - r.ratio) * 100 > percent]
