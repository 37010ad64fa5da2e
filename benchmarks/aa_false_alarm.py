#!/usr/bin/env python
"""The verdict validated on real runs (a benchmark, not a timed test).

A/A: the torch reference against itself installed a second time under another name
(`torch_twin`, benchmarks/twins: the same worker on the same env), `--compares` compares of
`--repeat` trials each after the warm-up round; the false-alarm rate is the share of compares
whose verdict is not "no difference detected" (wanted: at most 1 of 20). Known slowdown:
`torch_slow`, the same worker doing real extra arithmetic after each optimizer step (25% more
time a step: TGS 20% lower), `--slow-compares` compares; each must say "slower" with an
interval that holds 20%.

    .venv/bin/python benchmarks/aa_false_alarm.py [--scenario tiny_cpu] [--compares 20] [--repeat 5]
        [--slow-compares 5] [--db PATH] [--hogs 2]

Each A/A compare also gives its interval's width paired over the rounds (as the verdicts are) and
unpaired (the same trials, rounds ignored), and the runs that did not end `ok` with why: with
`--hogs 2` (a busy loop per core beside it) that is how an honest run fares on a loaded machine.

How long: every trial is a full run (torch and torch_slow on tiny_cpu: 5 and 7 s of wall time
in one check on this 2-core machine, ~6 s with the process's own overhead), and a compare is
2 backends x (repeat + 1 warm-up) runs: 12 runs, ~75 s. The defaults (20 A/A + 5 slowdown
compares) are 300 runs, about 30 min here, more on a busy machine.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
TWINS = {"torch_twin": "fbench_twins.plugin:TwinBackend", "torch_slow": "fbench_twins.plugin:SlowBackend"}
SLOWDOWN = 0.20  # torch_slow's TGS is 1 / (1 + 0.25) of the reference's (fbench_twins/slow_worker.py)


def install_twins(site: Path) -> list[Path]:
    """Register the twins through an entry point, like any third-party backend, and give each
    the torch env under its own name (a link: the same interpreter and packages); the links
    made, for `main` to take away."""
    info = site / "fbench_twins-0.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fbench-twins\nVersion: 0.0\n")
    (info / "entry_points.txt").write_text("[fbench.backends]\n" + "".join(f"{n} = {t}\n" for n, t in TWINS.items()))
    sys.path[:0] = [str(HERE / "twins"), str(site)]
    from framework_bench.envs import venvs
    links = [venvs.env_path(name) for name in TWINS if not venvs.env_path(name).exists()]
    for link in links:
        link.symlink_to(venvs.env_path("torch"), target_is_directory=True)
    return links


def one_compare(scenario, twin: str, repeat: int, store):
    """One compare of the reference and `twin`: its ratio of twin over the reference (paired over
    the rounds, as the verdicts are), the same trials' unpaired ratio, and the runs not `ok`."""
    from framework_bench.measure import statistics
    from framework_bench.run import compare
    from framework_bench.run.options import RunOptions
    results = compare.compare([scenario], ["torch", twin], RunOptions(db=store.path), store=store, repeat=repeat)
    trials = [statistics.Trial.from_record(r.model_dump(mode="json")) for r in results]
    [pair] = statistics.pairs(trials, reference="torch")
    [apart] = statistics.pairs([replace(t, round=None) for t in trials], reference="torch")
    return pair, apart, [f"{r.backend} {r.status}: {r.reason}" for r in results if r.status != "ok"]


def width(pair) -> str:
    return "-" if pair.low is None else f"{(pair.high - pair.low) * 100:.1f} points"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", default="tiny_cpu")
    parser.add_argument("--compares", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--slow-compares", type=int, default=5)
    parser.add_argument("--db", type=Path, default=None, help="default: a new file in a temporary folder")
    parser.add_argument("--hogs", type=int, default=0, help="busy loops beside the compares (one per core: a loaded machine)")
    args = parser.parse_args()
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.hogs)]
    with tempfile.TemporaryDirectory() as tmp:
        links = install_twins(Path(tmp) / "site")
        try:
            run(args, Path(tmp))
        finally:
            for link in links:
                link.unlink()
            for hog in hogs:
                hog.kill()


def run(args: argparse.Namespace, tmp: Path) -> None:
    """The A/A compares, then the slowdown compares, each verdict as it comes, then the rates."""
    from framework_bench.present.verdict import sentence
    from framework_bench.scenario import scenario as scenarios
    from framework_bench.store.results import ResultStore
    s = scenarios.load(args.scenario)
    start = time.monotonic()
    alarms = found = 0
    with ResultStore(args.db or tmp / "aa.sqlite") as store:
        for i in range(args.compares):
            pair, apart, not_ok = one_compare(s, "torch_twin", args.repeat, store)
            said = sentence(pair)
            alarms += not said.startswith("no difference detected")
            print(f"A/A {i + 1}/{args.compares}: {said}; interval width paired {width(pair)}, unpaired "
                  f"{width(apart)}; runs not ok: {not_ok or 'none'}", flush=True)
        for i in range(args.slow_compares):
            pair, _, not_ok = one_compare(s, "torch_slow", args.repeat, store)
            said = sentence(pair) + (f"; runs not ok: {not_ok}" if not_ok else "")
            found += " slower than " in said and pair.low <= 1 - SLOWDOWN <= pair.high
            print(f"slowdown {i + 1}/{args.slow_compares}: {said}", flush=True)
    print(f"A/A false alarms: {alarms} of {args.compares} compares ({args.repeat} trials each, {args.scenario}); "
          f"the {SLOWDOWN:.0%} slowdown found, its interval holding {SLOWDOWN:.0%}: {found} of {args.slow_compares}; "
          f"{(time.monotonic() - start) / 60:.0f} min")


if __name__ == "__main__":
    main()
