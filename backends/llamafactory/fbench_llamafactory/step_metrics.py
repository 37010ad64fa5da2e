"""Per-step measurements written to the project's common metrics file (worker side).

`StepRecorder` is trainer-neutral; `StepMetricsCallback` plugs it into the HF Trainer that
LLaMA-Factory's `run_exp` drives (the v1 trainer has its own adapter in worker_v1.py).
Tokens are counted from the batches the model really receives (a forward pre-hook on the
top-level model), not derived from the scenario.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from transformers import TrainerCallback

from framework_bench.worker import StepTimer

FLASH_ATTENTION_2 = "flash_attention_2"


def zero_stage_of(optimizer) -> int:
    """The ZeRO stage of the optimizer that really steps: under DeepSpeed the HF Trainer's
    optimizer is accelerate's wrapper around DeepSpeed's ZeRO optimizer (stage 3 has its own
    class; stages 1 and 2 share one, stage 2 partitioning the gradients too). 0 otherwise."""
    inner = getattr(optimizer, "optimizer", None)
    name = type(inner).__name__
    if name == "DeepSpeedZeroOptimizer_Stage3":
        return 3
    if name == "DeepSpeedZeroOptimizer":
        return 2 if inner.partition_gradients else 1
    return 0


class StepRecorder:
    """The SDK's `StepTimer` (one timing and peak-memory window per optimizer step, the same
    for every backend) fed from LLaMA-Factory's trainer events, plus what the model really
    runs with. The logged loss arrives after the step ends (`on_log`), so a step's line is
    written then; the clock stops at the step's end, the peak is read when the line is written."""

    def __init__(self, run_dir: Path, device: str, require_flash_attn: bool, zero_stage: int = 0):
        self.timer = StepTimer(run_dir, device)
        self.require_flash_attn = require_flash_attn
        self.expected_zero_stage = zero_stage
        self.zero_stage: int | None = None
        self.attention_used: str | None = None
        self.param_dtype: str | None = None
        self.notes: list[str] = []
        self._step = 0
        self._pending = False
        self.first_step_at: float | None = None

    @property
    def steps_written(self) -> int:
        return self.timer.steps_written

    def attach(self, model: torch.nn.Module) -> None:
        """Record what the model really runs with, and count the tokens it is fed."""
        self.attention_used = getattr(model.config, "_attn_implementation", None)
        self.param_dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
        if self.require_flash_attn and self.attention_used != FLASH_ATTENTION_2:
            raise RuntimeError(f"the scenario needs {FLASH_ATTENTION_2} but LLaMA-Factory built the model "
                               f"with {self.attention_used!r} (flash-attn missing or refused)")
        model.register_forward_pre_hook(self._count_tokens, with_kwargs=True)

    def check_zero_stage(self, optimizer) -> None:
        """Refuse to measure anything but the ZeRO stage asked for (never a silent ZeRO 0)."""
        self.zero_stage = zero_stage_of(optimizer)
        if self.zero_stage != self.expected_zero_stage:
            raise RuntimeError(f"ZeRO stage in effect is {self.zero_stage} ({type(optimizer).__name__}), "
                               f"the scenario asks for {self.expected_zero_stage}")

    def _count_tokens(self, _module, args, kwargs) -> None:
        # Under sequence parallel the v1 trainer splits each row before the forward call, so
        # the hook counts this rank's shard only.
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None:
            self.timer.add_tokens(ids.numel())

    def begin(self) -> None:
        self._flush(None)
        if self.first_step_at is None:
            self.first_step_at = time.time()
        self.timer.begin()

    def end(self) -> None:
        self.timer.pause()
        self._step += 1
        self._pending = True

    def loss(self, value: float) -> None:
        """The logged loss arrives after the step ends; it completes the pending line."""
        self._flush(float(value))

    def _flush(self, loss: float | None) -> None:
        if self._pending:
            self.timer.end(self._step, loss)
            self._pending = False

    def close(self) -> None:
        self._flush(None)
        self.timer.close()


class StepMetricsCallback(TrainerCallback):
    """HF `TrainerCallback` for LLaMA-Factory's v0 trainer (`run_exp(args, callbacks=[...])`)."""

    def __init__(self, recorder: StepRecorder, startup=None):
        self.recorder = recorder
        self.startup = startup  # the worker's StartupClock: the trainer's set-up ends at the first step

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        self.recorder.attach(model)
        self.recorder.check_zero_stage(optimizer)

    def on_step_begin(self, args, state, control, **kwargs):
        if self.startup is not None and self.recorder.first_step_at is None:
            self.startup.mark("framework_setup")
        self.recorder.begin()

    def on_step_end(self, args, state, control, **kwargs):
        self.recorder.end()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.recorder.loss(logs["loss"])

    def on_train_end(self, args, state, control, **kwargs):
        self.recorder.close()
