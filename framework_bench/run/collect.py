"""Submitted SLURM runs brought back into the results store when their jobs end: each ended job
becomes a stored `RunResult` through the pipeline's `finish` (the worker's metrics for a job
that completed, a `failed`/`timeout`/`oom` row with the tail of the SLURM output for one that
did not), judged for parity with the reference's run submitted beside it, as a compare run
here is; `wait` polls the queue until every job has ended.

What can go wrong between a job and its row never loses the row nor doubles it:
- A run folder stores at most one row: from just before its row is stored until `slurm.json`
  records the row's id, `storing.json` in it names the store and the result, so a collect that
  stored the row but could not record so (a full disk, a kill) is followed by one that finds the
  row there (by run folder) and records it, instead of storing it again.
- A job the queue no longer holds, with nothing to tell how it ended (no accounting, no exit
  status in its run folder: a node lost), is waited for VANISHED_AFTER_S (10 min) from the first
  collect that saw it so, then stored `failed` saying so: `collect --wait` ends. One that started
  longer ago than its time limit allows (+ 10 min) is `failed` at once, even where the queue
  cannot be asked (`slurm_queue.job_state`).
- A job whose files are damaged (a `slurm-exit-code` that is not a number, a `job.json` that does
  not read) is stored `failed`, the reason naming the file and the damage.
"""

from __future__ import annotations

import math
import os
import re
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from pydantic import BaseModel, ValidationError

from framework_bench.measure import processes
from framework_bench.measure.metrics import RunResult
from framework_bench.plugins.contract import Job
from framework_bench.run import pipeline, referee
from framework_bench.run.options import RunOptions
from framework_bench.run.reference import reference_backend
from framework_bench.run.round import JudgingRuns, Round
from framework_bench.store.results import ResultStore
from framework_bench.run.launchers.base import SUBMISSION, Submission
from framework_bench.run.launchers.slurm import ROUND_LINE, SBATCH_EXIT_FILE, SBATCH_FILE, twin_key, written_for
from framework_bench.run.launchers.slurm_queue import JobState, job_state, node, outcome_of
from framework_bench.scenario.scenario import Scenario
from framework_bench.scenario.scenario import load as load_scenario
from framework_bench.worker.files import read_metrics
from framework_bench.worker.loss_schemes import JudgingLoss

JOB_FILE = "job.json"


def ingest(sub: Submission, state: JobState, reference: RunResult | None = None,
           store: ResultStore | None = None) -> tuple[RunResult, Round]:
    """The stored-to-be result of an ended job, and its round resumed (`resumed`) to keep it in
    `store`; its MFU against the GPU of the node that ran it (none when that is unknown: the plan's
    target GPU may not be what the scheduler gave); judged against `reference`, the reference's
    result (never `ok` without one). A run whose job file is damaged cannot be read back:
    `failed`, naming the damage."""
    outcome = outcome_of(sub, state)
    round_ = resumed(sub, store)
    if damage := job_damage(sub):
        reason = (f"{outcome.log_tail}\n[fbench] {damage}: the run cannot be read back (its row's scenario is "
                  f"{sub.scenario!r} as defined now)")
        return RunResult(backend=sub.backend, scenario=sub.scenario, status="failed", run_dir=sub.run_dir,
                         wall_seconds=round(outcome.seconds, 2), reason=referee.shortened(reason.strip())), round_
    result = pipeline.finish(pipeline.Prepared.of_run_dir(sub.run_dir, sub.backend, node(sub)[1]), outcome)
    result.compare_id, result.trial_round, result.trial_position = sub.compare_id, sub.trial_round, sub.trial_position
    if sub.backend != round_.reference:
        round_.judge(result, reference)
    return result, round_


def resumed(sub: Submission, store: ResultStore | None) -> Round:
    """The round `sub`'s job ran, resumed to judge and keep it: its judging runs are read back from
    the folders the job trained them in (`ReadBack`)."""
    scenario = scenario_of(sub)
    absent = ("no reference run was submitted beside it" if sub.reference is None else
              f"the reference's run ({sub.reference}) left no result")
    return Round(scenario, RunOptions(), reference=reference_backend(), absent=absent, store=store,
                 judging=ReadBack(sub, scenario), compare_id=sub.compare_id, number=sub.trial_round,
                 manifest=node_manifest(sub))


