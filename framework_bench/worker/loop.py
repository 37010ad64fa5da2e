"""Every claim of a plain training loop's steps, from one object: `StepLog`.

A loop that calls the model itself (the torch reference, CONTRIBUTING's example) records the
same things per optimizer step: the step's clock and tokens (`StepTimer`), each micro-batch's
loss and divisor (`MicroLosses`), the rows it fed (`ConsumedRows`, recorded after the clock
stopped), and its own throughput over the measured steps. A worker driving a framework's
trainer calls those pieces from the framework's hooks instead.
"""

from __future__ import annotations

import time

from framework_bench.worker.job import Job
from framework_bench.worker.losses import MicroLosses, supervised_after_shift
from framework_bench.worker.rows import ConsumedRows
from framework_bench.worker.steps import StepTimer


class StepLog:
    def __init__(self, job: Job, rank: int):
        self.timer = StepTimer(job.run_dir, job.device, rank=rank)
        self.consumed = ConsumedRows(job.run_dir, rank)
        self.losses = MicroLosses(job.run_dir, rank)
        self.warmup = job.scenario.steps.warmup
        self._fed: list = []
        self._measured_tokens = 0
        self._measured_from: float | None = None
        self._measured_to: float | None = None

    def begin(self, step: int) -> None:
        """Before the step's first forward: starts its clock (and, at the first measured step,
        the loop's own clock over the measured steps)."""
        if step == self.warmup + 1:
            self._measured_from = time.perf_counter()
        self.timer.begin()

    def micro(self, ids, labels, loss, divisor, scale=None, tokens=None) -> None:
        """One micro-batch fed: `loss` is the framework's (a tensor is read at `end`), `divisor`
        what it divided the summed token loss by, `scale` the factor the loop applied to `loss`
        before backward (1: backpropagated as it is; None: not said, MicroLosses);
        `ids`/`labels` the whole rows fed; `tokens` this rank's share of them (default all:
        under sequence parallel, its slice)."""
        self.losses.add(loss, divisor, labels, scale)
        self.timer.add_tokens(tokens if tokens is not None else ids.numel() if hasattr(ids, "numel") else ids.size)
        self._fed.append((ids, labels, loss, divisor))

    def end(self, step: int) -> dict:
        """After the optimizer update: closes the step's clock, then records the rows and losses.
        The step's loss is its token mean, sum(loss x divisor) / supervised tokens over its
        micro-batches (None when it fed no supervised token): the host's canonical loss."""
        supervised = sum(supervised_after_shift(labels) for _, labels, _, _ in self._fed)
        loss = sum(float(loss) * divisor for _, _, loss, divisor in self._fed) / supervised if supervised else None
        record = self.timer.end(step, loss)
        for ids, labels, _, _ in self._fed:
            self.consumed.add(ids, labels)
        self._fed = []
        self.consumed.end_step(step)
        self.losses.end_step(step)
        if step > self.warmup:
            self._measured_tokens += record["tokens"]
            self._measured_to = time.perf_counter()
        return record

    def throughput(self) -> dict[str, float]:
        """The loop's own clock from the first measured step's start to the last one's end, data
        preparation included: set beside the host's TGS from the per-step seconds."""
        if self._measured_from is None or self._measured_to is None:
            return {}
        return {"tokens_per_sec": self._measured_tokens / (self._measured_to - self._measured_from)}

    def close(self) -> None:
        self.timer.close()
        self.consumed.close()
        self.losses.close()
