#!/usr/bin/env python
"""How many stored runs the `machine` check marks disturbed (a benchmark, not a timed test): per
results store and backend, the runs, how many disturbed, and the share of the machine's CPUs
other processes kept busy during the measured steps (lowest, median, highest). A run stored
before the check existed is judged here from its run folder's stamps, as the host would judge it
now (framework_bench/measure/machine_load.py); one whose folder is gone is left out, said so.

    .venv/bin/fbench compare --scenario tiny_cpu --backends xtuner,llamafactory --repeat 10 --db /tmp/quiet.db
    # beside two busy loops (`python3 -c 'while True: pass' &`, twice, killed after)
    .venv/bin/fbench compare --scenario tiny_cpu --backends xtuner,llamafactory --repeat 10 --db /tmp/loaded.db
    .venv/bin/python benchmarks/machine_load_counts.py /tmp/quiet.db /tmp/loaded.db
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from pathlib import Path

from rich.console import Console
from rich.table import Table

from framework_bench.measure import machine_load
from framework_bench.measure.clock_checks import load_stamps
from framework_bench.scenario import scenario as scenarios
from framework_bench.store.results import ResultStore


def share(run: dict) -> float | None:
    """The run's `others_share`: its stored `machine` check's, else recomputed from its stamps."""
    stored = next((c for c in run["checks"] if c["name"] == machine_load.NAME), None)
    if stored is not None:
        return stored["figures"]["others_share"]
    if not run.get("run_dir") or not Path(run["run_dir"]).is_dir():
        return None
    warmup = scenarios.Scenario.model_validate(run["scenario_json"]).steps.warmup
    check = machine_load.check(load_stamps(Path(run["run_dir"])), warmup)
    return None if check is None else check.figures["others_share"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("db", nargs="+", help="results stores")
    args = parser.parse_args()
    console = Console()
    for path in args.db:
        shares: dict[str, list[float]] = defaultdict(list)
        unread = 0
        for run in ResultStore(path, must_exist=True, read_only=True).list():
            if run["status"] not in ("ok", "unverified", "invalid"):
                continue
            if (s := share(run)) is None:
                unread += 1
            else:
                shares[run["backend"]].append(s)
        every = [s for values in shares.values() for s in values]
        table = Table(title=f"{path}: {len(every)} runs read, {unread} without stamps; disturbed above "
                            f"{machine_load.DISTURBED_SHARE:.0%}")
        for column in ("backend", "runs", "disturbed", "others' share: lowest", "median", "highest"):
            table.add_column(column, justify="left" if column == "backend" else "right")
        for backend, values in sorted(shares.items()) + [("all", every)]:
            if values:
                table.add_row(backend, str(len(values)), str(sum(v > machine_load.DISTURBED_SHARE for v in values)),
                              f"{min(values):.1%}", f"{statistics.median(values):.1%}", f"{max(values):.1%}")
        console.print(table)


if __name__ == "__main__":
    main()
