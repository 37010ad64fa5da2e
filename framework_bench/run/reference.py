"""The choice of reference: which installed backend judges every other's runs, and which of its
runs judges a given run (the round's, or one trained with the run's loss normalisation)."""

from __future__ import annotations

import os
from collections.abc import Callable

from framework_bench.measure import losses
from framework_bench.measure.metrics import RunResult
from framework_bench.plugins import registry as plugins

# Pins the reference to another installed backend (a new reference loop, or a stand-in in tests):
# the one whose runs judge every other's, named wherever its share is shown.
REFERENCE_ENV = "FBENCH_REFERENCE"


def reference_backend() -> str | None:
    """The backend every other is judged against and shown as a share of: the one `FBENCH_REFERENCE`
    names (when installed), else the installed backend that declares itself the no-framework
    reference (`BackendInfo.reference`; two such are refused, `plugins.backends`)."""
    found = plugins.backends()
    pinned = os.environ.get(REFERENCE_ENV)
    if pinned:
        return pinned if pinned in found else None
    return next((name for name, b in found.items() if b.info.reference), None)


def absent_reason() -> str:
    """Why no reference runs, naming what was asked for: `FBENCH_REFERENCE`'s value when it names no
    installed backend, else that none declares itself the reference."""
    pinned = os.environ.get(REFERENCE_ENV)
    if pinned:
        why = plugins.load_errors.get(pinned)
        return (f"{REFERENCE_ENV}={pinned!r} names " + (f"a broken backend: {why}" if why else
                f"no installed backend (installed: {', '.join(plugins.backends()) or 'none'})"))
    return f"no reference backend is installed ({REFERENCE_ENV} or BackendInfo.reference)"


def reference_first(backend_names: list[str]) -> tuple[list[str], str | None]:
    """The backends with the reference first, and the reference's name: the order a SLURM
    compare submits them, so that every other run records the reference's run folder."""
    reference_name = reference_backend()
    return sorted(backend_names, key=lambda b: b != reference_name), reference_name


RunReference = Callable[[str], RunResult]  # trains the reference backend with a loss scheme: its result


def judging_reference(result: RunResult, reference: RunResult | None, run_reference: RunReference,
                      made: dict[tuple[int, str], RunResult]) -> RunResult | None:
    """The reference run `result` is judged against: the round's, or where `result` normalises the
    loss otherwise (`losses.needed_reference_scheme`: XTuner's mean of per-micro-batch means at
    grad_accum 2, HF Trainer's labels counted before the shift), a run of the reference backend
    trained that way (`run_reference(scheme)`), made once per round reference and scheme (`made`).
    It judges only: not a trial of the reference's speed, so it is not stored; the run's notes
    name its folder."""
    if reference is None or reference.status not in ("ok", "unverified") or result.status not in ("ok", "unverified"):
        return reference
    scheme = losses.needed_reference_scheme(result, reference)
    if scheme is None:
        return reference
    key = (id(reference), scheme)
    if key not in made:
        made[key] = run_reference(scheme)
    judging = made[key]
    result.notes.append(f"judged against a run of {reference.backend} trained with loss_scheme {scheme} "
                        f"({judging.status}; not stored, not a trial: {judging.run_dir})")
    return judging
