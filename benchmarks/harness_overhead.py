#!/usr/bin/env python
"""Harness overhead (not a test): what fbench's instrumentation adds to a training step.

Runs each backend once on a scenario (default tiny_cpu) and prints, from that one run:
  - the framework's own throughput (XTuner's ThroughputHook in vis_data/scalars.json;
    LLaMA-Factory's trainer_log.jsonl) beside the host's, over the same measured steps;
  - the cost of one metrics-file write (the worker-side instrumentation) against the
    median step time;
  - the run's wall time against the sum of its step times (start-up: imports, data
    conversion, model build: paid once per run, not per step).

    .venv/bin/python benchmarks/harness_overhead.py [--scenario tiny_cpu] [--backends xtuner,llamafactory]
"""

from __future__ import annotations

import argparse
import tempfile
import time

from framework_bench import runner, scenario
from framework_bench.worker_io import MetricsWriter, read_metrics


def metrics_write_seconds(n: int = 20000) -> float:
    with tempfile.TemporaryDirectory() as d:
        w = MetricsWriter(d, 0)
        t = time.perf_counter()
        for i in range(n):
            w.write(i + 1, 0.123456, 512, 5.4321, 123456789)
        w.close()
        return (time.perf_counter() - t) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", default="tiny_cpu")
    ap.add_argument("--backends", default="xtuner,llamafactory")
    args = ap.parse_args()
    s = scenario.load(args.scenario)
    write = metrics_write_seconds()
    print(f"metrics write: {write * 1e6:.1f} us per step line")
    for name in args.backends.split(","):
        r = runner.run_one(name, s)
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
              f"wall {r.wall_seconds:.1f} s for {total_steps:.1f} s of steps")


if __name__ == "__main__":
    main()
