"""This machine's processes, as /proc lists them (Linux), and files claimed by a process.

A pid with its start time names one process, never a later one given the same pid. Without
/proc no process is listed and none has a start time: `alive` asks a process recorded so by
its pid alone (kill 0).
`cpu` reads a process's CPU time: the watcher (`clock.py`) sums it over the run's process tree
at every stamp. Stdlib only: the node-side watcher uses it with no host dependencies.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100  # /proc/PID/stat's times are in these


class Stat(NamedTuple):
    """A process's /proc/PID/stat figures that fbench reads."""

    parent: int
    started: str  # clock ticks since boot (field 22)
    state: str  # "Z" a zombie, "X" dead


class Cpu(NamedTuple):
    """A process's CPU seconds as /proc has them now."""

    ran: float  # its live threads' run time (/proc/PID/task/TID/schedstat, to the nanosecond)
    waited: float  # the time its live threads waited, runnable, for a CPU
    own: float  # utime + stime: every thread's run time, those that ended too (in clock ticks)
    reaped: float  # cutime + cstime: its children's that ended and were waited for, and theirs


def _read(path: str) -> bytes:
    """A small /proc file's bytes (os.read: a third of `Path.read_text`'s cost, read at every stamp)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 1 << 16)
    finally:
        os.close(fd)


def _fields(pid: int) -> list[str]:
    """/proc/PID/stat's fields from the third (the state) on: field N at N - 3 (OSError once gone)."""
    return _read(f"/proc/{pid}/stat").decode(errors="replace").rpartition(")")[2].split()  # the command may hold ")"


def stat(pid: int) -> Stat | None:
    """The process's `Stat`; None once it is gone (or without /proc)."""
    try:
        fields = _fields(pid)
    except OSError:
        return None
    return Stat(int(fields[1]), fields[19], fields[0])


def cpu(pid: int) -> Cpu | None:
    """The process's `Cpu`; None once it is gone (or without /proc). A zombie still has its own
    time; once reaped, its time and its children's are in its parent's `reaped`. A child reaped
    by the kernel itself (its parent ignored SIGCHLD) leaves no time anywhere: read while it
    runs, it counted until then."""
    try:
        fields, tasks = _fields(pid), os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    ran = waited = 0
    for tid in tasks:
        try:
            run, wait = _read(f"/proc/{pid}/task/{tid}/schedstat").split()[:2]
        except (OSError, ValueError):  # ended since, or no schedstat in this kernel
            continue
        ran, waited = ran + int(run), waited + int(wait)
    utime, stime, cutime, cstime = (int(f) for f in fields[11:15])
    return Cpu(ran / 1e9, waited / 1e9, (utime + stime) / TICK, (cutime + cstime) / TICK)


def start_time(pid: int) -> str | None:
    s = stat(pid)
    return None if s is None else s.started


def alive(pid: int, started: str | None = None) -> bool:
    """Whether process `pid` runs (a zombie does, until reaped); given the `start_time` recorded
    for it, whether that same process does."""
    if started is not None:
        return start_time(pid) == started
    if pid <= 0:  # kill(2) would ask a process group
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except OSError:  # alive, another user's
        return True
    return True


def abandoned(pid: int, host: str | None = None) -> bool:
    """Whether a file claimed by process `pid` of machine `host` (None: this one) may be taken
    over: its claimant ran here and is gone (`kill -9`, a power cut). Never this process's own."""
    return host in (None, socket.gethostname()) and pid != os.getpid() and not alive(pid)


def _pids() -> list[int]:
    try:
        return [int(e.name) for e in os.scandir("/proc") if e.name.isascii() and e.name.isdigit()]
    except OSError:
        return []


def table() -> dict[int, Stat]:
    """{pid: `Stat`} of every process /proc lists, this one included."""
    return {pid: s for pid in _pids() if (s := stat(pid)) is not None}


def descendants(table_: dict[int, Stat], root: int) -> list[int]:
    """The pids in `table_` that descend from `root` (children, theirs, and so on)."""
    children: dict[int, list[int]] = {}
    for pid, s in table_.items():
        children.setdefault(s.parent, []).append(pid)
    found, todo = [], [root]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def matching(match: Callable[[int], bool]) -> list[int]:
    """The processes /proc lists, but this one, for which `match(pid)` holds; one that ends, or
    whose files are not ours to read, while `match` reads them is left out."""
    found = []
    for pid in _pids():
        if pid != os.getpid():
            try:
                if match(pid):
                    found.append(pid)
            except OSError:
                continue
    return found


def cmdline(pid: int) -> bytes:
    """The process's arguments, each ended by a NUL (OSError once it is gone)."""
    return Path(f"/proc/{pid}/cmdline").read_bytes()


def environ(pid: int) -> list[bytes]:
    """The process's environment as it started, `NAME=value` each (OSError once it is gone or not ours)."""
    return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")


def open_files(pid: int) -> list[str]:
    """The real paths of what the process holds open (OSError once it is gone or not ours)."""
    return [os.path.realpath(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
