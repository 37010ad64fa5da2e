"""One run of one backend on one scenario, whatever launches it: judge (every refusal) ->
prepare (pack, job, `fbench_plan`, the host's rewrite of job.json) -> execute (a launcher:
`framework_bench/run/launchers/`) -> finish (read the report back, verify, figures).

`run_one` runs it here; `submit` hands it to SLURM, and `framework_bench/run/collect.py`
finishes it when its job ends; `dry_run` stops after the plan. Every hook is called through
`call_hook` on each of these paths, and `plan_for` rewrites job.json after every plan, so the
guarantees of `framework_bench/plugins/hookspecs.py` hold whatever the launcher. Every outcome
is a `RunResult`; unsupported settings, crashes, OOMs and timeouts are results with a status
and a reason, never a traceback in the host.
"""

from __future__ import annotations

import json
import os
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, Field

from framework_bench.data import tokenizer
from framework_bench.data.packing import PackedData, pack, packed_dir
from framework_bench.envs import venvs as envs
from framework_bench.measure import clock, flops, losses, metrics, update, verify
from framework_bench.measure.machine import detect
from framework_bench.measure.memory import estimate
from framework_bench.measure.metrics import RunResult
from framework_bench.plugins import registry as plugins
from framework_bench.plugins.backend import CONTRACT, Job, LaunchPlan, Machine, MemoryScheme, WorkerReport
from framework_bench.run import orphans, verdicts
from framework_bench.run.launchers.base import Outcome, default_launcher, executor_for
from framework_bench.run.launchers.slurm import (SlurmExecutor, Submission, TimeEstimate, estimate_time,
                                                 sbatch_available, shared_path_warnings)
from framework_bench.run.options import RunOptions
from framework_bench.spec.scenario import Scenario
from framework_bench.worker.files import read_metrics
from framework_bench.worker.hparams import SEED
from framework_bench.worker.packed import TOKENIZER_DIR

StepCallback = Callable[[int, int, float | None], None]  # (steps done, steps total, last step seconds)


def runs_root() -> Path:
    return envs.fbench_home() / "runs"


def check(backend: plugins.Backend, scenario: Scenario, machine: Machine):
    """(env, reason): reason is None when the backend can run the scenario here. The reason
    names every refusal side by side (this machine, the env, the backend's own check,
    memory): see `framework_bench/run/verdicts.py`. The backend's declared capabilities are
    enforced there too, before its own check."""
    env, verdict = verdicts.judge(backend, scenario, machine, force=True)  # memory: `memory_shortfall`
    return env, verdict.reason


HOOK_ERROR_FRAMES = 6  # the innermost frames of a hook's traceback kept in a failed result


class HookError(Exception):
    """A backend hook raised: the run becomes a `failed` result naming the hook, never a host crash."""


def call_hook(hook: str, fn, *args, **kwargs):
    """`fn(*args, **kwargs)`, with any exception turned into a `HookError` carrying the traceback tail."""
    try:
        return fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - any plugin bug ends as a failed row
        # The plugin's frames: the host's own (this module, pluggy's dispatch) say nothing.
        frames = [f for f in traceback.extract_tb(e.__traceback__)
                  if f.filename not in (__file__, plugins.__file__, verdicts.__file__) and f"{os.sep}pluggy{os.sep}" not in f.filename]
        tail = "".join(traceback.format_list(frames[-HOOK_ERROR_FRAMES:]) + traceback.format_exception_only(e))
        raise HookError(f"{hook} raised {type(e).__name__}: {e}\nTraceback (most recent call last):\n{tail}".rstrip()) from e


def memory_shortfall(scenario: Scenario, machine: Machine, declared: MemoryScheme, settings_mode: str) -> str | None:
    """Refuse before launch when the per-GPU memory estimate exceeds this machine's GPUs."""
    if scenario.cluster.device != "cuda" or not machine.gpu_memory_gib:
        return None
    e = estimate(scenario, declared=declared, settings_mode=settings_mode, gpu_memory_gib=machine.gpu_memory_gib)
    return None if e.fits else verdicts.fit_refusal(e, machine.gpu_name)


