"""Stopping fbench from outside: Ctrl-C (SIGINT), `kill` or a CI cancel (SIGTERM) and a closed
terminal or dropped SSH session (SIGHUP) all end the work the same way, as KeyboardInterrupt:
the launcher stops the worker's whole process group and every process it started, the run
is stored as `interrupted`, a packing in progress removes its temporary folder.

Signal handlers can only be set from the main thread; elsewhere these are no-ops.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


@contextmanager
def stop_signals_interrupt() -> Iterator[None]:
    """While inside, SIGTERM and SIGHUP raise KeyboardInterrupt like Ctrl-C."""
    if not _main_thread():
        yield
        return
    previous = {s: signal.signal(s, _raise_interrupt) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


@contextmanager
def held(reraise: bool = True) -> Iterator[None]:
    """Let the block finish (stopping a worker, storing a run's row): a Ctrl-C, SIGTERM or SIGHUP
    that arrives meanwhile is held, then raised as KeyboardInterrupt when the block is done
    (`reraise`), or dropped when the block is itself the answer to an interrupt."""
    if not _main_thread():
        yield
        return
    arrived: list[int] = []
    signals = (signal.SIGINT, *STOP_SIGNALS)
    previous = {s: signal.signal(s, lambda signum, frame: arrived.append(signum)) for s in signals}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if arrived and reraise:
        raise KeyboardInterrupt(signal.Signals(arrived[0]).name)
