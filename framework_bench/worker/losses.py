"""The loss of every micro-batch, as the framework computed it and as the host can restate it.

Frameworks normalise a step's loss differently (a mean of per-micro-batch means, a token mean
over the step, a token sum over a label count taken before the shift), so their logged
losses cannot be compared. Per micro-batch the worker records, in `RUN_DIR/losses/rank<R>.jsonl`:
  - `loss`: the framework's own loss for the micro-batch;
  - `divisor`: what the framework divided that micro-batch's summed token loss by, read from
    the framework (so `loss * divisor` is the summed token loss);
  - `supervised`: the worker's own count of supervised tokens after the shift (labels
    [:, 1:] not ignored).
The host (`framework_bench/measure/losses.py`) restates each optimizer step's loss as the token mean
sum(loss * divisor) / sum(supervised) over ranks and micro-batches: the same figure for every
framework that computed the same step.

`add` keeps the loss as a tensor and `end_step` reads it, so call `end_step` after the step's
clock has stopped: reading a device tensor synchronises.
"""

from __future__ import annotations

import json
from pathlib import Path

from framework_bench.worker.packed import IGNORE_INDEX

LOSSES_DIR = "losses"


def supervised_after_shift(labels) -> int:
    """Tokens whose label is predicted: the first position of each row predicts nothing."""
    return int((labels[..., 1:] != IGNORE_INDEX).sum())


class MicroLosses:
    def __init__(self, run_dir: str | Path, rank: int):
        directory = Path(run_dir) / LOSSES_DIR
        directory.mkdir(parents=True, exist_ok=True)
        self._fh = (directory / f"rank{rank}.jsonl").open("a", buffering=1)
        self._pending: list[tuple] = []

    def add(self, loss, divisor, labels) -> None:
        """One micro-batch: the framework's loss (a tensor or float), its divisor, the labels fed."""
        self._pending.append((loss.detach() if hasattr(loss, "detach") else loss, divisor, labels))

    def end_step(self, step: int) -> None:
        for micro, (loss, divisor, labels) in enumerate(self._pending):
            self._fh.write(json.dumps({"step": step, "micro": micro, "loss": float(loss), "divisor": float(divisor),
                                       "supervised": supervised_after_shift(labels)}) + "\n")
        self._pending = []

    def close(self) -> None:
        self._fh.close()
