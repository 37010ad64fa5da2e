"""How the results store waits for a lock another process holds: SQLite's own wait per try,
then tries again with a growing pause, up to the patience; only then is a row kept aside
(`unstored.py`). The first wait is said once, naming who has the file open.
"""

from __future__ import annotations

import os
import sqlite3
import sys
import time
from pathlib import Path

from framework_bench.measure import processes

LOCK_WAIT = 30.0
LOCK_PATIENCE = 600.0
FIRST_PAUSE = 0.5


def locked(e: sqlite3.Error) -> bool:
    return isinstance(e, sqlite3.OperationalError) and any(w in str(e) for w in ("locked", "busy"))


def holders(path: Path) -> list[str]:
    """The other processes of this machine that have the file `path` open ("pid N (command)"):
    SQLite does not say which one holds its lock, so each is named."""
    target = os.path.realpath(path)
    found = []
    for pid in processes.matching(lambda pid: target in processes.open_files(pid)):
        try:
            command = processes.cmdline(pid).replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # gone meanwhile
            continue
        found.append(f"pid {pid}" + (f" ({command[:80]})" if command else ""))
    return found


class Patience:
    """The waits of one store's connection `conn` to the file `path`."""

    def __init__(self, conn: sqlite3.Connection, path: Path):
        self.conn, self.path = conn, path
        self._said_waiting = False

    def _say_waiting(self, patience: float) -> None:
        """One line, once: the store is locked, by whom, and that this command waits for it."""
        if self._said_waiting:
            return
        self._said_waiting = True
        who = ", ".join(holders(self.path)) or "another process"
        print(f"the results file {self.path} is locked (open in {who}): waiting for it, up to {patience:.0f} s",
              file=sys.stderr, flush=True)

    def briefly(self, step):
        """`step()`, first with a short wait: when the store is locked, say so (`_say_waiting`),
        then wait SQLite's whole wait."""
        self.conn.execute("PRAGMA busy_timeout = 200")
        try:
            return step()
        except sqlite3.OperationalError as e:
            if not locked(e):
                raise
            self._say_waiting(LOCK_WAIT)
        finally:
            self.conn.execute(f"PRAGMA busy_timeout = {int(LOCK_WAIT * 1000)}")
        return step()

    def fully(self, step):
        """`step()` (a whole transaction), tried again while the store is locked, up to `LOCK_PATIENCE`."""
        pause, deadline = FIRST_PAUSE, time.monotonic() + LOCK_PATIENCE
        while True:
            try:
                return step()
            except sqlite3.Error as e:
                if not locked(e) or time.monotonic() + pause > deadline:
                    raise
                self._say_waiting(LOCK_PATIENCE)
                time.sleep(pause)
                pause = min(2 * pause, 30.0)
