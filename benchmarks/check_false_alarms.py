#!/usr/bin/env python
"""How often each check fails an honest run (a benchmark, not a timed test): every stored run of
a results store made by honest backends, per backend, the runs each check failed or left
unverified, and each run not `ok` with why. Blocking checks make a run `invalid`; a flag only
shows (framework_bench/measure/verify.py), so both are counted. For the host's timed checks, the
honest figure that came closest to the check's bound, per backend: how much room the bound left.

    .venv/bin/fbench compare --scenario tiny_cpu --backends xtuner,llamafactory --repeat 34 --db /tmp/quiet.db
    .venv/bin/python benchmarks/check_false_alarms.py /tmp/quiet.db [more stores...]

For the loaded count, run the same compare with a busy loop per core beside it
(docs/calibration.md has the commands and the counts).
"""

from __future__ import annotations

import argparse
from collections import Counter, defaultdict

from rich.console import Console
from rich.table import Table

from framework_bench.measure import clock_checks as cc
from framework_bench.measure.verify import BLOCKING, THROUGHPUT_TOLERANCE
from framework_bench.store.results import ResultStore


# Each timed check's figure, the end of its range closer to failing, and its bound.
MARGINS = {
    "clock": (lambda f: f["share"], min, f"claimed share of the window >= {cc.MIN_CLAIMED_SHARE:g}"),
    "pauses": (lambda f: f["share"], max, f"paused share of a step <= {cc.MAX_PAUSE_SHARE:g}"),
    "gaps": (lambda f: f["share"], max, f"share between steps <= {cc.MAX_GAP_SHARE:g}"),
    "median_step": (lambda f: min(f["wall_share"], f.get("cpu_share", f["wall_share"])), max,
                    f"the gaps behind the median step, share of it <= {cc.MAX_GAP_SHARE:g} (and a slack)"),
    "warmup_update_parity": (lambda f: f["relative"], max, "|p - p_ref| / |dw_ref| <= 1e-4 (fp32)"),
    "cpu": (lambda f: f["share"], min, f"CPU share of the median step >= {cc.MIN_CPU_SHARE:g}"),
    "warmup": (lambda f: f["cpu_seconds"] / f["measured_median_cpu_seconds"], max,
               f"warm-up CPU / measured median <= {cc.MAX_WARMUP_CPU_RATIO:g} (or 1.5 x the steps)"),
    "projection_delay": (lambda f: f["projection_seconds"] / f["limit"], max, "seconds / its limit <= 1"),
    "first_window": (lambda f: f.get("first_window_cpu_seconds", f.get("first_window_seconds")) / f["limit"], max,
                     "reveal to first step (CPU work on CPU) / its limit <= 1"),
    "warmup_time": (lambda f: f["ratio"], max, f"warm-up wall time / measured median <= {cc.WARMUP_FLAG_RATIO:g}"),
    "throughput": (lambda f: abs(f["ratio"] - 1), max, f"|framework / host - 1| <= {THROUGHPUT_TOLERANCE:g}"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("db", nargs="+", help="results stores of honest runs")
    args = parser.parse_args()
    runs = [r for path in args.db for r in ResultStore(path, must_exist=True, read_only=True).list()]
    per_backend = Counter(r["backend"] for r in runs)
    failed: dict[str, Counter] = defaultdict(Counter)
    unverified: dict[str, Counter] = defaultdict(Counter)
    figures: dict[tuple[str, str], list[float]] = defaultdict(list)  # (check, backend): its MARGINS figure per run
    for r in runs:
        for c in r["checks"]:
            if c["status"] == "unverified":
                unverified[c["name"]][r["backend"]] += 1
                continue
            if c["status"] == "fail":
                failed[c["name"]][r["backend"]] += 1
            if c["name"] in MARGINS:
                try:
                    figures[c["name"], r["backend"]].append(MARGINS[c["name"]][0](c["figures"]))
                except (KeyError, TypeError, ZeroDivisionError):
                    pass  # a run stored before its check kept this figure

    def closest(name: str, backend: str) -> str:
        """The honest figure nearest `name`'s bound over `backend`'s runs, or '' without one."""
        found = figures[name, backend]
        return f" · {MARGINS[name][1](found):.3g}" if found else ""

    backends = sorted(per_backend)
    table = Table(title=f"{len(runs)} stored runs: " + ", ".join(f"{b} {per_backend[b]}" for b in backends))
    table.add_column("check")
    table.add_column("kind")
    for b in backends:
        table.add_column(f"{b}\nfailed / unverified · closest", justify="right")
    table.add_column("closest: the figure and its bound")
    for name in sorted({c["name"] for r in runs for c in r["checks"]}):  # every check judged, its zeros too
        table.add_row(name, "blocking" if name in BLOCKING else "flag",
                      *(f"{failed[name][b]} / {unverified[name][b]}{closest(name, b)}" for b in backends),
                      MARGINS[name][2] if name in MARGINS else "")
    console = Console()
    console.print(table)
    statuses = Counter((r["backend"], r["status"]) for r in runs)
    console.print("status: " + "; ".join(f"{b} {s} {n}" for (b, s), n in sorted(statuses.items())))
    for r in runs:
        if r["status"] != "ok":
            console.print(f"run {r['id']} {r['backend']} {r['status']}: {r['reason']}")


if __name__ == "__main__":
    main()