def new_run_dir(backend: str, scenario: Scenario, root: Path | None) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return (root or runs_root()) / f"{stamp}-{scenario.name}-{backend}-{time.monotonic_ns() % 10**6:06d}"


def make_job(backend: str, scenario: Scenario, data: PackedData, machine: Machine, root: Path | None,
             settings_mode: str = "matched", run_dir: Path | None = None, seed: int = SEED) -> Job:
    run_dir = run_dir or new_run_dir(backend, scenario, root)
    return Job(backend=backend, scenario=scenario, data_dir=data.dir, data_sha256=data.sha256, run_dir=run_dir,
               device=scenario.cluster.device, nprocs=scenario.cluster.gpus_per_node, nnodes=scenario.cluster.nodes,
               settings_mode=settings_mode, seed=seed)


def run_one(backend_name: str, scenario: Scenario, options: RunOptions | None = None, *,
            data: PackedData | None = None, machine: Machine | None = None,
            on_step: StepCallback = lambda done, total, secs: None, reference: RunResult | None = None) -> RunResult:
    """Run it here (the local or torchrun launcher) and wait for its end.

    `options.db`: the results file the caller will store the run in (`results.save`); should
    fbench die before that, the next command stores the run there as `failed`
    (framework_bench/run/orphans.py). `reference`: the torch reference's run on the same
    scenario and seed; the run's parity with it is then one more blocking check."""
    options = options or RunOptions()
    backend = plugins.get(backend_name)
    machine = machine or detect()
    try:
        env, reason = call_hook("fbench_check", check, backend, scenario, machine)
    except HookError as e:
        return RunResult(backend=backend_name, scenario=scenario.name, status="failed", reason=str(e))
    if reason is None and not options.force:
        reason = memory_shortfall(scenario, machine, backend.info.memory, options.settings_mode)
    base = dict(backend=backend_name, scenario=scenario.name, framework_version=env.version(backend.info.env.framework_package),
                settings_mode=options.settings_mode, seed=options.seed)
    if reason:
        # A backend that refuses for want of its env has a setup to finish, not a setting it cannot run
        # (a scenario outside its declared capabilities stays unsupported, env or not).
        setup = (not env.ready and verdicts.machine_shortfall(scenario, machine) is None
                 and backend.info.capabilities.refusal(scenario, backend.name) is None)
        return RunResult(**base, status="failed" if setup else "unsupported", reason=reason)
    # From here on the run is the host's to store: claimed in its run folder before packing, so
    # that should fbench die now (packing, the worker, storing), the next command stores it.
    run_dir = new_run_dir(backend_name, scenario, options.root)
    try:
        orphans.claim(run_dir, options.db, backend_name, scenario, options.settings_mode)
    except OSError as e:  # a full or read-only runs folder: nothing was launched
        return RunResult(**base, status="failed", reason=f"cannot write the run folder: {e}")
    try:
        result = _pack_launch_finish(backend, scenario, env, base, machine, data, run_dir, options, on_step)
    except BaseException:
        orphans.release(run_dir)  # a user error while packing (bad data) is said by the CLI, not stored
        raise
    finally:
        if options.db is None:  # nobody stores it: nothing for a later command to recover
            orphans.release(run_dir)
    if reference is not None and result.status == "ok":
        _judge_parity(result, reference, scenario)
    return result


def _judge_parity(result: RunResult, reference: RunResult, scenario: Scenario) -> None:
    """The run's canonical step-1 loss against the reference's (framework_bench/measure/losses.py),
    and its update projection (framework_bench/measure/update.py)."""
    checks = [c for c in (losses.parity(result, reference, scenario.precision),
                          update.parity(result, reference, scenario.precision)) if c is not None]
    result.checks += checks
    reason, _ = verify.verdict(checks)
    if reason:
        result.status, result.reason = "invalid", reason
    _save(result)


