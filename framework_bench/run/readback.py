"""What the host reads of what a worker wrote: while it runs, its progress (`progress`); once it
ended, what `finish` makes of it: the worker's report read back, the data it trained on checked,
the figures, and the host's checks of every claim (framework_bench/measure/verify.py). Parity
with the reference is the referee's (framework_bench/run/referee.py). Called by
`framework_bench/run/pipeline.py` only."""

from __future__ import annotations

from collections.abc import Callable

from framework_bench.measure import clock_checks, flops, losses, machine_load, metrics, reveal_checks, update, verify
from framework_bench.measure.median_step import median_step_check
from framework_bench.measure.metrics import RunResult
from framework_bench.plugins import registry as plugins
from framework_bench.plugins.contract import CONTRACT, Job, WorkerReport
from framework_bench.run.hooks import HookError, call_hook
from framework_bench.run.launchers.base import Outcome
from framework_bench.scenario.scenario import Scenario
from framework_bench.worker.files import read_metrics

StepCallback = Callable[[int, int, float | None], None]  # (steps done, steps total, last step seconds)


def progress(job: Job, on_step: StepCallback) -> Callable[[], None]:
    """The launcher's poll: `on_step` each time the worker's metrics show another step done."""
    seen = [0]

    def poll() -> None:
        # Progress only: a line the worker is writing now (or garbage) is read again later,
        # and the figures come from the full read once the worker has ended.
        try:
            steps = read_metrics(job.run_dir)
            done = len({s["step"] for s in steps})
            last = float(steps[-1]["seconds"]) if steps else None
        except (OSError, ValueError, KeyError, TypeError, IndexError):
            return
        if done != seen[0]:
            seen[0] = done
            on_step(done, job.scenario.steps.total, last)
    return poll


def read_back(result: RunResult, backend: plugins.RegisteredBackend, job: Job, outcome: Outcome, gpu_name: str | None) -> None:
    """Fill `result` from what the worker left in the run folder; a wrong or missing claim makes it
    `invalid` (or `unverified`), a worker that ended otherwise keeps its status with the log's tail."""
    scenario = job.scenario
    if outcome.status != "ok":
        result.reason = f"exit code {outcome.returncode}\n{outcome.log_tail}" if outcome.returncode else outcome.log_tail
        return
    stamps = clock_checks.load_stamps(job.run_dir)
    try:
        report = call_hook("fbench_read_report", lambda: WorkerReport.model_validate(backend.read_report(job)))
    except HookError as e:
        cause = e.__cause__
        result.status = "failed"
        result.reason = f"the worker wrote no metrics: {cause}" if isinstance(cause, FileNotFoundError) else str(e)
        return
    result.notes = list(report.notes)
    result.data_sha256 = report.data_sha256
    result.attention_used = report.attention_used
    result.framework_version = report.framework_version or result.framework_version
    result.framework_throughput = report.framework_throughput
    result.startup_seconds = report.startup_seconds
    if report.data_sha256 != job.data_sha256:
        result.status = "invalid"
        result.reason = f"the worker trained on data {report.data_sha256}, not the packed stream {job.data_sha256}"
    figures = metrics.figures(scenario, clock_checks.never_above_the_host(report.steps, stamps),
                              flops.gpu_peak_tflops(gpu_name), gpu_name)
    impossible = figures.pop("impossible", None)
    for key, value in figures.items():
        setattr(result, key, value)
    if impossible and result.status == "ok":
        result.status, result.reason = "invalid", f"impossible figures: {impossible}"
    if result.status == "ok" and result.steps_measured == 0:
        result.status, result.reason = "failed", "no measured steps in the metrics file"
    _verify(result, scenario, report, job, backend.info.contract, stamps)


def _verify(result: RunResult, scenario: Scenario, report, job: Job, contract: int, stamps: dict | None) -> None:
    """The host's checks of the worker's claims: a wrong claim makes an `ok` run `invalid`;
    a claim not made too, where the backend's contract names it. A claim its older contract
    does not name, or one the worker says it cannot make on this run (`WorkerReport.unclaimed`,
    with why), leaves the run `unverified`: shown, kept out of "% of reference" and the charts."""
    result.settings = dict(report.settings or {})
    result.loss_curve = losses.canonical_losses(job.run_dir)
    claimed: dict[int, dict[int, float]] = {}
    for m in report.steps:
        claimed.setdefault(m.rank, {})[m.step] = m.seconds
    off = verify.unchecked()
    result.checks = [c for c in verify.verify(scenario, report, job.data_dir, result.tgs, job)
                     + clock_checks.checks(stamps, scenario.steps.warmup, claimed, cpu=job.device == "cpu")
                     + [update.check(job.run_dir, stamps, adapters=scenario.finetune.method != "full")]
                     + [c for c in [reveal_checks.losses_in_time_check(stamps, job.run_dir),
                                    reveal_checks.initial_reveal_check(stamps, job.run_dir),
                                    reveal_checks.warmup_update_check(stamps, job.run_dir, scenario.finetune.method != "full",
                                                                      still=_warmup_steps(scenario) == 0),
                                    median_step_check(stamps, scenario.steps.warmup),
                                    machine_load.check(stamps, scenario.steps.warmup)]
                        if c is not None]
                     if c.name not in off]
    reason, flags = verify.fold(result.checks)
    result.flags += flags
    if reason and result.status == "ok":
        result.status, result.reason = "invalid", reason
    unmeasured = [f"{c.name} ({c.detail.removeprefix('unverified: ')})" for c in result.checks
                  if c.status == "unverified" and c.name in clock_checks.HOST_MEASURED]
    unmeasured += [f for f in result.flags if f.startswith(metrics.NO_CEILING)]
    missing = [c.name for c in result.checks if c.status == "unverified" and c.name not in clock_checks.HOST_MEASURED]
    parts = []
    if verify.CLAIMS not in off and missing and result.status == "ok":
        said = {name: why for name, why in report.unclaimed.items() if name in missing}
        owed = [name for name in missing if name not in said and contract >= verify.claimed_since(name)]
        if owed:
            result.status = "invalid"
            result.reason = f"claims missing, which plugin contract {contract} requires: {', '.join(owed)}"
            return
        older = [name for name in missing if name not in said]
        if older:
            parts.append(f"claims not made by this contract-{contract} plugin (contract {CONTRACT} requires them): "
                         f"{', '.join(older)}")
        if said:
            parts.append("claims the backend says it cannot make on this run: "
                         + "; ".join(f"{name} ({why})" for name, why in said.items()))
    # The host's own measurements it could not make (a span too short to read, no /proc, no
    # hardware ceiling): no claim of the worker's is missing, but no check vouched for them either.
    if unmeasured and result.status == "ok":
        parts.append("what the host could not measure: " + "; ".join(unmeasured))
    if parts and result.status == "ok":
        result.status, result.reason = "unverified", "; ".join(parts)


def _warmup_steps(scenario: Scenario) -> int:
    """The optimizer steps that end within the warm-up (its micro-iterations, with `steps.unit: micro`)."""
    steps = scenario.steps
    return steps.warmup // scenario.grad_accum if steps.unit == "micro" else steps.warmup
