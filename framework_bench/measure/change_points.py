"""Change points in a series of speeds: where a framework's TGS moved and stayed moved.

Binary segmentation over the log of the series, in the circular form (Olshen et al. 2004) for a
stretch in the middle: the split that parts the series best (the largest pooled t between the two
sides' means) is kept when a permutation test of that largest t (the series reshuffled, the
largest t over every split taken again, so the search is inside the test) puts it under half of
`ALPHA` and the step is at least `MIN_STEP`; where no split is, the stretch in the middle that
parts best from the rest is tested the same way (a release that slowed and a later one that mended it). Each
end of what is kept is named where its own step is at least `MIN_STEP`; then each part is searched
again. The permutations are seeded: one series, one answer. The false-alarm rate on this
project's own A/A series is in docs/statistics.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ALPHA = 0.05  # over both searches: each is tested at half of it (Bonferroni)
# A step smaller than this is not named, however sure: repeated compares on one machine move by
# a few percent from one day to the next (docs/statistics.md).
MIN_STEP = 0.05
MIN_SEGMENT = 2  # points each side of a change: one point alone is an outlier, not a level
# Below this the most extreme split of a shuffled series is too likely to be the one seen: with
# 8 points split 4/4 no permutation test gets under 0.025.
MIN_POINTS = 9
PERMUTATIONS = 1999


@dataclass(frozen=True)
class Change:
    """A level shift: the series' points from index `at` on run at `ratio` times the speed of
    those before it (medians over the segments either side), with its permutation `p`."""

    at: int
    ratio: float
    p: float


def _stretches(n: int) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """Every stretch [a, b) of a series of `n` with at least `MIN_SEGMENT` points in it and in the
    rest: those reaching an end (a single step), then those in the middle (two)."""
    a, b = np.triu_indices(n + 1, k=MIN_SEGMENT)
    keep = (n - (b - a) >= MIN_SEGMENT) & ~((a == 0) & (b == n))
    a, b = a[keep], b[keep]
    step = (a == 0) | (b == n)
    return (a[step], b[step]), (a[~step], b[~step])


def _largest_t(x: np.ndarray, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row of `x` (series of equal length), the largest pooled two-sample t between a stretch
    and the rest, over the stretches [a, b), and the stretch's index there."""
    n = x.shape[1]
    zero = np.zeros((len(x), 1))
    sums, squares = np.hstack([zero, np.cumsum(x, axis=1)]), np.hstack([zero, np.cumsum(x * x, axis=1)])
    m = b - a
    inside, inside_sq = sums[:, b] - sums[:, a], squares[:, b] - squares[:, a]
    mean_in, mean_out = inside / m, (sums[:, -1:] - inside) / (n - m)
    within = (inside_sq - m * mean_in**2) + (squares[:, -1:] - inside_sq - (n - m) * mean_out**2)
    pooled = np.maximum(within / (n - 2), 1e-18)
    t = np.abs(mean_in - mean_out) / np.sqrt(pooled * (1 / m + 1 / (n - m)))
    best = np.argmax(t, axis=1)
    return t[np.arange(len(x)), best], best


def _p(segment: np.ndarray, t: float, a: np.ndarray, b: np.ndarray, rng: np.random.Generator) -> float:
    """The share of reshuffled series whose largest t reaches `t` (in chunks: a long series has
    many stretches)."""
    reached, chunk = 0, max(1, 2_000_000 // len(a))
    for start in range(0, PERMUTATIONS, chunk):
        shuffled = rng.permuted(np.broadcast_to(segment, (min(chunk, PERMUTATIONS - start), len(segment))), axis=1)
        reached += int(np.sum(_largest_t(shuffled, a, b)[0] >= t * (1 - 1e-9)))
    return (1 + reached) / (PERMUTATIONS + 1)


def _search(values: np.ndarray, lo: int, hi: int, rng: np.random.Generator, found: list[Change]) -> None:
    segment = np.log(values[lo:hi])
    if len(segment) < MIN_POINTS:
        return
    for a, b in _stretches(len(segment)):  # a single step first; where none, a stretch in the middle
        if not len(a):
            continue
        t, best = _largest_t(segment[None, :], a, b)
        p = _p(segment, float(t[0]), a, b, rng)
        start, stop = lo + int(a[best[0]]), lo + int(b[best[0]])
        inside, outside = values[start:stop], np.concatenate([values[lo:start], values[stop:hi]])
        if p < ALPHA / 2 and abs(np.median(inside) / np.median(outside) - 1) >= MIN_STEP:
            break
    else:
        return
    ends = [at for at in (start, stop) if lo < at < hi]
    bounds = [lo, *ends, hi]
    for left, at, right in zip(bounds, ends, bounds[2:]):
        ratio = float(np.median(values[at:right]) / np.median(values[left:at]))
        if abs(ratio - 1) >= MIN_STEP:
            found.append(Change(at, ratio, p))
    for left, right in zip(bounds, bounds[1:]):
        _search(values, left, right, rng, found)


def find(values: list[float]) -> list[Change] | None:
    """The change points of a series of positive speeds, in order; None below `MIN_POINTS`
    (insufficient data: no change could be told from chance)."""
    if len(values) < MIN_POINTS:
        return None
    found: list[Change] = []
    _search(np.asarray(values, dtype=float), 0, len(values), np.random.default_rng(0), found)
    return sorted(found, key=lambda c: c.at)
