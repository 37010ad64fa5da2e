#!/usr/bin/env python
"""How much CPU work honest warm-up steps do, held against the reference's in the same round (a
benchmark, not a timed test): whether a bound relative to the reference could tell an honest
warm-up from a lie that trains in it, where the `warmup` check's bound on the run's own measured
steps (framework_bench/measure/clock_checks.py) cannot beside other work.

    .venv/bin/fbench compare --scenario tiny_cpu --backends xtuner,llamafactory --repeat 6 --db results.db
    .venv/bin/python benchmarks/warmup_ratios.py results.db [more stores...] [--reference torch]

Each stored run's `warmup` check keeps its largest warm-up step's CPU work (`cpu_seconds`) and its
measured steps' median (`measured_median_cpu_seconds`). Per round of a compare (its compare id,
scenario and round), each run of a backend other than the reference against the reference's run
of that round: its warm-up over the reference's warm-up, over the reference's measured step, and
over its own measured step (the check's figure, as benchmarks/check_false_alarms.py reads it).
Printed per store and backend: the highest of each over its rounds, and how many runs; runs
whose round has no reference with the figures (a refusal, a run stopped) are left out.
"""

from __future__ import annotations

import argparse
from collections import defaultdict

from rich.console import Console
from rich.table import Table

from framework_bench.run.reference import reference_backend
from framework_bench.store.results import ResultStore

from check_false_alarms import MARGINS  # beside this script: the check's own figure, read as the false-alarm count reads it

own_ratio = MARGINS["warmup"][0]


def warmup(run: dict) -> dict | None:
    """The figures of the run's `warmup` check, where it read the CPU work."""
    found = next((c["figures"] for c in run["checks"] if c["name"] == "warmup"), None)
    return found if found and found.get("cpu_seconds") is not None and found.get("measured_median_cpu_seconds") else None


def round_ratios(runs: list[dict], reference: str) -> dict[str, list[tuple[float, float, float]]]:
    """{backend: [(warm-up / the reference's warm-up, / the reference's measured step, / its own
    measured step) per round]} over the stored runs of compares."""
    rounds: dict[tuple, dict[str, dict]] = defaultdict(dict)
    for r in runs:
        if r["compare_id"] and (figures := warmup(r)):
            rounds[r["compare_id"], r["scenario"], r["trial_round"]][r["backend"]] = figures
    out: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    for by_backend in rounds.values():
        ref = by_backend.get(reference)
        if ref is None:
            continue
        for backend, w in by_backend.items():
            if backend != reference:
                out[backend].append((w["cpu_seconds"] / ref["cpu_seconds"],
                                     w["cpu_seconds"] / ref["measured_median_cpu_seconds"], own_ratio(w)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("db", nargs="+", help="results stores of compares")
    parser.add_argument("--reference", default=None, help="the reference backend (default: the installed one)")
    args = parser.parse_args()
    reference = args.reference or reference_backend()
    table = Table(title=f"Warm-up CPU work per round, the highest over the rounds, against {reference}'s")
    for column in ("store", "backend", "runs", f"over {reference}'s warm-up", f"over {reference}'s measured step",
                   "over its own measured step"):
        table.add_column(column, justify="left" if column in ("store", "backend") else "right")
    every: list[tuple[float, float, float]] = []
    for path in args.db:
        ratios = round_ratios(ResultStore(path, must_exist=True, read_only=True).list(), reference)
        for backend, found in sorted(ratios.items()):
            every += found
            table.add_row(path, backend, str(len(found)), *(f"{max(column):.2f}x" for column in zip(*found)))
    if every:
        table.add_row("every store", "every backend", str(len(every)), *(f"{max(column):.2f}x" for column in zip(*every)))
    Console(width=200).print(table)


if __name__ == "__main__":
    main()
