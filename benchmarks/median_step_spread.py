#!/usr/bin/env python
"""The spread of the `median_step` check over honest runs (a benchmark, not a timed test): per
backend, every stored run judged again from its folder's stamps by the check as it now stands, and
as stored (the rule of the day it ran): the judged gap (on the rank with the least room, the
`held`-th largest gap between measured steps, less the least) as a share of the median step, in
wall time and CPU work, and how far it stood from the bound (`over`, ms; failing above 0), beside
the share of the machine other work took (the `machine` check). Where the bound and its slacks sit
against honest frameworks:

    .venv/bin/fbench compare --scenario multiproc_tiny_cpu_1x2 --backends llamafactory,trl,swift --repeat 10 --db /tmp/mp.db
    .venv/bin/python benchmarks/median_step_spread.py /tmp/mp.db            # judged again now
    .venv/bin/python benchmarks/median_step_spread.py --stored /tmp/mp.db   # as stored

docs/calibration.md has the figures.
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
from framework_bench.measure.median_step import (MAX_MEDIAN_GAP_SHARE, MEDIAN_GAP_CPU_SLACK_SECONDS,
                                                 MEDIAN_GAP_WALL_SLACK_SECONDS, median_step_check)
from framework_bench.store.results import ResultStore


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("db", nargs="+", help="results stores of honest runs (their run folders kept)")
    parser.add_argument("--stored", action="store_true", help="the figures as stored, not judged again")
    args = parser.parse_args()
    rows: dict[str, list[tuple]] = defaultdict(list)
    for path in args.db:
        for r in ResultStore(path, must_exist=True, read_only=True).list():
            checks = {c["name"]: c for c in r["checks"]}
            if "median_step" not in checks:
                continue
            if args.stored:
                f, status = checks["median_step"]["figures"], checks["median_step"]["status"]
            else:
                again = median_step_check(load_stamps(Path(r["run_dir"])), r["scenario_json"]["steps"]["warmup"])
                f, status = again.figures, again.status
            others = (checks.get(machine_load.NAME) or {}).get("figures", {}).get("others_share")
            rows[r["backend"]].append((f["over"] * 1000, f["wall_share"], f.get("cpu_share"), f.get("wall_gap", 0) * 1000,
                                       f.get("cpu_gap", 0) * 1000, others, status))
    table = Table(title=f"median_step: the judged gap against {MAX_MEDIAN_GAP_SHARE:.0%} of the median step, slack "
                        f"{MEDIAN_GAP_WALL_SLACK_SECONDS * 1000:g} ms wall / {MEDIAN_GAP_CPU_SLACK_SECONDS * 1000:g} ms CPU")
    for col in ("backend", "runs", "failed", "over ms: median / max", "wall share: median / max",
                "CPU share: median / max", "the closest run: gap wall / CPU ms, others' share"):
        table.add_column(col, justify="left" if col == "backend" else "right")
    for backend, found in sorted(rows.items()):
        overs, walls = [r[0] for r in found], [r[1] for r in found]
        cpus = [r[2] for r in found if r[2] is not None]
        top = max(found)
        table.add_row(backend, str(len(found)), str(sum(r[6] == "fail" for r in found)),
                      f"{statistics.median(overs):.1f} / {max(overs):.1f}",
                      f"{statistics.median(walls):.3f} / {max(walls):.3f}",
                      f"{statistics.median(cpus):.3f} / {max(cpus):.3f}" if cpus else "-",
                      f"{top[3]:.1f} / {top[4]:.1f}, {top[5] if top[5] is not None else '-'}")
    Console().print(table)


if __name__ == "__main__":
    main()