def _pack_launch_finish(backend: plugins.Backend, scenario: Scenario, env, base: dict, machine: Machine,
                        data: PackedData | None, run_dir: Path, options: RunOptions, on_step: StepCallback) -> RunResult:
    try:
        data = data or pack(scenario, progress=False, say=lambda msg: None)
    except KeyboardInterrupt:
        return RunResult(**base, status="interrupted", reason="interrupted while packing the data", run_dir=run_dir)
    except OSError as e:  # a full disk under the data cache: the run could not start
        return RunResult(**base, status="failed", reason=f"cannot pack the data: {e}", run_dir=run_dir)
    try:
        job = make_job(base["backend"], scenario, data, machine, None, options.settings_mode, run_dir, base["seed"])
        job.write()
    except OSError as e:  # a full or read-only runs folder: nothing was launched
        return RunResult(**base, status="failed", reason=f"cannot write the run folder: {e}", data_sha256=data.sha256,
                         run_dir=run_dir)
    # From here on a worker may run: whatever goes wrong in the host ends as this run's
    # result, never as a traceback that leaves the worker behind and the row unstored.
    try:
        return _launch_and_finish(backend, job, env, base, machine, options, on_step)
    except Exception as e:  # noqa: BLE001 - any host or plugin error after the job exists
        result = RunResult(**base, status="failed", run_dir=job.run_dir, data_sha256=data.sha256,
                           reason=f"fbench failed while running it: {type(e).__name__}: {e}\n{_tail_of(e)}".rstrip())
        _save(result)
        return result
    except KeyboardInterrupt:  # after the worker stopped (the executor answers one during the run)
        result = RunResult(**base, status="interrupted", run_dir=job.run_dir, data_sha256=data.sha256,
                           reason="interrupted while fbench read the run back")
        _save(result)
        return result


def _tail_of(e: BaseException) -> str:
    return "".join(traceback.format_exception(e)[-HOOK_ERROR_FRAMES:])


def plan_for(backend: plugins.Backend, job: Job, env) -> LaunchPlan:
    """`fbench_plan` under the host's guarantees, on every path: an exception in it is a
    `HookError`; job.json (written before) is written again after it, so whatever a plan wrote
    there, the worker reads the host's job."""
    plan = call_hook("fbench_plan", lambda: LaunchPlan.model_validate(backend.plan(job, env)))
    job.write()
    return plan


def _plan_failed(base: dict, job: Job, e: HookError) -> RunResult:
    result = RunResult(**base, status="failed", reason=str(e), run_dir=job.run_dir, data_sha256=job.data_sha256)
    _save(result)
    return result


def _launch_and_finish(backend: plugins.Backend, job: Job, env, base: dict, machine: Machine, options: RunOptions,
                       on_step: StepCallback) -> RunResult:
    try:
        plan = plan_for(backend, job, env)
    except HookError as e:
        return _plan_failed(base, job, e)
    executor = executor_for(options.launcher or default_launcher(job))
    (job.run_dir / "plan.json").write_text(json.dumps(
        {"launcher": executor.name, "argv": executor.node_argvs(plan, job), "env": plan.env,
         "files": {k: str(v) for k, v in plan.files.items()}}, indent=2))
    total = job.scenario.steps.total
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
            on_step(done, total, last)

    outcome = executor.run(plan, job, options.timeout, poll)
    return finish(backend, job, outcome, base, machine.gpu_name)


# A reason is read on a terminal: its head and tail, never a whole log or a list of 200,000 steps.
REASON_LINES = 60
REASON_CHARS = 4000


