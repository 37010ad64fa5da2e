"""The update after training, host side: the projection seed the host reveals once
the last measured step ended, and its checks of the worker's projection
(`framework_bench/worker/update.py`).

- `Reveal`: what the host's clock watcher (`framework_bench/measure/clock.py`) reveals, and when:
  once every rank's clock line says the last step ended, it writes the seed into the run folder
  (`REVEAL_FILE`) and keeps the stamp in its record of the run.
- `projection_seed`: the seed of this host process for a scenario and compare seed: derived from
  a secret drawn at start-up, so every run of one `fbench compare` (or `check-backend`) on a
  scenario projects onto the same vector, and no worker can know it before its reveal. Under
  SLURM the watcher on the node draws its own (no run there has a reference to match).
- `check`: the worker projected with the revealed seed, and the weights moved; the same of the
  projection the worker makes when the warm-up ends (`WARMUP_UPDATE`: the watcher reveals its seed
  once every rank ended the last warm-up step; `reveal_checks.warmup_update_check` adds when).
- `parity`: the projection (or the warm-up's) equals the reference's on the same rows and seeds, where both
  weighed each token alike (the same loss normalisation `scheme`, framework_bench/measure/losses.py):
  |p - p_ref| / |dw_ref|, the difference over the reference's update norm (reported with the
  projection, computed in the same pass). The projection is ~N(0, |dw|^2) over the random
  vector, so dividing by the reference's own projection made the figure's scale a matter of
  luck; the norm is not. A run that skipped updates, trained a subset of the
  model, other rows or with another optimizer cannot match. Where the normalisations differ or
  are unknown, or the reference reported no norm, the check is `unverified` with why, never
  `skipped` and never passed. Only projections onto other vectors (SLURM jobs, whose watchers
  each draw a seed) are `skipped`: no comparison applies, the loss parity judges the training.

What it does not stop: a worker that reads other runs' folders or the results store (the
reference's projection is there) and writes a matching figure. A plugin runs code in the host
anyway; the checks catch a worker whose claims misreport its work, not one that attacks the host.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import secrets
from dataclasses import dataclass
from pathlib import Path

from framework_bench.worker.files import INITIAL_REVEAL_FILE, REVEAL_FILE, UPDATE_FILE
from framework_bench.worker.update import WARMUP_REVEAL_FILE, WARMUP_UPDATE_FILE

_PROCESS_SECRET = secrets.token_bytes(16)
# |p - p_ref| / |dw_ref| (fp32 / bf16 autocast): far above what honest backends measured against
# the torch reference normalising alike, under the mildest lie in fp32; in bf16 the noise hides
# mild lies, not SGD (benchmarks/projection_spread.py; the figures: docs/calibration.md).
PARITY_TOLERANCE = {"fp32": 1e-4, "bf16": 2e-1}


def projection_seed(scenario: str, seed: int, round_: int = 0) -> int:
    """This host process's projection seed for `scenario` at the compare's `seed` in its round
    `round_` (31 bits): the runs of one round share it (each is judged against that round's
    reference, whose folder no other run of the round can read: `run/sealing.py`), and no
    round's can be read from another's, a reference's projection from an earlier round included
    (`new_round`)."""
    digest = hashlib.blake2b(f"{scenario}/{seed}/{round_}".encode(), key=_PROCESS_SECRET, digest_size=4).digest()
    return int.from_bytes(digest, "big") >> 1


_rounds = itertools.count(1)


def new_round() -> int:
    """A round number this process has not given before: a compare's round (and a run alone: 0)."""
    return next(_rounds)


def initial_seed(seed: int, round_: int, pinned: bool = False) -> int:
    """The seed the trained weights start from, revealed once every rank is ready for its first
    step (`framework_bench/worker/initial_weights_worker.py`: fill_revealed): this host process's,
    for the compare's `seed` in its round, so no worker knows it before; the runs of a round share
    it. A pinned seed (`--seed`) gives `seed` itself: reproducible across compares, which then
    cannot exclude training before the first step (`design.PINNED_SEED_NOTE`)."""
    if pinned:
        return seed
    digest = hashlib.blake2b(f"initial/{seed}/{round_}".encode(), key=_PROCESS_SECRET, digest_size=4).digest()
    return int.from_bytes(digest, "big") >> 1


