"""Verdicts in words, from the statistics over trials (framework_bench/measure/statistics.py).

"xtuner is 4.1% faster than llamafactory (95% CI 2.0 to 6.3%, paired over 5 rounds)" only when
the whole interval is on one side of 0; otherwise "no difference detected"; from a single trial,
"1 trial: no interval", never a bare percentage; once, how many comparisons share the family-wise
95%; and each disturbed round. The table cells that show an interval are
written here too, and `Points` makes the trials of each point (backend x scenario) one row, so
a table, the report, the charts and the terminal say the same thing.
"""

from __future__ import annotations

import json
from collections import defaultdict

from framework_bench.measure import machine_load, statistics
from framework_bench.measure.statistics import Ratio, Summary, Trial
from framework_bench.run.compare import AutoStop


def definition(scenario_json: dict) -> str:
    """A scenario's stored definition as one comparable string."""
    return json.dumps(scenario_json, sort_keys=True)


MINUS = "\u2212"  # a typographic minus: "−1.8" reads as a number, "-1.8" as a dash


def _signed(x: float) -> str:
    return f"{x:+.1f}".replace("-", MINUS)


# An interval's end beyond ten times says only that the trials cannot tell: over two rounds under
# load a paired interval ran to +53,958,362,970,365,968%, a figure as useless as it is wide.
SHOWN_UP_TO = 10.0


def _upper(pct: float, signed: bool) -> str:
    """An interval's upper end in percent, or `above +900.0` past `SHOWN_UP_TO`."""
    cap = (SHOWN_UP_TO - 1) * 100
    text = _signed(min(pct, cap)) if signed else f"{min(pct, cap):.1f}"
    return f"above {text}" if pct > cap else text


def _trials(r: Ratio) -> str:
    a, b = r.trials
    if r.paired:
        return f"paired over {r.rounds} rounds" + ("" if a == b == r.rounds else f"; {a} and {b} trials")
    return f"{a} trials each" if a == b else f"{a} and {b} trials"


def word(r: Ratio) -> str:
    """One pair's verdict as data: `faster`, `slower`, `no difference` (the interval holds 1), or
    `no interval` (a side with fewer than two counted trials)."""
    if r.low is None:
        return "no interval"
    return "faster" if r.low > 1 else "slower" if r.high < 1 else "no difference"


def _worded(r: Ratio, than: str, alike: str) -> str:
    """`r.backend` faster or slower `than` the other side, with its interval; else `alike`."""
    pct, low, high = ((x - 1) * 100 for x in (r.ratio, r.low, r.high))
    if low > 0:
        return f"{r.backend} is {pct:.1f}% faster {than} (95% CI {low:.1f} to {_upper(high, False)}%, {_trials(r)})"
    if high < 0:
        return f"{r.backend} is {-pct:.1f}% slower {than} (95% CI {-high:.1f} to {-low:.1f}%, {_trials(r)})"
    return f"{alike} (95% CI {_signed(low)} to {_upper(high, True)}%, {_trials(r)})"


def sentence(r: Ratio) -> str:
    """One pair's verdict: `r.backend` against `r.other`."""
    if r.low is None:
        return f"{r.backend} vs {r.other}: 1 trial: no interval"
    return _worded(r, f"than {r.other}", f"no difference detected between {r.backend} and {r.other}")


def between_sentence(r: Ratio) -> str:
    """One backend's verdict between two compares (`statistics.between`): the later over the earlier."""
    if r.low is None:
        return f"{r.backend}: fewer than 2 trials in a compare: no interval (later / earlier {_signed((r.ratio - 1) * 100)}%)"
    return _worded(r, "in the later compare", f"no difference detected for {r.backend}")


def family(pairs: list[Ratio]) -> list[str]:
    """The line, said once, that the pairs with an interval are one family (from two of them)."""
    m = sum(p.low is not None for p in pairs)
    if m < 2:
        return []
    return [f"{m} comparisons, family-wise {statistics.CONFIDENCE:.0%} (Holm): each interval is widened to the "
            f"level its comparison was tested at, so a difference is said only where Holm finds one"]


