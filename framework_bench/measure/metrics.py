"""From per-step worker metrics to one run's figures: the only place TGS is computed.

TGS (tokens per second per GPU) of a step = tokens per rank averaged over ranks / the
step's wall time (the slowest rank's). A run's TGS is the median over measured steps
(warm-up excluded), reported with its min and max.

Every figure is held to the ceiling of the device that ran it: a GPU's dense bf16 peak from the
one GPU table (measure/gpus.py), of which a step sustains at most MAX_MFU; a CPU's peak read
from this machine (measure/cpu_peak.py: CPU runs are local), which the model FLOPs of all its
worker processes together never exceed. Above either, the figures are impossible; a device
whose ceiling is unknown keeps its figures with a flag saying why.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from framework_bench.measure import cpu_peak, flops
from framework_bench.plugins.contract import StepMetric
from framework_bench.scenario.scenario import Scenario
from framework_bench.measure.verify import Check

# invalid: the run finished but a claim of its worker did not hold (framework_bench/measure/verify.py)
# unverified: the run finished, but a plugin of an older contract did not make every claim (runner._verify)
Status = Literal["ok", "failed", "oom", "timeout", "unsupported", "interrupted", "invalid", "unverified"]

MIN_MEASURED_STEPS = 3
MAX_SPREAD = 0.25  # (max - min) / median of step TGS above which the figure is flagged
MAX_MFU = 0.8  # of the GPU's dense bf16 peak: no dense training step sustains more (model FLOPs)


class RunResult(BaseModel):
    backend: str
    scenario: str
    status: Status
    reason: str | None = Field(None, description="why unsupported / failed, and the log tail")
    framework_version: str | None = None
    tgs: float | None = None
    tgs_min: float | None = None
    tgs_max: float | None = None
    tflops: float | None = Field(None, description="per GPU, attention projections counted as full MHA "
                                                  "(XTuner's published formula: flops.mha_flops_per_token)")
    model_tflops: float | None = Field(None, description="per GPU, exact model FLOPs")
    mfu: float | None = None
    steps_measured: int = 0
    step_unit: Literal["optimizer", "micro"] = Field("optimizer", description="what one measured step was")
    tokens_measured: int | None = Field(None, description="tokens per GPU over the measured steps")
    step_seconds: float | None = Field(None, description="median measured step time")
    peak_mem_bytes: int | None = Field(None, description="max over the measured steps of the peak allocated (max RSS on CPU)")
    peak_reserved_bytes: int | None = Field(None, description="max over the measured steps of the peak reserved (CUDA)")
    startup_seconds: float | None = Field(None, description="worker start to the first step (imports, data, model build)")
    final_loss: float | None = None
    flags: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list, description="the backend's notes on the run (WorkerReport.notes)")
    data_sha256: str | None = None
    attention_used: str | None = None
    framework_throughput: dict[str, float] = Field(default_factory=dict)
    run_dir: Path | None = None
    wall_seconds: float | None = None
    result_id: int | None = None
    settings_mode: str = "matched"
    settings: dict[str, str | int | float | bool | None] = Field(
        default_factory=dict, description="the settings in effect, as the worker read them from the live objects")
    checks: list[Check] = Field(default_factory=list, description="the host's verification of the worker's claims")
    seed: int | None = Field(None, description="the compare's seed: initial weights and the framework's seeding")
    loss_curve: dict[int, float] = Field(default_factory=dict, description=(
        "canonical loss per optimizer step: the token mean over all ranks (framework_bench/measure/losses.py)"))
    compare_id: str | None = Field(None, description="the compare this run is a trial of (None: a run on its own)")
    trial_round: int | None = Field(None, description="the compare's round this trial ran in, from 1")
    trial_position: int | None = Field(None, description="its place in the round's order of backends, from 1")


def per_step(steps: list[StepMetric]) -> list[tuple[int, float, float]]:
    """(step, seconds, tokens per GPU) with ranks merged."""
    by_step: dict[int, list[StepMetric]] = defaultdict(list)
    for m in steps:
        by_step[m.step].append(m)
    return [
        (s, max(m.seconds for m in ms), sum(m.tokens for m in ms) / len(ms))
        for s, ms in sorted(by_step.items())
    ]


# The fields `figures` computes from the step times: left out when those are impossible.
FIGURES = ("tgs", "tgs_min", "tgs_max", "tflops", "model_tflops", "mfu", "step_seconds")


def impossible_steps(merged: list[tuple[int, float, float]], tgs_steps: list[float]) -> str | None:
    """Why the measured steps cannot give a throughput (a rate of infinity, no tokens at all), or None."""
    for (step, seconds, tokens), rate in zip(merged, tgs_steps):
        if not math.isfinite(rate):
            return f"step {step}: {tokens:g} tokens in {seconds:g} s is no measurable rate"
    if statistics.median(tgs_steps) <= 0:
        return f"the measured steps fed no tokens ({sum(1 for r in tgs_steps if r <= 0)} of {len(tgs_steps)} steps with 0)"
    return None


def figures(scenario: Scenario, steps: list[StepMetric], peak_tflops: float | None, gpu_name: str | None = None,
            cpu: cpu_peak.CpuPeak | str | None = None) -> dict:
    """The aggregated figures of a run (fields of RunResult). Steps that cannot give a
    throughput leave the figures out and say why under the key `impossible`. `peak_tflops`:
    the GPU's (None when not in the table); `cpu`: a CPU run's ceiling, or why there is none
    (default: this machine's)."""
    merged = [row for row in per_step(steps) if row[0] > scenario.steps.warmup]
    out: dict = {"steps_measured": len(merged), "flags": [], "step_unit": scenario.steps.unit,
                 "tokens_measured": round(sum(tokens for _, _, tokens in merged))}
    if not merged:
        out["flags"].append("no measured steps")
        return out
    tgs_steps = [tokens / seconds for _, seconds, tokens in merged]
    if problem := impossible_steps(merged, tgs_steps):
        out["impossible"] = problem
        return out
    tgs = statistics.median(tgs_steps)
    recompute = scenario.activation_checkpointing
    mha = flops.mha_flops_per_token(scenario.arch, scenario.context_length, recompute)
    model = flops.scenario_model_flops_per_token(scenario, recompute)  # LoRA-aware: a frozen base takes no weight gradients
    out.update(
        tgs=tgs, tgs_min=min(tgs_steps), tgs_max=max(tgs_steps),
        tflops=flops.tflops(tgs, mha), model_tflops=flops.tflops(tgs, model),
        step_seconds=statistics.median(s for _, s, _ in merged),
    )
    out["mfu"] = flops.mfu(out["model_tflops"], peak_tflops)
    problem = None
    if overflowed := [k for k in FIGURES if out.get(k) is not None and not math.isfinite(out[k])]:
        problem = f"{', '.join(overflowed)} beyond any number: TGS {tgs:g}"
    elif out["mfu"] is not None and out["mfu"] > MAX_MFU:
        # Above what a GPU sustains: the step times, the tokens or the GPU named are wrong.
        problem = (f"MFU {out['mfu']:.0%} is above the peak a GPU sustains, {MAX_MFU:.0%} of the "
                   f"{gpu_name or 'GPU'}'s dense bf16 {peak_tflops:g} TFLOPs")
    elif scenario.cluster.device == "cpu":
        problem = _above_cpu_peak(scenario, out, cpu_peak.this_machine() if cpu is None else cpu)
    elif peak_tflops is None:
        out["flags"].append(f"no GPU ceiling: {gpu_name} is not in the GPU table (framework_bench/measure/gpus.py)"
                            if gpu_name else "no GPU ceiling: the GPU's name is unknown")
    if problem:
        return {k: v for k, v in out.items() if k not in FIGURES} | {"impossible": problem}
    # Each step's peak is a window over that step (the worker SDK's StepTimer), so the run's
    # figure is the max over the measured steps, on every backend alike.
    measured = [m for m in steps if m.step > scenario.steps.warmup]
    for key in ("peak_mem_bytes", "peak_reserved_bytes"):
        peaks = [getattr(m, key) for m in measured if getattr(m, key) is not None]
        out[key] = max(peaks) if peaks else None
    losses = [m.loss for m in steps if m.loss is not None and m.rank == 0]
    out["final_loss"] = losses[-1] if losses else None
    if scenario.steps.unit == "micro":
        out["flags"].append(f"per micro-iteration: {len(merged)} measured, {out['tokens_measured']:,} tokens/GPU"
                            + (f"; the update runs once every {scenario.grad_accum}" if scenario.grad_accum > 1 else ""))
    if len(merged) < MIN_MEASURED_STEPS:
        out["flags"].append(f"only {len(merged)} measured steps")
    spread = (out["tgs_max"] - out["tgs_min"]) / tgs
    if spread > MAX_SPREAD:
        out["flags"].append(f"step spread {spread:.0%}")
    return out


# The flags of a run whose figures no hardware ceiling could be held against (`figures`): the
# run is `unverified` for them (framework_bench/run/readback.py), never `ok` unchecked.
NO_CEILING = ("no CPU ceiling:", "no GPU ceiling:")


def _above_cpu_peak(scenario: Scenario, out: dict, peak: cpu_peak.CpuPeak | str) -> str | None:
    """Why the model FLOPs of the run's worker processes on one machine, together, are above its
    CPU's peak; None when they are not, or when the peak is unknown (flagged, the figures stand)."""
    if isinstance(peak, str):
        out["flags"].append(f"no CPU ceiling: {peak}")
        return None
    processes = scenario.cluster.gpus_per_node
    achieved, ceiling = out["model_tflops"] * processes, peak.tflops(scenario.precision)
    if achieved <= ceiling:
        return None
    per = f" ({processes} processes x {out['model_tflops']:.3g})" if processes > 1 else ""
    return (f"model FLOPs {achieved:.3g} TFLOPs{per} at TGS {out['tgs']:,.0f} are above the peak of the CPU "
            f"that ran it, {peak.describe(scenario.precision)}")
