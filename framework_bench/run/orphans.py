"""Runs whose fbench died before storing them (`kill -9`, a lost node, a power cut).

Before launching, the host writes `host.json` into the run folder (its pid, that pid's start
time, the results file, the trial it is); once the run's row is stored, or kept aside for the next
command, the file goes. On start, fbench looks for run folders still holding one whose host is
gone: it ends what is left of the worker and stores the run as the trial it was: `failed`, saying
so, or, where its read-back had ended (its `result.json`), with its own status, judged without a
reference since its round never judged it. A process is ended only when its own command line
names that run folder, or its environment does (what the worker started in a session of its own:
`launchers/descendants.py`): pids are reused.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import time
from pathlib import Path

from framework_bench.measure import processes
from framework_bench.measure.metrics import RunResult
from framework_bench.run.interrupts import held
from framework_bench.run.launchers.base import Submission
from framework_bench.run.launchers.descendants import of_run
from framework_bench.run.options import Trial
from framework_bench.scenario.scenario import Scenario
from framework_bench.store import results, unstored

HOST_FILE = "host.json"


def claim(run_dir: Path, db: Path | None, backend: str, scenario: Scenario, settings_mode: str,
          trial: Trial | None = None) -> None:
    """Mark `run_dir` (made here) as this process's to store in `db`, with what its row needs: the
    trial it is (compare, round, place) too."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / HOST_FILE).write_text(json.dumps({
        "pid": os.getpid(), "started": processes.start_time(os.getpid()), "hostname": socket.gethostname(),
        "db": str(Path(db).absolute()) if db else None,  # the next command may run from another folder
        "backend": backend, "settings_mode": settings_mode, "scenario": scenario.model_dump(mode="json"),
        "trial": (trial or Trial()).model_dump()}))


def release(run_dir: Path | None) -> None:
    if run_dir is not None:
        (Path(run_dir) / HOST_FILE).unlink(missing_ok=True)


def save(store: results.ResultStore, result: RunResult, scenario: Scenario, manifest: dict | None = None) -> Path | None:
    """`unstored.save`, then the run's claim released: a row stored, kept beside the store, or
    (`Unstored`) printed by the caller as JSON is no orphan, and no later command stores another.
    Any other failure keeps the claim, so the next command stores the run as failed."""
    try:
        kept = unstored.save(store, result, scenario, manifest)
    except unstored.Unstored:
        release(result.run_dir)
        raise
    release(result.run_dir)
    return kept


def _host_alive(record: dict) -> bool:
    """Whether the run's host may still be running it. A run started on another machine sharing
    FBENCH_HOME is that machine's to judge; without /proc, a live pid is taken as the host."""
    return record.get("hostname") != socket.gethostname() or processes.alive(record["pid"], record.get("started"))


def _naming(run_dir: Path) -> list[int]:
    """Live processes whose command line names `run_dir` (the worker's job file lies there), or
    whose environment names it their run."""
    needle = str(run_dir).encode()
    return processes.matching(lambda pid: needle in processes.cmdline(pid) or of_run(pid, run_dir))


def end_leftovers(run_dir: Path) -> int:
    """End every process naming `run_dir` (a group leader with its whole group): TERM, then
    KILL after 5 s. Returns how many were found."""
    pids = _naming(run_dir)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                if os.getpgid(pid) == pid:
                    os.killpg(pid, sig)
                else:
                    os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                continue
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and _naming(run_dir):
            time.sleep(0.1)
        if not _naming(run_dir):
            break
    return len(pids)


def _claim_of_the_dead(path: Path) -> bool:
    """Whether `path` (`host.json.<pid>`) was taken by a recovering command of this machine that
    is gone (`kill -9` during its wait): then the next command takes the run over."""
    pid = path.name[len(HOST_FILE) + 1:]
    if not (pid.isascii() and pid.isdigit()):
        return False
    try:
        host = json.loads(path.read_text()).get("hostname")
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(host, str) and processes.abandoned(int(pid), host)


