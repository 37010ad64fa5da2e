"""The fp32 twin: a bf16 run's training step judged where fp32 can see it.

bf16's tolerances (losses 1e-2, the update 2e-1 of |dw|: framework_bench/measure/losses.py and
update.py) are wider than what a misconfigured step moves: AdamW's betas and weight decay, no
gradient clipping, attention dropout, a per-document attention mask all pass them
(docs/referee.md). So a run of a bf16 scenario is judged twice: its speed and its bf16 parity as
before, and its training step in its fp32 twin: the same scenario (model shape, rows, optimizer,
settings, launcher, sequence split, per-document attention) in fp32 for `TWIN_WARMUP` +
`TWIN_MEASURED` steps, the same backend against the reference's fp32 twin, at fp32 tolerances.
The `fp32_twin` check carries the twin's parity, update and update-parts checks; the twin's own
clock and CPU checks are not the run's (its figures are never shown). The twin trains the run's
step only if its settings ledger is the run's: only what follows from the precision may differ
(`PRECISION_SETTINGS`), so a recipe applied in bf16 alone, and said in the ledger, fails here.

Which kernels run a twin is its backend's: flash-attention has no fp32 kernels, so a sequence
split or a per-document mask runs in fp32 only where the backend has another kernel for it (the
torch reference's Ulysses attends with SDPA). A backend that has none refuses its twin, and the run
is `unverified` naming why: a bf16 run whose twin cannot run is never `ok`.

Twins run after the round's runs ended, the backends' first and the reference's last (what a
twin could read of a reference run's files it can only read once its own ended). They are not
stored and not trials: the run's notes name their folders.
"""

from __future__ import annotations

from collections.abc import Callable

from framework_bench.measure.metrics import RunResult
from framework_bench.measure.verify import Check
from framework_bench.scenario.scenario import Scenario

CHECK = "fp32_twin"
TWIN_WARMUP, TWIN_MEASURED = 1, 4
# The twin's checks that are the training step's; its clock, CPU and claim checks judge its own timing.
STEP_CHECKS = ("parity", "update", "update_parity", "update_parts")
# Ledger keys (framework_bench/worker/settings.py) a twin may record otherwise than its run: the
# dtypes and the recipe that follow from the precision, the attention kernel (flash-attention has no
# fp32 kernels: parity judges what replaces it), and the seed (the run's identity, not its recipe).
PRECISION_SETTINGS = frozenset({
    "param_dtype", "autocast_dtype", "loss_scaler", "grad_reduce_dtype", "master_weights",
    "base_dtype", "adapter_dtype", "compute_dtype", "quant_storage",
    "attention", "attention_kv_repeat", "seed",
})

# Runs a backend on a scenario (the twin), with a judging loss for the reference (the default: its own), and
# optionally in other settings than the round's (a dropout twin's, `dropout_twin.py`): its result.
RunTwin = Callable[..., RunResult]


def twin_of(scenario: Scenario) -> Scenario | None:
    """The fp32 twin of a bf16 scenario, its sequence parallel and attention kept; None for one in
    fp32 already (its own run is judged at fp32)."""
    if scenario.precision != "bf16":
        return None
    steps = scenario.steps.model_copy(update={"warmup": TWIN_WARMUP,
                                              "measured": min(TWIN_MEASURED, scenario.steps.measured)})
    return scenario.model_copy(update={"name": f"{scenario.name}_fp32_twin", "precision": "fp32", "steps": steps})


def check(result: RunResult, twin: RunResult | None) -> Check:
    """The `fp32_twin` check of `result` from its twin's run after the referee (None: none was run).
    A twin that did not run, or was not judged (no reference twin fit to judge it), leaves it
    `unverified`; one whose ledger is not the run's, or that failed a step check, fails it."""
    if twin is None:
        return Check(name=CHECK, status="unverified",
                     detail="no fp32 twin was run beside it (its judge was given no way to run one)")
    result.notes.append(f"its training step judged in its fp32 twin ({twin.status}; not stored, not a trial: "
                        f"{twin.run_dir})")
    if twin.status == "unsupported":
        return Check(name=CHECK, status="unverified", detail=f"its fp32 twin cannot run: {last_line(twin.reason)}")
    step = {c.name: c for c in twin.checks if c.name in STEP_CHECKS}
    failed = [f"{c.name}: {c.detail}" for c in step.values() if c.status == "fail"]
    if differences := ledger_differences(result.settings, twin.settings):
        failed.append(f"its fp32 twin trained otherwise than it ({differences}): the twin did not judge its step")
    if failed:
        return Check(name=CHECK, status="fail", detail="in fp32: " + "; ".join(failed))
    if "parity" not in step or step["parity"].status != "pass":
        why = last_line(twin.reason) or "its fp32 twin was not judged"
        return Check(name=CHECK, status="unverified", detail=f"its fp32 twin ended {twin.status}: {why}")
    return Check(name=CHECK, status="pass", detail=f"in fp32 over {len(twin.loss_curve)} steps: "
                 + "; ".join(f"{c.name} {c.status}" for c in step.values()))


def ledger_differences(run: dict | None, twin: dict | None) -> str:
    """The settings the twin's ledger records otherwise than the run's, beyond `PRECISION_SETTINGS`
    ('' when none, or when either recorded none: the run's own `settings` check says so). A key
    one of them records and the other does not is a difference."""
    if not run or not twin:
        return ""

    def said(ledger: dict, key: str) -> str:
        return repr(ledger[key]) if key in ledger else "not recorded"
    keys = sorted((run.keys() | twin.keys()) - PRECISION_SETTINGS)
    return ", ".join(f"{k} {said(run, k)} in bf16, {said(twin, k)} in fp32" for k in keys
                     if said(run, k) != said(twin, k))


def last_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[-1][:300] if (text or "").strip() else ""
