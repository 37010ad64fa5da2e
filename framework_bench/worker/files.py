"""Files a worker writes: the common metrics file, the worker report (typed: `framework_bench.worker.report`;
the job it reads: `framework_bench.worker.job`).

Stdlib + numpy only: this module is imported by workers inside each backend's own
environment (made importable there by the `.pth` file `framework_bench/envs/venvs.py` writes).

Common metrics file, one per rank: `RUN_DIR/metrics/rank<R>.jsonl`, one JSON object per
optimizer step: {"step", "seconds", "tokens", "loss", "peak_mem_bytes", "peak_reserved_bytes", "rank"}.
`seconds` is the step's wall time (after a device synchronise on GPU); `tokens` counts
tokens this rank processed in the step (its sequence-parallel shard only).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from framework_bench.worker.dist import dist_info

METRICS_DIR = "metrics"
CLOCK_DIR = "clock"  # the step timer's clock events, which the host stamps (framework_bench/measure/clock.py)
WORKER_REPORT = "worker.json"
# The update after training (framework_bench/worker/update.py): the projection seed the host
# reveals once the last measured step ended, and the worker's projection with it.
REVEAL_FILE = "projection_seed.json"
UPDATE_FILE = "update_projection.json"
# The seed the trained weights start from, which the host reveals once every rank says it is
# ready for its first step (framework_bench/worker/initial_weights_worker.py: fill_revealed).
INITIAL_REVEAL_FILE = "initial_seed.json"
# The host writes a seed within a poll of the clock line it waits for; a shared filesystem under
# SLURM may take its attribute-cache time to show it on another node.
REVEAL_TIMEOUT = 300.0
REVEAL_POLL = 0.02


def wait_for_seed(path: Path, key: str, timeout: float = REVEAL_TIMEOUT) -> int | None:
    """The seed `key` of the file the host reveals at `path`, or None when none came within `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return int(json.loads(path.read_text())[key])
        except (OSError, ValueError, KeyError, TypeError):  # not there yet (the host renames it into place)
            if time.monotonic() > deadline:
                return None
            time.sleep(REVEAL_POLL)


class MetricsWriter:
    """Appends one line per step, flushed at once so a crash keeps the steps done so far."""

    def __init__(self, run_dir: str | Path, rank_: int | None = None):
        self.rank = dist_info().rank if rank_ is None else rank_
        directory = Path(run_dir) / METRICS_DIR
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"rank{self.rank}.jsonl"
        self._fh = self.path.open("a", buffering=1)

    def write(self, step: int, seconds: float, tokens: int, loss: float | None, peak_mem_bytes: int | None,
              peak_reserved_bytes: int | None = None) -> None:
        rec = {"step": step, "seconds": seconds, "tokens": tokens, "loss": loss,
               "peak_mem_bytes": peak_mem_bytes, "peak_reserved_bytes": peak_reserved_bytes, "rank": self.rank}
        self._fh.write(json.dumps(rec) + "\n")

    def close(self) -> None:
        self._fh.close()


def write_worker_report(run_dir: str | Path, **fields) -> None:
    """Rank 0 records what it really did, untyped: kept for workers written before the typed
    `framework_bench.worker.report.write_report`, which writes through it."""
    if not dist_info().is_main:
        return
    path = Path(run_dir) / WORKER_REPORT
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(fields, indent=2, default=str))
    tmp.replace(path)


def read_metrics(run_dir: str | Path) -> list[dict]:
    """All ranks' step records (host side reads them through `framework_bench.measure.metrics`)."""
    out = []
    for p in sorted((Path(run_dir) / METRICS_DIR).glob("rank*.jsonl")):
        out.extend(json.loads(line) for line in p.read_text().splitlines() if line.strip())
    return out


def read_worker_report(run_dir: str | Path) -> dict:
    path = Path(run_dir) / WORKER_REPORT
    return json.loads(path.read_text()) if path.exists() else {}
