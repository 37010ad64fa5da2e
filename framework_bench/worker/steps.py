"""The step timer: one common-metrics line per optimizer step, timed and measured alike
for every backend.

The timing contract it implements is written once, in `framework_bench/plugins/hookspecs.py`: a
step's seconds run from `begin()` (a device synchronise before the first micro-batch's
forward) to `end()` (a device synchronise after the optimizer update), less any
`pause()` ... `resume()` around data loading; tokens are this rank's (`add_tokens`, or
`end(tokens=...)`); peak memory is the window `begin()` resets and `end()` reads.

Beside the claims, the timer writes its clock events as they happen (`ClockLines`): the host
stamps each line on arrival with its own clock (`framework_bench/measure/clock.py`), so the seconds a
worker claims are held against the time the host saw pass.
"""

from __future__ import annotations

import json
import resource
import time
from collections.abc import Callable
from pathlib import Path

from framework_bench.worker.dist import dist_info, sync
from framework_bench.worker.files import CLOCK_DIR, MetricsWriter


class PeakMemory:
    """Peak memory over a window (one optimizer step)."""

    def __init__(self, device: str):
        self.cuda = device == "cuda"

    def reset(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.reset_peak_memory_stats()

    def read(self) -> tuple[int, int | None]:
        """(peak allocated, peak reserved) in bytes since the last reset; reserved is None on CPU."""
        if self.cuda:
            import torch

            return int(torch.cuda.max_memory_allocated()), int(torch.cuda.max_memory_reserved())
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, None  # Linux reports KiB


class ClockLines:
    """`RUN_DIR/clock/rank<R>.jsonl`: one line per clock event (begin, pause, resume, end),
    written and flushed the moment it happens. The lines carry no time: the host's stamp on
    arrival is the time (a worker could write any figure, not the moment it wrote)."""

    def __init__(self, run_dir: str | Path, rank: int | None = None):
        directory = Path(run_dir) / CLOCK_DIR
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"rank{dist_info().rank if rank is None else rank}.jsonl"
        self._fh = self.path.open("a", buffering=1)
        self._after_end: dict[int, Callable[[], None]] = {}

    def after_end(self, step: int, call: Callable[[], None]) -> None:
        """Call `call` once, right after the end line of `step` is written: what the host reveals
        when it sees that line (`framework_bench/worker/update.py`, `report_at_warmup_end`)."""
        self._after_end[step] = call

    def write(self, event: str, step: int | None = None) -> None:
        self._fh.write(json.dumps({"event": event} if step is None else {"event": event, "step": step}) + "\n")
        if event == "end" and step in self._after_end:
            self._after_end.pop(step)()

    def close(self) -> None:
        self._fh.close()


class StepTimer:
    """Times optimizer steps and writes the common metrics file (`metrics/rank<R>.jsonl`)."""

    def __init__(self, run_dir: str | Path, device: str, rank: int | None = None):
        self.device = device
        self.writer = MetricsWriter(run_dir, rank)
        self.clock = ClockLines(run_dir, rank)
        self.memory = PeakMemory(device)
        self.steps_written = 0
        self._seconds = 0.0
        self._tokens = 0
        self._started: float | None = None
        self._open = False

    def begin(self) -> None:
        """Start a new optimizer step (resets the peak-memory window)."""
        sync(self.device)
        self.memory.reset()
        self._seconds, self._tokens, self._open = 0.0, 0, True
        self.clock.write("begin")
        self._started = time.perf_counter()

    def pause(self) -> None:
        """Stop the clock inside a step (before work that is not the step's: data loading).
        A pause declares itself to the host; one not followed by `resume()` ends the step's
        window (the line is written later by `end()`)."""
        sync(self.device)
        self._stop("pause")

    def _stop(self, event: str | None) -> None:
        if self._started is not None:
            self._seconds += time.perf_counter() - self._started
            self._started = None
            if event:
                self.clock.write(event)

    def resume(self) -> None:
        """Start the clock again inside the current step; begins a step if none is open."""
        if not self._open:
            self.begin()
            return
        sync(self.device)
        self.clock.write("resume")
        self._started = time.perf_counter()

    def add_tokens(self, n: int) -> None:
        self._tokens += int(n)

    def end(self, step: int, loss: float | None, tokens: int | None = None) -> dict:
        """Close the step and write its line; `tokens` overrides the count from `add_tokens`."""
        sync(self.device)
        self._stop(None)  # the "end" line below is the stop, unless a pause stopped the clock already
        allocated, reserved = self.memory.read()
        record = dict(step=step, seconds=self._seconds, tokens=self._tokens if tokens is None else int(tokens),
                      loss=None if loss is None else float(loss), peak_mem_bytes=allocated,
                      peak_reserved_bytes=reserved)
        self.writer.write(**record)
        self.clock.write("end", step)
        self.steps_written += 1
        self._open = False
        return record

    def close(self) -> None:
        self.writer.close()
        self.clock.close()
