#!/usr/bin/env python
"""Does the update projection see a part move that never moved? (a benchmark, not a timed test):
the rounding `FROZEN_RATIO` in framework_bench/measure/update.py allows for. In the torch env:

    .venv/bin/fbench run --backend torch --scenario tiny_cpu_lora --dry-run   # writes a job.json, runs nothing
    .fbench/envs/torch/bin/python benchmarks/frozen_part_rounding.py .fbench/runs/dry-run/<its folder>/job.json [--fills 500]

The model of the job (a LoRA job: the base frozen, the adapters trained) built as the torch
reference builds it (`models.from_config`), then `--fills` times in this one process, with no
step between: `initial_weights_worker.fill` from an initial seed, the trained tensors filled again
from a trained seed (`fill_revealed`'s fill), and `update.project` of (final - initial) weights,
which recomputes the initial values from the seeds. Fill i takes the job's seed + i, the trained
seed the job's seed + `--fills` + i, the projection seed i. Every |dw| should be exactly 0; one
element whose recomputed float64 value rounds to the other side of a float32 boundary adds one ulp
(CI saw 2^-34 once on the torch reference's LoRA base). Printed per part of the model (`all`,
`base`, `adapters`, each part `update.part_of` names): in how many projections its |dw| was not 0,
and the largest. About 3 s a fill and projection on this 2-core machine: 500 take about 25 min.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter, defaultdict

import torch

from framework_bench.worker import initial_weights_worker, load_job, update
from framework_bench.worker.initial_weights_host import starts_revealed
from framework_bench.worker.models import from_config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("job", help="a run folder's job.json (tiny_cpu_lora: `fbench run ... --dry-run` writes one)")
    parser.add_argument("--fills", type=int, default=500)
    args = parser.parse_args()
    job = load_job(args.job)
    adapters = bool(job.scenario.finetune.adapters)
    model = from_config(job, torch.device("cpu"), attn_implementation="sdpa", dtype=torch.float32)
    moved: Counter[str] = Counter()
    largest: dict[str, float] = defaultdict(float)
    started = time.monotonic()
    for i in range(args.fills):
        seed, trained = job.seed + i, job.seed + args.fills + i
        initial_weights_worker.fill(model, seed, job.hf_config)
        initial_weights_worker.fill(model, trained, job.hf_config, only=lambda name: starts_revealed(name, adapters))
        for part, (_, norm) in update.project(model, seed, job.hf_config, i, trained, adapters=adapters).items():
            moved[part] += norm != 0.0
            largest[part] = max(largest[part], norm)
    print(f"# {job.scenario.name}: {args.fills} fills and projections, no step between, "
          f"{time.monotonic() - started:.0f} s, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("part projections-with-|dw|-not-0 largest-|dw|")
    for part in sorted(largest, key=lambda p: (p not in ("all", "base", "adapters"), p)):
        print(f"{part!r} {moved[part]} {largest[part]:.3e}")


if __name__ == "__main__":
    main()
