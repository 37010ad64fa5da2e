"""What a worker reports, typed: the one definition of each record host and worker exchange
after a run (the job before it: `framework_bench.worker.job`).

- `StepMetric`: one line of the common metrics file (`framework_bench.worker.files`).
- `Claims`: what rank 0 says about the run in `RUN_DIR/worker.json`, which the host verifies
  (`framework_bench/measure/verify.py`).
- `Report`: the claims a worker writes (`write_report`), with the framework's own throughput
  and a backend's own keys (`extra`: library versions, what its framework had in effect),
  written beside them at the top level. The data sha256 is not a field: the writer records
  the one the job verified in this process (`Job.open_rows` / `Job.check_data`).
- `WorkerReport`: the claims as the host reads them back from the run folder, with the steps
  and the rows each step consumed.

The host validates these same dataclasses with pydantic (`framework_bench.plugins.contract`):
the checks a type cannot say (bounds) are in `__post_init__`, which pydantic runs.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from framework_bench.worker.files import write_worker_report
from framework_bench.worker.job import Job

# Bounds of one step's figures: whatever a worker writes must fit a SQLite integer (< 2**63)
# and be a finite number; beyond these a line is a worker's bug, not a measurement.
MAX_STEP_TOKENS = 2**40
MAX_BYTES = 2**60
MAX_RANK = 2**20
MAX_STEP = 2**31 - 1


def _within(name: str, value: int | None, high: int, low: int = 0) -> None:
    if value is not None and not low <= value <= high:
        raise ValueError(f"{name} {value} is not in [{low}, {high}]")


@dataclass(kw_only=True)
class StepMetric:
    """One line of a worker's common metrics file (`metrics/rank<R>.jsonl`)."""

    step: int
    # Wall time of the step, device-synchronised on GPU (the interval: see the timing contract
    # in framework_bench/plugins/hookspecs.py).
    seconds: float
    tokens: int  # tokens this rank's model received in this step (its SP shard only)
    # Mean training loss over the step's micro-batches, this rank. NaN is a measurement (the
    # training diverged), kept as NaN; infinity is no loss at all.
    loss: float | None = None
    peak_mem_bytes: int | None = None  # peak allocated over the step (max RSS on CPU)
    peak_reserved_bytes: int | None = None  # peak reserved by the allocator over the step (CUDA)
    rank: int = 0

    def __post_init__(self) -> None:
        _within("step", self.step, MAX_STEP, low=1)
        if not (math.isfinite(self.seconds) and self.seconds > 0):
            raise ValueError(f"seconds {self.seconds} is not a positive finite number")
        _within("tokens", self.tokens, MAX_STEP_TOKENS)
        _within("peak_mem_bytes", self.peak_mem_bytes, MAX_BYTES)
        _within("peak_reserved_bytes", self.peak_reserved_bytes, MAX_BYTES)
        _within("rank", self.rank, MAX_RANK)


@dataclass(kw_only=True)
class Claims:
    """What rank 0 says about the run (`worker.json`); None where a worker does not say it."""

    framework_version: str | None = None
    attention_used: str | None = None
    # The settings in effect, read from the live objects (`framework_bench.worker.settings`);
    # `write_report` adds the job's settings_mode.
    settings: dict[str, str | int | float | bool | None] | None = None
    param_count: int | None = None  # parameters of the model the framework built
    startup_seconds: float | None = None  # worker start to the first step's start (`StartupClock.total`)
    startup_breakdown: dict[str, float] | None = None  # by phase (`StartupClock.phases`)
    notes: list[str] = field(default_factory=list)  # what the host should know about how the run went
    # Claims (check names) the worker cannot make on this run, each with why: listed as
    # unverified, the run `unverified`, never `invalid` for them.
    unclaimed: dict[str, str] = field(default_factory=dict)


@dataclass(kw_only=True)
class Report(Claims):
    throughput: dict[str, float] = field(default_factory=dict)  # the framework's own figures
    extra: dict = field(default_factory=dict)


@dataclass(kw_only=True)
class WorkerReport(Claims):
    """What a backend read back from its run folder (`fbench_read_report`)."""

    steps: list[StepMetric]
    data_sha256: str | None = None  # sha256 of the token ids the worker actually trained on
    # The framework's own figures (e.g. tokens_per_sec), mean over measured steps.
    framework_throughput: dict[str, float] = field(default_factory=dict)
    # {rank: {step: row fingerprints}} fed to the trainer (framework_bench/worker/rows.py).
    consumed_rows: dict[int, dict[int, list[str]]] | None = None


def write_report(job: Job, report: Report) -> None:
    """Rank 0 writes `worker.json` (atomically); the other ranks write nothing."""
    fields = asdict(report)
    extra = fields.pop("extra")
    if fields["settings"] is not None:
        fields["settings"] = {"settings_mode": job.settings_mode, **fields["settings"]}
    write_worker_report(job.run_dir, data_sha256=job.verified_sha256, **fields, **extra)


def exit_now(code: int = 0) -> None:
    """End the worker's process now, its report written: logging's handlers and the standard
    streams flushed, then `os._exit`, skipping the interpreter's teardown of torch and the
    framework (docs/calibration.md, "A worker's exit"). Call it last, from the worker's
    `__main__`: nothing after it runs, atexit handlers neither."""
    import logging
    import os
    import sys

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or a pipe gone: nothing left to keep
            pass
    os._exit(code)
