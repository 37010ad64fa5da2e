"""A SLURM job's time limit: estimated from the scenario, and read and written as sbatch's `--time`.

The estimate: the scenario's steps x the step time its published TGS implies (tokens one
GPU trains per step / TGS), or, without a published figure, the model's FLOPs per token at
an assumed share of the target GPU's peak; times a margin, plus start-up. Printed in every
SLURM plan, overridable with `--time`. How the assumed rates compare with measured ones:
docs/calibration.md.
"""

from __future__ import annotations

import math
import re

from pydantic import BaseModel, Field

from framework_bench.measure import flops
from framework_bench.scenario.scenario import Scenario

# Margins, because a wrong guess costs a whole queue wait: twice the expected training
# time, plus start-up (env import, model build, data conversion, NCCL).
MARGIN = 2.0
STARTUP_S = {"cuda": 30 * 60, "cpu": 10 * 60}
# Without a published TGS: the throughput the model's FLOPs allow at an assumed MFU of the
# target GPU's bf16 peak (a conservative share, below what the published rows reach), or an
# assumed rate for CPU workers.
ASSUMED_MFU = 0.25
ASSUMED_CPU_GFLOPS = 10.0
LONG_JOB_S = 2 * 86400  # beyond this many clusters' longest limit: say how to shorten it

SLURM_TIME = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$|^\d+-\d+$")


class TimeEstimate(BaseModel):
    limit: str = Field(description="the --time value, [D-]HH:MM:SS")
    seconds: int
    step_seconds: float
    steps: int
    unit: str
    startup_seconds: int
    source: str = Field(description="where the step time comes from")
    runs: int = Field(1, description="the runs the job holds, one after another (a SLURM round)")
    hint: str | None = None

    def summary(self) -> str:
        each = (f"{self.steps} {self.unit} steps x {duration(self.step_seconds)} ({self.source}) x {MARGIN:g} margin "
                f"+ {duration(self.startup_seconds)} start-up")
        return (f"--time={self.limit}: " + (f"{self.runs} runs x ({each})" if self.runs > 1 else each)
                + (f"; {self.hint}" if self.hint else ""))


def estimate_time(scenario: Scenario, gpu_name: str | None = None, runs: int = 1) -> TimeEstimate:
    """The SLURM time limit for `runs` runs of `scenario` one after another: its steps x the step
    time its published TGS implies, or else its FLOPs at an assumed MFU of the target GPU; with
    margin, and start-up for each run."""
    tokens = scenario.tokens_per_gpu_step
    device = scenario.cluster.device
    if scenario.reference:
        tgs, source = scenario.reference.tgs, f"published TGS {scenario.reference.tgs:g}"
    else:
        per_token = flops.model_flops_per_token(scenario.arch, scenario.context_length,
                                                scenario.activation_checkpointing)
        peak = flops.gpu_peak_tflops(gpu_name) if device == "cuda" else None
        if peak:
            tgs, source = peak * 1e12 * ASSUMED_MFU / per_token, f"model FLOPs at {ASSUMED_MFU:.0%} MFU of {gpu_name}"
        elif device == "cuda":
            peak = min(flops.GPU_PEAK_TFLOPS.values())
            tgs, source = peak * 1e12 * ASSUMED_MFU / per_token, f"model FLOPs at {ASSUMED_MFU:.0%} MFU of {peak:g} TFLOP/s"
        else:
            tgs, source = ASSUMED_CPU_GFLOPS * 1e9 / per_token, f"model FLOPs at an assumed {ASSUMED_CPU_GFLOPS:g} GFLOP/s per CPU process"
    step = tokens / tgs
    steps = scenario.steps.total
    seconds = math.ceil(runs * (MARGIN * steps * step + STARTUP_S[device]) / 60) * 60
    hint = None
    if seconds > LONG_JOB_S and scenario.steps.unit == "optimizer" and scenario.grad_accum > 1:
        micro = scenario.model_copy(update={"steps": scenario.steps.model_copy(update={"unit": "micro"})})
        hint = f"with steps.unit micro: {estimate_time(micro, gpu_name, runs).limit}"
    return TimeEstimate(limit=format_time(seconds), seconds=seconds, step_seconds=step, steps=steps,
                        unit=scenario.steps.unit, startup_seconds=STARTUP_S[device], source=source, runs=runs,
                        hint=hint)


def limit_seconds(limit: str) -> int | None:
    """A `--time` value in seconds (minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS, as sbatch
    reads it); None where it sets no limit or does not read."""
    if not SLURM_TIME.match(limit) or len(limit) > 20:
        return None
    days, _, rest = limit.rpartition("-")
    parts = [int(part) for part in rest.split(":")]
    if days:
        h, m, s = (parts + [0, 0])[:3]
    elif len(parts) == 3:
        h, m, s = parts
    else:
        h, m, s = 0, *(parts + [0])[:2]
    return int(days or 0) * 86400 + h * 3600 + m * 60 + s


def format_time(seconds: int) -> str:
    days, rest = divmod(int(seconds), 86400)
    h, rest = divmod(rest, 3600)
    text = f"{h:02d}:{rest // 60:02d}:{rest % 60:02d}"
    return f"{days}-{text}" if days else text


def duration(seconds: float) -> str:
    """A duration as people say it: seconds, minutes or hours, one decimal."""
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.1f} s"