def _shortened(reason: str) -> str:
    lines = reason.splitlines()
    if len(lines) > REASON_LINES:
        lines = lines[:REASON_LINES // 2] + [f"[... {len(lines) - REASON_LINES} lines left out ...]"] + lines[-REASON_LINES // 2:]
    reason = "\n".join(lines)
    if len(reason) > REASON_CHARS:
        half = REASON_CHARS // 2
        reason = f"{reason[:half]} [... {len(reason) - REASON_CHARS} characters left out ...] {reason[-half:]}"
    return reason


def finish(backend: plugins.Backend, job: Job, outcome: Outcome, base: dict,
           gpu_name: str | None) -> RunResult:
    """The result of a launched run once it ended (here, or as a SLURM job): read the
    worker's report back, check the data it trained on, compute the figures, save it.
    Whatever fails here makes the run `failed` with the reason: it is never lost."""
    result = RunResult(**base, status=outcome.status, run_dir=job.run_dir, wall_seconds=round(outcome.seconds, 2),
                       data_sha256=job.data_sha256)
    try:
        _read_back(result, backend, job, outcome, gpu_name)
    except Exception as e:  # noqa: BLE001 - a bug in the figures or checks must not lose the run
        result.status = "failed"
        result.reason = f"fbench could not read the run back: {type(e).__name__}: {e}\n{_tail_of(e)}".rstrip()
    if result.reason:
        result.reason = _shortened(result.reason)
    _save(result)
    return result


def _read_back(result: RunResult, backend: plugins.Backend, job: Job, outcome: Outcome,
               gpu_name: str | None) -> None:
    scenario = job.scenario
    if outcome.status != "ok":
        result.reason = f"exit code {outcome.returncode}\n{outcome.log_tail}" if outcome.returncode else outcome.log_tail
        return
    stamps = clock.load_stamps(job.run_dir)
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
    figures = metrics.figures(scenario, report.steps, flops.gpu_peak_tflops(gpu_name), gpu_name)
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
                     + clock.checks(stamps, scenario.steps.warmup, claimed, cpu=job.device == "cpu")
                     + [update.check(job.run_dir, stamps)]
                     if c.name not in off]
    reason, flags = verify.verdict(result.checks)
    result.flags += flags
    if reason and result.status == "ok":
        result.status, result.reason = "invalid", reason
    missing = [c.name for c in result.checks if c.status == "unverified"]
    if verify.CLAIMS not in off and missing and result.status == "ok":
        said = {name: why for name, why in report.unclaimed.items() if name in missing}
        owed = [name for name in missing if name not in said and contract >= verify.claimed_since(name)]
        if owed:
            result.status = "invalid"
            result.reason = f"claims missing, which plugin contract {contract} requires: {', '.join(owed)}"
        else:
            result.status, parts = "unverified", []
            older = [name for name in missing if name not in said]
            if older:
                parts.append(f"claims not made by this contract-{contract} plugin (contract {CONTRACT} requires them): "
                             f"{', '.join(older)}")
            if said:
                parts.append("claims the backend says it cannot make on this run: "
                             + "; ".join(f"{name} ({why})" for name, why in said.items()))
            result.reason = "; ".join(parts)


def _save(result: RunResult) -> None:
    """A copy of the result in the run folder, for people reading it; the store holds the row.
    A full disk or a run folder a plugin removed costs this copy only, never the row."""
    if not result.run_dir:
        return
    try:
        (result.run_dir / "result.json").write_text(result.model_dump_json(indent=2))
    except OSError as e:
        result.notes.append(f"result.json not written in the run folder: {e.strerror or e}")


class DryRun(BaseModel):
    """What `run_one` would do, without packing or launching anything."""

    backend: str
    scenario: str
    launcher: str
    check: str | None = Field(description="why it would be refused on this machine; None if it would run")
    verdict: verdicts.Verdict | None = Field(None, description="each refusal on its own: machine, env, backend, memory")
    time: TimeEstimate | None = Field(None, description="the SLURM time limit estimate (slurm launcher)")
    plan_error: str | None = Field(None, description="fbench_plan raised: its error (no argv, env or files then)")
    argv: list[str]
    env: dict[str, str]
    files: dict[str, Path]
    run_dir: Path


