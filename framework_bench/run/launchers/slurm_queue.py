"""The queue, asked how a submitted SLURM job is doing and how it ended.

A submitted run is a run folder holding `submit.sbatch` and `slurm.json` (the job id and
what was submitted). `job_state` asks `squeue` (still queued or running) and then `sacct`
(how it ended), falling back to the exit status the batch script writes into the run folder
when the cluster keeps no accounting (a damaged one: the job ended, failed, the note says why).
A job the queue no longer holds, with nothing to tell how it ended, is UNKNOWN and `vanished`;
one that started (wrote `node.txt`) longer ago than its time limit + OVERDUE_MARGIN_S is FAILED.
Its run is stored by `framework_bench/run/collect.py`.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

from pydantic import BaseModel, Field

from framework_bench.run.launchers.base import OOM_MARKERS, Outcome, Submission, tail
from framework_bench.run.launchers.slurm import NODE_FILE, SBATCH_EXIT_FILE
from framework_bench.run.launchers.slurm_time import duration, limit_seconds

# A job is ended by its time limit: one that started (NODE_FILE written) longer ago than that, plus
# this margin (SLURM's grace before the kill, clocks of two machines), is not running any more.
OVERDUE_MARGIN_S = 600

ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING", "STAGE_OUT",
          "SIGNALING", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "STOPPED"}


class JobState(BaseModel):
    state: str = Field(description="SLURM's state (COMPLETED, FAILED, TIMEOUT...), or UNKNOWN")
    exit_code: int | None = None
    elapsed: float | None = Field(None, description="seconds the job ran (sacct)")
    vanished: bool = Field(False, description=(
        "UNKNOWN, and the queue answered that it no longer holds the job: it ended, how is not recorded"))
    note: str | None = Field(None, description="how fbench came to the state, where SLURM did not say it")

    @property
    def active(self) -> bool:
        return self.state in ACTIVE


def _ask(argv: list[str]) -> subprocess.CompletedProcess | None:
    """The command's answer; None where it could not be asked (not installed here, hung)."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None


def job_state(sub: Submission) -> JobState:
    """squeue while the job is known to the scheduler, then sacct, then the exit status
    the batch script left in the run folder (clusters without accounting)."""
    queue = _ask(["squeue", "-h", "-j", sub.job_id, "-o", "%T"])
    if queue is not None and queue.returncode == 0 and (queued := queue.stdout.split()):
        return JobState(state=queued[0])
    exit_file = sub.run_dir / SBATCH_EXIT_FILE
    if sub.round_runs > 1 and exit_file.exists():  # one run of a round: its own ending, not the job's
        return _exit_status(exit_file)
    accounting = _ask(["sacct", "-n", "-P", "-X", "-j", sub.job_id, "-o", "State,ExitCode,ElapsedRaw"])
    for line in (accounting.stdout if accounting is not None and accounting.returncode == 0 else "").splitlines():
        state, code, elapsed = (line.split("|") + ["", ""])[:3]
        if state.strip():
            if sub.round_runs > 1:  # the job's ending, where this run left none: it never ended itself
                return JobState(state="FAILED" if state.startswith("COMPLETED") else state.split()[0], note=(
                    f"ended {state.split()[0]} before this run of its round ended (no {SBATCH_EXIT_FILE} in its "
                    "run folder)"))
            rc = code.split(":")[0]
            return JobState(state=state.split()[0], exit_code=int(rc) if rc.isascii() and rc.isdigit() else None,
                            elapsed=float(elapsed) if elapsed.strip().isascii() and elapsed.strip().isdigit() else None)
    if exit_file.exists():
        return _exit_status(exit_file)
    # No accounting and no exit status: a job killed by SLURM says so in its output.
    text = tail(slurm_output(sub), 50)
    if "DUE TO TIME LIMIT" in text:
        return JobState(state="TIMEOUT")
    if "CANCELLED" in text:
        return JobState(state="CANCELLED")
    if overdue := _overdue(sub):
        return JobState(state="FAILED", note=overdue)
    # Nothing tells how it ended; whether it ended, only the queue can say: one that answers without
    # the job (squeue's "Invalid job id" for a job it has forgotten) no longer holds it.
    gone = queue is not None and (queue.returncode == 0 or "Invalid job id" in queue.stderr)
    return JobState(state="UNKNOWN", vanished=gone)


