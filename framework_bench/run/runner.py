"""Run one backend on one scenario: check, pack, plan, launch, read back, compute figures.

Every outcome is a `RunResult`; unsupported settings, crashes, OOMs and timeouts are
results with a status and a reason, never a traceback in the host.
"""

from __future__ import annotations

import json
import os
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, Field

from framework_bench.measure import clock
from framework_bench.envs import venvs as envs
from framework_bench.measure import flops
from framework_bench.run import launch
from framework_bench.measure import losses
from framework_bench.measure import metrics
from framework_bench.run import orphans
from framework_bench.plugins import registry as plugins
from framework_bench.run import verdicts
from framework_bench.measure import verify
from framework_bench.plugins.backend import CONTRACT, Job, LaunchPlan, Machine, WorkerReport
from framework_bench.data import tokenizer
from framework_bench.data.packing import PackedData, pack, packed_dir
from framework_bench.worker.packed import TOKENIZER_DIR
from framework_bench.worker.hparams import SEED
from framework_bench.measure.machine import detect
from framework_bench.measure.memory import MemoryScheme, estimate
from framework_bench.measure.metrics import RunResult
from framework_bench.run.sbatch import SbatchOptions, TimeEstimate, estimate_time
from framework_bench.spec.scenario import Scenario
from framework_bench.worker.files import read_metrics

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
               settings_mode=settings_mode)


def run_one(
    backend_name: str,
    scenario: Scenario,
    *,
    data: PackedData | None = None,
    timeout: float | None = None,
    launcher: launch.Launcher | None = None,
    root: Path | None = None,
    machine: Machine | None = None,
    on_step: StepCallback = lambda done, total, secs: None,
    force: bool = False,
    settings_mode: str = "matched",
    db: Path | None = None,
    seed: int = SEED,
    reference: RunResult | None = None,
) -> RunResult:
    """`db`: the results file the caller will store the run in (`results.save`); should fbench
    die before that, the next command stores the run there as `failed` (framework_bench/run/orphans.py).
    `reference`: the torch reference's run on the same scenario and seed; the run's parity with
    it is then one more blocking check."""
    backend = plugins.get(backend_name)
    machine = machine or detect()
    try:
        env, reason = call_hook("fbench_check", check, backend, scenario, machine)
    except HookError as e:
        return RunResult(backend=backend_name, scenario=scenario.name, status="failed", reason=str(e))
    if reason is None and not force:
        reason = memory_shortfall(scenario, machine, backend.info.memory, settings_mode)
    base = dict(backend=backend_name, scenario=scenario.name, framework_version=env.version(backend.info.env.framework_package),
                settings_mode=settings_mode, seed=seed)
    if reason:
        # A backend that refuses for want of its env has a setup to finish, not a setting it cannot run
        # (a scenario outside its declared capabilities stays unsupported, env or not).
        setup = (not env.ready and verdicts.machine_shortfall(scenario, machine) is None
                 and backend.info.capabilities.refusal(scenario, backend.name) is None)
        return RunResult(**base, status="failed" if setup else "unsupported", reason=reason)
    # From here on the run is the host's to store: claimed in its run folder before packing, so
    # that should fbench die now (packing, the worker, storing), the next command stores it.
    run_dir = new_run_dir(backend_name, scenario, root)
    try:
        orphans.claim(run_dir, db, backend_name, scenario, settings_mode)
    except OSError as e:  # a full or read-only runs folder: nothing was launched
        return RunResult(**base, status="failed", reason=f"cannot write the run folder: {e}")
    try:
        result = _pack_launch_finish(backend, scenario, env, base, machine, data, run_dir, settings_mode, timeout,
                                     launcher, on_step)
    except BaseException:
        orphans.release(run_dir)  # a user error while packing (bad data) is said by the CLI, not stored
        raise
    finally:
        if db is None:  # nobody stores it: nothing for a later command to recover
            orphans.release(run_dir)
    if reference is not None and result.status == "ok":
        _judge_parity(result, reference, scenario)
    return result


