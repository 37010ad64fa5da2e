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

from framework_bench.metrics import RunResult
from framework_bench.verify import Check
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


def parity(run: RunResult, reference: RunResult, precision: str, name: str = "parity") -> Check:
    """The run's canonical step-1 loss against the reference's on the same rows, seed and
    scenario: from the same initial weights, step 1 is one forward pass, the same for every
    framework whatever its normalisation. Later steps are shown, not judged: a framework that
    divides by another count (HF's labels before the shift) takes a slightly different update."""
    for who, r in (("the run", run), ("the reference", reference)):
        if r.status != "ok":
            return Check(name=name, status="fail", detail=f"{who} ({r.backend}) ended {r.status}: {r.reason or ''}"[:300])
        if 1 not in r.loss_curve:
            return Check(name=name, status="fail", detail=f"{who} ({r.backend}) recorded no per-micro-batch losses")
    if run.seed != reference.seed:
        return Check(name=name, status="fail", detail=f"seeds differ: {run.seed} vs the reference's {reference.seed}")
    tolerance = PARITY_TOLERANCE[precision]
    first = relative_difference(run.loss_curve[1], reference.loss_curve[1])
    later = [relative_difference(run.loss_curve[s], reference.loss_curve[s])
             for s in sorted(set(run.loss_curve) & set(reference.loss_curve)) if s > 1]
    detail = (f"step 1: {run.loss_curve[1]:.7f} vs {reference.backend} {reference.loss_curve[1]:.7f} "
              f"(relative {first:.1e}, at most {tolerance:g})"
              + (f"; later steps at most {max(later):.1e} apart" if later else ""))
    return Check(name=name, status="pass" if first <= tolerance else "fail", detail=detail)