def _overdue(sub: Submission) -> str | None:
    """Why the job cannot be running any more, where it started longer ago than its time limit
    allows; None otherwise (not started, or no limit to go by)."""
    limit = limit_seconds(sub.time_limit)
    try:
        started = (sub.run_dir / NODE_FILE).stat().st_mtime
    except OSError:
        return None
    if limit is None or time.time() - started <= limit + OVERDUE_MARGIN_S:
        return None
    return (f"started {duration(time.time() - started)} ago with a time limit of {sub.time_limit}, and nothing "
            f"tells how it ended (not in the queue, no record in sacct, no {SBATCH_EXIT_FILE} in its run folder: "
            f"a node lost): stored failed {OVERDUE_MARGIN_S // 60} min past its limit")


def _exit_status(exit_file: Path) -> JobState:
    """The status the batch script wrote last (`echo $status`): empty, the script was cut off
    while writing it; anything but a number, the file is damaged: either way the job ended, failed."""
    try:
        text = exit_file.read_bytes().decode(errors="replace").strip()
    except OSError as e:
        return JobState(state="FAILED", note=f"ended, but its {exit_file} cannot be read ({e.strerror or e}): "
                                             "how is unknown")
    if not text:
        return JobState(state="FAILED", exit_code=1)
    if not re.fullmatch(r"[0-9]{1,3}", text):
        return JobState(state="FAILED", note=f"ended, but its {exit_file} holds {text[:60]!r}, not an exit "
                                             "status: how is unknown")
    rc = int(text)
    return JobState(state="COMPLETED" if rc == 0 else "FAILED", exit_code=rc)


def slurm_output(sub: Submission) -> Path:
    return sub.run_dir / f"slurm-{sub.job_id}.out"


def outcome_of(sub: Submission, state: JobState) -> Outcome:
    """How the job ended, as the local launchers classify a process."""
    log = slurm_output(sub)
    last = tail(log)
    seconds = state.elapsed if state.elapsed is not None and sub.round_runs == 1 else _output_span(sub)
    if state.state == "COMPLETED" and state.exit_code in (0, None):
        return Outcome("ok", 0, seconds, last)
    note = f"[fbench] SLURM job {sub.job_id} {state.note or f'ended {state.state}'}"
    if state.state == "TIMEOUT":
        return Outcome("timeout", None, seconds, f"{last}\n{note} (time limit {sub.time_limit})")
    oom = state.state == "OUT_OF_MEMORY" or any(m in tail(log, 2000) for m in OOM_MARKERS)
    return Outcome("oom" if oom else "failed", state.exit_code, seconds, f"{last}\n{note}")


def _output_span(sub: Submission) -> float:
    """Without accounting, or for one run of a round: from its start (its node file's writing;
    else its job file's, queue time included) to its SLURM output's last write."""
    try:
        end = slurm_output(sub).stat().st_mtime
    except OSError:
        return 0.0
    for start in (NODE_FILE, "job.json"):
        try:
            return max(0.0, end - (sub.run_dir / start).stat().st_mtime)
        except OSError:
            continue
    return 0.0


def node(sub: Submission) -> tuple[str | None, str | None]:
    """(hostname, GPU name) of the node that ran the job, as its batch script wrote them; Nones
    where it wrote nothing (a job that never started, a CPU node has no GPU name)."""
    try:
        lines = (sub.run_dir / NODE_FILE).read_text().splitlines()
    except OSError:
        return None, None
    return (lines[0].strip() or None) if lines else None, (lines[1].strip() or None) if len(lines) > 1 else None
