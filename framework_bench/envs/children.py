"""Processes fbench starts that must not outlive it: pip building an env, a worker training."""

from __future__ import annotations

import ctypes
import os
import signal
from collections.abc import Callable

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def dies_with_this_process(sig: int = signal.SIGKILL) -> Callable[[], None] | None:
    """A `preexec_fn` that has the kernel send `sig` to the started process when this one dies
    (Linux `PR_SET_PDEATHSIG`): a `kill -9` of fbench has no way out to end it from. None where
    prctl is not to be had (not Linux)."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, sig)
        if os.getppid() != parent:  # this process died before the signal was armed
            os.kill(os.getpid(), sig)

    return arm
