"""Which loss normalisation a run's records show (`scheme`), and which reference runs a round
needs to judge its runs by their own loss (`needed`: that normalisation, the labels rolled).
Standard library only: the host judges with it (framework_bench/measure/losses.py), and a SLURM
round's batch script asks it on the node, after the round's runs ended, which judging reference
runs to train beside them:

    python -m framework_bench.worker.loss_weighting REFERENCE_RUN_DIR RUN_DIR...

prints each judging loss needed (`JudgingLoss.key`), once, one a line.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

from framework_bench.worker.files import read_worker_report
from framework_bench.worker.loss_schemes import (MICRO_MEAN_MEAN, ROLLED, SCHEMES, STEP_LABEL_MEAN, STEP_TOKEN_MEAN,
                                                 WORLD_LABEL_MEAN, JudgingLoss)
from framework_bench.worker.losses import LOSSES_DIR

# Two weights of a token are the same normalisation when this close (relative): float rounding
# of one arithmetic, never another count (one token of 500 is 2e-3).
EXACT = 1e-9
OTHER, UNKNOWN = "other", "unknown"


def records(run_dir: Path | None) -> list[tuple[int, dict]]:
    """(rank, record) of every micro-batch the workers recorded."""
    if run_dir is None:
        return []
    found = []
    for path in sorted((Path(run_dir) / LOSSES_DIR).glob("rank*.jsonl")):
        rank = int(path.stem.removeprefix("rank"))
        found += [(rank, json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
    return found


def _expected_weights(name: str, micros: list[dict], world: list[dict]) -> list[float | None]:
    """Per micro-batch of one step on one rank (`micros`; `world`: the step's micro-batches on
    every rank), the weight of a supervised token under `name` (None where the records cannot
    say: no count before the shift from an older SDK; no supervised token)."""
    if name == MICRO_MEAN_MEAN:
        return [1 / (m["supervised"] * len(micros)) if m["supervised"] else None for m in micros]
    counted = world if name == WORLD_LABEL_MEAN else micros
    if name in (STEP_LABEL_MEAN, WORLD_LABEL_MEAN) and not all("labelled" in m for m in counted):
        return [None] * len(micros)
    total = sum(m["supervised" if name == STEP_TOKEN_MEAN else "labelled"] for m in counted)
    ranks = len({m["rank"] for m in world}) if name == WORLD_LABEL_MEAN else 1
    return [ranks / total if total else None] * len(micros)


def scheme(run_dir: Path | None) -> str:
    """The loss normalisation the run's records show: one of `SCHEMES` where every micro-batch
    with a supervised token weighs it as that scheme says, `OTHER` where none fits, `UNKNOWN`
    without records or without the factor applied before backward (`scale`)."""
    steps: dict[tuple[int, int], list[dict]] = defaultdict(list)
    world: dict[int, list[dict]] = defaultdict(list)
    for rank, rec in records(run_dir):
        steps[rec["step"], rank].append(rec)
        world[rec["step"]].append({**rec, "rank": rank})
    if not steps or any("scale" not in m for micros in steps.values() for m in micros):
        return UNKNOWN
    several = len({rank for _, rank in steps}) > 1  # one rank's world_label_mean is its step_label_mean
    # At grad_accum 1 the first two coincide; with equal counts on every rank the last two.
    for name in (STEP_TOKEN_MEAN, MICRO_MEAN_MEAN, STEP_LABEL_MEAN) + ((WORLD_LABEL_MEAN,) if several else ()):
        if all(expected is not None and m["divisor"] and abs(m["scale"] / m["divisor"] - expected) <= EXACT * expected
               for (step, _), micros in steps.items()
               for m, expected in zip(micros, _expected_weights(name, micros, world[step])) if m["supervised"]):
            return name
    return OTHER


def rolled(run_dir: Path | None) -> bool:
    """Whether the run's settings ledger says it trained each row's labels rolled (`Job.labels_rolled`)."""
    return run_dir is not None and bool(read_worker_report(run_dir).get("settings", {}).get(ROLLED))


def needed(run_dir: Path | None, reference_dir: Path | None) -> JudgingLoss:
    """The loss a second reference run needs for the run to be judged at every step and on its
    update: the run's scheme where it differs from the reference's and the reference worker can
    train with it (not other, unknown), and its labels rolled where the reference's were not."""
    mine = scheme(run_dir)
    return JudgingLoss(mine if mine in SCHEMES and mine != scheme(reference_dir) else None,
                       rolled(run_dir) and not rolled(reference_dir))


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m framework_bench.worker.loss_weighting REFERENCE_RUN_DIR RUN_DIR...", file=sys.stderr)
        return 2
    reference, *runs = (Path(a) for a in argv)
    for name in dict.fromkeys(n for run in runs if (n := needed(run, reference).key)):
        print(name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