def _judge_parity(result: RunResult, reference: RunResult, scenario: Scenario) -> None:
    """The run's canonical step-1 loss against the reference's (framework_bench/measure/losses.py)."""
    check = losses.parity(result, reference, scenario.precision)
    result.checks.append(check)
    reason, _ = verify.verdict([check])
    if reason:
        result.status, result.reason = "invalid", reason
    _save(result)


def _pack_launch_finish(backend: plugins.Backend, scenario: Scenario, env, base: dict, machine: Machine,
                        data: PackedData | None, run_dir: Path, settings_mode: str, timeout: float | None,
                        launcher: launch.Launcher | None, on_step: StepCallback) -> RunResult:
    try:
        data = data or pack(scenario, progress=False, say=lambda msg: None)
    except KeyboardInterrupt:
        return RunResult(**base, status="interrupted", reason="interrupted while packing the data", run_dir=run_dir)
    except OSError as e:  # a full disk under the data cache: the run could not start
        return RunResult(**base, status="failed", reason=f"cannot pack the data: {e}", run_dir=run_dir)
    try:
        job = make_job(base["backend"], scenario, data, machine, None, settings_mode, run_dir, base["seed"])
        job.write()
    except OSError as e:  # a full or read-only runs folder: nothing was launched
        return RunResult(**base, status="failed", reason=f"cannot write the run folder: {e}", data_sha256=data.sha256,
                         run_dir=run_dir)
    # From here on a worker may run: whatever goes wrong in the host ends as this run's
    # result, never as a traceback that leaves the worker behind and the row unstored.
    try:
        return _launch_and_finish(backend, job, scenario, env, base, machine, timeout, launcher, on_step)
    except Exception as e:  # noqa: BLE001 - any host or plugin error after the job exists
        result = RunResult(**base, status="failed", run_dir=job.run_dir, data_sha256=data.sha256,
                           reason=f"fbench failed while running it: {type(e).__name__}: {e}\n{_tail_of(e)}".rstrip())
        _save(result)
        return result
    except KeyboardInterrupt:  # after the worker stopped (launch.execute answers one during the run)
        result = RunResult(**base, status="interrupted", run_dir=job.run_dir, data_sha256=data.sha256,
                           reason="interrupted while fbench read the run back")
        _save(result)
        return result


def _tail_of(e: BaseException) -> str:
    return "".join(traceback.format_exception(e)[-HOOK_ERROR_FRAMES:])


def _launch_and_finish(backend: plugins.Backend, job: Job, scenario: Scenario, env, base: dict, machine: Machine,
                       timeout: float | None, launcher: launch.Launcher | None, on_step: StepCallback) -> RunResult:
    try:
        plan = call_hook("fbench_plan", lambda: LaunchPlan.model_validate(backend.plan(job, env)))
    except HookError as e:
        result = RunResult(**base, status="failed", reason=str(e), run_dir=job.run_dir, data_sha256=job.data_sha256)
        _save(result)
        return result
    job.write()  # the host owns job.json: whatever a plan wrote there, the worker reads the host's job
    launcher = launcher or launch.default_launcher(job)
    argvs = launch.node_argvs(plan, job, launcher)
    (job.run_dir / "plan.json").write_text(json.dumps(
        {"launcher": launcher, "argv": argvs, "env": plan.env, "files": {k: str(v) for k, v in plan.files.items()}},
        indent=2))

    total = scenario.steps.total
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

    # The host's own clock stamps the worker's clock lines as they arrive (framework_bench/measure/clock.py).
    gpus = launch.visible_gpus_env(job, {**os.environ, **plan.env}).get("CUDA_VISIBLE_DEVICES")
    with clock.Watcher(job.run_dir, scenario.steps.warmup, cpu=job.device == "cpu", gpus=gpus):
        outcome = launch.execute(argvs, plan.env, job.run_dir, job.run_dir / "worker.log", timeout, poll)
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


