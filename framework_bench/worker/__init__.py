"""The worker SDK: what a backend's worker (running inside the backend's own env) builds on.

- `dist_info()` -> `DistInfo`: rank, world size, local rank, as the launcher set them.
- `sync(device)`: wait for the device's queued work (a no-op on CPU).
- `StepTimer`: one common-metrics line per optimizer step, kept to the timing contract
  (`framework_bench/plugins/hookspecs.py`); `PeakMemory`: the per-step peak-memory window it uses.
- `StartupClock`: start-up seconds by phase (imports, data, model build, framework set-up).
- `ConsumedRows`: the record of the rows each step fed, which the host checks
  (`framework_bench.worker.rows`; the plugin reads it back with `read_consumed`).
- `settings`: the settings in effect, read from the live objects (`torch_loop_settings` for
  a plain loop; `param_count` for the built model).
- `LEARNING_RATE`, `ADAM_BETAS`, `ADAM_EPS`, `WEIGHT_DECAY`, `MAX_GRAD_NORM`: the optimizer
  settings every backend uses, so that only the framework differs.

The file formats (job, metrics, worker report) are in `framework_bench.worker.files`, the
packed rows in `framework_bench.worker.packed`. CONTRIBUTING.md shows a complete worker on this.

Stdlib + numpy at import time; torch is imported lazily inside the helpers that need it,
so the host can import this package too (it never calls the torch parts).
"""

from framework_bench.worker import settings
from framework_bench.worker.dist import DistInfo, dist_info, sync
from framework_bench.worker.hparams import ADAM_BETAS, ADAM_EPS, LEARNING_RATE, MAX_GRAD_NORM, SEED, WEIGHT_DECAY
from framework_bench.worker.rows import ConsumedRows
from framework_bench.worker.startup import StartupClock
from framework_bench.worker.steps import PeakMemory, StepTimer

__all__ = ["ADAM_BETAS", "ADAM_EPS", "LEARNING_RATE", "MAX_GRAD_NORM", "SEED", "WEIGHT_DECAY", "ConsumedRows", "DistInfo",
           "PeakMemory", "StartupClock", "StepTimer", "dist_info", "settings", "sync"]
