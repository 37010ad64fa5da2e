#!/usr/bin/env python
"""Harness overhead (not a test): what fbench's instrumentation adds to a training step.

Runs each backend once on a scenario (default tiny_cpu) and prints, from that one run:
  - the framework's own throughput (XTuner's ThroughputHook in vis_data/scalars.json;
    LLaMA-Factory's trainer_log.jsonl) beside the host's, over the same measured steps;
  - the cost of one metrics-file write (the worker-side instrumentation) against the
    median step time;
  - the run's wall time against the sum of its step times (start-up: imports, data
    conversion, model build: paid once per run, not per step);
  - the host clock's cost (framework_bench/measure/clock.py): one clock-line write in the worker
    (four a step at most) against the median step, and the host's watcher thread's CPU
    while it stamps lines at a pace of 10 steps a second, as a share of one core and of the
    machine (the watcher must stay under 1 %), with the lag from a line's write to its stamp.

    .venv/bin/python benchmarks/harness_overhead.py [--scenario tiny_cpu] [--backends xtuner,llamafactory]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import os
import threading

from framework_bench.measure import clock
from framework_bench.run import pipeline
from framework_bench.scenario import scenario
from framework_bench.worker.steps import ClockLines
from framework_bench.worker.files import MetricsWriter, read_metrics


def metrics_write_seconds(n: int = 20000) -> float:
    with tempfile.TemporaryDirectory() as d:
        w = MetricsWriter(d, 0)
        t = time.perf_counter()
        for i in range(n):
            w.write(i + 1, 0.123456, 512, 5.4321, 123456789)
        w.close()
        return (time.perf_counter() - t) / n


def clock_write_seconds(n: int = 20000) -> float:
    with tempfile.TemporaryDirectory() as d:
        lines = ClockLines(d, 0)
        t = time.perf_counter()
        for i in range(n):
            lines.write("end", i + 1)
        lines.close()
        return (time.perf_counter() - t) / n


def watcher_cost(seconds: float = 5.0, steps_per_second: float = 10.0) -> tuple[float, float]:
    """(CPU seconds the watcher thread used per wall second, median lag from a line's write
    to its stamp), lines arriving at a step pace (the writer sleeps between steps, so the
    process's CPU time is the watcher's, near enough)."""
    with tempfile.TemporaryDirectory() as d:
        lines = ClockLines(d, 0)
        done = threading.Event()
        written: list[float] = []

        def steps() -> None:
            step = 0
            while not done.wait(1 / steps_per_second):
                step += 1
                written.append(time.monotonic())
                lines.write("end", step)

        writer = threading.Thread(target=steps)
        with clock.Watcher(Path(d), warmup=0, cpu=False) as watcher:
            cpu, wall = time.process_time(), time.perf_counter()
            writer.start()
            time.sleep(seconds)
            done.set()
            writer.join()
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        lines.close()
        lags = sorted(stamp - at for (stamp, *_), at in zip(watcher.events[0], written))
        return cpu / wall, lags[len(lags) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", default="tiny_cpu")
    ap.add_argument("--backends", default="xtuner,llamafactory")
    args = ap.parse_args()
    s = scenario.load(args.scenario)
    write = metrics_write_seconds()
    print(f"metrics write: {write * 1e6:.1f} us per step line")
    clock_write = clock_write_seconds()
    share, lag = watcher_cost()
    print(f"clock line write: {clock_write * 1e6:.1f} us per line; host watcher at 10 steps/s: {share:.2%} of one "
          f"core ({share / (os.cpu_count() or 1):.2%} of this machine's {os.cpu_count()} CPUs), a line stamped "
          f"{lag * 1e3:.2f} ms after its write (median)")
    for name in [n for n in args.backends.split(",") if n]:
        r = pipeline.run_one(name, s)
        if r.status != "ok":
            print(f"{name}: {r.status}: {(r.reason or '').splitlines()[:1]}")
            continue
        steps = [m for m in read_metrics(r.run_dir) if m["step"] > s.steps.warmup and m["rank"] == 0]
        host_window = sum(m["tokens"] for m in steps) / sum(m["seconds"] for m in steps)
        own = r.framework_throughput
        own_window = own.get("tokens_per_sec_median") if name == "xtuner" else own.get("tokens_per_sec")
        host_figure = r.tgs if name == "xtuner" else host_window  # like for like: XTuner median, LF window
        total_steps = sum(m["seconds"] for m in read_metrics(r.run_dir) if m["rank"] == 0)
        print(f"{name} {r.framework_version}: host TGS {r.tgs:,.1f} (median), window {host_window:,.1f}; "
              f"framework's own {own_window:,.1f} -> host/own {host_figure / own_window:.4f}; "
              f"metrics write / median step {write / r.step_seconds:.2e}; "
              f"clock lines / median step {4 * clock_write / r.step_seconds:.2e}; "
              f"wall {r.wall_seconds:.1f} s for {total_steps:.1f} s of steps")


if __name__ == "__main__":
    main()
