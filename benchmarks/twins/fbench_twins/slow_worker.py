"""The torch reference's worker with real extra work in every step: after each optimizer step,
matrix products for EXTRA times the time since the previous one, so each step takes
1 + EXTRA times as long and TGS falls to 1 / (1 + EXTRA) of the reference's (EXTRA 0.25: 20%)."""

from __future__ import annotations

import os
import runpy
import time

import torch

EXTRA = float(os.environ.get("FBENCH_TWIN_EXTRA", "0.25"))
_step = torch.optim.AdamW.step
_last: list[float] = []


def _slower_step(self, *args, **kwargs):
    out = _step(self, *args, **kwargs)
    now = time.perf_counter()
    if _last:
        deadline = now + EXTRA * (now - _last[0])
        x = torch.randn(128, 128)
        while time.perf_counter() < deadline:
            x = torch.tanh(x @ x)  # real arithmetic on the step's device, like a framework's extra kernel
    _last[:] = [time.perf_counter()]
    return out


torch.optim.AdamW.step = _slower_step
runpy.run_module("fbench_torch.worker", run_name="__main__")