class ReadBack(JudgingRuns):
    """The runs that judge `sub` (`sub.judging`), read back as the round asks for one: the reference
    trained with another loss normalisation, each fp32 twin (`twin_key`), trained in the same job
    after the round's runs (framework_bench/run/submit.py), in the round's settings only. None is
    trained with a run's own adapters there: such a run is judged as the reference's run allows,
    saying so."""

    def __init__(self, sub: Submission, scenario: Scenario):
        super().__init__()
        self.sub, self.scenario = sub, scenario

    def __call__(self, backend: str, trained: Scenario, loss: JudgingLoss, settings_mode: str | None = None) -> RunResult:
        sub, scenario = self.sub, self.scenario
        unjudged = RunResult(backend=backend, scenario=trained.name, status="unsupported")
        if settings_mode is not None:
            unjudged.reason = (f"a SLURM round's judging runs train in the settings its job held, not in "
                               f"{settings_mode} ones")
            return unjudged
        if trained.finetune != scenario.finetune:
            unjudged.reason = ("a SLURM round trains no reference with a run's own adapters (native settings): "
                               "judge them with --settings matched, or on the local launcher")
            return unjudged
        key = twin_key(backend, loss.key) if trained.precision != scenario.precision else loss.key
        folder = sub.judging.get(key)
        if folder is None or not (folder / SBATCH_EXIT_FILE).exists():
            unjudged.status = "failed"
            unjudged.reason = (f"its round's run {key} did not run"
                               + (f" ({folder})" if folder else ": none was submitted with it"))
            return unjudged
        run = sub.model_copy(update={"backend": backend, "run_dir": folder, "reference": None, "judging": {}})
        return pipeline.finish(pipeline.Prepared.of_run_dir(folder, backend, node(run)[1]), outcome_of(run, job_state(run)))


def job_damage(sub: Submission) -> str | None:
    """What is wrong with the run folder's job file, or None."""
    path = sub.run_dir / JOB_FILE
    try:
        Job.model_validate_json(path.read_text())
    except (OSError, ValueError) as e:  # pydantic's ValidationError is a ValueError
        return f"its job file {path} {_damage(e)}"
    return None


def _damage(e: OSError | ValueError) -> str:
    """What is wrong with a file that did not read, in a few words."""
    if isinstance(e, FileNotFoundError):
        return "is missing"
    if isinstance(e, OSError):
        return f"cannot be read ({e.strerror or e})"
    if isinstance(e, ValidationError):
        first = e.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        return f"is damaged ({where + ': ' if where else ''}{first['msg']})"
    return f"is damaged ({e})"


def reference_of(sub: Submission, waiting: dict[Path, str] | None = None) -> RunResult | str | None:
    """The reference's result `sub` is judged against once collected; while the reference's job
    has not ended, its state (the run waits for it); None when there is none to judge against
    (no reference submitted beside it, or its job ended without a result). `waiting`: the runs
    this collect left waiting, with their state: a reference among them is waited for even if
    its job ended since (its result is stored by the next collect, not yet)."""
    if sub.reference is None:
        return None
    if waiting and (state := waiting.get(sub.reference)):
        return state
    try:
        ref = Submission.load(sub.reference)
        if ref.result_id is None and ((state := job_state(ref)).active or state.state == "UNKNOWN"):
            return state.state
        return RunResult.model_validate_json((sub.reference / "result.json").read_text())
    except (OSError, ValueError):  # pydantic's ValidationError is a ValueError
        return None


