"""The torch reference's worker with real extra work in every step: after each optimizer step,
matrix products for EXTRA times the step's own time so far (from the step log's `begin`: the
pauses between steps, the update snapshot or data, do not count), so each timed step takes
1 + EXTRA times as long and TGS falls to 1 / (1 + EXTRA) of the reference's (EXTRA 0.25: 20%)."""

from __future__ import annotations

import os
import runpy
import time

import torch

from framework_bench.worker.loop import StepLog

EXTRA = float(os.environ.get("FBENCH_TWIN_EXTRA", "0.25"))
_begin, _step = StepLog.begin, torch.optim.AdamW.step
_started: list[float] = []


def _begin_timed(self, *args, **kwargs):
    out = _begin(self, *args, **kwargs)
    _started[:] = [time.perf_counter()]
    return out


def _slower_step(self, *args, **kwargs):
    out = _step(self, *args, **kwargs)
    if _started:
        now = time.perf_counter()
        deadline = now + EXTRA * (now - _started[0])
        x = torch.randn(128, 128)
        while time.perf_counter() < deadline:
            x = torch.tanh(x @ x)  # real arithmetic on the step's device, like a framework's extra kernel
    return out


StepLog.begin, torch.optim.AdamW.step = _begin_timed, _slower_step
runpy.run_module("fbench_torch.worker", run_name="__main__")
