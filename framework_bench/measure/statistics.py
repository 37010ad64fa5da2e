"""How sure a comparison is: TGS over repeated trials, with 95% confidence intervals.

The one place a figure's uncertainty is computed (a run's own TGS is `metrics.figures`). Per
backend and scenario: the median TGS over the trials and its 95% interval (a percentile
bootstrap), the trial-to-trial coefficient of variation, "noisy" above 5%, and how many trials
would narrow the interval to ±2%.

Per pair of backends on one scenario, a ratio of TGS and its interval. Paired where both sides
have counted trials in two or more of the same rounds (a compare's round runs every backend once,
on one machine state): from the per-round ratios, so a burst of outside load that slows a whole
round cancels (`_paired`). Otherwise (trials of different compares) unpaired: the ratio of the
medians, each side resampled on its own. The pairs of one verdict set are then one family:
Holm's step-down over all of them (`holm`), so that an A/A compare of many pairs rarely says any
"difference". A round that slowed every run in it is named (`slowed_rounds`), never dropped.

Bootstraps are written with numpy (a host dependency already) in a few lines rather than with
`scipy.stats.bootstrap`: scipy is not in the host venv (the package lists have it only as
wheels), and it would add a large compiled dependency to every install for a few short
functions; so are Student's t quantiles. The generator is seeded per interval, so the same
trials give the same interval on every machine and whatever else was computed before.

A verdict wants 5 trials a side (the simulated false-alarm rates and power: docs/calibration.md).

Trials whose run did not end `ok` do not count: they are named, with their status, in
`Summary.excluded`. One rule decides, everywhere a trial is shown: a check that can drop a trial
is blocking and makes the run `invalid`; a flag (a non-blocking check that failed) is shown
beside the run and never drops it. Warm-up rounds' trials (round 0 and below) do not count either.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from itertools import combinations

import numpy as np

CONFIDENCE = 0.95
NOISY_CV = 0.05  # trial-to-trial coefficient of variation above which a backend's figure is "noisy"
TARGET_HALF_WIDTH = 0.02  # the ±2% a noisy row says how many trials would reach
RESAMPLES = 10_000
SEED = 20_261_201  # fixed: an interval depends only on its trials
_Z = 1.959963984540054  # the normal quantile of a two-sided 95% interval
# The variance of a sample median is about pi/2 times the mean's (normal data): the trials a
# median's interval needs are that many more than a mean's.
_MEDIAN_EFFICIENCY = math.pi / 2
# A slowed round: every counted run in it below its backend's median by more than this many
# robust standard deviations (1.4826 MAD) of that backend's trials, and by more than NOISY_CV (a
# drop an ordinary trial can show) where the MAD is tiny.
SLOWED_MADS = 3.0
_MAD_TO_SD = 1.4826

Round = tuple[str, int]  # (compare_id, trial_round): runs that shared one machine state


@dataclass(frozen=True)
class Trial:
    """One run of a backend on a scenario, as the statistics need it. `label` names it when
    it is left out ("run 12, round 2"); `round` is its compare's round, None for a run alone."""
    backend: str
    scenario: str
    tgs: float | None
    status: str
    label: str
    warmup: bool = False  # a warm-up round's: neither counted nor named
    round: Round | None = None

    @property
    def counts(self) -> bool:
        return self.status == "ok" and self.tgs is not None and self.tgs > 0 and not self.warmup

    def why_excluded(self) -> str:
        return f"{self.label} ({self.status if self.status != 'ok' else 'no figure'})"

    @classmethod
    def from_record(cls, r: dict) -> "Trial":
        """From a stored row or a `RunResult` dump: its checks are dicts with `name` and `status`."""
        label = f"run {r.get('id', r.get('result_id'))}" + (f", round {r['trial_round']}" if r.get("trial_round") else "")
        in_round = r.get("compare_id") and r.get("trial_round") is not None
        round_ = (r["compare_id"], r["trial_round"]) if in_round else None
        return cls(r["backend"], r["scenario"], r.get("tgs"), r["status"], label,
                   warmup=r.get("trial_round") is not None and r["trial_round"] <= 0, round=round_)


