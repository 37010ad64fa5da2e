"""The dropout twin: the adapters of a native LoRA run that claims adapter dropout, judged with it off.

In native settings a framework trains its own adapters, and the referee judges the run against a
run of the reference trained with the adapters its settings ledger claims (rank, alpha, targets:
`reference.claimed_adapters`), at every step and on its update. Dropout draws random masks that
no two frameworks share, so a run claiming it is judged at step 1 only, where B is still zero
whatever the adapters: a worker could train smaller adapters than it claims (r=8 on q and v,
claiming every linear) behind a claim of dropout. So such a run also trains as its dropout twin:
the same backend on the scenario with the adapters its ledger claims and dropout 0, for
`twin.TWIN_WARMUP` + `twin.TWIN_MEASURED` steps, judged against the reference trained with the
same adapters (and the twin's loss normalisation, as any judging reference) at every step and
on its update. The twin runs in matched settings: native settings mean the framework's own
dropout, so only the scenario's adapters, given explicitly, can ask for another.

The `dropout_twin` check carries the twin's trainable and parameter counts and its step checks
(`twin.STEP_CHECKS`); the twin's clock and CPU checks judge its own timing, not the run's. A twin
that cannot run, whose ledger says a dropout other than 0 (the backend cannot train without it)
or adapters other than the run claims, or that was not judged, leaves the check `unverified`,
never `ok`. What it leaves: the twin is told its adapters, so a worker that trains what it is
told in matched settings and smaller adapters in native ones, its ledger saying the same in both,
is not caught (as a recipe of bf16 alone, hidden from the ledger, passes the fp32 twin).

Twins run once the round's runs ended, the backends' before the reference's; they are not stored
and not trials: the run's notes name their folders.
"""

from __future__ import annotations

from pydantic import ValidationError

from framework_bench.measure import verify
from framework_bench.measure.losses import ADAPTER_SETTINGS
from framework_bench.measure.metrics import RunResult
from framework_bench.measure.verify import Check
from framework_bench.run import twin
from framework_bench.run.reference import adapters_claimed
from framework_bench.scenario.scenario import MAX_NAME, Scenario

CHECK = "dropout_twin"
SETTINGS_MODE = "matched"  # the twin's: its adapters as the scenario names them
# The twin's checks that judge the adapters it trained (its clock and CPU checks judge its own timing).
JUDGED = ("trainable", "parameters", *twin.STEP_CHECKS)


def dropout(result: RunResult) -> float:
    """The adapter dropout `result`'s ledger claims (0 where it claims none)."""
    try:
        return float((result.settings or {}).get("lora_dropout") or 0.0)
    except (TypeError, ValueError):
        return 0.0


def twin_of(scenario: Scenario, result: RunResult) -> Scenario | str | None:
    """The dropout twin's scenario for a native run claiming adapter dropout; why none can judge
    it (a sentence); None where it needs none (matched settings, no dropout claimed, or the check
    left out: `FBENCH_UNCHECKED`)."""
    if (result.settings or {}).get("settings_mode") != "native" or not dropout(result) or CHECK in verify.unchecked():
        return None
    adapters = adapters_claimed(result.settings or {})
    if isinstance(adapters, str):
        return adapters
    steps = {"warmup": twin.TWIN_WARMUP, "measured": min(twin.TWIN_MEASURED, scenario.steps.measured)}
    try:
        return Scenario.model_validate({**scenario.model_dump(), "name": f"{scenario.name}_dropout_twin"[:MAX_NAME],
                                        "steps": {**scenario.steps.model_dump(), **steps},
                                        "finetune": {**scenario.finetune.model_dump(), **adapters}})
    except ValidationError as e:  # adapters on modules the model has not
        return f"the adapters its ledger claims do not fit the model: {e.errors()[0]['msg']}"


def check(result: RunResult, twin_run: RunResult | None, why_none: str | None = None) -> Check:
    """The `dropout_twin` check of `result` from its twin's run after the referee (None: none was
    run, `why_none` says why where known)."""
    if twin_run is None:
        return Check(name=CHECK, status="unverified", detail=(
            f"its dropout twin cannot run: {why_none}" if why_none else
            "no dropout twin was run beside it (its judge was given no way to run one)"))
    result.notes.append(f"its adapters judged in its dropout twin, at dropout 0 ({twin_run.status}; not stored, not a "
                        f"trial: {twin_run.run_dir})")
    if twin_run.status == "unsupported":
        return Check(name=CHECK, status="unverified", detail=f"its dropout twin cannot run: {twin.last_line(twin_run.reason)}")
    mine, theirs = result.settings or {}, twin_run.settings or {}
    if dropout(twin_run):
        return Check(name=CHECK, status="unverified", detail=(
            f"its dropout twin trained with lora_dropout {theirs.get('lora_dropout')}: {result.backend} cannot train "
            "these adapters without dropout, so they are judged at step 1 only"))
    if differ := [f"{k} {mine.get(k)!r} in the run, {theirs.get(k)!r} in the twin" for k in ADAPTER_SETTINGS
                  if k != "lora_dropout" and mine.get(k) != theirs.get(k)]:
        return Check(name=CHECK, status="unverified", detail=(
            f"its dropout twin trained other adapters than it claims ({'; '.join(differ)}): not judged"))
    judged = {c.name: c for c in twin_run.checks if c.name in JUDGED}
    if failed := [f"{c.name}: {c.detail}" for c in judged.values() if c.status == "fail"]:
        return Check(name=CHECK, status="fail", detail="at dropout 0: " + "; ".join(failed))
    if "parity" not in judged or judged["parity"].status != "pass":
        why = twin.last_line(twin_run.reason) or "its dropout twin was not judged"
        return Check(name=CHECK, status="unverified", detail=f"its dropout twin ended {twin_run.status}: {why}")
    return Check(name=CHECK, status="pass", detail=f"at dropout 0 over {len(twin_run.loss_curve)} steps: "
                 + "; ".join(f"{c.name} {c.status}" for c in judged.values()))