def verdicts(trials: list[statistics.Trial], pairs: list[Ratio]) -> list[str]:
    """Per scenario, each pair's sentence (`pairs`: the trials' ratios, adjusted with their family),
    then each backend's noise and left-out trials (a run refused as unsupported trained nothing:
    its refusal says so, not this), then each round slowed as a whole and what became of it."""
    summaries = statistics.summarise(trials)
    out = []
    for r in pairs:
        out.append(f"{r.scenario}: {sentence(r)}")
    for (scenario, backend), s in sorted(summaries.items()):
        if s.noisy:
            out.append(f"{scenario}: {backend} is noisy: trial-to-trial CV {s.cv:.1%}; about {s.trials_for_target} "
                       f"trials would narrow its interval to ±{statistics.TARGET_HALF_WIDTH:.0%}")
        if excluded := [why for why in s.excluded if not why.endswith("(unsupported)")]:
            out.append(f"{scenario}: {backend}: {len(excluded)} trial(s) not counted: {'; '.join(excluded)}")
    for d in statistics.slowed_rounds(trials):
        out.append(f"{d.scenario}: round {d.round} of compare {d.compare_id} was slowed as a whole (outside load?): every run "
                   f"in it {min(d.drops):.0%} to {max(d.drops):.0%} below its backend's median; kept: a paired "
                   f"ratio cancels what the whole round shared")
    return out


def auto_stop_sentence(stop: AutoStop, uncounted: list[str] = ()) -> str:
    """Why `--repeat auto` stopped on a scenario: the precision reached, or the cap; `uncounted`,
    the scenario's backends none of whose trials counted, are named: they are in no interval."""
    asked = f"±{stop.precision:g}%"
    none = f"no trial of {' or '.join(uncounted)} counted" if uncounted else "no trial counted"
    if stop.out_of_budget:
        spent = f"its share of --budget ({_duration(stop.budget_s)}) spent after {stop.rounds} rounds"
        if stop.widest is not None and stop.widest <= stop.precision:
            return f"{stop.scenario}: every 95% interval within {asked} (widest ±{stop.widest:.1f}%), {spent}"
        where = (none if stop.widest is None else "one pair still has no interval" if stop.widest == float("inf")
                 else f"the widest 95% interval is ±{stop.widest:.1f}%")
        return f"{stop.scenario}: not settled within the budget: {spent}; {where}, not within {asked}"
    if stop.widest is None:
        return f"{stop.scenario}: --repeat auto stopped after {stop.rounds} rounds: {none}, no interval to narrow"
    also = f"; {none}: it has no interval" if uncounted else ""
    if stop.capped:
        widest = "one pair still has no interval" if stop.widest == float("inf") else \
            f"the widest 95% interval is ±{stop.widest:.1f}%"
        return (f"{stop.scenario}: --repeat auto stopped at its cap of {stop.rounds} rounds: {widest}, "
                f"not within {asked}{also}")
    return (f"{stop.scenario}: every 95% interval within {asked} after {stop.rounds} rounds "
            f"(widest ±{stop.widest:.1f}%){also}")


def _duration(seconds: float | None) -> str:
    """Seconds as a budget reads: 4 min 30 s, 45 s."""
    if seconds is None:
        return "-"
    minutes, rest = divmod(max(round(seconds), 0), 60)
    return f"{minutes} min {rest} s" if minutes else f"{rest} s"


def tgs_cell(s: Summary | None) -> str:
    """The median TGS and, from two trials, its interval: `2,506.6 (2,480.1–2,530.2)`."""
    if s is None or s.median is None:
        return "-"
    if s.low is None:
        return f"{s.median:,.1f}"
    return f"{s.median:,.1f} ({s.low:,.1f}–{s.high:,.1f})"


def share_cell(r: Ratio | None) -> str:
    """TGS as % of the other backend's and, from two trials each, its interval: `97% (95–99%)`."""
    if r is None:
        return "-"
    if r.low is None:
        return f"{r.ratio * 100:.0f}%"
    high = f">{SHOWN_UP_TO * 100:.0f}" if r.high > SHOWN_UP_TO else f"{r.high * 100:.0f}"
    return f"{r.ratio * 100:.0f}% ({r.low * 100:.0f}–{high}%)"


def noise_note(s: Summary | None) -> list[str]:
    """A table row's note when its backend's trials are noisy."""
    if s is None or not s.noisy:
        return []
    return [f"noisy: CV {s.cv:.1%} over {s.trials} trials; ~{s.trials_for_target} for ±"
            f"{statistics.TARGET_HALF_WIDTH:.0%}"]


# The figures that scale with TGS on one scenario (the FLOPs per token are the scenario's).
_WITH_TGS = ("tflops", "model_tflops", "mfu")


def where(record: dict) -> str:
    """' in round N' for a trial of a compare's round, '' for a run on its own."""
    return f" in round {record['trial_round']}" if record.get("trial_round") is not None else ""


