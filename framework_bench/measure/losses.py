"""The canonical loss per optimizer step (host side), from the workers' per-micro-batch records
(`framework_bench/worker/losses.py`), the loss normalisation those records show, and the
loss parity with the torch reference.

Canonical loss of a step = sum over ranks and micro-batches of (framework loss x the divisor
the framework used) / sum of supervised tokens after the shift: the token mean over the step,
whatever each framework divides by. From the same initial weights step 1 is one forward pass,
so its canonical loss is the same for every framework.

Later steps depend on how each supervised token weighed in the gradients of the steps before:
scale / divisor, both recorded per micro-batch (`scale`: the factor the framework applied to
the logged loss before backward). `scheme` names that weighting from the records, exactly
(`EXACT`, relative), per (step, rank, micro-batch):
  - "step_token_mean": 1 / the step's supervised tokens on the rank (the torch loop; any
    framework at grad_accum 1 that takes a micro-batch's token mean);
  - "micro_mean_mean": 1 / (the micro-batch's supervised tokens x micro-batches in the step)
    (mmengine's OptimWrapper or DeepSpeed dividing each micro-batch's mean by the accumulation);
  - "step_label_mean": 1 / the step's labels counted before the shift (HF Trainer's
    `num_items_in_batch`);
  - "world_label_mean": the ranks / the step's labels counted before the shift on every rank
    (HF Trainer's `average_tokens_across_devices`; the ranks' gradient average then gives each
    token 1 / those labels); only ever named for a run of several ranks;
  - "other": none of these; "unknown": no records, or records without `scale` (a worker that
    does not say: an older plugin).
Two runs with the same known scheme took the same updates when honest: every step is judged.
Otherwise step 1 is judged and the rest is `unverified`, naming the scheme a reference would
need (`needed_reference_loss`: the torch reference trains with any of the named ones
through `Job.loss_scheme`); never `skipped` or passed unseen.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

from framework_bench.measure.metrics import RunResult
from framework_bench.measure.verify import Check
from framework_bench.worker.loss_schemes import SCHEMES, JudgingLoss
from framework_bench.worker.loss_weighting import OTHER, UNKNOWN, needed, records, scheme

# Parity of the canonical losses with the reference: fp32 / bf16 autocast.
PARITY_TOLERANCE = {"fp32": 1e-5, "bf16": 1e-2}


def canonical_losses(run_dir: Path | None) -> dict[int, float]:
    """{step: token-mean loss over all ranks' micro-batches}; empty when no worker wrote records."""
    nll: dict[int, float] = defaultdict(float)
    tokens: dict[int, int] = defaultdict(int)
    for _, rec in records(run_dir):
        if rec["divisor"]:  # a micro-batch with no label: its loss is 0/0 and adds nothing
            nll[rec["step"]] += rec["loss"] * rec["divisor"]
        tokens[rec["step"]] += rec["supervised"]
    return {step: (nll[step] / tokens[step] if tokens[step] else math.nan) for step in sorted(nll)}


def scheme_of(run: RunResult) -> str:
    """`scheme` of a run's records (UNKNOWN where its run folder is gone)."""
    return scheme(run.run_dir)


def needed_reference_loss(run: RunResult, reference: RunResult) -> JudgingLoss:
    """The loss a second reference run needs for `run` to be judged at every step and on its
    update (`loss_weighting.needed`): the run's scheme where it differs from the reference's and
    the reference worker can train with it, its labels rolled where it claims so; the default
    where they agree."""
    return needed(run.run_dir, reference.run_dir)


def alike(run: RunResult, reference: RunResult) -> tuple[bool, str]:
    """(whether both weighted every token alike, what the detail says when not)."""
    mine, theirs = scheme_of(run), scheme_of(reference)
    if mine == theirs and mine in SCHEMES:
        return True, f"both {mine}"
    if UNKNOWN in (mine, theirs):
        who = run.backend if mine == UNKNOWN else reference.backend
        return False, (f"the loss normalisation of {who} is unknown (its records do not say what was "
                       "applied to each loss before backward: an older worker SDK)")
    if mine == OTHER:
        return False, f"{run.backend} normalises the loss as no reference can ({OTHER}; {reference.backend}: {theirs})"
    return False, (f"{run.backend} normalises the loss as {mine}, {reference.backend} as {theirs}: "
                   f"judging it needs a reference run with loss_scheme {mine}")


# The adapter settings that change what a LoRA step trains (framework_bench/worker/adapters.py).
ADAPTER_SETTINGS = ("lora_targets", "lora_head_adapted", "lora_rank", "lora_alpha", "lora_dropout", "lora_rslora",
                    "lora_dora")


def native_adapter_differences(run: RunResult, reference: RunResult) -> str | None:
    """In native mode, the adapter settings where the run's framework defaults differ from
    the reference's (XTuner's r=64, alpha 16, dropout 0.1 against the scenario's), said as one
    line; None in matched mode or where they agree. Only step 1 can then agree: B starts at
    zero, so the first forward pass is the base's whatever the adapters."""
    if (run.settings or {}).get("settings_mode") != "native":
        return None
    mine, theirs = run.settings or {}, reference.settings or {}
    differ = [f"{k} {mine.get(k)} vs {theirs.get(k)}" for k in ADAPTER_SETTINGS if k in mine and mine.get(k) != theirs.get(k)]
    return f"the adapters differ by the framework's native defaults ({'; '.join(differ)})" if differ else None


def relative_difference(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def step_differences(run: RunResult, reference: RunResult) -> dict[int, float]:
    """{step: relative difference of the canonical losses} over the steps both recorded."""
    steps = sorted(set(run.loss_curve) & set(reference.loss_curve))
    return {s: relative_difference(run.loss_curve[s], reference.loss_curve[s]) for s in steps}


def parity(run: RunResult, reference: RunResult, precision: str, name: str = "parity") -> Check:
    """The run's canonical losses against the reference's on the same rows, seed and scenario.
    Step 1 always: from the same initial weights it is one forward pass, the same for every
    framework whatever its normalisation. Every later step too where both weigh each token
    alike (the same `scheme`); otherwise a passing step 1 leaves the check `unverified`, saying
    which reference it needs: the later steps are shown, not judged."""
    for who, r in (("the run", run), ("the reference", reference)):
        if r.status not in ("ok", "unverified"):  # an older plugin's run, short of a claim, is judged too
            return Check(name=name, status="fail", detail=f"{who} ({r.backend}) ended {r.status}: {r.reason or ''}"[:300])
        if 1 not in r.loss_curve:  # a claim not made: owed by an `ok` run, missing already from an unverified one
            return Check(name=name, status="unverified" if r.status == "unverified" else "fail",
                         detail=f"{who} ({r.backend}) recorded no per-micro-batch losses")
    if run.seed != reference.seed:
        return Check(name=name, status="fail", detail=f"seeds differ: {run.seed} vs the reference's {reference.seed}")
    tolerance = PARITY_TOLERANCE[precision]
    # Native adapters that differ leave step 1 only to judge, whatever the normalisations.
    native = native_adapter_differences(run, reference)
    same, why = (False, native) if native else alike(run, reference)
    off = step_differences(run, reference)
    steps = sorted(off)
    judged = steps if same else [1]
    worst = max(judged, key=lambda s: off[s] if off[s] == off[s] else math.inf)
    later = [off[s] for s in steps if s > 1]
    detail = (f"step 1: {run.loss_curve[1]:.7f} vs {reference.backend} {reference.loss_curve[1]:.7f} "
              f"(relative {off[1]:.1e}, at most {tolerance:g})"
              + (f"; later steps at most {max(later):.1e} apart" if later else "")
              + (f"; {why}, every step judged" if same else f"; step 1 judged, later steps not: {why}"))
    if not off[worst] <= tolerance:  # NaN fails too
        return Check(name=name, status="fail", detail=f"step {worst} off by {off[worst]:.1e} (relative): {detail}")
    return Check(name=name, status="pass" if same or not later or native else "unverified", detail=detail)