def node_manifest(sub: Submission) -> dict:
    """The run's manifest: this machine's backend env and checkout, with the node's name and GPU."""
    from framework_bench.store import provenance
    hostname, gpu = node(sub)
    return {**provenance.manifest(sub.backend), "hostname": hostname, "gpu": gpu, "collected_on": socket.gethostname()}


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
    """What a script submitted by hand ran, from its job file or else (a damaged one: its run is
    stored `failed` saying so) from the script's own words."""
    text = script.read_text()
    try:
        job = Job.model_validate_json((run_dir / JOB_FILE).read_text())
        scenario, backend = job.scenario.name, job.backend
    except (OSError, ValueError) as e:
        if (written := written_for(text)) is None:
            raise ValueError(f"its {JOB_FILE} {_damage(e)}, and {script.name} does not say what it runs") from None
        scenario, backend = written
    limit = next((line.split("=", 1)[1] for line in text.splitlines() if line.startswith("#SBATCH --time=")), "?")
    in_round = re.search(ROUND_LINE, text, re.M)
    return Submission(job_id=output.stem.removeprefix("slurm-"), backend=backend, scenario=scenario,
                      run_dir=run_dir, submitted_at="(by hand)", time_limit=limit,
                      round_runs=int(in_round[1]) if in_round else 1)


COLLECTING = "collecting"  # in a run folder while one `collect` stores it: the pid of that process


@contextmanager
def _claimed(sub: Submission) -> Iterator[bool]:
    """Whether this process may store `sub`: of two collects at once, one does (a claim whose
    process is gone is taken over)."""
    claim = sub.run_dir / COLLECTING
    # Linked into place with the pid already in it: a claim opened and written after was seen
    # empty by the other collect, taken for abandoned, and both stored the run.
    mine = claim.with_name(f".{COLLECTING}.{os.getpid()}")
    mine.write_text(str(os.getpid()))
    try:
        for _ in range(2):
            try:
                os.link(mine, claim)
            except FileExistsError:
                try:
                    holder = claim.read_text().strip()
                except FileNotFoundError:
                    continue  # released meanwhile
                if holder.isascii() and holder.isdigit() and not processes.abandoned(int(holder)):
                    yield False
                    return
                claim.unlink(missing_ok=True)
                continue
            try:
                yield True
            finally:
                claim.unlink(missing_ok=True)
            return
        yield False
    finally:
        mine.unlink(missing_ok=True)


STORING = "storing.json"  # in a run folder from just before its row is stored until slurm.json records the row


class _Storing(BaseModel):
    """A row being stored: its store, and the result (found there again by its run folder)."""

    db: Path
    result: RunResult


