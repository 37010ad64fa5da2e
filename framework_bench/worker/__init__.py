"""The worker SDK: what a backend's worker (running inside the backend's own env) builds on.

- `load_job(path)` -> `Job`: the host's job, typed (steps, micro-batches per step, rows
  needed, data-parallel size, seed, settings mode, the scenario's fields); `job.open_rows()`
  opens the packed rows after checking their sha256, `job.check_data` checks converted rows.
- `Report` and `write_report(job, report)`: the worker report rank 0 writes (`worker.json`),
  with the sha256 the job verified.
- `dist_info()` -> `DistInfo`: rank, world size, local rank, as the launcher set them;
  `join(device)`: this rank's device, in its process group (`leave()` after); `sync(device)`: wait for the
  device's queued work (a no-op on CPU).
- `publish_once(target, write)` / `wait_for(path)`: one process writes what all share.
- `StepLog`: every claim of a plain loop's steps (timer, losses, rows, its own throughput).
- `StepTimer`: one common-metrics line per optimizer step, kept to the timing contract
  (`framework_bench/plugins/hookspecs.py`); `PeakMemory`: the per-step peak-memory window it uses.
- `StartupClock`: start-up seconds by phase (imports, data, model build, framework set-up).
- `ConsumedRows`: the record of the rows each step fed, which the host checks
  (`framework_bench.worker.rows`); `MicroLosses`: each micro-batch's loss and its divisor
  (`framework_bench.worker.losses`); `init_weights` (a submodule, imported when named): the
  compare's initial weights; `models.from_config`: a HF model from the job's config with them.
- `settings`: the settings in effect, read from the live objects (`torch_loop_settings` for
  a plain loop; `param_count` for the built model).
- `SEED`, `LEARNING_RATE`, `ADAM_BETAS`, `ADAM_EPS`, `WEIGHT_DECAY`, `MAX_GRAD_NORM`: the seed
  default and the optimizer settings every backend uses, so that only the framework differs.

The file formats (metrics, worker report) are in `framework_bench.worker.files`, the
packed rows in `framework_bench.worker.packed`. CONTRIBUTING.md shows a complete worker on this.

Stdlib + numpy at import time; torch is imported lazily inside the helpers that need it,
so the host can import this package too (it never calls the torch parts).
"""

from framework_bench.worker import settings
from framework_bench.worker.dist import DistInfo, dist_info, join, leave, sync
from framework_bench.worker.hparams import ADAM_BETAS, ADAM_EPS, LEARNING_RATE, MAX_GRAD_NORM, SEED, WEIGHT_DECAY
from framework_bench.worker.job import Job, load_job
from framework_bench.worker.loop import StepLog
from framework_bench.worker.losses import MicroLosses, supervised_after_shift
from framework_bench.worker.publish import publish_once, wait_for
from framework_bench.worker.report import Report, write_report
from framework_bench.worker.rows import ConsumedRows
from framework_bench.worker.startup import StartupClock
from framework_bench.worker.steps import PeakMemory, StepTimer

__all__ = ["ADAM_BETAS", "ADAM_EPS", "LEARNING_RATE", "MAX_GRAD_NORM", "SEED", "WEIGHT_DECAY", "ConsumedRows",
           "DistInfo", "Job", "MicroLosses", "PeakMemory", "Report", "StartupClock", "StepLog", "StepTimer", "dist_info",
           "join", "leave", "load_job", "publish_once", "settings", "supervised_after_shift", "sync",
           "wait_for", "write_report"]
