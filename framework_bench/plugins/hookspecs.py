"""The `TrainBackend` hook specification: what a backend plugin must provide.

A backend is one plugin object registered under the entry-point group `fbench.backends`:
a subclass of `framework_bench.plugins.base.Backend` (which implements these hooks over the
few methods a backend writes, and supplies the rest), or any object holding the four hooks
(the first contract's module of hook functions). The host calls each hook on one backend
at a time, so every hook is `firstresult`. Hooks run in the host process: they must stay
cheap and must not import torch or the framework (that happens in the worker, inside the
backend's own env).

Flow for one run (see `framework_bench/run/pipeline.py`):
    info = fbench_backend_info()
    reason = info.capabilities.refusal(scenario)        # enforced by the host: str -> "unsupported"
    reason = fbench_check(scenario, machine, env)      # None -> go on, str -> "unsupported"
    ... host writes run_dir/job.json ...
    plan = fbench_plan(job, env)                        # writes framework config files
    ... host rewrites job.json, launches the plan (local / torchrun) and waits ...
    report = fbench_read_report(job)                    # per-step metrics, data sha256, notes

What the host guarantees:
- A plugin that fails to import, lacks one of the four hooks, or whose `fbench_backend_info`
  raises is listed as broken with its error (`fbench backends`, `fbench run --backend NAME`);
  the other backends load.
- An exception in `fbench_check`, `fbench_plan` or `fbench_read_report` ends that run as a
  `failed` result carrying the traceback's tail; the host goes on (a compare keeps its rows).
- `job.json` belongs to the host: it is written before `fbench_plan` and again after it, so
  the worker always reads the host's job. A plan writes its own files only.
- `WorkerReport.notes` are kept in the result, stored and shown.
- `Job`, `WorkerReport` and its `StepMetric`s are the worker SDK's dataclasses
  (`framework_bench/worker/job.py`, `report.py`), validated by the host: what a plan reads of
  the job is what its worker reads of job.json, and what `fbench_read_report` returns is
  checked against the same definitions the worker wrote by.

Timing contract (what the worker's common metrics file holds, one line per optimizer step
and rank; `framework_bench.worker.StepTimer` writes it this way, so a worker on the SDK
keeps it by construction):
- `seconds` covers one optimizer step: from a device synchronise right before its first
  micro-batch's forward to a device synchronise right after its optimizer update (gradient
  clipping and the all-reduce included). Data loading between micro-batches may be left
  out (`StepTimer.pause()`/`resume()`); nothing else may: no logging, no checkpoints.
- `tokens` counts the tokens this rank's model received in the step (its micro-batches x
  rows x context; with sequence parallel, its shard only). The host's TGS is tokens per
  rank averaged over ranks / the slowest rank's seconds, median over the measured steps.
- `peak_mem_bytes` / `peak_reserved_bytes`: the device's peak allocated / reserved over the
  step's window (counters reset at its start); on CPU, the process's max RSS (not resettable).
- `loss`: this rank's mean training loss over the step's micro-batches (None if unknown).
- Steps are numbered 1..warmup+measured with no gaps; the first `warmup` are not measured.
- Beside the lines, `StepTimer` writes its clock events to `RUN_DIR/clock/rank<R>.jsonl` as
  they happen; the host stamps them with its own clock and holds the claimed seconds against
  what it saw pass (`framework_bench/measure/clock_checks.py`). Backends declaring the current contract
  (`BackendInfo.contract`, `framework_bench.plugins.contract.CONTRACT`) must make every claim,
  or say in the run's report which they cannot make there and why (`WorkerReport.unclaimed`).
- After the last step, every rank projects its weight update onto the vector of the seed the
  host reveals then (`framework_bench/worker/update.py`, contract 3).
"""

from __future__ import annotations

import pluggy

from framework_bench.plugins.contract import BackendEnv, BackendInfo, Job, LaunchPlan, Machine, WorkerReport
from framework_bench.scenario.scenario import Scenario

PROJECT = "fbench"
ENTRY_POINT_GROUP = "fbench.backends"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class TrainBackend:
    """Hooks a training-framework backend implements."""

    @hookspec(firstresult=True)
    def fbench_backend_info(self) -> BackendInfo:
        """Describe the backend: its name (unique; used on the command line), the framework,
        what it supports (CPU, GPU, sequence parallel, varlen attention, ZeRO stages: the host
        refuses a scenario outside them before `fbench_check`) and the `EnvSpec` from which
        the host builds its own virtual environment.

        Must not import the framework: the framework version is read from the env's record.
        """

    @hookspec(firstresult=True)
    def fbench_check(self, scenario: Scenario, machine: Machine, env: BackendEnv) -> str | None:
        """Say whether this backend can run `scenario` here *as specified*.

        Return None when it can, or one sentence saying why not, naming what is missing
        (e.g. "sequence_parallel 8 needs flash_attn and deepspeed, not installed in the
        xtuner env"). The host records that as an `unsupported` result and never launches.
        A setting that the framework would silently ignore or replace (SP without its
        engine, varlen attention without flash-attn) must be refused here, not measured.
        """

    @hookspec(firstresult=True)
    def fbench_plan(self, job: Job, env: BackendEnv) -> LaunchPlan:
        """Build the launch plan for `job` (scenario + packed data + run folder).

        Write every generated framework file (configs, DeepSpeed JSON) into `job.run_dir`
        and list them in `LaunchPlan.files`; `job.json` is the host's (it rewrites it). The plan names a worker module run with the
        env's Python; the host's launcher (local / torchrun) wraps it. The worker reads
        `job.json` (see `framework_bench/worker/files.py`), converts the packed data, trains
        with the framework's own trainer, and writes the common metrics file.
        """

    @hookspec(firstresult=True)
    def fbench_read_report(self, job: Job) -> WorkerReport:
        """Read the finished run's folder: the common per-step metrics (all ranks), the
        sha256 of the data the worker trained on, the framework's own throughput figures
        for comparison, and any notes worth keeping with the result. Raise
        `FileNotFoundError` if the worker wrote nothing. TGS and TFLOPs are computed by the
        host, never here. The per-step records follow the timing contract above.

        The host verifies the claims (framework_bench/measure/verify.py): also return the `settings`
        in effect (SDK: framework_bench/worker/settings.py), the built model's `param_count`
        and the `consumed_rows` (SDK: framework_bench/worker/rows.py, `read_consumed`). The
        framework's own figure goes in `framework_throughput` as `tokens_per_sec_median`
        (per step), `tokens_per_sec` (measured steps) or `tokens_per_sec_whole_run`, per GPU.
        A report without them runs, flagged "unverified"; a wrong one is stored `invalid`.
        """
