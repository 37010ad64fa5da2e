"""One process writes a file or folder that many share; the others wait for it.

Ranks of one run (several processes per node, several nodes on one shared run folder) often
need the same prepared input: rows converted to a framework's format, a data file. Exactly
one of them writes it, every other one waits until it is in place, and none ever reads it
half-written. Stdlib only.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

WAIT_S = 1800  # converting a large stream for a long context takes minutes on a loaded node


def wait_for(path: Path, seconds: float = WAIT_S) -> None:
    deadline = time.monotonic() + seconds
    while not Path(path).exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {path} (written by another rank: see {Path(path).name}.lock)")
        time.sleep(0.2)


def publish_once(target: Path, write: Callable[[Path], None], wait_s: float = WAIT_S) -> bool:
    """One writer per shared run folder, however many processes and nodes share it: the process
    that creates `<target>.lock` first (O_CREAT | O_EXCL: one winner, on a shared filesystem
    too) calls `write(tmp)` with a temporary name unique to its host and pid, then renames
    it into place (atomic, a file or a folder); every other process waits for `target`.
    Returns True in the writer."""
    target = Path(target)
    if target.exists():
        return False
    lock = target.with_name(target.name + ".lock")
    try:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        wait_for(target, wait_s)
        return False
    with os.fdopen(fd, "w") as fh:  # kept: it names the writer, for a waiter that times out
        fh.write(f"{socket.gethostname()} pid {os.getpid()}\n")
    tmp = target.with_name(f"{target.name}.tmp.{socket.gethostname()}.{os.getpid()}")
    write(tmp)
    os.replace(tmp, target)
    return True
