"""The canonical loss per optimizer step (host side), from the workers' per-micro-batch records
(`framework_bench/worker/losses.py`), and its parity with the torch reference.

Canonical loss of a step = sum over ranks and micro-batches of (framework loss x the divisor
the framework used) / sum of supervised tokens after the shift: the token mean over the step,
whatever each framework divides by.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

from framework_bench.worker.losses import LOSSES_DIR

# Parity of the step-1 canonical loss with the reference (issue 20): fp32 / bf16 autocast.
PARITY_TOLERANCE = {"fp32": 1e-5, "bf16": 1e-2}


def canonical_losses(run_dir: Path | None) -> dict[int, float]:
    """{step: token-mean loss over all ranks' micro-batches}; empty when no worker wrote records."""
    if run_dir is None:
        return {}
    nll: dict[int, float] = defaultdict(float)
    tokens: dict[int, int] = defaultdict(int)
    for path in sorted((Path(run_dir) / LOSSES_DIR).glob("rank*.jsonl")):
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            rec = json.loads(line)
            if rec["divisor"]:  # a micro-batch with no label: its loss is 0/0 and adds nothing
                nll[rec["step"]] += rec["loss"] * rec["divisor"]
            tokens[rec["step"]] += rec["supervised"]
    return {step: (nll[step] / tokens[step] if tokens[step] else math.nan) for step in sorted(nll)}


def relative_difference(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)