def derived_initial_seed(projection_seed: int) -> int:
    """The initial seed of a SLURM job's watcher, which is handed its projection seed only: one
    the worker cannot derive before either reveal."""
    return int.from_bytes(hashlib.blake2b(f"initial/{projection_seed}".encode(), digest_size=4).digest(), "big") >> 1


def derived_warmup_seed(projection_seed: int, secret: bytes | None = _PROCESS_SECRET) -> int:
    """The seed of the projection at the warm-up's end, from the round's projection seed: the runs
    of a round share it. Keyed by this host process's secret, so that no worker can work the
    projection seed out of it; a SLURM job's watcher (a process of its own) derives it unkeyed
    (`secret=None`), as its initial seed, for its round's runs to share it."""
    digest = hashlib.blake2b(f"warmup/{projection_seed}".encode(), key=secret or b"", digest_size=4).digest()
    return int.from_bytes(digest, "big") >> 1


@dataclass(frozen=True)
class Reveal:
    """Reveal `initial_seed` once each of `ranks` ranks said it is ready for its first step,
    `warmup_seed` (its projection's) once each ended the last warm-up step, and `seed` (the projection's)
    once each ended step `after_step` (the last one)."""

    after_step: int
    ranks: int
    seed: int
    initial_seed: int
    warmup_seed: int | None = None  # None: this host process's (`derived_warmup_seed`)

    def __post_init__(self) -> None:
        if self.warmup_seed is None:
            object.__setattr__(self, "warmup_seed", derived_warmup_seed(self.seed))

    def write(self, run_dir: Path) -> None:
        _write(Path(run_dir) / REVEAL_FILE, {"projection_seed": self.seed})

    def write_warmup(self, run_dir: Path) -> None:
        _write(Path(run_dir) / WARMUP_REVEAL_FILE, {"projection_seed": self.warmup_seed})

    def write_initial(self, run_dir: Path) -> None:
        _write(Path(run_dir) / INITIAL_REVEAL_FILE, {"initial_seed": self.initial_seed})


def _write(path: Path, content: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(content))
    tmp.replace(path)  # whole or absent: the worker polls for it


@dataclass(frozen=True)
class Claim:
    """A projection claim: its check's name, the worker's file, the watcher's record of its seed's
    reveal (in the stamps), and when that seed is revealed, in words."""

    name: str
    file: str
    reveal: str
    when: str


UPDATE = Claim("update", UPDATE_FILE, "reveal", "after the last step")
WARMUP_UPDATE = Claim("warmup_update", WARMUP_UPDATE_FILE, "warmup_reveal", "when the warm-up ended")