def apart(faster: dict, slower: dict) -> bool:
    """Whether one trial of each ranks the two rows: the faster run's slowest measured step is
    faster than every step of the slower one (its step spread wider than the gap says no; a
    disturbed run ranks nothing, which `answers` says)."""
    low, high = faster.get("tgs_min"), slower.get("tgs_max")
    return low is not None and high is not None and low > high


def spread(row: dict) -> str:
    """A row's TGS over its measured steps, slowest to fastest."""
    if row.get("tgs_min") is None:
        return "steps not recorded"
    return f"{row['tgs_min']:,.0f}-{row['tgs_max']:,.0f}"


class Points:
    """Runs (store rows or `RunResult` dumps, oldest first) as the trials of their points: `rows`,
    one per backend x scenario in the order they first appear, its figures at the median over
    the counted trials (TGS min–max over all their steps; `trials` and, from two, `tgs_low` and
    `tgs_high`, the median's interval); `shares` each framework's `Ratio` to the reference;
    `lines` the verdict sentences (`with_intervals`: less the pairs with no interval, which a
    compare's answer says once). Runs of a scenario stored under two definitions (the file
    edited between them) are never paired."""

    def __init__(self, runs: list[dict], reference: str | None):
        self.runs, self.reference = runs, reference
        # the points with a run on a busy machine (`machine_load`): marked, and ranked by no answer
        self.disturbed_runs = [r for r in runs if machine_load.disturbed(r)]
        self.disturbed = {(r["scenario"], r["backend"]) for r in self.disturbed_runs}
        groups: dict[str, list[dict]] = defaultdict(list)
        for r in runs:  # a compare's results carry no definition: they ran one
            groups[definition(r["scenario_json"]) if "scenario_json" in r else ""].append(r)
        self.summaries: dict[tuple[str, str], Summary] = {}
        self.shares: dict[tuple[str, str], Ratio] = {}
        self.pairs: list[Ratio] = []
        self.lines: list[str] = []
        trials_of = [[Trial.from_record(r) for r in group] for group in groups.values()]
        found = [statistics.estimates(trials, reference) for trials in trials_of]
        adjusted = iter(statistics.holm([e for es in found for e in es]))  # one family: every group's pairs
        for trials, es in zip(trials_of, found):
            self.summaries |= statistics.summarise(trials)
            pairs = [next(adjusted) for _ in es]
            self.pairs += pairs
            self.shares |= {(p.scenario, p.backend): p for p in pairs if p.other == reference}
            # the reference is 100% of itself, exactly: no interval
            self.shares |= {key: Ratio(key[0], reference, reference, (s.trials, s.trials), 1.0)
                            for key, s in self.summaries.items() if key[1] == reference and s.trials}
            self.lines += verdicts(trials, pairs)
        self.lines += [f"{r['scenario']}: {r['backend']}'s run{where(r)} was {machine_load.said(r)}"
                       for r in self.disturbed_runs]
        self.lines[:0] = family(self.pairs)
        unpaired = {f"{p.scenario}: {sentence(p)}" for p in self.pairs if p.low is None}
        self.with_intervals = [line for line in self.lines if line not in unpaired]
        newest = {(r["scenario"], r["backend"]): r for r in runs}
        for scenario, backend in newest:  # runs of warm-up rounds alone (a compare stopped in its first): no trial
            self.summaries.setdefault((scenario, backend), Summary(backend, scenario, 0, None))
        self.rows = [self._at_median(r, [t for t in runs if (t["scenario"], t["backend"]) == key])
                     for key, r in newest.items()]

    def _at_median(self, newest: dict, trials: list[dict]) -> dict:
        s = self.summaries[newest["scenario"], newest["backend"]]
        counted = [t for t in trials if Trial.from_record(t).counts]
        if not counted:
            return {**newest, "trials": 0}
        r = dict(counted[-1])
        scale = s.median / r["tgs"]
        r.update({k: r[k] * scale for k in _WITH_TGS if r.get(k) is not None}, tgs=s.median, trials=s.trials,
                 tgs_low=s.low, tgs_high=s.high)
        spread = [t for t in counted if t.get("tgs_min") is not None]
        if spread:
            r.update(tgs_min=min(t["tgs_min"] for t in spread), tgs_max=max(t["tgs_max"] for t in spread))
        return r

    def data(self) -> dict:
        """The verdicts as data (`--json`): per backend x scenario its summary over the counted
        trials and the trials left out with why; per pair its ratio, 95% interval and verdict word."""
        return {
            "summaries": [{"scenario": s.scenario, "backend": s.backend, "trials": s.trials, "median_tgs": s.median,
                           "low": s.low, "high": s.high, "cv": s.cv, "excluded": list(s.excluded)}
                          for s in self.summaries.values()],
            "pairs": [{"scenario": p.scenario, "backend": p.backend, "other": p.other, "trials": list(p.trials),
                       "ratio": p.ratio, "low": p.low, "high": p.high, "level": p.level, "paired": p.paired,
                       "rounds": p.rounds, "verdict": word(p), "sentence": sentence(p)}
                      for p in self.pairs],
            "verdicts": self.lines,
        }

    def answers(self) -> list[str]:
        """Per scenario, the answer a compare exists to give: the fastest framework (the reference
        aside) and by how much over the next, how sure (its interval, Holm-adjusted as the verdicts
        are), and its share of the reference; then, once, how to get an interval where a pair has
        none. First, where runs were disturbed, how many and what to do; no disturbed run is
        ranked on one trial, nor its reference's share quoted."""
        out, without = [], False
        rows = {(r["scenario"], r["backend"]): r for r in self.rows}
        shaken = self.disturbed
        if shaken:
            out.append(f"{len(self.disturbed_runs)} of {len(self.runs)} runs ran on a busy machine (other processes kept over "
                       f"{machine_load.DISTURBED_SHARE:.0%} of its CPUs busy during their measured steps): their "
                       "figures are the machine's as much as the frameworks'; rerun on a quiet machine, or "
                       "--repeat 3 or more, whose rounds name the disturbed runs")
        for scenario in dict.fromkeys(sc for sc, _ in self.summaries):
            ranked = sorted((s for (sc, b), s in self.summaries.items()
                             if sc == scenario and b != self.reference and s.median is not None), key=lambda s: -s.median)
            if not ranked:
                continue
            best = ranked[0]
            share = self.shares.get((scenario, best.backend))
            of_reference = f"; {share_cell(share)} of {self.reference}" if share and self.reference else ""
            if of_reference and (scenario, self.reference) in shaken:  # no share a reader would quote
                of_reference = f"; {self.reference}'s run disturbed: no share of it"
            if len(ranked) == 1:
                out.append(f"{scenario}: {best.backend} alone counted{of_reference}")
                continue
            pair = self._pair(scenario, best.backend, ranked[1].backend)
            if pair is None or pair.low is None:
                without = True
                ahead = (best.median / ranked[1].median - 1) * 100
                faster, slower = rows[scenario, best.backend], rows[scenario, ranked[1].backend]
                if {(scenario, best.backend), (scenario, ranked[1].backend)} & shaken:
                    out.append(f"{scenario}: {best.backend} {ahead:.1f}% above {ranked[1].backend} on one trial each, "
                               f"a run of them disturbed: one trial on a busy machine cannot rank them{of_reference}")
                elif apart(faster, slower):
                    out.append(f"{scenario}: {best.backend} fastest, {ahead:.1f}% above {ranked[1].backend} on one trial "
                               f"each, beyond their steps' spread: no interval{of_reference}")
                else:
                    out.append(f"{scenario}: {best.backend} {ahead:.1f}% above {ranked[1].backend} on one trial each, "
                               f"inside their steps' spread (TGS {spread(faster)}, {spread(slower)}): one trial "
                               f"cannot rank them{of_reference}")
            else:
                on_busy = {(scenario, best.backend), (scenario, ranked[1].backend)} & shaken
                out.append(f"{scenario}: " + _worded(pair, f"than {pair.other}",
                                                     f"no difference detected between {pair.backend} and {pair.other}")
                           + of_reference + ("; resting on disturbed trials" if on_busy else ""))
        if without:
            out.append("one trial per backend gives no interval: --repeat 3 or more gives each pair a 95% interval")
        return out

    def _pair(self, scenario: str, backend: str, other: str) -> Ratio | None:
        """The pair's ratio `backend` over `other`, inverted where the statistics made it the other way."""
        for p in self.pairs:
            if p.scenario != scenario:
                continue
            if (p.backend, p.other) == (backend, other):
                return p
            if (p.backend, p.other) == (other, backend):
                return Ratio(scenario, backend, other, p.trials[::-1], 1 / p.ratio,
                             None if p.high is None else 1 / p.high, None if p.low is None else 1 / p.low,
                             p.paired, p.rounds, p.level)
        return None

    def slower_than(self, percent: float) -> list[Ratio]:
        """Each pair against the reference whose verdict is `slower` by more than `percent`."""
        return [p for p in self.pairs if p.other == self.reference and word(p) == "slower"
                and (1 - p.ratio) * 100 > percent]