@dataclass(frozen=True)
class Summary:
    """One backend on one scenario over its trials. `low`/`high` (the 95% interval of the median)
    and `cv` need two counted trials; `trials_for_target` is set only when `noisy`."""
    backend: str
    scenario: str
    trials: int
    median: float | None
    low: float | None = None
    high: float | None = None
    cv: float | None = None
    excluded: tuple[str, ...] = field(default=())

    @property
    def noisy(self) -> bool:
        return self.cv is not None and self.cv > NOISY_CV

    @property
    def trials_for_target(self) -> int | None:
        """Trials for a median's interval of ±2%, from the normal approximation; None unless noisy."""
        if not self.noisy:
            return None
        return math.ceil(_MEDIAN_EFFICIENCY * (_Z * self.cv / TARGET_HALF_WIDTH) ** 2)


@dataclass(frozen=True)
class Ratio:
    """`backend`'s TGS over `other`'s on one scenario; `low`/`high` its interval (None when either
    side has fewer than two counted trials) at `level`: 95%, or wider where the family's Holm
    step-down tested the pair at a stricter level. `paired`: the geometric mean of the ratios of
    `rounds` shared rounds; else the ratio of the medians."""
    scenario: str
    backend: str
    other: str
    trials: tuple[int, int]
    ratio: float
    low: float | None = None
    high: float | None = None
    paired: bool = False
    rounds: int = 0
    level: float = CONFIDENCE


@dataclass(frozen=True)
class Estimate:
    """One pair before its family's adjustment: the Ratio at 95%, the p-value of "no difference"
    (None without an interval) and the interval at any level (`p` < 1 - level exactly when it
    leaves 1 out)."""
    ratio: Ratio
    p: float | None = None
    interval: Callable[[float], tuple[float, float]] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class SlowedRound:
    """A round of a compare on one scenario in which every counted run was far below its
    backend's median (outside load, most likely); `drops` each run's shortfall, as a share."""
    scenario: str
    compare_id: str
    round: int
    drops: tuple[float, ...]