def finish(backend: plugins.Backend, job: Job, outcome: launch.Outcome, base: dict,
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


def _read_back(result: RunResult, backend: plugins.Backend, job: Job, outcome: launch.Outcome,
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
    a claim not made too, from a backend of the current contract (one of an older contract
    is `unverified`: shown, kept out of "% of reference" and the charts)."""
    result.settings = dict(report.settings or {})
    result.loss_curve = losses.canonical_losses(job.run_dir)
    result.checks = verify.verify(scenario, report, job.data_dir, result.tgs, job)
    referee = clock.referee_on()
    if referee:
        claimed: dict[int, dict[int, float]] = {}
        for m in report.steps:
            claimed.setdefault(m.rank, {})[m.step] = m.seconds
        result.checks += clock.checks(stamps, scenario.steps.warmup, claimed, cpu=job.device == "cpu")
    reason, flags = verify.verdict(result.checks)
    result.flags += flags
    if reason and result.status == "ok":
        result.status, result.reason = "invalid", reason
    missing = [c.name for c in result.checks if c.status == "unverified"]
    if referee and missing and result.status == "ok":
        if contract >= CONTRACT:
            result.status = "invalid"
            result.reason = f"claims missing, which plugin contract {contract} requires: {', '.join(missing)}"
        else:
            result.status = "unverified"
            result.reason = (f"claims not made by this contract-{contract} plugin (contract {CONTRACT} requires "
                             f"them): {', '.join(missing)}")


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


def dry_run(backend_name: str, scenario: Scenario, launcher: launch.Launcher | None = None,
            machine: Machine | None = None, root: Path | None = None, pack_data: bool = False,
            settings_mode: str = "matched", sbatch_options: SbatchOptions | None = None) -> DryRun:
    """Plan without launching. Without `pack_data` no rows are packed (a 1M-token scenario's
    stream is gigabytes): the plan gets a stand-in data folder holding only the tokenizer."""
    backend = plugins.get(backend_name)
    machine = machine or detect()
    try:
        env, verdict = call_hook("fbench_check", verdicts.judge, backend, scenario, machine)
        reason = verdict.reason
    except HookError as e:
        env, verdict, reason = envs.inspect(backend.name, backend.info.env), None, str(e)
    root = root or runs_root() / "dry-run"
    data = pack(scenario, progress=False, say=lambda msg: None) if pack_data else _unpacked(scenario, root)
    job = make_job(backend_name, scenario, data, machine, root, settings_mode)
    job.write()
    launcher = launcher or launch.default_launcher(job)
    try:
        plan = call_hook("fbench_plan", lambda: LaunchPlan.model_validate(backend.plan(job, env)))
    except HookError as e:
        return DryRun(backend=backend_name, scenario=scenario.name, launcher=launcher, check=reason, verdict=verdict,
                      plan_error=str(e), argv=[], env={}, files={"job": job.job_file}, run_dir=job.run_dir)
    job.write()
    files = {"job": job.job_file, **plan.files}
    time_ = None
    if launcher == "slurm":
        opts = sbatch_options or SbatchOptions()
        time_ = estimate_time(scenario, verdicts.target_machine(scenario, machine).gpu_name)
        files["sbatch"] = launch.write_sbatch(plan, job, opts.time_limit or time_.limit, opts.cpus_per_task,
                                              tuple(opts.extra))
    return DryRun(backend=backend_name, scenario=scenario.name, launcher=launcher, check=reason, verdict=verdict, time=time_,
                  argv=launch.argv_for(plan, job, launcher), env=plan.env, files=files, run_dir=job.run_dir)


def _unpacked(scenario: Scenario, root: Path) -> PackedData:
    directory = root / f"unpacked-{packed_dir(scenario).name}"
    tokenizer.save_for_transformers(tokenizer.load(scenario.dataset.tokenizer), directory / TOKENIZER_DIR,
                                    scenario.context_length)
    return PackedData(directory, {"sha256": "(not packed in a dry run)"})
