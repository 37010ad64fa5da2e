"""SLURM, end to end: a time limit estimated from the scenario, submission, the queue, and
the runs brought back into the results store when their jobs end.

A submitted run is a run folder holding `submit.sbatch` and `slurm.json` (the job id and
what was submitted). `poll` asks `squeue` (still queued or running) and then `sacct` (how it
ended), falling back to the exit status the batch script writes into the run folder when
the cluster keeps no accounting. `collect` turns every ended job into a stored `RunResult`:
the worker's metrics for a job that completed, a `failed`/`timeout`/`oom` row with the tail
of the SLURM output for one that did not.

fbench assumes a filesystem every node shares, at the same path, for the run folder, the
packed data and the backend env (FBENCH_HOME and the project checkout): the batch script
checks those paths on every node before it starts the workers.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from pydantic import BaseModel, Field

from framework_bench.run import launch
from framework_bench.plugins import registry as plugins
from framework_bench.run import runner
from framework_bench.run import verdicts
from framework_bench.plugins.backend import Job, Machine
from framework_bench.data.packing import pack
from framework_bench.measure.machine import detect
from framework_bench.measure.metrics import RunResult
from framework_bench.run.sbatch import SbatchOptions, TimeEstimate, estimate_time
from framework_bench.spec.scenario import Scenario
from framework_bench.worker.files import read_metrics

SUBMISSION = "slurm.json"

class Submission(BaseModel):
    """What `slurm.json` in a run folder records."""

    job_id: str
    backend: str
    scenario: str
    run_dir: Path
    submitted_at: str
    time_limit: str
    gpu_name: str | None = Field(None, description="GPU the plan targets (the time estimate's; MFU uses the node's)")
    result_id: int | None = None
    db: str | None = Field(None, description="the results file the run was submitted for; its row goes there")

    @classmethod
    def load(cls, run_dir: Path) -> "Submission":
        return cls.model_validate_json((run_dir / SUBMISSION).read_text())

    def save(self) -> None:
        (self.run_dir / SUBMISSION).write_text(self.model_dump_json(indent=2))


class Planned(BaseModel):
    """One backend x scenario for SLURM: refused (result), or written (and maybe submitted)."""

    verdict: verdicts.Verdict
    result: RunResult | None = Field(None, description="the unsupported result when refused")
    sbatch: Path | None = None
    time: TimeEstimate | None = None
    submission: Submission | None = None
    note: str | None = None


def sbatch_available() -> bool:
    return shutil.which("sbatch") is not None


def shared_path_warnings(job: Job, python: Path) -> list[str]:
    """Paths the nodes will not see the same way (node-local locations), seen from here."""
    local = ("/tmp/", "/var/tmp/", "/dev/shm/")
    return [f"{what} {path} looks node-local: every node needs it at the same path" for what, path in
            (("run folder", job.run_dir), ("packed data", job.data_dir), ("env Python", python))
            if str(path).startswith(local)]


def plan_and_submit(backend_name: str, scenario: Scenario, options: SbatchOptions, *, submit: bool = True,
                    machine: Machine | None = None, root: Path | None = None, force: bool = False,
                    settings_mode: str = "matched", db: Path | None = None) -> Planned:
    """Judge, pack, plan and write the sbatch script; submit it when `submit` and sbatch
    exists. Nothing is written or submitted for a backend whose own check refused."""
    backend = plugins.get(backend_name)
    machine = machine or detect()
    env, verdict = verdicts.judge(backend, scenario, machine, force=force)
    if verdict.refused_by_backend:
        base = dict(backend=backend_name, scenario=scenario.name,
                    framework_version=env.version(backend.info.env.framework_package), settings_mode=settings_mode)
        return Planned(verdict=verdict, result=RunResult(**base, status="unsupported", reason=verdict.reason))
    target = verdicts.target_machine(scenario, machine)
    time_ = estimate_time(scenario, target.gpu_name)
    data = pack(scenario, progress=False, say=lambda msg: None)
    job = runner.make_job(backend_name, scenario, data, machine, root, settings_mode)
    job.write()
    plan = backend.plan(job, env)
    limit = options.time_limit or time_.limit
    sbatch = launch.write_sbatch(plan, job, limit, options.cpus_per_task, tuple(options.extra))
    warnings = shared_path_warnings(job, plan.python)
    out = Planned(verdict=verdict, sbatch=sbatch, time=time_, note="; ".join(warnings) or None)
    if not submit:
        return out
    if not sbatch_available():
        out.note = "; ".join([*warnings, f"sbatch not found here: submit {sbatch} on the cluster, "
                              "then `fbench results collect` stores it when it ends"])
        return out
    proc = subprocess.run(["sbatch", "--parsable", str(sbatch)], capture_output=True, text=True)
    job_id = proc.stdout.strip().split(";")[0]
    if proc.returncode != 0 or not job_id.isdigit():
        out.note = f"sbatch failed ({proc.returncode}): {(proc.stderr or proc.stdout).strip()}"
        return out
    out.submission = Submission(job_id=job_id, backend=backend_name, scenario=scenario.name, run_dir=job.run_dir,
                                submitted_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"), time_limit=limit,
                                gpu_name=target.gpu_name, db=str(db) if db else None)
    out.submission.save()
    return out


# ---------------------------------------------------------------------------------------
# The queue

ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING", "STAGE_OUT",
          "SIGNALING", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "STOPPED"}


class JobState(BaseModel):
    state: str = Field(description="SLURM's state (COMPLETED, FAILED, TIMEOUT...), or UNKNOWN")
    exit_code: int | None = None
    elapsed: float | None = Field(None, description="seconds the job ran (sacct)")

    @property
    def active(self) -> bool:
        return self.state in ACTIVE


def _run(argv: list[str]) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return proc.stdout if proc.returncode == 0 else ""


def job_state(sub: Submission) -> JobState:
    """squeue while the job is known to the scheduler, then sacct, then the exit status
    the batch script left in the run folder (clusters without accounting)."""
    queued = _run(["squeue", "-h", "-j", sub.job_id, "-o", "%T"]).split()
    if queued:
        return JobState(state=queued[0])
    for line in _run(["sacct", "-n", "-P", "-X", "-j", sub.job_id, "-o", "State,ExitCode,ElapsedRaw"]).splitlines():
        state, code, elapsed = (line.split("|") + ["", ""])[:3]
        if state.strip():
            rc = code.split(":")[0]
            return JobState(state=state.split()[0], exit_code=int(rc) if rc.isdigit() else None,
                            elapsed=float(elapsed) if elapsed.strip().isdigit() else None)
    exit_file = sub.run_dir / launch.SBATCH_EXIT_FILE
    if exit_file.exists():
        rc = int(exit_file.read_text().strip() or 1)
        return JobState(state="COMPLETED" if rc == 0 else "FAILED", exit_code=rc)
    # No accounting and no exit status: a job killed by SLURM says so in its output.
    text = launch.tail(slurm_output(sub), 50)
    if "DUE TO TIME LIMIT" in text:
        return JobState(state="TIMEOUT")
    if "CANCELLED" in text:
        return JobState(state="CANCELLED")
    return JobState(state="UNKNOWN")


def slurm_output(sub: Submission) -> Path:
    return sub.run_dir / f"slurm-{sub.job_id}.out"


def outcome_of(sub: Submission, state: JobState) -> launch.Outcome:
    """How the job ended, as the local launchers classify a process."""
    log = slurm_output(sub)
    tail = launch.tail(log)
    seconds = state.elapsed if state.elapsed is not None else _output_span(sub)
    if state.state == "COMPLETED" and state.exit_code in (0, None):
        return launch.Outcome("ok", 0, seconds, tail)
    note = f"[fbench] SLURM job {sub.job_id} ended {state.state}"
    if state.state == "TIMEOUT":
        return launch.Outcome("timeout", None, seconds, f"{tail}\n{note} (time limit {sub.time_limit})")
    oom = state.state == "OUT_OF_MEMORY" or any(m in launch.tail(log, 2000) for m in launch.OOM_MARKERS)
    return launch.Outcome("oom" if oom else "failed", state.exit_code, seconds, f"{tail}\n{note}")


def _output_span(sub: Submission) -> float:
    """Without accounting: from the job file's writing to the SLURM output's last write
    (queue time included)."""
    try:
        return max(0.0, slurm_output(sub).stat().st_mtime - (sub.run_dir / "job.json").stat().st_mtime)
    except OSError:
        return 0.0


def node(sub: Submission) -> tuple[str | None, str | None]:
    """(hostname, GPU name) of the node that ran the job, as its batch script wrote them; Nones
    where it wrote nothing (a job that never started, a CPU node has no GPU name)."""
    try:
        lines = (sub.run_dir / launch.NODE_FILE).read_text().splitlines()
    except OSError:
        return None, None
    return (lines[0].strip() or None) if lines else None, (lines[1].strip() or None) if len(lines) > 1 else None


def ingest(sub: Submission, state: JobState) -> RunResult:
    """The stored-to-be result of an ended job; its MFU against the GPU of the node that ran it
    (none when that is unknown: the plan's target GPU may not be what the scheduler gave)."""
    job = Job.model_validate_json((sub.run_dir / "job.json").read_text())
    backend = plugins.get(sub.backend)
    base = dict(backend=sub.backend, scenario=sub.scenario, framework_version=None, settings_mode=job.settings_mode)
    return runner.finish(backend, job, outcome_of(sub, state), base, node(sub)[1])


def node_manifest(sub: Submission) -> dict:
    """The run's manifest: this machine's backend env and checkout, with the node's name and GPU."""
    from framework_bench.store import results
    hostname, gpu = node(sub)
    return {**results.manifest(sub.backend), "hostname": hostname, "gpu": gpu, "collected_on": socket.gethostname()}


def steps_done(sub: Submission) -> int:
    return len({s["step"] for s in read_metrics(sub.run_dir)})


def pending(root: Path | None = None, problems: list[str] | None = None) -> list[Submission]:
    """Submitted runs not yet stored, oldest first; a script submitted by hand (where this
    machine had no sbatch) is found by the `slurm-<job id>.out` its job wrote. A run folder
    that cannot be read (a corrupt `slurm.json`) is named in `problems` and skipped."""
    root = root or runner.runs_root()
    found = []
    for script in sorted(root.glob(f"*/{launch.SBATCH_FILE}")):
        run_dir = script.parent
        try:
            if (run_dir / SUBMISSION).exists():
                sub = Submission.load(run_dir)
            elif outputs := sorted(run_dir.glob("slurm-*.out")):
                sub = _hand_submitted(run_dir, outputs[-1], script)
                sub.save()
            else:
                continue
        except (OSError, ValueError) as e:  # pydantic's ValidationError is a ValueError
            if problems is not None:
                problems.append(f"{run_dir}: cannot be read: {type(e).__name__}: {e}".splitlines()[0])
            continue
        if sub.result_id is None:
            found.append(sub)
    return found


def _hand_submitted(run_dir: Path, output: Path, script: Path) -> Submission:
    job = Job.model_validate_json((run_dir / "job.json").read_text())
    limit = next((line.split("=", 1)[1] for line in script.read_text().splitlines()
                  if line.startswith("#SBATCH --time=")), "?")
    return Submission(job_id=output.stem.removeprefix("slurm-"), backend=job.backend, scenario=job.scenario.name,
                      run_dir=run_dir, submitted_at="(by hand)", time_limit=limit)


COLLECTING = "collecting"  # in a run folder while one `collect` stores it: the pid of that process


@contextmanager
def _claimed(sub: Submission) -> Iterator[bool]:
    """Whether this process may store `sub`: of two collects at once, one does (a claim whose
    process is gone is taken over)."""
    claim = sub.run_dir / COLLECTING
    for _ in range(2):
        try:
            fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            holder = claim.read_text().strip() if claim.exists() else ""
            if holder.isdigit() and Path(f"/proc/{holder}").exists():
                yield False
                return
            claim.unlink(missing_ok=True)
            continue
        with os.fdopen(fd, "w") as fh:
            fh.write(str(os.getpid()))
        try:
            yield True
        finally:
            claim.unlink(missing_ok=True)
        return
    yield False


def collect(subs: list[Submission], store_for: Callable[[Submission], "ResultStore"],
            scenario_of: Callable[[Submission], Scenario],
            on_result: Callable[[RunResult, Submission], None] = lambda r, s: None,
            on_problem: Callable[[Submission, str], None] = lambda s, why: None) -> list[tuple[Submission, JobState]]:
    """Store every ended job among `subs`, each in `store_for(sub)`; returns those still queued
    or running (or whose state cannot be told yet), with their state. A job that cannot be
    stored (its plugin uninstalled, its folder damaged) goes to `on_problem` and stays to be
    collected later; the others are stored all the same."""
    waiting = []
    for sub in subs:
        try:
            state = job_state(sub)
            if state.active or state.state == "UNKNOWN":
                waiting.append((sub, state))
                continue
            with _claimed(sub) as mine:
                if not mine or Submission.load(sub.run_dir).result_id is not None:
                    continue  # another collect has it, or stored it meanwhile
                result = ingest(sub, state)
                store = store_for(sub)
                store.add(result, scenario_of(sub), node_manifest(sub))
                sub.result_id, sub.db = result.result_id, str(store.path)
                sub.save()
        except Exception as e:  # noqa: BLE001 - one bad submission must not stop the others
            on_problem(sub, f"{type(e).__name__}: {e}".splitlines()[0])
            continue
        on_result(result, sub)
    return waiting


def scenario_of(sub: Submission) -> Scenario:
    return Job.model_validate_json((sub.run_dir / "job.json").read_text()).scenario
