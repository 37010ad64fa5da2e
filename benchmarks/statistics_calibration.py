#!/usr/bin/env python
"""The comparison statistics on simulated compares (framework_bench/measure/statistics.py): how often
an A/A pair, or a set of them, says a "difference", and how often a known slowdown is found.

Each compare runs every backend once a round. A run's TGS is its speed times the round's machine
state (a shared drift, `--shared` CV) times its own noise (`--own` CV); a round is disturbed with
probability `--disturbed` (outside load: the whole round at 40-80% of its speed, each run a further
`--uneven` CV apart, the load never hitting each run alike). The figures go to docs/calibration.md.

    .venv/bin/python benchmarks/statistics_calibration.py [--sims 1000] [--seed 1]
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np

from framework_bench.measure import statistics
from framework_bench.measure.statistics import Trial


def compare(rng, speeds: dict[str, float], rounds: int, scenario: str, args, disturb_one: bool = False) -> list[Trial]:
    """One compare of `speeds` (backend: speed) on `scenario`; `disturb_one`: round 2 surely disturbed."""
    out = []
    for r in range(1, rounds + 1):
        state = 1 + args.shared * rng.standard_normal()
        uneven = 0.0
        if (disturb_one and r == 2) or rng.random() < args.disturbed:
            state *= rng.uniform(0.4, 0.8)
            uneven = args.uneven
        for b, speed in speeds.items():
            tgs = 2500 * speed * state * (1 + args.own * rng.standard_normal()) * (1 + uneven * rng.standard_normal())
            out.append(Trial(b, scenario, tgs, "ok", f"round {r}", round=(f"{scenario}-c", r)))
    return out


def unpaired(ts: list[Trial]) -> list[Trial]:
    return [replace(t, round=None) for t in ts]


def said(ratios) -> bool:
    return any(r.low > 1 or r.high < 1 for r in ratios)


def rate(hits: int, sims: int) -> str:
    return f"{100 * hits / sims:5.1f}%"


def one_pair(rng, args, rounds: int, speed: float, disturb_one: bool) -> str:
    """Unpaired | paired over `args.sims` compares of torch and a twin at `speed`: the share that
    says a difference (slower, for a slowdown) and the median half-width of the interval."""
    cells = []
    samples = [compare(rng, {"torch": 1.0, "twin": speed}, rounds, "s", args, disturb_one) for _ in range(args.sims)]
    for strip in (unpaired, list):
        rs = [statistics.pairs(strip(ts), "torch")[0] for ts in samples]
        hits = sum(r.high < 1 if speed < 1 else said([r]) for r in rs)
        cells.append(f"{rate(hits, args.sims)} ±{np.median([50 * (r.high - r.low) for r in rs]):4.1f}%")
    return " | ".join(cells)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sims", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--shared", type=float, default=0.02)
    parser.add_argument("--own", type=float, default=0.03)
    parser.add_argument("--disturbed", type=float, default=0.1)
    parser.add_argument("--uneven", type=float, default=0.05)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    print(f"noise: shared {args.shared:.0%}, own {args.own:.0%}, P(disturbed round) {args.disturbed:.0%}, "
          f"uneven {args.uneven:.0%}; {args.sims} simulated compares a row")
    print("One pair: the share saying a difference (a slowdown: saying slower), and the median half-width;"
          " unpaired bootstrap | paired t")
    for speed in (1.0, 0.8, 0.95):
        for rounds in (3, 5, 10):
            for one in (False, True):
                print(f"  {'A/A' if speed == 1 else f'{1 - speed:.0%} slower'}, {rounds:2d} rounds"
                      f"{', one surely disturbed' if one else '':22s} {one_pair(rng, args, rounds, speed, one)}")
    print("A/A sweeps, 4 scenarios x 3 backends (12 comparisons), 5 rounds, paired: any difference said")
    fw = unadjusted = 0
    for _ in range(args.sims):
        ts = [t for s in range(4) for t in compare(rng, {"torch": 1.0, "a": 1.0, "b": 1.0}, 5, f"s{s}", args)]
        fw += said(statistics.pairs(ts, "torch"))
        unadjusted += said(e.ratio for e in statistics.estimates(ts, "torch"))
    print(f"  each at 95%: {rate(unadjusted, args.sims)}; Holm, family-wise 95%: {rate(fw, args.sims)}")
    print("A slowdown found as slower, 5 rounds, paired, in the 12-comparison sweep (on one scenario, its round 2"
          " disturbed)")
    for slow in (0.75, 0.8, 0.95):
        found = 0
        for _ in range(args.sims):
            ts = [t for s in range(4) for t in compare(rng, {"torch": 1.0, "a": slow if s == 0 else 1.0, "b": 1.0}, 5,
                                                       f"s{s}", args, disturb_one=s == 0)]
            [r] = [r for r in statistics.pairs(ts, "torch") if (r.scenario, r.backend, r.other) == ("s0", "a", "torch")]
            found += r.high < 1
        print(f"  {1 - slow:.0%} slower: {rate(found, args.sims)}")


if __name__ == "__main__":
    main()
