"""One run of one backend on one scenario, whatever launches it, in three steps:

1. `prepare`: judge every refusal once (this machine, the env, the backend's own check, memory,
   in the run's settings mode), pack, write the host's job.json, call `fbench_plan`, write
   job.json again (whatever the plan wrote there, the worker reads the host's job);
2. the launcher `start`s it (`framework_bench/run/launchers/`): here, to its `Outcome`, or on
   SLURM, to a `Submission` that `framework_bench/run/collect.py` finishes when its job ends;
3. `finish`: read the report back, verify every claim, judge parity with the reference,
   write result.json.

`run_one` runs the three here; `submit` stops after the start on SLURM; `dry_run` prepares
without packing and describes the plan. Every outcome is a `RunResult`: unsupported settings,
a raising hook, crashes, OOMs and timeouts are results with a status and a reason, never a
traceback in the host.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, Field

from framework_bench.data import tokenizer
from framework_bench.data.packing import PackedData, pack, packed_dir
from framework_bench.envs import venvs as envs
from framework_bench.measure.machine import detect
from framework_bench.measure.metrics import RunResult
from framework_bench.plugins import registry as plugins
from framework_bench.plugins.backend import Job, LaunchPlan, Machine
from framework_bench.run import orphans, readback, verdicts
from framework_bench.run.hooks import HookError, call_hook, tail_of
from framework_bench.run.launchers import executor_for
from framework_bench.run.launchers.base import Executor, Outcome, Submission, default_launcher
from framework_bench.run.launchers.slurm import SBATCH_FILE, TimeEstimate
from framework_bench.run.options import RunOptions
from framework_bench.spec.scenario import Scenario
from framework_bench.worker.files import read_metrics
from framework_bench.worker.hparams import SEED
from framework_bench.worker.packed import TOKENIZER_DIR

StepCallback = Callable[[int, int, float | None], None]  # (steps done, steps total, last step seconds)


def runs_root() -> Path:
    return envs.fbench_home() / "runs"


class Identity(BaseModel):
    """What names a run in every result it can end as, from a refusal to a full read-back."""

    backend: str
    scenario: str
    framework_version: str | None = None
    settings_mode: str = "matched"
    seed: int = SEED

    def result(self, status: str, **fields) -> RunResult:
        return RunResult(**self.model_dump(), status=status, **fields)


@dataclass
class Prepared:
    """A run ready to start: its job (job.json written), the backend's plan (None when rebuilt
    from a run folder to be finished, or when `plan_error` says why there is none), the launcher,
    and the GPU of the nodes it targets (its MFU's)."""

    identity: Identity
    backend: plugins.Backend
    job: Job
    gpu_name: str | None
    plan: LaunchPlan | None = None
    executor: Executor | None = None
    verdict: verdicts.Verdict | None = None
    refusal: str | None = None
    plan_error: str | None = None

    @classmethod
    def of_run_dir(cls, run_dir: Path, backend: str, gpu_name: str | None) -> "Prepared":
        """A run `backend` launched, as its folder holds it (the job the host wrote), to be finished."""
        job = Job.model_validate_json((Path(run_dir) / "job.json").read_text())
        return cls(Identity(backend=backend, scenario=job.scenario.name, settings_mode=job.settings_mode,
                            seed=job.seed), plugins.get(backend), job, gpu_name)


def prepare(backend_name: str, scenario: Scenario, options: RunOptions, *, machine: Machine | None = None,
            data: PackedData | None = None, dry: bool = False,
            on_verdict: Callable[[verdicts.Verdict], None] = lambda v: None) -> Prepared | RunResult:
    """Judge, pack, write the job and plan it; a `RunResult` when the run ends here (refused, a
    raising hook, a run folder that cannot be written). `dry`: refusals and a raising plan are
    kept on the `Prepared` instead, nothing is packed (the plan gets a stand-in data folder
    holding only the tokenizer) and the run folder is under `options.root` or FBENCH_HOME/runs/dry-run.
    A run that is not dry is claimed (framework_bench/run/orphans.py) before packing.
    `on_verdict` hears the verdict, every refusal on its own, whatever comes of it."""
    backend, machine = plugins.get(backend_name), machine or detect()
    identity = Identity(backend=backend_name, scenario=scenario.name, settings_mode=options.settings_mode,
                        seed=options.seed)
    executor = executor_for(options.launcher or default_launcher(scenario))
    try:
        env, verdict = call_hook("fbench_check", verdicts.judge, backend, scenario, machine, force=options.force,
                                 settings_mode=options.settings_mode)
        refusal = executor.refusal(verdict)
        on_verdict(verdict)
    except HookError as e:
        if not dry:
            return identity.result("failed", reason=str(e))
        env, verdict, refusal = envs.inspect(backend.name, backend.info.env), None, str(e)
    identity.framework_version = env.version(backend.info.env.framework_package)
    if refusal and not dry:
        # A backend that refuses for want of its env has a setup to finish, not a setting it cannot run
        # (a scenario outside its declared capabilities stays unsupported, env or not).
        setup = (not env.ready and verdicts.machine_shortfall(scenario, machine) is None
                 and backend.info.capabilities.refusal(scenario, backend.name) is None)
        return identity.result("failed" if setup else "unsupported", reason=refusal)
    if dry:
        root = options.root or runs_root() / "dry-run"
        job = make_job(backend_name, scenario, _unpacked(scenario, root), root, options.settings_mode, seed=options.seed)
        job.write()
    else:
        job = _packed_job(identity, scenario, data, options)
        if isinstance(job, RunResult):
            return job
    prepared = Prepared(identity, backend, job, verdicts.target_machine(scenario, machine).gpu_name,
                        executor=executor, verdict=verdict, refusal=refusal)
    try:
        prepared.plan = plan_for(backend, job, env)
    except HookError as e:
        if not dry:
            return _save(identity.result("failed", reason=str(e), run_dir=job.run_dir, data_sha256=job.data_sha256))
        prepared.plan_error = str(e)
    return prepared


def _packed_job(identity: Identity, scenario: Scenario, data: PackedData | None, options: RunOptions) -> Job | RunResult:
    # From here on the run is the host's to store: claimed in its run folder before packing, so
    # that should fbench die now (packing, the worker, storing), the next command stores it.
    run_dir = new_run_dir(identity.backend, scenario, options.root)
    try:
        orphans.claim(run_dir, options.db, identity.backend, scenario, options.settings_mode)
    except OSError as e:  # a full or read-only runs folder: nothing was launched
        return identity.result("failed", reason=f"cannot write the run folder: {e}")
    try:
        data = data or pack(scenario, progress=False, say=lambda msg: None)
    except KeyboardInterrupt:
        return identity.result("interrupted", reason="interrupted while packing the data", run_dir=run_dir)
    except OSError as e:  # a full disk under the data cache: the run could not start
        return identity.result("failed", reason=f"cannot pack the data: {e}", run_dir=run_dir)
    except BaseException:
        orphans.release(run_dir)  # a user error while packing (bad data) is said by the CLI, not stored
        raise
    try:
        job = make_job(identity.backend, scenario, data, None, options.settings_mode, run_dir, identity.seed)
        job.write()
    except OSError as e:  # a full or read-only runs folder: nothing was launched
        return identity.result("failed", reason=f"cannot write the run folder: {e}", data_sha256=data.sha256,
                               run_dir=run_dir)
    return job


def plan_for(backend: plugins.Backend, job: Job, env) -> LaunchPlan:
    """`fbench_plan` under the host's guarantees, on every path: an exception in it is a
    `HookError`; job.json (written before) is written again after it, so whatever a plan wrote
    there, the worker reads the host's job."""
    plan = call_hook("fbench_plan", lambda: LaunchPlan.model_validate(backend.plan(job, env)))
    job.write()
    return plan


def run_one(backend_name: str, scenario: Scenario, options: RunOptions | None = None, *,
            data: PackedData | None = None, machine: Machine | None = None,
            on_step: StepCallback = lambda done, total, secs: None, reference: RunResult | None = None) -> RunResult:
    """Prepare, start here (the local or torchrun launcher) and finish.

    `options.db`: the results file the caller will store the run in (`results.save`); should
    fbench die before that, the next command stores the run there as `failed`
    (framework_bench/run/orphans.py). `reference`: the reference backend's run on the same
    scenario and seed; the run's parity with it is then one more blocking check."""
    options = options or RunOptions()
    prepared = prepare(backend_name, scenario, options, machine=machine, data=data)
    if isinstance(prepared, RunResult):
        if options.db is None:  # nobody stores it: nothing for a later command to recover
            orphans.release(prepared.run_dir)
        return prepared
    job = prepared.job
    # From here on a worker may run: whatever goes wrong in the host ends as this run's
    # result, never as a traceback that leaves the worker behind and the row unstored.
    executor, plan = prepared.executor, prepared.plan
    try:
        (job.run_dir / "plan.json").write_text(json.dumps(
            {"launcher": executor.name, "argv": executor.node_argvs(plan, job), "env": plan.env,
             "files": {k: str(v) for k, v in plan.files.items()}}, indent=2))
        outcome = executor.start(plan, job, options, prepared.gpu_name, _progress(job, on_step))
        return finish(prepared, outcome, reference)
    except Exception as e:  # noqa: BLE001 - any host or plugin error after the job exists
        return _save(prepared.identity.result("failed", run_dir=job.run_dir, data_sha256=job.data_sha256,
                                              reason=f"fbench failed while running it: {type(e).__name__}: {e}\n{tail_of(e)}".rstrip()))
    except KeyboardInterrupt:  # after the worker stopped (the executor answers one during the run)
        return _save(prepared.identity.result("interrupted", run_dir=job.run_dir, data_sha256=job.data_sha256,
                                              reason="interrupted while fbench read the run back"))
    except BaseException:
        orphans.release(job.run_dir)
        raise
    finally:
        if options.db is None:
            orphans.release(job.run_dir)


def _progress(job: Job, on_step: StepCallback) -> Callable[[], None]:
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


def finish(prepared: Prepared, outcome: Outcome, reference: RunResult | None = None) -> RunResult:
    """The result of a launched run once it ended (here, or as a SLURM job): read back, verified,
    judged for parity with `reference` when both ended `ok`, saved as result.json. Whatever
    fails here makes the run `failed` with the reason: it is never lost."""
    job = prepared.job
    result = prepared.identity.result(outcome.status, run_dir=job.run_dir, wall_seconds=round(outcome.seconds, 2),
                                      data_sha256=job.data_sha256)
    try:
        readback.read_back(result, prepared.backend, job, outcome, prepared.gpu_name)
        if reference is not None and reference.status == "ok" and result.status == "ok":
            readback.judge_parity(result, reference, job.scenario)
    except Exception as e:  # noqa: BLE001 - a bug in the figures or checks must not lose the run
        result.status = "failed"
        result.reason = f"fbench could not read the run back: {type(e).__name__}: {e}\n{tail_of(e)}".rstrip()
    if result.reason:
        result.reason = readback.shortened(result.reason)
    return _save(result)


def _save(result: RunResult) -> RunResult:
    """A copy of the result in the run folder, for people reading it; the store holds the row.
    A full disk or a run folder a plugin removed costs this copy only, never the row."""
    if result.run_dir:
        try:
            (result.run_dir / "result.json").write_text(result.model_dump_json(indent=2))
        except OSError as e:
            result.notes.append(f"result.json not written in the run folder: {e.strerror or e}")
    return result


class DryRun(BaseModel):
    """What `run_one` (or `submit`) would do, without packing or launching anything."""

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


def dry_run(backend_name: str, scenario: Scenario, options: RunOptions | None = None,
            machine: Machine | None = None) -> DryRun:
    """`prepare` without packing, described: the verdict, the command, its environment and the
    files the plan and the launcher wrote."""
    options = options or RunOptions()
    p = prepare(backend_name, scenario, options, machine=machine, dry=True)
    files = {"job": p.job.job_file}
    head = dict(backend=backend_name, scenario=scenario.name, launcher=p.executor.name, check=p.refusal,
                verdict=p.verdict, run_dir=p.job.run_dir)
    if p.plan is None:
        return DryRun(**head, plan_error=p.plan_error, argv=[], env={}, files=files)
    files |= p.plan.files | p.executor.write(p.plan, p.job, options, p.gpu_name)
    return DryRun(**head, time=p.executor.time_limit(scenario, p.gpu_name), argv=p.executor.argv(p.plan, p.job),
                  env=p.plan.env, files=files)


class Planned(BaseModel):
    """One backend x scenario for SLURM: refused or failed (result), or written (and maybe submitted)."""

    verdict: verdicts.Verdict
    result: RunResult | None = Field(None, description="the unsupported or failed result: nothing submitted")
    sbatch: Path | None = None
    time: TimeEstimate | None = None
    submission: Submission | None = None
    note: str | None = None


def submit(backend_name: str, scenario: Scenario, options: RunOptions, machine: Machine | None = None,
           reference: Path | None = None) -> Planned:
    """Prepare and start on SLURM: write the sbatch script, submitted where sbatch exists here.
    Nothing is written or submitted for a backend that refused, or whose hooks raised (a
    result then, as on every launcher); the job ends on the cluster and
    `framework_bench/run/collect.py` finishes it, judged for parity with the run in `reference`."""
    options = options.model_copy(update={"launcher": "slurm"})
    heard: list[verdicts.Verdict] = []
    p = prepare(backend_name, scenario, options, machine=machine, on_verdict=heard.append)
    if isinstance(p, RunResult):  # the caller stores it, which releases its claim
        return Planned(verdict=heard[0] if heard else verdicts.Verdict(backend=backend_name, check=p.reason), result=p)
    sub = p.executor.start(p.plan, p.job, options, p.gpu_name, lambda: None)
    orphans.release(p.job.run_dir)  # its job is `results collect`'s to store now
    if sub.job_id is not None and reference is not None:
        sub.reference = reference
        sub.save()
    return Planned(verdict=p.verdict, sbatch=p.job.run_dir / SBATCH_FILE, time=p.executor.time_limit(scenario, p.gpu_name),
                   submission=sub if sub.job_id else None, note=sub.note)


def new_run_dir(backend: str, scenario: Scenario, root: Path | None) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return (root or runs_root()) / f"{stamp}-{scenario.name}-{backend}-{time.monotonic_ns() % 10**6:06d}"


def make_job(backend: str, scenario: Scenario, data: PackedData, root: Path | None, settings_mode: str = "matched",
             run_dir: Path | None = None, seed: int = SEED) -> Job:
    """The host's job for a run folder under `root` (or `run_dir`)."""
    run_dir = run_dir or new_run_dir(backend, scenario, root)
    return Job(backend=backend, scenario=scenario, data_dir=data.dir, data_sha256=data.sha256, run_dir=run_dir,
               device=scenario.cluster.device, nprocs=scenario.cluster.gpus_per_node, nnodes=scenario.cluster.nodes,
               settings_mode=settings_mode, seed=seed)


def _unpacked(scenario: Scenario, root: Path) -> PackedData:
    directory = root / f"unpacked-{packed_dir(scenario).name}"
    tokenizer.save_for_transformers(tokenizer.load(scenario.dataset.tokenizer), directory / TOKENIZER_DIR,
                                    scenario.context_length)
    return PackedData(directory, {"sha256": "(not packed in a dry run)"})