def _stored_earlier(sub: Submission) -> tuple[RunResult, Path] | None:
    """The result an earlier collect stored for `sub` without recording so in `slurm.json`, with
    its store; None where no row was stored (the store named holds none for the run folder)."""
    marker = sub.run_dir / STORING
    try:
        storing = _Storing.model_validate_json(marker.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:  # written whole (a rename): damaged by hand, not by a crash
        raise ValueError(f"{marker} {_damage(e)}: whether the run's row was stored cannot be told; "
                         "remove it once its store holds no row for this run folder") from None
    if not storing.db.exists():
        return None
    with ResultStore(storing.db, must_exist=True, read_only=True) as store:
        run_id = store.id_of_run(storing.result.run_dir)
    if run_id is None:
        return None
    storing.result.result_id = run_id
    return storing.result, storing.db


def _store(sub: Submission, result: RunResult, round_: Round) -> None:
    """Keep the run's row through its round, named in the run folder first (`STORING`): a collect
    that dies before `slurm.json` records the row leaves the next one to find it."""
    marker = sub.run_dir / STORING
    written = marker.with_name(f".{STORING}.{os.getpid()}")
    written.write_text(_Storing(db=round_.store.path, result=result).model_dump_json())
    os.replace(written, marker)
    kept: list[Path] = []
    round_.on_kept = kept.append
    round_.conclude(result)
    if kept:
        raise OSError(f"{round_.store.path} could not take the row now: kept in {kept[0]}, stored by the next "
                      "command; the next collect records it")


def _record(sub: Submission, result: RunResult, db: Path) -> None:
    """`slurm.json` records the stored row: the run is collected."""
    sub.result_id, sub.db = result.result_id, str(db)
    try:
        sub.save()
    except OSError as e:
        raise OSError(f"stored as result {result.result_id} in {db}, but {sub.run_dir / SUBMISSION} could not "
                      f"record so ({e.strerror or e}): the next collect finds the row there and does not store it again") from None
    (sub.run_dir / STORING).unlink(missing_ok=True)


VANISHED = "vanished-since"  # in a run folder whose job vanished (JobState.vanished): when a collect first saw so
VANISHED_AFTER_S = 600  # then its run is stored failed: time for a late accounting record, and `collect --wait` ends


def _unless_vanished(sub: Submission, state: JobState) -> JobState:
    """`state`; for a job that vanished, UNKNOWN saying since when, until VANISHED_AFTER_S from
    the first collect that saw it so (recorded in the run folder), then FAILED saying why."""
    record = sub.run_dir / VANISHED
    if not state.vanished:
        record.unlink(missing_ok=True)  # seen again: the count starts afresh if it vanishes
        return state
    try:
        since = float(record.read_text())
        if not math.isfinite(since):
            raise ValueError(since)
    except (OSError, ValueError):
        since = time.time()
        record.write_text(repr(since))
    minutes, limit = (time.time() - since) / 60, VANISHED_AFTER_S // 60
    if minutes < limit:
        return state.model_copy(update={"note": f"gone from the queue for {minutes:.0f} min with no word of how "
                                                f"it ended; stored failed at {limit} min"})
    return JobState(state="FAILED", note=(
        f"gone from the queue for {minutes:.0f} min with nothing to tell how it ended (no record in sacct, no "
        f"{SBATCH_EXIT_FILE} in its run folder: a node lost, or the job purged from accounting): stored "
        f"failed after {limit} min"))


def collect(subs: list[Submission], store_for: Callable[[Submission], "ResultStore"],
            scenario_of: Callable[[Submission], Scenario],
            on_result: Callable[[RunResult, Submission], None] = lambda r, s: None,
            on_problem: Callable[[Submission, str], None] = lambda s, why: None) -> list[tuple[Submission, JobState]]:
    """Store every ended job among `subs`, each in `store_for(sub)` (or, for a row an earlier
    collect stored without recording so, found in that one's store); returns those still queued
    or running (or whose state cannot be told yet, a vanished job for VANISHED_AFTER_S), with
    their state. A job that cannot be stored (its plugin uninstalled, its `slurm.json` unwritable)
    goes to `on_problem` and stays to be collected later; the others are stored all the same."""
    waiting = []
    # The references first: a run submitted beside one is judged against its result.
    for sub in sorted(subs, key=lambda sub: sub.reference is not None):
        try:
            state = _unless_vanished(sub, job_state(sub))
            if state.active or state.state == "UNKNOWN":
                waiting.append((sub, JobState(state=f"unknown ({state.note})") if state.note else state))
                continue
            reference = reference_of(sub, {s.run_dir: state.state for s, state in waiting})
            if isinstance(reference, str):
                waiting.append((sub, JobState(state=f"waiting for the reference's job ({reference})")))
                continue
            with _claimed(sub) as mine:
                if not mine or Submission.load(sub.run_dir).result_id is not None:
                    continue  # another collect has it, or stored it meanwhile
                if earlier := _stored_earlier(sub):
                    result, db = earlier
                else:
                    result, round_ = ingest(sub, state, reference, store_for(sub))
                    _store(sub, result, round_)
                    db = round_.store.path
                _record(sub, result, db)
        except Exception as e:  # noqa: BLE001 - one bad submission must not stop the others
            on_problem(sub, f"{type(e).__name__}: {e}".splitlines()[0])
            continue
        on_result(result, sub)
    return waiting


def scenario_of(sub: Submission) -> Scenario:
    """The scenario the run was submitted with; where its job file is damaged, the scenario of
    that name as defined now (its `failed` row says so)."""
    try:
        return Job.model_validate_json((sub.run_dir / JOB_FILE).read_text()).scenario
    except (OSError, ValueError):
        return load_scenario(sub.scenario)


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