def recover(root: Path) -> list[str]:
    """Store each run under `root` whose host died before storing it; one line for each. The run
    is claimed while it is recovered (`host.json` renamed `host.json.<pid>`) and given back on
    every exit that leaves it unstored, Ctrl-C included; a claim whose command is gone is taken over."""

    found = []
    for path in sorted(root.glob(f"*/{HOST_FILE}*")):
        if path.name == HOST_FILE:
            found.append((path, path))
        elif _claim_of_the_dead(path):
            found.append((path, path.with_name(HOST_FILE)))
    lines = []
    for claimed, host_file in found:
        run_dir = host_file.parent
        try:
            record = json.loads(claimed.read_text())
            if _host_alive(record):
                continue
            # The host's own file, taken so that of two commands starting at once one stores it.
            taken = host_file.with_name(f"{HOST_FILE}.{os.getpid()}")
            claimed.rename(taken)
        except (OSError, ValueError, KeyError, TypeError):
            continue
        try:
            lines.append(_recover_one(run_dir, record, taken, host_file))
        except BaseException:  # Ctrl-C during the wait for its processes: the run is the next command's
            with contextlib.suppress(OSError):  # gone: the row was stored (the claim goes with it)
                taken.rename(host_file)
            raise
    return lines


def _ended(run_dir: Path) -> RunResult | None:
    """The result the run's read-back left in its folder (`pipeline.finish`), or None: it had not ended."""
    try:
        return RunResult.model_validate_json((run_dir / "result.json").read_text())
    except (OSError, ValueError):  # pydantic's ValidationError is a ValueError
        return None


def _dead_hosts_result(run_dir: Path, record: dict, scenario: Scenario) -> RunResult:
    """The run as its dead host left it, as the trial its claim names: one that had ended, with its
    own status, judged without a reference (its round never judged it: `ok` becomes `unverified`);
    one that had not, `failed`."""
    died = f"the fbench host (pid {record['pid']}) died"
    if (result := _ended(run_dir)) is not None:
        if result.status in ("ok", "unverified"):  # never `ok` unjudged; a run's own failure stands
            result.status = "unverified"
            result.reason = "; ".join(p for p in (result.reason, f"parity not judged: its round never judged it: "
                                                                 f"{died} before the round ended") if p)
    else:
        job_file = run_dir / "job.json"
        stage = "during the run" if job_file.exists() else "while packing the data"
        try:
            sha = json.loads(job_file.read_text()).get("data_sha256") if job_file.exists() else None
        except (OSError, ValueError, AttributeError):
            sha = None
        result = RunResult(backend=record["backend"], scenario=scenario.name, status="failed", run_dir=run_dir,
                           settings_mode=record["settings_mode"], data_sha256=sha, reason=f"{died} {stage}")
    for field, value in Trial.model_validate(record.get("trial") or {}):  # an older fbench's claim names none
        setattr(result, field, value)
    return result


def _handed_to_slurm(run_dir: Path, record: dict) -> Submission | None:
    """The SLURM job that took the run, where its host died as it recorded the submission: its
    `slurm.json` completed with the trial the claim names (`results collect` stores the run)."""
    try:
        sub = Submission.load(run_dir)
    except (OSError, ValueError):  # none (not a SLURM run, or not yet submitted), or cut by the kill
        return None
    if sub.job_id is None:
        return None
    if sub.compare_id is None:
        for field, value in Trial.model_validate(record.get("trial") or {}):
            setattr(sub, field, value)
        sub.save()
    return sub


def _recover_one(run_dir: Path, record: dict, taken: Path, host_file: Path) -> str:
    """End what is left of the dead host's run and store it (`_dead_hosts_result`), unless a SLURM
    job took it; the line saying so."""
    if (sub := _handed_to_slurm(run_dir, record)) is not None:
        taken.unlink(missing_ok=True)
        return (f"fbench (pid {record.get('pid')}) ended as it submitted the run in {run_dir} as SLURM job "
                f"{sub.job_id}: `fbench results collect` stores it")
    ended = end_leftovers(run_dir)
    what = f"fbench (pid {record.get('pid')}) ended before storing the run in {run_dir}"
    if ended:
        what += f"; {ended} process(es) of it were still running and are now stopped"
    if record.get("db"):
        try:
            scenario = Scenario.model_validate(record["scenario"])
            result = _dead_hosts_result(run_dir, record, scenario)
            with results.ResultStore(record["db"]) as store, held():  # the row and the claim's end, together
                if (stored := store.id_of_run(run_dir)) is not None:  # it died between the row and the claim's end
                    taken.unlink(missing_ok=True)
                    return f"{what}: its row was stored (result {stored} in {record['db']})"
                kept = save(store, result, scenario)
                taken.unlink(missing_ok=True)
            what += f": kept in {kept} for the next command" if kept else \
                f": stored as {result.status} result {result.result_id} in {record['db']}"
        except Exception as e:  # noqa: BLE001 - one damaged folder must not stop the others
            taken.rename(host_file)
            return f"{what}, but it could not be stored yet: {type(e).__name__}: {e}"
    taken.unlink(missing_ok=True)
    return what
