"""The fp32 twin: a bf16 run's training step judged where fp32 can see it.

bf16's tolerances (losses 1e-2, the update 2e-1 of |dw|: framework_bench/measure/losses.py and
update.py) are wider than what a misconfigured step moves: AdamW's betas and weight decay, no
gradient clipping, attention dropout, a per-document attention mask all pass them
(docs/referee.md). So a run of a bf16 scenario is judged twice: its speed and its bf16 parity as
before, and its training step in its fp32 twin: the same scenario (model shape, rows, optimizer,
settings, launcher) in fp32 for `TWIN_WARMUP` + `TWIN_MEASURED` steps, the same backend against the reference's fp32 twin,
at fp32 tolerances. The `fp32_twin` check carries the twin's parity, update and update-parts
checks; the twin's own clock and CPU checks are not the run's (its figures are never shown).

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

# Runs a backend on a scenario (the twin), with a loss scheme for the reference (None: its own): its result.
RunTwin = Callable[[str, Scenario, "str | None"], RunResult]


def no_twin(scenario: Scenario) -> str | None:
    """Why a bf16 scenario can have no fp32 twin, or None: flash-attention, which sequence parallel
    and per-example (varlen) attention need, has no fp32 kernels."""
    if scenario.sequence_parallel > 1 or scenario.attention == "varlen":
        return ("its fp32 twin cannot run: " + ("sequence parallel" if scenario.sequence_parallel > 1 else
                "varlen attention") + " needs flash-attention, which has no fp32 kernels")
    return None


def twin_of(scenario: Scenario) -> Scenario | None:
    """The fp32 twin of a bf16 scenario; None for one in fp32 already (its own run is judged at
    fp32) or one with `no_twin`."""
    if scenario.precision != "bf16" or no_twin(scenario):
        return None
    steps = scenario.steps.model_copy(update={"warmup": TWIN_WARMUP,
                                              "measured": min(TWIN_MEASURED, scenario.steps.measured)})
    return scenario.model_copy(update={"name": f"{scenario.name}_fp32_twin", "precision": "fp32", "steps": steps})


def check(result: RunResult, twin: RunResult | None) -> Check:
    """The `fp32_twin` check of `result` from its twin's run after the referee (None: none was run):
    a twin without a passed `parity` was not judged (no reference twin fit to judge it)."""
    if twin is None:
        return Check(name=CHECK, status="skipped", detail="no fp32 twin was run beside it (a SLURM round runs none yet)")
    result.notes.append(f"its training step judged in its fp32 twin ({twin.status}; not stored, not a trial: "
                        f"{twin.run_dir})")
    if twin.status == "unsupported":
        return Check(name=CHECK, status="skipped", detail=f"its fp32 twin cannot run here: {_last_line(twin.reason)}")
    step = {c.name: c for c in twin.checks if c.name in STEP_CHECKS}
    failed = [c for c in step.values() if c.status == "fail"]
    if failed:
        return Check(name=CHECK, status="fail", detail="in fp32: " + "; ".join(f"{c.name}: {c.detail}" for c in failed))
    if "parity" not in step or step["parity"].status != "pass":
        why = _last_line(twin.reason) or "its fp32 twin was not judged"
        return Check(name=CHECK, status="unverified", detail=f"its fp32 twin ended {twin.status}: {why}")
    return Check(name=CHECK, status="pass", detail=f"in fp32 over {len(twin.loss_curve)} steps: "
                 + "; ".join(f"{c.name} {c.status}" for c in step.values()))


def _last_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[-1][:300] if (text or "").strip() else ""