def _claim(run_dir: Path, file: str = UPDATE_FILE) -> dict | None:
    try:
        claim = json.loads((Path(run_dir) / file).read_text())
        norm = claim.get("norm")  # absent from an older worker SDK's claim
        parts = {f"{part}_{figure}": float(claim[part][figure]) for part in ("adapters", "base") if part in claim
                 for figure in ("projection", "norm")}  # LoRA: each part alone
        model_parts = {f"{PART}{part}:{figure}": float(value[figure]) for part, value in claim.get("parts", {}).items()
                       for figure in ("projection", "norm")}  # absent from an older worker SDK's
        return {"projection_seed": int(claim["projection_seed"]), "projection": float(claim["projection"]),
                "norm": None if norm is None else float(norm), "seconds": claim.get("seconds"), **parts, **model_parts}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def check(run_dir: Path, stamps: dict | None, adapters: bool = False, of: Claim = UPDATE, still: bool = False):
    """The `update` check of a finished run (or `of` another projection claim), from the worker's
    claim and the host's record of the seed it revealed (`stamps`, the watcher's record:
    `clock_checks.load_stamps`). With LoRA adapters (`adapters`) two figures more: the frozen base
    did not move (`unmoved`: |dw| 0 but for the rounding of recomputed initial values) and the
    adapters did. `still`: no optimizer step had ended by then (a warm-up of fewer
    micro-iterations than one step), so the weights must be the initial ones."""
    from framework_bench.measure.verify import Check  # here: the node-side watcher imports this module

    name, claim, revealed = of.name, _claim(run_dir, of.file), (stamps or {}).get(of.reveal)
    if claim is None:
        why = "" if revealed else f" (the host revealed no seed: it never saw every rank get there, {of.when})"
        return Check(name=name, status="unverified",
                     detail=f"unverified: the worker reported no projection {of.when}{why}")
    if not revealed:
        return Check(name=name, status="unverified", detail="unverified: the host kept no record of a revealed seed")
    figures = {**claim, "revealed_seed": revealed["seed"]}
    if claim["projection_seed"] != revealed["seed"]:
        return Check(name=name, status="fail", figures=figures,
                     detail=f"projected with seed {claim['projection_seed']}, the host revealed {revealed['seed']}")
    if still:
        if claim["projection"] == 0.0:
            return Check(name=name, status="pass", figures=figures,
                         detail=f"the weights unchanged {of.when}, as due: no optimizer step had ended")
        return Check(name=name, status="fail", figures=figures, detail=(
            f"the weights project to {claim['projection']} {of.when}, before any optimizer step had ended"))
    if not math.isfinite(claim["projection"]) or claim["projection"] == 0.0:
        return Check(name=name, status="fail", figures=figures, detail=(
            f"the weights project to {claim['projection']} {of.when}: "
            + ("the weights never changed" if claim["projection"] == 0.0 else "not a number")))
    detail = f"(weights - initial weights) . v = {claim['projection']:.6e} with the seed revealed {of.when}"
    if not adapters:
        return Check(name=name, status="pass", figures=figures, detail=detail)
    if "base_norm" not in claim or "adapters_norm" not in claim:
        return Check(name=name, status="unverified", figures=figures, detail=(
            "unverified: the worker's projection does not part the frozen base from the adapters (an older worker SDK)"))
    base, adapted = claim["base_norm"], claim["adapters_norm"]
    if not adapted > 0.0:  # NaN fails too
        return Check(name=name, status="fail", figures=figures,
                     detail=f"the adapters never changed: |dw| over the adapters {adapted}")
    if not unmoved(base, adapted):
        return Check(name=name, status="fail", figures=figures, detail=(
            f"the frozen base moved: |dw| over the base {base:.3e}, over the adapters {adapted:.3e}"))
    still = "|dw| 0" if base == 0.0 else f"|dw| {base:.1e}, the rounding of a recomputed initial value"
    return Check(name=name, status="pass", figures=figures,
                 detail=f"{detail}; base unchanged ({still}), adapters |dw| {adapted:.3e}")


# A part of the model did not move when its |dw| is at most this fraction of the run's whole
# |dw|: an element never updated adds 0 but for the rounding of its recomputed initial value
# (one ulp of one element, rarely), one AdamW step of one element adds about the learning rate
# (the figures: docs/calibration.md, "Frozen parts").
FROZEN_RATIO = 1e-6


def unmoved(norm: float, whole: float | None) -> bool:
    """A part with this |dw| did not move, in a run whose whole update's |dw| is `whole`."""
    return norm == 0.0 or (whole is not None and norm <= FROZEN_RATIO * whole)  # NaN moved


# A part of the model moved as the reference's part when its |dw| is within this factor of the
# reference's: wide, for bf16's noise and the frameworks' reduction orders; a frozen part is
# `unmoved`, one trained at a tenth of the rate far outside (docs/calibration.md).
PART_NORM_RATIO = 2.0
PART = "part:"  # the `update` check's figures of one part: "part:<name>:norm", "part:<name>:projection"


def _part_norms(figures: dict) -> dict[str, float]:
    """{part: |dw|} from an `update` check's figures (empty from an older worker SDK's)."""
    return {key[len(PART):].rsplit(":", 1)[0]: value for key, value in figures.items()
            if key.startswith(PART) and key.endswith(":norm")}


def _passed(result, of: Claim = UPDATE) -> dict | None:
    return next((c.figures for c in result.checks if c.name == of.name and c.status == "pass"), None)


