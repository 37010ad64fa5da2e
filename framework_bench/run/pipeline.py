"""A run's life, whatever command or launcher runs it: the one owner of each stage.

1. `prepare`: judge every refusal once (this machine, the env, the backend's own check, memory,
   in the run's settings mode), claim the run folder, pack, write the host's job.json, call
   `fbench_plan`, write job.json again (whatever the plan wrote there, the worker reads the host's);
2. the launcher `start`s it (`framework_bench/run/launchers/`): here, to its `Outcome`
   (`run_one`), or on SLURM to a `Submission` (`framework_bench/run/submit.py`) that
   `framework_bench/run/collect.py` finishes when its job ends;
3. `finish`: read the report back and verify every claim (`framework_bench/run/readback.py`);
4. its round (`framework_bench/run/round.py`) judges it against the round's reference;
5. `keep`: result.json, the row stored, the claim released; `recover`: what a dead fbench left.

Every outcome is a `RunResult`: unsupported settings, a raising hook, crashes, OOMs and timeouts
are results with a status and a reason, never a traceback in the host.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel

from framework_bench.data.packing import PackedData, pack
from framework_bench.envs import venvs as envs
from framework_bench.measure.machine import detect
from framework_bench.measure.metrics import RunResult
from framework_bench.plugins import registry as plugins
from framework_bench.plugins.contract import Job, LaunchPlan, Machine
from framework_bench.run import orphans, readback, referee, refusals
from framework_bench.run.hooks import HookError, call_hook, tail_of
from framework_bench.run.interrupts import held
from framework_bench.run.launchers import executor_for
from framework_bench.run.launchers.base import Executor, Outcome, default_launcher
from framework_bench.run.options import RunOptions
from framework_bench.scenario.scenario import Scenario
from framework_bench.store import results, unstored
from framework_bench.worker.hparams import SEED


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
    backend: plugins.RegisteredBackend
    job: Job
    gpu_name: str | None
    plan: LaunchPlan | None = None
    executor: Executor | None = None
    refusals: refusals.Refusals | None = None
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
            on_refusals: Callable[[refusals.Refusals], None] = lambda v: None) -> Prepared | RunResult:
    """Judge, pack, write the job and plan it; a `RunResult` when the run ends here (refused, a
    raising hook, a run folder that cannot be written). `dry`: refusals and a raising plan are
    kept on the `Prepared` instead, and nothing is packed: the plan gets `data`, a stand-in
    (`framework_bench/run/dry_run.py`). A run that is not dry is claimed
    (framework_bench/run/orphans.py) before packing.
    `on_refusals` hears the refusals, each on its own, whatever comes of them."""
    backend, machine = plugins.get(backend_name), machine or detect()
    seed = SEED if options.seed is None else options.seed  # a compare sets its round's
    identity = Identity(backend=backend_name, scenario=scenario.name, settings_mode=options.settings_mode, seed=seed)
    executor = executor_for(options.launcher or default_launcher(scenario))
    try:
        env, judged = call_hook("fbench_check", refusals.refusals_for, backend, scenario, machine, force=options.force,
                                 settings_mode=options.settings_mode)
        refusal = executor.refusal(judged)
        on_refusals(judged)
    except HookError as e:
        if not dry:
            return identity.result("failed", reason=str(e))
        env, judged, refusal = envs.inspect(backend.name, backend.info.env), None, str(e)
    identity.framework_version = env.version(backend.info.env.framework_package)
    if refusal and not dry:
        # A backend that refuses for want of its env has a setup to finish, not a setting it cannot run
        # (a scenario outside its declared capabilities stays unsupported, env or not).
        setup = (not env.ready and refusals.machine_shortfall(scenario, machine) is None
                 and backend.refusal(scenario) is None)
        return identity.result("failed" if setup else "unsupported", reason=refusal)
    if dry:
        job = make_job(backend_name, scenario, data, options.root, options.settings_mode, seed=seed,
                       loss_scheme=options.loss_scheme, labels_rolled=options.labels_rolled)
        job.write()
    else:
        job = _packed_job(identity, scenario, data, options)
        if isinstance(job, RunResult):
            return job
    prepared = Prepared(identity, backend, job, refusals.target_machine(scenario, machine).gpu_name,
                        executor=executor, refusals=judged, refusal=refusal)
    try:  # job.json again after the plan: whatever a plan wrote there, the worker reads the host's job
        prepared.plan = call_hook("fbench_plan", lambda: LaunchPlan.model_validate(backend.plan(job, env)))
        job.write()
    except HookError as e:
        if not dry:
            return write_result(identity.result("failed", reason=str(e), run_dir=job.run_dir, data_sha256=job.data_sha256))
        prepared.plan_error = str(e)
    except KeyboardInterrupt:
        if dry:
            raise
        return write_result(identity.result("interrupted", reason="interrupted while the backend planned the run",
                                            run_dir=job.run_dir, data_sha256=job.data_sha256))
    return prepared


def _packed_job(identity: Identity, scenario: Scenario, data: PackedData | None, options: RunOptions) -> Job | RunResult:
    # From here on the run is the host's to store: claimed in its run folder before packing, so
    # that should fbench die now (packing, the worker, storing), the next command stores it.
    run_dir = new_run_dir(identity.backend, scenario, options.root)
    try:
        orphans.claim(run_dir, options.db, identity.backend, scenario, options.settings_mode, options.trial)
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
        job = make_job(identity.backend, scenario, data, None, options.settings_mode, run_dir, identity.seed,
                       options.loss_scheme, options.labels_rolled)
        job.write()
    except OSError as e:  # a full or read-only runs folder: nothing was launched
        return identity.result("failed", reason=f"cannot write the run folder: {e}", data_sha256=data.sha256,
                               run_dir=run_dir)
    return job


def run_one(backend_name: str, scenario: Scenario, options: RunOptions | None = None, *,
            data: PackedData | None = None, machine: Machine | None = None,
            on_step: readback.StepCallback = lambda done, total, secs: None) -> RunResult:
    """Prepare, start here (the local or torchrun launcher) and read back: the run's own checks,
    not yet judged against a reference nor stored (its round does both).

    `options.db`: the results file the caller will store the run in; should fbench die before
    that, the next command stores the run there as `failed` (`recover`)."""
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
        outcome = executor.start(plan, job, options, prepared.gpu_name, readback.progress(job, on_step))
        return finish(prepared, outcome)
    except Exception as e:  # noqa: BLE001 - any host or plugin error after the job exists
        return write_result(prepared.identity.result(
            "failed", run_dir=job.run_dir, data_sha256=job.data_sha256,
            reason=f"fbench failed while running it: {type(e).__name__}: {e}\n{tail_of(e)}".rstrip()))
    except KeyboardInterrupt:  # after the worker stopped (the executor answers one during the run)
        return write_result(prepared.identity.result("interrupted", run_dir=job.run_dir, data_sha256=job.data_sha256,
                                                     reason="interrupted while fbench read the run back"))
    except BaseException:
        orphans.release(job.run_dir)
        raise
    finally:
        if options.db is None:
            orphans.release(job.run_dir)


def finish(prepared: Prepared, outcome: Outcome) -> RunResult:
    """The result of a launched run once it ended (here, or as a SLURM job): read back and its
    claims verified, saved as result.json. Whatever fails here makes the run `failed` with the
    reason: it is never lost."""
    job = prepared.job
    result = prepared.identity.result(outcome.status, run_dir=job.run_dir, wall_seconds=round(outcome.seconds, 2),
                                      data_sha256=job.data_sha256)
    try:
        readback.read_back(result, prepared.backend, job, outcome, prepared.gpu_name)
    except Exception as e:  # noqa: BLE001 - a bug in the figures or checks must not lose the run
        result.status = "failed"
        result.reason = f"fbench could not read the run back: {type(e).__name__}: {e}\n{tail_of(e)}".rstrip()
    if result.reason:
        result.reason = referee.shortened(result.reason)
    return write_result(result)


def keep(store: results.ResultStore | None, result: RunResult, scenario: Scenario,
         manifest: dict | None = None) -> Path | None:
    """The end of a run's life: its result.json, its row in `store` (None: nobody stores it) with
    `manifest` (default: this machine's), its claim on the run folder released. Returns the file
    the row was kept in for the next command when the store could not take it now; raises
    `unstored.Unstored` when that failed too."""
    note = getattr(scenario, "shadow_note", None)  # a user's scenario over a bundled one: said on its runs
    if note and note not in result.notes:
        result.notes.append(note)
    write_result(result)
    if store is None:
        orphans.release(result.run_dir)
        return None
    with held():  # a second Ctrl-C now must not lose this run's row
        return orphans.save(store, result, scenario, manifest)


def recover(store: results.ResultStore) -> list[str]:
    """Store what earlier commands could not: runs whose fbench died, rows kept aside. One line each."""
    return orphans.recover(runs_root()) + unstored.recover(store)


def write_result(result: RunResult) -> RunResult:
    """A copy of the result in the run folder, for people reading it; the store holds the row.
    A full disk or a run folder a plugin removed costs this copy only, never the row."""
    if result.run_dir:
        try:
            (result.run_dir / "result.json").write_text(result.model_dump_json(indent=2))
        except OSError as e:
            result.notes.append(f"result.json not written in the run folder: {e.strerror or e}")
    return result


def new_run_dir(backend: str, scenario: Scenario, root: Path | None) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return (root or runs_root()) / f"{stamp}-{scenario.name}-{backend}-{time.monotonic_ns() % 10**6:06d}"


def make_job(backend: str, scenario: Scenario, data: PackedData, root: Path | None, settings_mode: str = "matched",
             run_dir: Path | None = None, seed: int = SEED, loss_scheme: str | None = None,
             labels_rolled: bool = False) -> Job:
    """The host's job for a run folder under `root` (or `run_dir`)."""
    run_dir = run_dir or new_run_dir(backend, scenario, root)
    return Job(backend=backend, scenario=scenario, data_dir=data.dir, data_sha256=data.sha256, run_dir=run_dir,
               device=scenario.cluster.device, nprocs=scenario.cluster.gpus_per_node, nnodes=scenario.cluster.nodes,
               settings_mode=settings_mode, seed=seed, loss_scheme=loss_scheme, labels_rolled=labels_rolled)
