"""The worker report, typed: what rank 0 records about the run in `RUN_DIR/worker.json`.

The fields are the ones the host reads back (`framework_bench.plugins.backend.WorkerReport`);
`extra` holds a backend's own keys (library versions, what its framework had in effect),
written beside them at the top level as before. The data sha256 is not a field: the writer
records the one the job verified in this process (`Job.open_rows` / `Job.check_data`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from framework_bench.worker.files import write_worker_report
from framework_bench.worker.job import Job


@dataclass
class Report:
    framework_version: str | None = None
    attention_used: str | None = None
    settings: dict | None = None  # in effect (`framework_bench.worker.settings`); the job's settings_mode added
    param_count: int | None = None
    startup_seconds: float | None = None  # worker start to the first step's start (`StartupClock.total`)
    startup_breakdown: dict[str, float] | None = None  # `StartupClock.phases`
    throughput: dict[str, float] = field(default_factory=dict)  # the framework's own figures
    notes: list[str] = field(default_factory=list)
    unclaimed: dict[str, str] = field(default_factory=dict)  # claims it cannot make on this run: {check: why}
    extra: dict = field(default_factory=dict)


def write_report(job: Job, report: Report) -> None:
    """Rank 0 writes `worker.json` (atomically); the other ranks write nothing."""
    fields = asdict(report)
    extra = fields.pop("extra")
    if fields["settings"] is not None:
        fields["settings"] = {"settings_mode": job.settings_mode, **fields["settings"]}
    write_worker_report(job.run_dir, data_sha256=job.verified_sha256, **fields, **extra)
