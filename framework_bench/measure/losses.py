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

from framework_bench.measure.metrics import RunResult
from framework_bench.measure.verify import Check
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


def normalised_alike(run: RunResult, reference: RunResult) -> bool:
    """Both record the same `loss_normalization` setting."""
    return run.settings.get("loss_normalization") == reference.settings.get("loss_normalization")


def step_differences(run: RunResult, reference: RunResult) -> dict[int, float]:
    """{step: relative difference of the canonical losses} over the steps both recorded."""
    steps = sorted(set(run.loss_curve) & set(reference.loss_curve))
    return {s: relative_difference(run.loss_curve[s], reference.loss_curve[s]) for s in steps}


def parity(run: RunResult, reference: RunResult, precision: str, name: str = "parity") -> Check:
    """The run's canonical losses against the reference's on the same rows, seed and scenario.
    Step 1 always: from the same initial weights it is one forward pass, the same for every
    framework whatever its normalisation. Later steps too where both normalise the loss alike
    (the same `loss_normalization` setting); otherwise they are shown, not judged: a framework
    dividing by another count (HF's labels before the shift) takes a slightly different update."""
    for who, r in (("the run", run), ("the reference", reference)):
        if r.status != "ok":
            return Check(name=name, status="fail", detail=f"{who} ({r.backend}) ended {r.status}: {r.reason or ''}"[:300])
        if 1 not in r.loss_curve:
            return Check(name=name, status="fail", detail=f"{who} ({r.backend}) recorded no per-micro-batch losses")
    if run.seed != reference.seed:
        return Check(name=name, status="fail", detail=f"seeds differ: {run.seed} vs the reference's {reference.seed}")
    tolerance = PARITY_TOLERANCE[precision]
    same = normalised_alike(run, reference)
    off = step_differences(run, reference)
    steps = sorted(off)
    judged = steps if same else [1]
    worst = max(judged, key=lambda s: off[s] if off[s] == off[s] else math.inf)
    later = [off[s] for s in steps if s > 1]
    detail = (f"step 1: {run.loss_curve[1]:.7f} vs {reference.backend} {reference.loss_curve[1]:.7f} "
              f"(relative {off[1]:.1e}, at most {tolerance:g})"
              + (f"; later steps at most {max(later):.1e} apart" if later else "")
              + ("; same normalisation, every step judged" if same else
                 f"; normalisation differs ({run.settings.get('loss_normalization')}), step 1 judged"))
    if not off[worst] <= tolerance:  # NaN fails too
        return Check(name=name, status="fail", detail=f"step {worst} off by {off[worst]:.1e} (relative): {detail}")
    return Check(name=name, status="pass", detail=detail)
