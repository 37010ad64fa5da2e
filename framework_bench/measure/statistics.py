"""How sure a comparison is: TGS over repeated trials, with 95% confidence intervals.

The one place a figure's uncertainty is computed (a run's own TGS is `metrics.figures`). Per
backend and scenario: the median TGS over the trials and its 95% interval, the trial-to-trial
coefficient of variation, "noisy" above 5%, and how many trials would narrow the interval to
±2%. Per pair of backends on one scenario: the ratio of their median TGS and its 95% interval.

Intervals are percentile bootstraps over trials (each side resampled on its own), written here
with numpy (a host dependency already) in a few lines rather than with `scipy.stats.bootstrap`:
scipy is not in the host venv (the package lists have it only as wheels), and it would add a
large compiled dependency to every install for one function this short. The generator is
seeded per interval, so the same trials give the same interval on every machine and whatever
else was computed before.

A verdict wants 5 trials a side: with 3 the percentile bootstrap of a median is too narrow
(the simulated false-alarm rates: docs/calibration.md).

Trials whose run did not end `ok` do not count: they are named, with their status, in
`Summary.excluded`. One rule decides, everywhere a trial is shown: a check that can drop a trial
is blocking and makes the run `invalid`; a flag (a non-blocking check that failed) is shown
beside the run and never drops it. Warm-up rounds' trials (round 0 and below) do not count either.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
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


@dataclass(frozen=True)
class Trial:
    """One run of a backend on a scenario, as the statistics need it. `label` names it when
    it is left out ("run 12, round 2")."""
    backend: str
    scenario: str
    tgs: float | None
    status: str
    label: str
    warmup: bool = False  # a warm-up round's: neither counted nor named

    @property
    def counts(self) -> bool:
        return self.status == "ok" and self.tgs is not None and self.tgs > 0 and not self.warmup

    def why_excluded(self) -> str:
        return f"{self.label} ({self.status if self.status != 'ok' else 'no figure'})"

    @classmethod
    def from_record(cls, r: dict) -> "Trial":
        """From a stored row or a `RunResult` dump: its checks are dicts with `name` and `status`."""
        label = f"run {r.get('id', r.get('result_id'))}" + (f", round {r['trial_round']}" if r.get("trial_round") else "")
        return cls(r["backend"], r["scenario"], r.get("tgs"), r["status"], label,
                   warmup=r.get("trial_round") is not None and r["trial_round"] <= 0)


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
    """`backend`'s median TGS over `other`'s on one scenario; `low`/`high` its 95% interval (None
    when either side has fewer than two counted trials)."""
    scenario: str
    backend: str
    other: str
    trials: tuple[int, int]
    ratio: float
    low: float | None = None
    high: float | None = None


def _bootstrap_medians(values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The median of each of RESAMPLES resamples (with replacement) of `values`, sorted first so
    that the order the trials came in does not change the interval."""
    values = np.sort(values)
    picks = rng.integers(0, len(values), size=(RESAMPLES, len(values)))
    return np.median(values[picks], axis=1)


def _percentiles(samples: np.ndarray) -> tuple[float, float]:
    tail = 100 * (1 - CONFIDENCE) / 2
    low, high = np.percentile(samples, [tail, 100 - tail])
    return float(low), float(high)


def summarise(trials: Iterable[Trial]) -> dict[tuple[str, str], Summary]:
    """Per (scenario, backend): the median TGS over counted trials, its interval, CV and exclusions."""
    by_point: dict[tuple[str, str], list[Trial]] = defaultdict(list)
    for t in trials:
        if not t.warmup:
            by_point[t.scenario, t.backend].append(t)
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


def ratio(a: list[float], b: list[float], scenario: str, backend: str, other: str) -> Ratio:
    """median(a) / median(b), with its bootstrap interval when both sides have two or more trials."""
    point = float(np.median(a) / np.median(b))
    if len(a) < 2 or len(b) < 2:
        return Ratio(scenario, backend, other, (len(a), len(b)), point)
    rng = np.random.default_rng(SEED)
    samples = _bootstrap_medians(np.asarray(a, float), rng) / _bootstrap_medians(np.asarray(b, float), rng)
    return Ratio(scenario, backend, other, (len(a), len(b)), point, *_percentiles(samples))


def pairs(trials: Iterable[Trial], reference: str | None) -> list[Ratio]:
    """Per scenario: each framework against the reference, then each pair of frameworks (in name
    order, the first over the second); only backends with a counted trial."""
    counted: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for t in trials:
        if t.counts:
            counted[t.scenario][t.backend].append(t.tgs)
    out = []
    for scenario, by_backend in counted.items():
        frameworks = sorted(b for b in by_backend if b != reference)
        if reference in by_backend:
            out += [ratio(by_backend[b], by_backend[reference], scenario, b, reference) for b in frameworks]
        out += [ratio(by_backend[a], by_backend[b], scenario, a, b) for a, b in combinations(frameworks, 2)]
    return out


def widest_half_width(trials: Iterable[Trial], reference: str | None) -> float | None:
    """How far the least sure figure still is from a fixed precision: the widest 95% interval's
    half-width in percent, over every pair of each scenario (of the ratio, in points of %) or,
    where one backend alone has counted trials, over its median TGS (relative to the median).
    `inf` while one of them has no interval yet (a side with one counted trial); None when no
    trial counts at all, so that nothing more trials could narrow."""
    trials = list(trials)
    ratios = pairs(trials, reference)
    widths = [100 * (r.high - r.low) / 2 if r.low is not None else math.inf for r in ratios]
    paired = {(r.scenario, b) for r in ratios for b in (r.backend, r.other)}
    for key, s in summarise(trials).items():
        if s.trials and key not in paired:
            widths.append(100 * (s.high - s.low) / 2 / s.median if s.low is not None else math.inf)
    return max(widths, default=None)