def parts_parity(run, reference, name: str = "update_parts"):
    """Each part of the model (embeddings, each decoder layer, final norm, head, adapters:
    `framework_bench/worker/update.py`) moved as the reference's did: its |dw| within
    `PART_NORM_RATIO` of the reference's part, a part the reference left unmoved unmoved. A frozen
    part fails however small its share of the whole (the embeddings in bf16 hide in the whole
    projection's tolerance). None where `update_parity` has nothing to compare (no passed update,
    other vectors, native adapters) or the reference reports no parts (an older worker SDK)."""
    from framework_bench.measure import losses
    from framework_bench.measure.verify import Check

    mine, theirs = _passed(run), _passed(reference)
    if (mine is None or theirs is None or mine["projection_seed"] != theirs["projection_seed"]
            or losses.native_adapter_differences(run, reference)):
        return None
    ours, ref_parts = _part_norms(mine), _part_norms(theirs)
    if not ref_parts:
        return None
    if not ours:
        return Check(name=name, status="unverified", detail=(
            f"the reference {reference.backend} reports |dw| per part of the model, the run does not (an older worker SDK)"))
    ratios, off = {}, []
    for part in sorted(set(ref_parts) | set(ours)):
        ref_norm, norm = ref_parts.get(part, 0.0), ours.get(part, 0.0)
        still, ref_still = unmoved(norm, mine.get("norm")), unmoved(ref_norm, theirs.get("norm"))
        if still and ref_still:
            continue
        ratio = math.inf if ref_still else 0.0 if still else norm / ref_norm
        ratios[part] = ratio
        if not 1 / PART_NORM_RATIO <= ratio <= PART_NORM_RATIO:  # NaN fails too
            off.append(f"{part} |dw| {norm:.3e} against {ref_norm:.3e}" + (" (frozen)" if still else ""))
    figures = {f"ratio:{part}": ratio for part, ratio in ratios.items()}
    if off:
        return Check(name=name, status="fail", figures=figures, detail=(
            f"parts of the model moved otherwise than {reference.backend}'s (|dw| not within {PART_NORM_RATIO:g}x): "
            + "; ".join(off)))
    spread = f"{min(ratios.values()):.3f}-{max(ratios.values()):.3f}" if ratios else "none moved"
    return Check(name=name, status="pass", figures=figures, detail=(
        f"each of {len(ratios)} parts moved as {reference.backend}'s: |dw| ratios {spread}"))


def parity(run, reference, precision: str, name: str = "update_parity", of: Claim = UPDATE):
    """The run's update projection (or `of` another projection claim: `WARMUP_UPDATE`) against the
    reference's (`RunResult`s), or None when either has no passed check of it to compare (the
    run's own checks say why)."""
    from framework_bench.measure import losses
    from framework_bench.measure.verify import Check

    mine, theirs = _passed(run, of), _passed(reference, of)
    if mine is None or theirs is None:
        return None
    if mine["projection_seed"] != theirs["projection_seed"]:
        # Not a failure made a skip: no comparison applies. Only SLURM jobs project apart (each
        # job's watcher draws its own seed on its node); the loss parity judges their training.
        return Check(name=name, status="skipped", detail=(
            f"projected onto other vectors (seeds {mine['projection_seed']} and {theirs['projection_seed']}): "
            "the reference's job drew its own seed on its node; the loss parity judges the training"))
    if native := losses.native_adapter_differences(run, reference):
        return Check(name=name, status="skipped", detail=(
            f"{native}: the weights cannot move alike; the update check judges the base unchanged and the "
            "adapters moved, the loss parity step 1"))
    norm = theirs.get("norm")
    if norm == 0.0 and theirs["projection"] == 0.0:  # no optimizer step had ended: both the initial weights
        return Check(name=name, status="pass" if mine["projection"] == 0.0 else "fail", detail=(
            f"{mine['projection']:.6e} vs {reference.backend} 0: no optimizer step had ended {of.when}"))
    if not norm or not math.isfinite(norm):
        return Check(name=name, status="unverified", detail=(
            f"the reference {reference.backend} reported no update norm to scale the difference by "
            "(an older worker SDK)"))
    off = abs(mine["projection"] - theirs["projection"]) / norm
    tolerance = PARITY_TOLERANCE[precision]
    figures = {"projection": mine["projection"], "reference_projection": theirs["projection"],
               "reference_norm": norm, "relative": off}
    detail = (f"{mine['projection']:.6e} vs {reference.backend} {theirs['projection']:.6e}, |dw| {norm:.6e} "
              f"(difference / |dw| {off:.1e}, at most {tolerance:g})")
    same, why = losses.alike(run, reference)
    if not same:
        return Check(name=name, status="unverified", figures=figures, detail=f"{detail}; not judged: {why}")
    if not off <= tolerance:  # NaN fails too
        return Check(name=name, status="fail", figures=figures,
                     detail=f"{detail}: the weights moved otherwise than the reference's, {of.when}")
    return Check(name=name, status="pass", figures=figures, detail=detail)
