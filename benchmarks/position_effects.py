#!/usr/bin/env python
"""Does a run's place in its round move its speed? (a benchmark, not a timed test): over the
counted trials of the stored compares, each trial's TGS over its backend's median in that
compare and scenario, summarised per backend and place in the round. With the reference rotated
with the others (framework_bench/run/design.py), every backend takes every place; a place that
runs faster or slower for all of them is a position effect the paired intervals do not cancel.

    .venv/bin/fbench compare --scenario tiny_cpu --backends xtuner,llamafactory --repeat 6 --db /tmp/pos.db
    .venv/bin/python benchmarks/position_effects.py /tmp/pos.db [more stores...]
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict

from rich.console import Console
from rich.table import Table

from framework_bench.store.results import ResultStore


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("db", nargs="+", help="results stores of compares with --repeat")
    args = parser.parse_args()
    runs = [r for path in args.db for r in ResultStore(path, must_exist=True, read_only=True).list()
            if r["status"] == "ok" and r["tgs"] and (r["trial_round"] or 0) >= 1 and r["trial_position"]]
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in runs:
        groups[r["compare_id"], r["scenario"], r["backend"]].append(r)
    relative: dict[tuple[str, int], list[float]] = defaultdict(list)  # (backend, place): TGS / its median
    for (_, _, backend), trials in groups.items():
        median = statistics.median(t["tgs"] for t in trials)
        for t in trials:
            relative[backend, t["trial_position"]].append(t["tgs"] / median)
            relative["every backend", t["trial_position"]].append(t["tgs"] / median)
    places = sorted({p for _, p in relative})
    table = Table(title=f"TGS over the backend's median, by place in the round ({len(runs)} counted trials)")
    table.add_column("backend")
    for p in places:
        table.add_column(f"place {p}", justify="right")
    for backend in sorted({b for b, _ in relative}, key=lambda b: (b == "every backend", b)):
        table.add_row(backend, *(f"{statistics.median(v) - 1:+.1%} (n={len(v)})" if (v := relative.get((backend, p)))
                                 else "-" for p in places))
    Console().print(table)


if __name__ == "__main__":
    main()
