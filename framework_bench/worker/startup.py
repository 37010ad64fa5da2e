"""Start-up seconds by phase: from the worker process's start to its first optimizer step.

A worker takes `STARTED = time.time()` before its heavy imports, makes a `StartupClock`
from it first thing in `main`, and calls `mark(phase)` as each phase ends (a phase marked
twice adds up, e.g. reading the first batch is "data" too). The phases fbench names are
"imports", "data", "model_build" and "framework_setup"; `total` is the worker start to
the last mark (the first step's start), reported as `startup_seconds`.
"""

from __future__ import annotations

import time


class StartupClock:
    def __init__(self, started: float):
        self.started = started
        self._last = started
        self.phases: dict[str, float] = {}
        self.mark("imports")

    def mark(self, phase: str) -> None:
        now = time.time()
        self.phases[phase] = round(self.phases.get(phase, 0.0) + now - self._last, 3)
        self._last = now

    @property
    def total(self) -> float:
        return round(self._last - self.started, 2)
