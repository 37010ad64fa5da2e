"""The worker SDK: what a backend's worker (running inside the backend's own env) builds on.

- `load_job(path)` -> `Job`: the host's job, typed (steps, micro-batches per step, rows
  needed, data-parallel size, seed, settings mode, the scenario's fields); `job.open_rows()`
  opens the packed rows after checking their sha256, `job.check_data` checks converted rows.
- `Report` and `write_report(job, report)`: the worker report rank 0 writes (`worker.json`),
  with the sha256 the job verified; `exit_now()`, last in the worker's `__main__`: the process
  ends without the interpreter's teardown of torch and the framework. These, with
  `report.StepMetric` and `report.WorkerReport`, are the one definition of what host and worker
  exchange: the host validates the same dataclasses.
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
  (`framework_bench.worker.losses`); `initial_weights_worker` (a submodule, imported when
  named): the compare's initial weights; `models.from_config`: a HF model from the job's
  config with them (and the scenario's LoRA adapters), `models.held_at_build`: what a rank
  holds once it is built (a ZeRO-3 shard or the whole); `adapters` (a submodule): peft's config
  of the scenario's adapters and the ledger read back from the live model.
- `settings`: the settings in effect, read from the live objects (`torch_loop_settings` for
  a plain loop; `param_count` for the built model).
- `SEED`, `LEARNING_RATE`, `ADAM_BETAS`, `ADAM_EPS`, `WEIGHT_DECAY`, `MAX_GRAD_NORM`: the seed
  default and the optimizer settings every backend uses, so that only the framework differs.

The file formats (metrics, worker report) are in `framework_bench.worker.files`, the
packed rows in `framework_bench.worker.packed`. CONTRIBUTING.md shows a complete worker on this.

Stdlib + numpy at import time (each name on first use); torch is imported lazily inside the helpers that need it,
so the host can import this package too (it never calls the torch parts).
"""

import importlib

# Where each name lives. Loaded on first use (PEP 562): the host's CLI reads `SEED` from
# `worker.hparams` for its `--seed` default, and `fbench --help` must not pay for numpy.
_HOMES = {
    "settings": None,
    "DistInfo": "dist", "dist_info": "dist", "join": "dist", "leave": "dist", "sync": "dist",
    "ADAM_BETAS": "hparams", "ADAM_EPS": "hparams", "LEARNING_RATE": "hparams", "MAX_GRAD_NORM": "hparams",
    "SEED": "hparams", "WEIGHT_DECAY": "hparams",
    "Job": "job", "load_job": "job",
    "StepLog": "loop",
    "MicroLosses": "losses", "supervised_after_shift": "losses",
    "publish_once": "publish", "wait_for": "publish",
    "Report": "report", "write_report": "report", "exit_now": "report",
    "ConsumedRows": "rows",
    "StartupClock": "startup",
    "PeakMemory": "steps", "StepTimer": "steps",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    home = _HOMES[name]
    module = importlib.import_module(f"{__name__}.{home or name}")
    value = module if home is None else getattr(module, name)
    globals()[name] = value
    return value
