"""The update after training, host side (issue 20): the projection seed the host reveals once
the last measured step ended, and its checks of the worker's projection
(`framework_bench/worker/update.py`).

- `Reveal`: what the host's clock watcher (`framework_bench/measure/clock.py`) reveals, and when:
  once every rank's clock line says the last step ended, it writes the seed into the run folder
  (`REVEAL_FILE`) and keeps the stamp in its record of the run.
- `projection_seed`: the seed of this host process for a scenario and compare seed: derived from
  a secret drawn at start-up, so every run of one `fbench compare` (or `check-backend`) on a
  scenario projects onto the same vector, and no worker can know it before its reveal. Under
  SLURM the watcher on the node draws its own (no run there has a reference to match).
- `check`: the worker projected with the revealed seed, and the weights moved.
- `parity`: the projection equals the reference's on the same rows and seeds, where both
  trained alike: the same loss normalisation, or loss curves equal at every step (another
  normalisation takes other updates: shown, not judged). A run that skipped updates, trained
  a subset of the model or other rows cannot match.

What it does not stop: a worker that reads other runs' folders or the results store (the
reference's projection is there) and writes a matching figure. A plugin runs code in the host
anyway; the checks catch a worker whose claims misreport its work, not one that attacks the host.
"""

from __future__ import annotations

import hashlib
import json
import math
import secrets
from dataclasses import dataclass
from pathlib import Path

from framework_bench.worker.files import REVEAL_FILE, UPDATE_FILE

_PROCESS_SECRET = secrets.token_bytes(16)
# Relative difference from the reference's projection (fp32 / bf16 autocast): see the closing
# note of issue 20 for what the three bundled backends measured on tiny_cpu.
PARITY_TOLERANCE = {"fp32": 1e-3, "bf16": 5e-2}


def projection_seed(scenario: str, seed: int) -> int:
    """This host process's projection seed for `scenario` at the compare's `seed` (31 bits)."""
    digest = hashlib.blake2b(f"{scenario}/{seed}".encode(), key=_PROCESS_SECRET, digest_size=4).digest()
    return int.from_bytes(digest, "big") >> 1


@dataclass(frozen=True)
class Reveal:
    """Reveal `seed` once each of `ranks` ranks ended step `after_step` (the last one)."""

    after_step: int
    ranks: int
    seed: int

    def write(self, run_dir: Path) -> None:
        path = Path(run_dir) / REVEAL_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"projection_seed": self.seed}))
        tmp.replace(path)  # whole or absent: the worker polls for it


def _claim(run_dir: Path) -> dict | None:
    try:
        claim = json.loads((Path(run_dir) / UPDATE_FILE).read_text())
        return {"projection_seed": int(claim["projection_seed"]), "projection": float(claim["projection"]),
                "seconds": claim.get("seconds")}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def check(run_dir: Path, stamps: dict | None):
    """The `update` check of a finished run, from the worker's claim and the host's record of
    the seed it revealed (`stamps`, the watcher's record: `clock.load_stamps`)."""
    from framework_bench.measure.verify import Check  # here: the node-side watcher imports this module

    claim, revealed = _claim(run_dir), (stamps or {}).get("reveal")
    if claim is None:
        why = "" if revealed else " (the host revealed no projection seed: it never saw the last step end on every rank)"
        return Check(name="update", status="unverified", detail=f"unverified: the worker reported no update projection{why}")
    if not revealed:
        return Check(name="update", status="unverified", detail="unverified: the host kept no record of a revealed seed")
    figures = {**claim, "revealed_seed": revealed["seed"]}
    if claim["projection_seed"] != revealed["seed"]:
        return Check(name="update", status="fail", figures=figures,
                     detail=f"projected with seed {claim['projection_seed']}, the host revealed {revealed['seed']}")
    if not math.isfinite(claim["projection"]) or claim["projection"] == 0.0:
        return Check(name="update", status="fail", figures=figures, detail=(
            f"the update projects to {claim['projection']}: "
            + ("the weights never changed" if claim["projection"] == 0.0 else "not a number")))
    return Check(name="update", status="pass", figures=figures,
                 detail=f"(final - initial weights) . v = {claim['projection']:.6e} with the seed revealed after the last step")


def _trained_alike(run, reference, precision: str) -> bool:
    """Whether both took the same updates: the same `loss_normalization`, or canonical losses
    equal within the loss parity tolerance at every step (two wordings of one normalisation:
    a single micro-batch's token mean is the step's). Otherwise their updates differ by design."""
    from framework_bench.measure import losses

    if losses.normalised_alike(run, reference):
        return True
    off, tolerance = losses.step_differences(run, reference), losses.PARITY_TOLERANCE[precision]
    return bool(off) and all(d <= tolerance for d in off.values())  # NaN parts


def parity(run, reference, precision: str, name: str = "update_parity"):
    """The run's update projection against the reference's (`RunResult`s), or None when either
    has no passed `update` check to compare (the run's own checks say why)."""
    from framework_bench.measure.verify import Check

    mine, theirs = (next((c.figures for c in r.checks if c.name == "update" and c.status == "pass"), None)
                    for r in (run, reference))
    if mine is None or theirs is None:
        return None
    if mine["projection_seed"] != theirs["projection_seed"]:
        return Check(name=name, status="skipped", detail=(
            f"projected onto other vectors (seeds {mine['projection_seed']} and {theirs['projection_seed']}): "
            "the reference ran under another fbench process"))
    off = abs(mine["projection"] - theirs["projection"]) / max(abs(theirs["projection"]), 1e-30)
    tolerance = PARITY_TOLERANCE[precision]
    figures = {"projection": mine["projection"], "reference_projection": theirs["projection"], "relative": off}
    detail = (f"{mine['projection']:.6e} vs {reference.backend} {theirs['projection']:.6e} "
              f"(relative {off:.1e}, at most {tolerance:g})")
    if not _trained_alike(run, reference, precision):
        return Check(name=name, status="skipped", figures=figures, detail=(
            f"{detail}; not judged: the loss is normalised otherwise ({run.settings.get('loss_normalization')}) "
            "and the loss curves part"))
    if not off <= tolerance:  # NaN fails too
        return Check(name=name, status="fail", figures=figures,
                     detail=f"{detail}: the weights moved otherwise than the reference's")
    return Check(name=name, status="pass", figures=figures, detail=detail)
