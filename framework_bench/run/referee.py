"""The referee: the one judging function every command calls (`fbench run`, `compare`,
`check-backend`, `results collect`), so that a run passes or fails the same checks whichever
command ran it.

A run reaches the referee once its own claims were checked at read-back
(`framework_bench/run/readback.py`). The referee's word is parity with the reference's run on the
same scenario, rows and seed: the canonical losses at every step, the update projection, and (a
flag) the time from the seed's reveal to the update claim. No run is `ok` without a finished
reference.
"""

from __future__ import annotations

import math
from functools import partial

from framework_bench.measure import losses, update, verify
from framework_bench.measure.reveal_checks import first_window_check, projection_delay_check
from framework_bench.measure.metrics import RunResult
from framework_bench.measure.verify import Check
from framework_bench.run import dropout_twin, twin
from framework_bench.run.hooks import tail_of
from framework_bench.run.reference import judging_reference
from framework_bench.scenario.scenario import Scenario
from framework_bench.worker.loss_schemes import JudgingLoss

# A reason is read on a terminal: its head and tail, never a whole log or a list of 200,000 steps.
REASON_LINES = 60
REASON_CHARS = 4000


def judge(result: RunResult, reference: RunResult | None, scenario: Scenario,
          absent: str = "none was run", run_twin: twin.RunTwin | None = None) -> RunResult:
    """The last word on a run whose own checks passed (`ok`, or `unverified` for want of some
    claim): its parity with `reference`, which can only make it `invalid` or `unverified`; in a
    bf16 scenario, its training step in its fp32 twin too (`twin.py`: `run_twin` runs the twins
    and the reference's judging runs of them; None where the launcher runs no twin); in a native
    LoRA run claiming adapter dropout, its adapters in its dropout twin (`dropout_twin.py`, run by
    `run_twin` in matched settings).
    Without a reference fit to judge (`absent` says why there was none) it is `unverified`,
    never `ok`. Any other status passes through, its reason shortened."""
    if result.status in ("ok", "unverified"):
        try:
            if missing := _unfit(reference, absent):
                result.status = "unverified"
                result.reason = "; ".join(p for p in (result.reason, missing) if p)
            else:
                _parity(result, reference, scenario, _twin_check(result, reference, scenario, run_twin),
                        _dropout_twin_check(result, reference, scenario, run_twin))
        except Exception as e:  # noqa: BLE001 - a bug in the checks must not lose the run
            result.status = "failed"
            result.reason = f"fbench could not judge the run: {type(e).__name__}: {e}\n{tail_of(e)}".rstrip()
    if result.reason:
        result.reason = shortened(result.reason)
    return result


def _unfit(reference: RunResult | None, absent: str) -> str | None:
    """Why `reference` cannot judge, or None. A reference `unverified` for a figure of its own
    the host could not read still judges: its losses and projection hold."""
    if reference is None:
        return f"parity not judged: no reference run ({absent})"
    if reference.status not in ("ok", "unverified"):
        return f"parity not judged: the reference {reference.backend} ended {reference.status}"
    if any(not math.isfinite(loss) for loss in reference.loss_curve.values()):
        return f"parity not judged: the reference {reference.backend}'s losses are not all finite"
    return None


def _twin_check(result: RunResult, reference: RunResult, scenario: Scenario,
                run_twin: twin.RunTwin | None) -> Check | None:
    """The `fp32_twin` check of a bf16 run: its twin judged against the reference's twin (trained as
    the twin says it trained, as `judging_reference` does for any run); None in fp32. Sequence
    parallel and varlen twins run too (`twin.twin_of`): one its backend refuses is `unverified`."""
    twin_scenario = twin.twin_of(scenario)
    if twin_scenario is None:
        return None
    if run_twin is None:
        return twin.check(result, None)
    return twin.check(result, _judged_twin(result.backend, reference.backend, twin_scenario, run_twin))


def _dropout_twin_check(result: RunResult, reference: RunResult, scenario: Scenario,
                        run_twin: twin.RunTwin | None) -> Check | None:
    """The `dropout_twin` check of a native LoRA run claiming adapter dropout: its dropout twin (its
    backend on the scenario with the adapters it claims, dropout 0) judged against the reference
    trained so, both in matched settings; None where none is needed (`dropout_twin.twin_of`)."""
    twin_scenario = dropout_twin.twin_of(scenario, result)
    if twin_scenario is None:
        return None
    if isinstance(twin_scenario, str):
        return dropout_twin.check(result, None, why_none=twin_scenario)
    if run_twin is None:
        return dropout_twin.check(result, None)
    matched = partial(run_twin, settings_mode=dropout_twin.SETTINGS_MODE)
    return dropout_twin.check(result, _judged_twin(result.backend, reference.backend, twin_scenario, matched))


def _judged_twin(backend: str, reference: str, twin_scenario: Scenario, run: twin.RunTwin) -> RunResult:
    """`backend`'s run of `twin_scenario` (made by `run`), judged against `reference`'s (trained as
    the twin says it trained, as `judging_reference` does for any run) where it ended `ok` or
    `unverified`."""
    own = run(backend, twin_scenario, JudgingLoss())
    if own.status not in ("ok", "unverified"):
        return own
    reference_twin = judging_reference(own, run(reference, twin_scenario, JudgingLoss()), twin_scenario,
                                       lambda trained, loss: run(reference, trained, loss), {})
    return judge(own, reference_twin, twin_scenario)


def _parity(result: RunResult, reference: RunResult, scenario: Scenario, *twin_checks: Check | None) -> None:
    """Losses, update projection and projection delay against the reference (and the twins'
    checks): a failed check makes the run `invalid`; one that could not be judged leaves it
    `unverified`, saying why."""
    checks = [c for c in (losses.parity(result, reference, scenario.precision),
                          update.parity(result, reference, scenario.precision),
                          update.parts_parity(result, reference),
                          update.parity(result, reference, scenario.precision, "warmup_update_parity", update.WARMUP_UPDATE),
                          projection_delay_check(result, reference), first_window_check(result, reference),
                          *twin_checks) if c is not None]
    result.checks += checks
    reason, flags = verify.fold(checks)
    result.flags += flags
    unjudged = [c for c in checks if c.status == "unverified" and c.name in verify.BLOCKING
                and c.name not in verify.unchecked()]
    if reason:
        result.status, result.reason = "invalid", reason
    elif unjudged:
        result.status = "unverified"
        result.reason = "; ".join([result.reason or ""] + [f"{c.name} not judged: {c.detail}" for c in unjudged]).lstrip("; ")


def shortened(reason: str) -> str:
    """`reason`'s head and tail, within REASON_LINES and REASON_CHARS."""
    lines = reason.splitlines()
    if len(lines) > REASON_LINES:
        lines = lines[:REASON_LINES // 2] + [f"[... {len(lines) - REASON_LINES} lines left out ...]"] + lines[-REASON_LINES // 2:]
    reason = "\n".join(lines)
    if len(reason) > REASON_CHARS:
        half = REASON_CHARS // 2
        reason = f"{reason[:half]} [... {len(reason) - REASON_CHARS} characters left out ...] {reason[-half:]}"
    return reason
