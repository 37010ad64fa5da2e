"""Submitted SLURM runs brought back into the results store when their jobs end: each ended job
becomes a stored `RunResult` through the pipeline's `finish` (the worker's metrics for a job
that completed, a `failed`/`timeout`/`oom` row with the tail of the SLURM output for one that
did not), judged for parity with the reference's run submitted beside it, as a compare run
here is; `wait` polls the queue until every job has ended.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from framework_bench.measure.metrics import RunResult
from framework_bench.plugins.contract import Job
from framework_bench.run import pipeline
from framework_bench.store.results import ResultStore
from framework_bench.run.launchers.base import SUBMISSION, Submission
from framework_bench.run.launchers.slurm import SBATCH_FILE, JobState, job_state, node, outcome_of
from framework_bench.spec.scenario import Scenario
from framework_bench.worker.files import read_metrics


def ingest(sub: Submission, state: JobState, reference: RunResult | None = None) -> RunResult:
    """The stored-to-be result of an ended job; its MFU against the GPU of the node that ran it
    (none when that is unknown: the plan's target GPU may not be what the scheduler gave)."""
    return pipeline.finish(pipeline.Prepared.of_run_dir(sub.run_dir, sub.backend, node(sub)[1]), outcome_of(sub, state), reference)


def reference_of(sub: Submission) -> RunResult | str | None:
    """The reference's result `sub` is judged against once collected; while the reference's job
    has not ended, its state (the run waits for it); None when there is none to judge against
    (no reference submitted beside it, or its job ended without a result)."""
    if sub.reference is None:
        return None
    try:
        ref = Submission.load(sub.reference)
        if ref.result_id is None and ((state := job_state(ref)).active or state.state == "UNKNOWN"):
            return state.state
        return RunResult.model_validate_json((sub.reference / "result.json").read_text())
    except (OSError, ValueError):  # pydantic's ValidationError is a ValueError
        return None


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
    root = root or pipeline.runs_root()
    found = []
    for script in sorted(root.glob(f"*/{SBATCH_FILE}")):
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
    # The references first: a run submitted beside one is judged against its result.
    for sub in sorted(subs, key=lambda sub: sub.reference is not None):
        try:
            state = job_state(sub)
            if state.active or state.state == "UNKNOWN":
                waiting.append((sub, state))
                continue
            reference = reference_of(sub)
            if isinstance(reference, str):
                waiting.append((sub, JobState(state=f"waiting for the reference's job ({reference})")))
                continue
            with _claimed(sub) as mine:
                if not mine or Submission.load(sub.run_dir).result_id is not None:
                    continue  # another collect has it, or stored it meanwhile
                result = ingest(sub, state, reference)
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


def wait(subs: list[Submission], store_for: Callable[[Submission], "ResultStore"], poll: float,
         on_result: Callable[[RunResult, Submission], None] = lambda r, s: None,
         on_problem: Callable[[Submission, str], None] = lambda s, why: None,
         on_waiting: Callable[[Submission, JobState], None] = lambda s, state: None) -> list[Submission]:
    """Poll the queue every `poll` seconds until every job has ended, storing each run as its
    job ends. Returns the jobs Ctrl-C (or SIGTERM/SIGHUP where mapped so) left waiting: none
    when every job ended; a later `results collect` stores them."""
    waiting = subs
    try:
        while waiting:
            still = collect(waiting, store_for, scenario_of, on_result, on_problem)
            for sub, state in still:
                on_waiting(sub, state)
            waiting = [sub for sub, _ in still]
            if waiting:
                time.sleep(poll)
    except KeyboardInterrupt:
        return waiting
    return []
