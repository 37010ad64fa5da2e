"""Every process a run's worker started ends with the run (Linux), not only the worker's
process group: a daemon's double fork, or a helper started in a new session (`setsid`,
`start_new_session`: torchrun starts each of its workers so), whose command line need not
name the run, would otherwise outlive it.

For the run, the host is a child subreaper (prctl `PR_SET_CHILD_SUBREAPER`): a process whose
parent exits is adopted by the host rather than by init, so whatever the worker started stays
a descendant of the host, found in /proc and ended once the worker's group is (TERM, then
KILL), and reaped. Only processes that descend from the host and appeared after the launch
are the run's: a test runs the host inside pytest, whose other children are not (the host
itself starts no other process while a run goes on).

Without prctl (not Linux) orphans go to init and cannot be found: only the worker's process
group is ended, as before. Without /proc nothing here is done.

A host that dies (`kill -9`) takes its adoptions with it: the next command's sweep of the dead
host's run (`framework_bench/run/orphans.py`) finds the run's processes by `RUN_ENV`, which
every process started by the run inherits unless it clears its environment.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time
from pathlib import Path

from framework_bench.measure import processes

PR_SET_CHILD_SUBREAPER, PR_GET_CHILD_SUBREAPER = 36, 37  # linux/prctl.h
RUN_ENV = "FBENCH_RUN_DIR"  # the run folder, in the environment the launcher gives the worker


def of_run(pid: int, run_dir: Path) -> bool:
    """Whether the process's environment names `run_dir` as its run (`RUN_ENV`)."""
    try:
        return f"{RUN_ENV}={run_dir}".encode() in processes.environ(pid)
    except OSError:
        return False


def _set_subreaper(on: int) -> int | None:
    """Make this process a child subreaper (`on` 1) or not (0); returns what it was, None where
    prctl is not to be had."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    was = ctypes.c_int(0)
    if prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(was)) != 0 or prctl(PR_SET_CHILD_SUBREAPER, on) != 0:
        return None
    return was.value


class RunTree:
    """While inside, the host adopts the orphans of its descendants; `end` ends every process
    that descends from the host and was not there on entering, but `workers`: the processes
    the launcher started, whose `Popen` reaps them and reads their exit codes."""

    def __init__(self, workers: list[subprocess.Popen]):
        self._workers = workers

    def __enter__(self) -> RunTree:
        table = processes.table()
        self._before = {(pid, table[pid].started) for pid in processes.descendants(table, os.getpid())}
        self._was_subreaper = _set_subreaper(1)
        return self

    def __exit__(self, *_exc) -> None:
        if self._was_subreaper is not None:
            _set_subreaper(self._was_subreaper)

    def reap(self) -> dict[int, str]:
        """Reap the run's processes the host adopted that have ended (nothing else would: they
        are no `Popen` of anyone's; a zombie also keeps its process group alive); returns
        {pid: start time} of the run's processes still alive."""
        table, host = processes.table(), os.getpid()
        workers = {p.pid for p in self._workers}
        alive = {}
        for pid in processes.descendants(table, host):
            ppid, started, state = table[pid]
            if (pid, started) in self._before or pid in workers:
                continue
            if state not in ("Z", "X"):  # a zombie, or dead
                alive[pid] = started
            elif ppid == host:
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass
        return alive

    def end(self, grace: float) -> None:
        """TERM every process of the run left (ones that appear meanwhile too), KILL those alive
        `grace` seconds later, then wait up to `grace` more for the KILLs to land."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            signalled: set[tuple[int, str]] = set()
            deadline = time.monotonic() + grace
            while left := self.reap():
                if time.monotonic() > deadline:
                    break
                for pid, started in left.items():
                    if (pid, started) not in signalled:
                        signalled.add((pid, started))
                        try:
                            os.kill(pid, sig)
                        except (ProcessLookupError, PermissionError):
                            pass
                time.sleep(0.05)
            else:
                return
