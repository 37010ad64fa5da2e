"""Start-up seconds by phase: from the worker process's start to its first optimizer step.

A worker takes `STARTED = time.time()` before its heavy imports, makes a `StartupClock`
from it first thing in `main`, and calls `mark(phase)` as each phase ends (a phase marked
twice adds up, e.g. reading the first batch is "data" too). The phases fbench names are
"imports", "data", "model_build", "framework_setup" and "initial_weights" (from the
ready line to the revealed seed's fill and report: `initial_weights_worker.fill_revealed`); `total` is the worker start to
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


def startup_note(seconds: float | None, phases: dict[str, float] | None) -> list[str]:
    """The breakdown as the one note a plugin adds to its report (shown with the run in
    `fbench run`, `--json`, the results table and the report): 'start-up 12.3 s: imports
    4.1, data 0.5, model_build 3.2, framework_setup 4.5'. Empty when the worker gave none."""
    if seconds is None or not phases:
        return []
    return [f"start-up {seconds:.1f} s: " + ", ".join(f"{name} {s:.1f}" for name, s in phases.items())]