def _bootstrap_medians(values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The median of each of RESAMPLES resamples (with replacement) of `values`, sorted first so
    that the order the trials came in does not change the interval."""
    values = np.sort(values)
    picks = rng.integers(0, len(values), size=(RESAMPLES, len(values)))
    return np.median(values[picks], axis=1)


def _percentiles(samples: np.ndarray, level: float = CONFIDENCE) -> tuple[float, float]:
    tail = 100 * (1 - level) / 2
    low, high = np.percentile(samples, [tail, 100 - tail])
    return float(low), float(high)


def summarise(trials: Iterable[Trial]) -> dict[tuple[str, str], Summary]:
    """Per (scenario, backend): the median TGS over counted trials, its interval, CV and exclusions."""
    by_point: dict[tuple[str, str], list[Trial]] = defaultdict(list)
    for t in trials:  # a point whose runs were all warm-up (a compare stopped then) has 0 trials
        points = by_point[t.scenario, t.backend]
        if not t.warmup:
            points.append(t)
    out = {}
    for (scenario, backend), ts in by_point.items():
        values = np.array([t.tgs for t in ts if t.counts], dtype=float)
        excluded = tuple(t.why_excluded() for t in ts if not t.counts)
        if len(values) == 0:
            out[scenario, backend] = Summary(backend, scenario, 0, None, excluded=excluded)
            continue
        median = float(np.median(values))
        if len(values) == 1:
            out[scenario, backend] = Summary(backend, scenario, 1, median, excluded=excluded)
            continue
        low, high = _percentiles(_bootstrap_medians(values, np.random.default_rng(SEED)))
        cv = float(np.std(values, ddof=1) / np.mean(values))
        out[scenario, backend] = Summary(backend, scenario, len(values), median, low, high, cv, excluded)
    return out


def _bootstrap_p(samples: np.ndarray) -> float:
    """The p-value that decides as the percentile interval of sorted `samples` does: the interval
    at `level` leaves 1 out exactly when p < 1 - level (np.percentile's interpolation, inverted)."""
    n = len(samples)

    def quantile(k: int) -> float:  # where the interpolation reaches 1, `k` samples on its left
        if k in (0, n):
            return k / n
        lo, hi = samples[k - 1], samples[k]
        return (k - 1 + (1 - lo) / (hi - lo)) / (n - 1)

    q_low = quantile(int(np.searchsorted(samples, 1.0, "right")))  # the lower bound passes 1 above it
    q_high = quantile(int(np.searchsorted(samples, 1.0, "left")))  # the upper bound reaches 1 from it
    return min(1.0, 2 * min(q_low, 1 - q_high))


def _t_within(theta: float, df: int) -> float:
    """P(|T| <= sqrt(df) tan theta) for Student's t with an integer `df`: the closed forms of
    Abramowitz & Stegun 26.7.3-4."""
    odd, c2, total, term = df % 2, math.cos(theta) ** 2, 0.0, 1.0
    for k in range((df - 1) // 2 if odd else df // 2):
        if k:
            term *= c2 * (2 * k / (2 * k + 1) if odd else (2 * k - 1) / (2 * k))
        total += term
    if odd:
        return 2 / math.pi * (theta + math.sin(theta) * math.cos(theta) * total)
    return math.sin(theta) * total


def _t_quantile(level: float, df: int) -> float:
    """The t with P(|T| <= t) = level, by bisection on the angle."""
    lo, hi = 0.0, math.pi / 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _t_within(mid, df) < level else (lo, mid)
    return math.sqrt(df) * math.tan((lo + hi) / 2)


def _paired(ratios: list[float], key: tuple[str, str, str], trials: tuple[int, int]) -> Estimate:
    """A t-interval on the logs of the per-round ratios: exact for normal log ratios at any number
    of rounds, where a distribution-free interval cannot reach 95% below 6 (a sign test's best at 5
    is 93.8%) and so would never find a difference; a round the load hit unevenly widens it."""
    logs = np.log(ratios)
    n, centre = len(logs), float(np.mean(logs))
    se = float(np.std(logs, ddof=1)) / math.sqrt(n)

    def interval(level: float) -> tuple[float, float]:
        half = _t_quantile(level, n - 1) * se
        return math.exp(centre - half), math.exp(centre + half)

    if se == 0:  # every round gave the same ratio
        p = 1.0 if centre == 0 else 0.0
    else:
        p = 1 - _t_within(math.atan(abs(centre) / se / math.sqrt(n - 1)), n - 1)
    ratio = Ratio(*key, trials, math.exp(centre), *interval(CONFIDENCE), paired=True, rounds=n)
    return Estimate(ratio, p, interval)


def _unpaired(a: list[float], b: list[float], key: tuple[str, str, str]) -> Estimate:
    """median(a) / median(b), with a bootstrap interval when both sides have two or more trials."""
    point = float(np.median(a) / np.median(b))
    if len(a) < 2 or len(b) < 2:
        return Estimate(Ratio(*key, (len(a), len(b)), point))
    rng = np.random.default_rng(SEED)
    samples = np.sort(_bootstrap_medians(np.asarray(a, float), rng) / _bootstrap_medians(np.asarray(b, float), rng))
    return Estimate(Ratio(*key, (len(a), len(b)), point, *_percentiles(samples)), _bootstrap_p(samples),
                    lambda level: _percentiles(samples, level))


def _estimate(a: list[Trial], b: list[Trial], key: tuple[str, str, str]) -> Estimate:
    """Paired over the rounds both sides have a counted trial in, from two of them; else unpaired."""
    a_by, b_by = ({t.round: t.tgs for t in ts if t.round is not None} for ts in (a, b))
    shared = sorted(a_by.keys() & b_by.keys())
    if len(shared) >= 2:
        return _paired([a_by[r] / b_by[r] for r in shared], key, (len(a), len(b)))
    return _unpaired([t.tgs for t in a], [t.tgs for t in b], key)


def estimates(trials: Iterable[Trial], reference: str | None) -> list[Estimate]:
    """Per scenario: each framework against the reference, then each pair of frameworks (in name
    order, the first over the second); only backends with a counted trial. Not yet adjusted for
    their family: `holm` does that over every pair of a verdict set."""
    counted: dict[str, dict[str, list[Trial]]] = defaultdict(lambda: defaultdict(list))
    for t in trials:
        if t.counts:
            counted[t.scenario][t.backend].append(t)
    out = []
    for scenario, by_backend in counted.items():
        frameworks = sorted(b for b in by_backend if b != reference)
        ordered = [(b, reference) for b in frameworks if reference in by_backend] + list(combinations(frameworks, 2))
        out += [_estimate(by_backend[a], by_backend[b], (scenario, a, b)) for a, b in ordered]
    return out


def holm(family: list[Estimate]) -> list[Ratio]:
    """Each pair's Ratio, in `family`'s order, after Holm's step-down over the pairs with an
    interval: the k-th smallest p-value of m is tested at 1 - 0.05 / (m - k + 1) until one holds
    1, the rest at that same level, and each interval is at its pair's level, so it leaves 1 out
    exactly where Holm finds a difference. Holm, not Benjamini-Hochberg: it bounds the chance of
    any false difference in the set at 5% whatever the truth, BH only their expected share."""
    tested = sorted((i for i, e in enumerate(family) if e.p is not None), key=lambda i: family[i].p)
    out = [e.ratio for e in family]
    level, stopped = CONFIDENCE, False
    for k, i in enumerate(tested):
        level = level if stopped else 1 - (1 - CONFIDENCE) / (len(tested) - k)
        low, high = family[i].interval(level)
        out[i] = replace(out[i], low=low, high=high, level=level)
        stopped = stopped or low <= 1 <= high
    return out


def pairs(trials: Iterable[Trial], reference: str | None) -> list[Ratio]:
    """The pairs of `estimates`, one family adjusted by `holm`."""
    return holm(estimates(trials, reference))


def between(before: Iterable[Trial], after: Iterable[Trial]) -> list[Ratio]:
    """Each backend on each scenario counted in both sets (two compares): `after`'s TGS over
    `before`'s (`Ratio.backend` and `other` name the same backend), unpaired (no round is
    shared), one family adjusted by `holm`."""
    def counted(trials: Iterable[Trial]) -> dict[tuple[str, str], list[float]]:
        out: dict[tuple[str, str], list[float]] = defaultdict(list)
        for t in trials:
            if t.counts:
                out[t.scenario, t.backend].append(t.tgs)
        return out

    old, new = counted(before), counted(after)
    return holm([_unpaired(new[k], old[k], (k[0], k[1], k[1])) for k in sorted(old.keys() & new.keys())])


def slowed_rounds(trials: Iterable[Trial]) -> list[SlowedRound]:
    """The rounds (two counted runs or more) whose every run fell below its backend's median on
    the scenario by more than SLOWED_MADS robust deviations and NOISY_CV: load from outside
    that slowed the whole round. Kept: a paired ratio cancels what the round's runs shared."""
    counted = [t for t in trials if t.counts]
    by_point: dict[tuple[str, str], list[float]] = defaultdict(list)
    by_round: dict[tuple[str, Round], list[Trial]] = defaultdict(list)
    for t in counted:
        by_point[t.scenario, t.backend].append(t.tgs)
        if t.round is not None:
            by_round[t.scenario, t.round].append(t)
    limits = {}
    for point, values in by_point.items():
        median = float(np.median(values))
        mad = float(np.median(np.abs(np.asarray(values) / median - 1)))
        limits[point] = median, max(SLOWED_MADS * _MAD_TO_SD * mad, NOISY_CV)
    out = []
    for (scenario, (compare_id, round_)), ts in sorted(by_round.items()):
        drops = [1 - t.tgs / limits[scenario, t.backend][0] for t in ts]
        if len(ts) >= 2 and all(d > limits[scenario, t.backend][1] for d, t in zip(drops, ts)):
            out.append(SlowedRound(scenario, compare_id, round_, tuple(drops)))
    return out


def widest_half_width(trials: Iterable[Trial], reference: str | None) -> float | None:
    """How far the least sure figure still is from a fixed precision: the widest 95% interval's
    half-width in percent, over the pairs of each scenario whose sides both have counted trials
    (of the ratio, in points of %) or, on a scenario of one backend alone, over its median TGS
    (relative to the median). `inf` while one of them has no interval yet (a side with one
    counted trial); None when there is none: no trial counts, or no backend beside another has
    any (the reference's own interval says nothing of a backend none of whose trials counted)."""
    trials = list(trials)
    widths = [100 * (r.high - r.low) / 2 if r.low is not None else math.inf for r in pairs(trials, reference)]
    backends: dict[str, set[str]] = defaultdict(set)
    for t in trials:
        if not t.warmup:
            backends[t.scenario].add(t.backend)
    for (scenario, backend), s in summarise(trials).items():
        if s.trials and backends[scenario] == {backend}:
            widths.append(100 * (s.high - s.low) / 2 / s.median if s.low is not None else math.inf)
    return max(widths, default=None)
