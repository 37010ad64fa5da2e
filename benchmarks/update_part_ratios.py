#!/usr/bin/env python
"""How far each part of an honest framework's update lies from the torch reference's part: the
figures `PART_NORM_RATIO` in framework_bench/measure/update.py is set from (a benchmark, not a
timed test).

    .venv/bin/python benchmarks/update_part_ratios.py [--scenario tiny_cpu] [--backends xtuner,llamafactory]
        [--bf16-context-length 1024] [--repeat 1] [--db results.db]

One compare (`compare.compare`, the reference added as `fbench compare` adds it) of the backends on
the scenario and on its bf16 copy (bf16 autocast, rows of `--bf16-context-length` tokens: bf16 on a
CPU without bf16 instructions is ~15x slower, so keep it short). Each run's `update_parts` check
keeps |dw| of each part of the model (embeddings, each decoder layer, final norm, head) over the
reference's part, against the reference normalising alike (`ratio:<part>`). Printed per scenario
and backend: the lowest and highest ratio over its runs' parts, and how many parts; a backend that
did not run or was not judged, why. `--db` keeps the runs (benchmarks/warmup_ratios.py reads them).
About 7 min here at `--repeat 1` beside other engineers' test runs (XTuner refuses bf16 on CPU).
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

from rich.console import Console
from rich.table import Table

from framework_bench.measure.metrics import RunResult
from framework_bench.measure.update import PART_NORM_RATIO
from framework_bench.run import compare
from framework_bench.run.options import RunOptions
from framework_bench.scenario import scenario as scenarios
from framework_bench.store.results import ResultStore

RATIO = "ratio:"  # the update_parts check's figure of one part


def part_ratios(result: RunResult) -> dict[str, float] | str:
    """{part: |dw| over the reference's} from the run's `update_parts` check, or why there are none."""
    if result.status == "unsupported":
        return "not run: " + (result.reason or "").strip().splitlines()[-1][:160]
    check = next((c for c in result.checks if c.name == "update_parts"), None)
    if check is None or check.status != "pass":
        detail = f"update_parts {check.status}: {check.detail}" if check else "no update_parts check"
        return f"{result.status}: {detail[:160]}"
    return {key[len(RATIO):]: value for key, value in check.figures.items() if key.startswith(RATIO)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="tiny_cpu")
    parser.add_argument("--backends", default="xtuner,llamafactory", help="judged against the reference, which is added")
    parser.add_argument("--bf16-context-length", type=int, default=1024, help="the bf16 copy's rows; 0: no bf16 copy")
    parser.add_argument("--repeat", type=int, default=1, help="rounds of each backend (from 2, after a warm-up round)")
    parser.add_argument("--db", default=None, help="a results store to keep the runs in (default: none)")
    args = parser.parse_args()
    scn = scenarios.load(args.scenario)
    chosen = [scn]
    if args.bf16_context_length:
        n = args.bf16_context_length
        chosen.append(scn.model_copy(update={"name": f"{scn.name}_bf16_{n}", "precision": "bf16", "context_length": n}))
    backends = args.backends.split(",")
    store = ResultStore(args.db) if args.db else None
    started = time.monotonic()
    results = compare.compare(chosen, backends, RunOptions(db=store.path if store else None), store=store,
                              repeat=args.repeat,
                              on_result=lambda r, s: print(f"# {s.name} {r.backend} round {r.trial_round}: {r.status}",
                                                           flush=True))
    ratios: dict[tuple[str, str], list[float]] = defaultdict(list)
    parts: dict[tuple[str, str], set[str]] = defaultdict(set)
    why: dict[tuple[str, str], list[str]] = defaultdict(list)
    for r in results:
        if r.backend not in backends:
            continue  # the reference: its parts are the denominators
        found = part_ratios(r)
        if isinstance(found, str):
            why[r.scenario, r.backend].append(found)
            continue
        ratios[r.scenario, r.backend] += found.values()
        parts[r.scenario, r.backend] |= set(found)
    table = Table(title=f"|dw| of each part over the reference's part (bound: within {PART_NORM_RATIO:g}x either way); "
                        f"{len(results)} runs, {time.monotonic() - started:.0f} s")
    for column in ("scenario", "precision", "backend", "lowest-highest", "parts", "runs not judged"):
        table.add_column(column)
    for s in chosen:
        for b in backends:
            found = ratios[s.name, b]
            table.add_row(s.name, s.precision, b, f"{min(found):.4f}-{max(found):.4f}" if found else "-",
                          str(len(parts[s.name, b])), "; ".join(sorted(set(why[s.name, b]))))
    Console(width=200).print(table)


if __name__ == "__main__":
    main()
