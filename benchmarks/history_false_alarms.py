#!/usr/bin/env python
"""How often `fbench history` names a change where nothing changed (a benchmark, not a timed
test): over A/A series (the same code and versions compare after compare), every window of
`--window` consecutive compares of each series is searched as `fbench history` searches a
series (framework_bench/measure/change_points.py); the share of windows with a change named is
the false-alarm rate. The A/A compares come from benchmarks/aa_false_alarm.py (the torch
reference and its twin, the same worker under two names):

    .venv/bin/python benchmarks/aa_false_alarm.py --compares 20 --repeat 3 --slow-compares 0 --db /tmp/aa.db
    .venv/bin/python benchmarks/history_false_alarms.py /tmp/aa.db [--window 10]
    .venv/bin/python benchmarks/history_false_alarms.py --simulate 200   # seeded iid series instead

Windows overlap, so they are not independent trials: the rate says how often a nightly job
looking at its last `--window` compares would have raised a false alarm on this history.
"""

from __future__ import annotations

import argparse

import numpy as np
from rich.console import Console
from rich.table import Table

from framework_bench.measure import change_points
from framework_bench.present.history import series
from framework_bench.store.results import ResultStore


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stores", nargs="*")
    parser.add_argument("--simulate", type=int, default=0, metavar="N",
                        help="also N seeded A/A series of 12 points at 3 %% and 8 %% noise")
    parser.add_argument("--window", type=int, default=10, help="compares a window holds (default 10)")
    args = parser.parse_args()
    if args.window < change_points.MIN_POINTS:
        parser.error(f"--window {args.window}: a window of fewer than {change_points.MIN_POINTS} compares is never judged")
    table = Table("store", "series", "compares", "whole series", "windows", "with a change", "rate")
    flagged_all = windows_all = 0
    for path in args.stores:
        with ResultStore(path, must_exist=True, read_only=True) as store:
            found = series(store.list())
        for s in found:
            medians = [p.median for p in s.points]
            windows = [medians[i:i + args.window] for i in range(len(medians) - args.window + 1)]
            flagged = sum(bool(change_points.find(w)) for w in windows)
            whole = "insufficient data" if s.changes is None else (
                ", ".join(f"{c.ratio:.3f} at {c.at} (p {c.p:.3f})" for c in s.changes) or "none")
            table.add_row(path, s.name, str(len(medians)), whole, str(len(windows)), str(flagged),
                          f"{flagged / len(windows):.1%}" if windows else "-")
            flagged_all, windows_all = flagged_all + flagged, windows_all + len(windows)
    Console().print(table)
    rng = np.random.default_rng(0)
    for noise in (0.03, 0.08) if args.simulate else ():
        named = sum(bool(change_points.find(list(np.exp(rng.normal(0, noise, 12))))) for _ in range(args.simulate))
        print(f"simulated: {named} of {args.simulate} A/A series of 12 points at {noise:.0%} noise with a change named "
              f"({named / args.simulate:.1%})")
    if windows_all:
        print(f"all series: {flagged_all} of {windows_all} windows of {args.window} with a change named "
              f"({flagged_all / windows_all:.1%}); ALPHA {change_points.ALPHA}, MIN_STEP {change_points.MIN_STEP:.0%}")


if __name__ == "__main__":
    main()