def dry_run(backend_name: str, scenario: Scenario, options: RunOptions | None = None, machine: Machine | None = None,
            pack_data: bool = False) -> DryRun:
    """Plan without launching. Without `pack_data` no rows are packed (a 1M-token scenario's
    stream is gigabytes): the plan gets a stand-in data folder holding only the tokenizer.
    `options.root`: the folder of the plans' run folders (default FBENCH_HOME/runs/dry-run)."""
    options = options or RunOptions()
    backend = plugins.get(backend_name)
    machine = machine or detect()
    try:
        env, verdict = call_hook("fbench_check", verdicts.judge, backend, scenario, machine)
        reason = verdict.reason
    except HookError as e:
        env, verdict, reason = envs.inspect(backend.name, backend.info.env), None, str(e)
    root = options.root or runs_root() / "dry-run"
    data = pack(scenario, progress=False, say=lambda msg: None) if pack_data else _unpacked(scenario, root)
    job = make_job(backend_name, scenario, data, machine, root, options.settings_mode, seed=options.seed)
    job.write()
    executor = executor_for(options.launcher or default_launcher(job))
    try:
        plan = plan_for(backend, job, env)
    except HookError as e:
        return DryRun(backend=backend_name, scenario=scenario.name, launcher=executor.name, check=reason,
                      verdict=verdict, plan_error=str(e), argv=[], env={}, files={"job": job.job_file},
                      run_dir=job.run_dir)
    files = {"job": job.job_file, **plan.files}
    time_ = None
    if isinstance(executor, SlurmExecutor):
        time_ = estimate_time(scenario, verdicts.target_machine(scenario, machine).gpu_name)
        files["sbatch"] = executor.write(plan, job, options.sbatch, time_)
    return DryRun(backend=backend_name, scenario=scenario.name, launcher=executor.name, check=reason, verdict=verdict,
                  time=time_, argv=executor.argv(plan, job), env=plan.env, files=files, run_dir=job.run_dir)


class Planned(BaseModel):
    """One backend x scenario for SLURM: refused or failed (result), or written (and maybe submitted)."""

    verdict: verdicts.Verdict
    result: RunResult | None = Field(None, description="the unsupported or failed result: nothing submitted")
    sbatch: Path | None = None
    time: TimeEstimate | None = None
    submission: Submission | None = None
    note: str | None = None


def submit(backend_name: str, scenario: Scenario, options: RunOptions | None = None,
           machine: Machine | None = None) -> Planned:
    """Judge, pack, plan and write the sbatch script; submit it when sbatch exists here.
    Nothing is written or submitted for a backend whose own check refused, or whose
    `fbench_check` or `fbench_plan` raised (a `failed` result then, as on every launcher);
    the job ends on the cluster and `framework_bench/run/collect.py` finishes it."""
    options = options or RunOptions()
    backend = plugins.get(backend_name)
    machine = machine or detect()
    base = dict(backend=backend_name, scenario=scenario.name, settings_mode=options.settings_mode, seed=options.seed)
    try:
        env, verdict = call_hook("fbench_check", verdicts.judge, backend, scenario, machine, force=options.force)
    except HookError as e:
        return Planned(verdict=verdicts.Verdict(backend=backend_name, check=str(e)),
                       result=RunResult(**base, status="failed", reason=str(e)))
    base["framework_version"] = env.version(backend.info.env.framework_package)
    if verdict.refused_by_backend:
        return Planned(verdict=verdict, result=RunResult(**base, status="unsupported", reason=verdict.reason))
    target = verdicts.target_machine(scenario, machine)
    time_ = estimate_time(scenario, target.gpu_name)
    data = pack(scenario, progress=False, say=lambda msg: None)
    job = make_job(backend_name, scenario, data, machine, options.root, options.settings_mode, seed=options.seed)
    job.write()
    try:
        plan = plan_for(backend, job, env)
    except HookError as e:
        return Planned(verdict=verdict, result=_plan_failed(base, job, e))
    executor = SlurmExecutor()
    sbatch = executor.write(plan, job, options.sbatch, time_)
    warnings = shared_path_warnings(job, plan.python)
    out = Planned(verdict=verdict, sbatch=sbatch, time=time_, note="; ".join(warnings) or None)
    if not sbatch_available():
        out.note = "; ".join([*warnings, f"sbatch not found here: submit {sbatch} on the cluster, "
                              "then `fbench results collect` stores it when it ends"])
        return out
    submitted = executor.submit(sbatch, job, options.sbatch.time_limit or time_.limit, target.gpu_name, options.db)
    if isinstance(submitted, str):
        out.note = submitted
    else:
        out.submission = submitted
    return out


def _unpacked(scenario: Scenario, root: Path) -> PackedData:
    directory = root / f"unpacked-{packed_dir(scenario).name}"
    tokenizer.save_for_transformers(tokenizer.load(scenario.dataset.tokenizer), directory / TOKENIZER_DIR,
                                    scenario.context_length)
    return PackedData(directory, {"sha256": "(not packed in a dry run)"})
