"""The loss of every micro-batch, as the framework computed it and as the host can restate it.

Frameworks normalise a step's loss differently (a mean of per-micro-batch means, a token mean
over the step, a token sum over a label count taken before the shift), so their logged
losses cannot be compared. Per micro-batch the worker records, in `RUN_DIR/losses/rank<R>.jsonl`:
  - `loss`: the framework's own loss for the micro-batch;
  - `divisor`: what the framework divided that micro-batch's summed token loss by, read from
    the framework (so `loss * divisor` is the summed token loss);
  - `scale`: the factor the framework applied to that logged loss before backward (1/accumulation
    where mmengine's OptimWrapper or DeepSpeed divides it, 1 where the loss is backpropagated as
    logged), read from the framework; absent from the records of a worker that does not say
    (`add` without `scale`): the host then cannot tell how the step's gradient was weighted;
  - `supervised`: the worker's own count of supervised tokens after the shift (labels
    [:, 1:] not ignored), and `labelled`, its count before the shift (labels not ignored: what
    HF Trainer's `num_items_in_batch` counts).
Each supervised token of the micro-batch thus weighs scale / divisor in the step's gradient:
the host names that weighting (`framework_bench/measure/losses.py`: `scheme`) and judges every
step only between runs weighted alike.

The host (`framework_bench/measure/losses.py`) restates each optimizer step's loss as the token mean
sum(loss * divisor) / sum(supervised) over ranks and micro-batches: the same figure for every
framework that computed the same step.

`add` keeps the loss as a tensor and `end_step` reads it, so call `end_step` after the step's
clock has stopped: reading a device tensor synchronises.
"""

from __future__ import annotations

import json
from pathlib import Path

from collections.abc import Callable

from framework_bench.worker.loss_schemes import MICRO_MEAN_MEAN, STEP_LABEL_MEAN, WORLD_LABEL_MEAN
from framework_bench.worker.packed import IGNORE_INDEX

LOSSES_DIR = "losses"


def supervised_after_shift(labels) -> int:
    """Tokens whose label is predicted: the first position of each row predicts nothing."""
    return int((labels[..., 1:] != IGNORE_INDEX).sum())


def labelled_before_shift(labels) -> int:
    """Labels not ignored, the first position of each row included (HF's `num_items_in_batch`)."""
    return int((labels != IGNORE_INDEX).sum())


def loss_divisors(scheme: str | None, labels: list,
                  over_ranks: Callable[[int], tuple[int, int]] = lambda n: (n, 1)) -> list[float]:
    """Per micro-batch of a step (its `labels`), what a loop that backpropagates the model's
    loss as it returns it (scale 1) passes as `num_items_in_batch` to normalise as `scheme`
    (None: the step's token mean). `over_ranks(count)`: (its sum over the data-parallel ranks,
    their number), which world_label_mean divides by. Never 0: a step with no supervised token
    adds nothing."""
    if scheme == MICRO_MEAN_MEAN:
        return [max(supervised_after_shift(lab), 1) * len(labels) for lab in labels]
    count = labelled_before_shift if scheme in (STEP_LABEL_MEAN, WORLD_LABEL_MEAN) else supervised_after_shift
    total = sum(count(lab) for lab in labels)
    if scheme == WORLD_LABEL_MEAN:  # HF divides by the world's count and multiplies the loss by the ranks
        world, ranks = over_ranks(total)
        return [max(world, 1) / ranks] * len(labels)
    return [max(total, 1)] * len(labels)


class MicroLosses:
    def __init__(self, run_dir: str | Path, rank: int):
        directory = Path(run_dir) / LOSSES_DIR
        directory.mkdir(parents=True, exist_ok=True)
        self._fh = (directory / f"rank{rank}.jsonl").open("a", buffering=1)
        self._pending: list[tuple] = []

    def add(self, loss, divisor, labels, scale=None) -> None:
        """One micro-batch: the framework's loss (a tensor or float), its divisor, the labels fed,
        and the factor the framework applied to that loss before backward (None: not said)."""
        self._pending.append((loss.detach() if hasattr(loss, "detach") else loss, divisor, labels, scale))

    def end_step(self, step: int) -> None:
        for micro, (loss, divisor, labels, scale) in enumerate(self._pending):
            record = {"step": step, "micro": micro, "loss": float(loss), "divisor": float(divisor),
                      "supervised": supervised_after_shift(labels), "labelled": labelled_before_shift(labels)}
            self._fh.write(json.dumps(record if scale is None else {**record, "scale": float(scale)}) + "\n")
        self._pending = []

    def close(self) -> None:
        self._fh.close()
