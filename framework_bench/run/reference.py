"""The choice of reference: which installed backend judges every other's runs, and which of its
runs judges a given run (the round's, or one trained with the run's loss normalisation)."""

from __future__ import annotations

import os
from collections.abc import Callable

from framework_bench.measure import losses, verify
from framework_bench.measure.metrics import RunResult
from framework_bench.plugins import registry as plugins
from framework_bench.scenario.scenario import Scenario
from framework_bench.worker.loss_schemes import JudgingLoss

# Pins the reference to another installed backend (a new reference loop, or a stand-in in tests):
# the one whose runs judge every other's, named wherever its share is shown.
REFERENCE_ENV = "FBENCH_REFERENCE"


def _pinned() -> str:
    """`FBENCH_REFERENCE`'s value, spaces around it dropped ('' when unset)."""
    return os.environ.get(REFERENCE_ENV, "").strip()


def reference_backend() -> str | None:
    """The backend every other is judged against and shown as a share of: the one `FBENCH_REFERENCE`
    names (when installed), else the installed backend that declares itself the no-framework
    reference (`BackendInfo.reference`; two such are refused, `plugins.backends`)."""
    found = plugins.backends()
    pinned = _pinned()
    if pinned:
        return pinned if pinned in found else None
    return next((name for name, b in found.items() if b.info.reference), None)


def refusal() -> str | None:
    """Why no run can be judged as asked, said before any runs instead of storing each one
    `unverified` for a reason it does not name: `FBENCH_REFERENCE` names no working backend, or
    two installed backends each declare themselves the reference (both broken for it). None
    when there is a reference, or when none is asked for nor declared."""
    if _pinned():
        return None if reference_backend() else absent_reason()
    found = plugins.backends()
    pm = plugins.manager()
    declared = set()
    for _, plugin in pm.list_name_plugin():
        try:
            info = plugins.RegisteredBackend(pm, plugin).info
        except Exception:  # noqa: BLE001 - a plugin's own bug: `plugins.load_errors` says it
            continue
        if getattr(info, "reference", False) and info.name not in found:
            declared.add(info.name)
    if len(declared) > 1:  # each one's load error names them all
        return f"no backend can be the reference: {plugins.load_errors[min(declared)]}"
    return None


def absent_reason() -> str:
    """Why no reference runs, naming what was asked for: `FBENCH_REFERENCE`'s value when it names no
    installed backend, else that none declares itself the reference."""
    pinned = _pinned()
    if pinned:
        why = plugins.load_errors.get(pinned)
        return (f"{REFERENCE_ENV}={pinned!r} names " + (f"a broken backend: {why}" if why else
                f"no installed backend (installed: {', '.join(plugins.backends()) or 'none'})"))
    return f"no reference backend is installed ({REFERENCE_ENV} or BackendInfo.reference)"


# Trains the reference backend on a scenario, with a judging loss (the default: its own): its result.
RunReference = Callable[[Scenario, JudgingLoss], RunResult]
NATIVE_ADAPTERS = "native_adapters"  # FBENCH_UNCHECKED name: judge native adapters at step 1 only, as before


def adapters_claimed(settings: dict) -> dict | str:
    """The `finetune` fields (rank, alpha, targets; dropout 0) of the adapters a settings ledger
    claims, for a reference, or a dropout twin, trained with them; or why none can be: rsLoRA, DoRA
    or an adapted LM head, which no reference trains, or a ledger short of them (the trainable
    check says so)."""
    unshared = [k for k in ("lora_rslora", "lora_dora", "lora_head_adapted") if settings.get(k)]
    if unshared:
        return f"no reference trains adapters with {', '.join(unshared)}"
    try:
        return {"rank": int(settings["lora_rank"]), "alpha": float(settings["lora_alpha"]), "dropout": 0.0,
                "targets": str(settings["lora_targets"]).split(",")}
    except (KeyError, TypeError, ValueError):
        return "its settings ledger does not say which adapters it trained (lora_rank, lora_alpha, lora_targets)"


def claimed_adapters(result: RunResult, reference: RunResult) -> dict | None:
    """The `finetune` fields of a reference trained with the adapters `result` claims, where they
    differ from the reference's (native mode: a framework's own rank, alpha, targets), so that
    every step and the update are judged against the adapters the run says it trained; None where
    they agree, or where no reference can train the same (`adapters_claimed`) or the run's own
    draws differ from any reference's (dropout: judged at step 1, and at dropout 0 in its dropout
    twin, `dropout_twin.py`)."""
    if NATIVE_ADAPTERS in verify.unchecked() or not losses.native_adapter_differences(result, reference):
        return None
    claim = result.settings or {}
    adapters = adapters_claimed(claim)
    return None if claim.get("lora_dropout") or isinstance(adapters, str) else adapters


def judging_reference(result: RunResult, reference: RunResult | None, scenario: Scenario,
                      run_reference: RunReference, made: dict[tuple, RunResult]) -> RunResult | None:
    """The reference run `result` is judged against: the round's, or a run of the reference
    backend trained as `result` says it trained where that differs: with its loss
    (`losses.needed_reference_loss`: XTuner's mean of per-micro-batch means at grad_accum 2, HF
    Trainer's labels counted before the shift, ms-swift's SP labels rolled) and with its native
    adapters (`claimed_adapters`).
    Made once per round reference and what it is trained with (`made`). It judges only: not a
    trial of the reference's speed, so it is not stored; the run's notes name its folder."""
    if reference is None or reference.status not in ("ok", "unverified") or result.status not in ("ok", "unverified"):
        return reference
    loss = losses.needed_reference_loss(result, reference)
    adapters = claimed_adapters(result, reference)
    if loss == JudgingLoss() and adapters is None:
        return reference
    key = (id(reference), loss, repr(adapters))
    if key not in made:
        trained = scenario if adapters is None else Scenario.model_validate(
            {**scenario.model_dump(), "finetune": {**scenario.finetune.model_dump(), **adapters}})
        made[key] = run_reference(trained, loss)
    judging = made[key]
    how = "; ".join(p for p in (loss.said(), adapters and "the run's own adapters "
                                + ", ".join(f"{k} {v}" for k, v in adapters.items())) if p)
    result.notes.append(f"judged against a run of {reference.backend} trained with {how} "
                        f"({judging.status}; not stored, not a trial: {judging.run_dir})")
    return judging
