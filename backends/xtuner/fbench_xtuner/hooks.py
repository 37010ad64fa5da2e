"""The mmengine hooks the worker registers on XTuner's Runner: the step clock (`StepStart`,
`CommonMetrics`, with `StepPeak` for memory), the checks that the asked settings took effect,
and the claims the host verifies (`Claims`: rows, micro-batch losses, the settings ledger, the
initial weights, the projection of the weights when the warm-up ends and the update projection)."""

from __future__ import annotations

import time

from mmengine.hooks import Hook

from fbench_xtuner.ledger import effective_settings, unwrap, zero_stage_in_effect
from fbench_xtuner.sp_binding import verify_sequence_parallel
from framework_bench.worker import (ConsumedRows, Job, MicroLosses, PeakMemory, StartupClock, StepTimer, dist_info,
                                    initial_weights_worker, supervised_after_shift, update)
from framework_bench.worker import adapters
from framework_bench.worker import settings as capture


class StepPeak(PeakMemory):
    """The step's peak-memory window, kept across micro-batches: mmengine's LoggerHook resets
    the CUDA peak counters after every iteration (LogProcessor._get_max_memory), so with
    grad_accum > 1 the counters alone would cover only the last micro-batch. `CommonMetrics`
    (highest priority: its after_train_iter runs before LoggerHook's) folds each
    micro-batch's peak in before that reset."""

    def __init__(self, device: str):
        super().__init__(device)
        self._seen: tuple[int, int | None] = (0, None)

    def reset(self) -> None:
        super().reset()
        self._seen = (0, None)

    def fold(self) -> None:
        self._seen = self.read()

    def read(self) -> tuple[int, int | None]:
        allocated, reserved = super().read()
        seen_allocated, seen_reserved = self._seen
        return max(allocated, seen_allocated), (None if reserved is None else max(reserved, seen_reserved or 0))


class StepStart(Hook):
    """Starts (first micro-batch) or resumes the step's clock; registered with the lowest
    priority so that its `before_train_iter` runs last, right before the train step. Data
    loading (between iterations) is outside the clock."""

    def __init__(self, timer: StepTimer, per_step: int, startup: StartupClock):
        self.timer = timer
        self.per_step = per_step
        self.startup = startup
        self.first_step_at: float | None = None

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        if self.first_step_at is None:
            self.startup.mark("framework_setup")  # optimizer, loops, hooks, the first batch
            self.first_step_at = time.time()
        if runner.iter % self.per_step == 0:
            self.timer.begin()
        else:
            self.timer.resume()


class CommonMetrics(Hook):
    """Pauses the clock after each micro-batch and writes one common-metrics line per optimizer
    step (grad_accum iterations) through the SDK's StepTimer; registered with the highest
    priority so that its `after_train_iter` runs first, before logging (see `StepPeak`).

    Also checks, once the model is built, that the settings the config asked for really
    took effect: through the Runner, XTuner drops sequence parallel and varlen attention
    without a word when their engines are missing, and a ZeRO stage must be DeepSpeed's.
    """

    def __init__(self, job: Job, timer: StepTimer):
        self.scenario = job.scenario
        # mmengine iterations (micro-batches) in one measured step: grad_accum, or 1 with
        # `steps.unit: micro` (every iteration is a step; the update lands in every grad_accum-th)
        self.per_step = job.micro_batches_per_step
        self.timer = timer
        self.sp_size = 1
        self.attention_used = None
        self.zero_stage = None
        self.losses: list[float] = []

    def before_train(self, runner) -> None:
        from xtuner.parallel.sequence import get_sequence_parallel_world_size

        self.sp_size = get_sequence_parallel_world_size()
        if self.sp_size != self.scenario.sequence_parallel:
            raise RuntimeError(
                f"sequence parallel size in effect is {self.sp_size}, the scenario asks for "
                f"{self.scenario.sequence_parallel}"
            )
        llm = unwrap(runner.model).llm
        verify_sequence_parallel(llm, self.scenario.sequence_parallel)
        self.attention_used = llm.config._attn_implementation
        if self.scenario.attention == "varlen" and self.attention_used != "flash_attention_2":
            raise RuntimeError(f"varlen attention asked for, but the model uses {self.attention_used!r}")
        self.zero_stage = zero_stage_in_effect(runner)
        if self.zero_stage != self.scenario.zero_stage:
            raise RuntimeError(f"ZeRO stage in effect is {self.zero_stage}, the scenario asks for {self.scenario.zero_stage}")
        runner.logger.info(f"fbench: attention {self.attention_used}, sequence parallel {self.sp_size}, "
                           f"ZeRO stage {self.zero_stage}")

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        self.timer.pause()
        self.timer.memory.fold()
        # The batch holds whole rows: each rank of a sequence-parallel group trains 1/SP of them.
        self.timer.add_tokens(data_batch["data"]["input_ids"].numel() // self.sp_size)
        self.losses.append(outputs["loss"].detach().item())
        if (runner.iter + 1) % self.per_step == 0:
            self.timer.end((runner.iter + 1) // self.per_step, sum(self.losses) / len(self.losses))
            self.losses = []

    def after_train(self, runner) -> None:
        self.timer.close()


class Claims(Hook):
    """Records what the host verifies (framework_bench/measure/verify.py): the rows fed in each
    optimizer step, read from the data batch (whole rows, before any SP split), the settings
    in effect and the parameter count. Runs after CommonMetrics has closed the step's clock."""

    def __init__(self, job: Job, metrics: CommonMetrics):
        self.job, self.metrics = job, metrics
        self.rows = ConsumedRows(job.run_dir, dist_info().rank)
        self.losses = MicroLosses(job.run_dir, dist_info().rank)
        self.micro = 0
        self.scale: float | None = None  # the factor of the micro-batch's loss before backward (loss_scales)
        self.settings: dict = {}
        self.probe = capture.KvRepeatProbe()  # installed when training begins, settled in the report
        self.param_count: int | None = None

    def before_train(self, runner) -> None:
        # the fine-tuning method as the live (peft-wrapped, for LoRA) model holds it: trainable_params on every run
        self.settings = {**effective_settings(runner, self.metrics.sp_size), **adapters.settings(unwrap(runner.model).llm)}
        self.probe.install()
        self.param_count = capture.param_count(unwrap(runner.model).llm)
        self.loss_scales(runner)
        # The trained weights from the seed the host reveals now, after mmengine's init_weights and
        # DeepSpeed's engine (its fp32 copies refreshed), then read back as the first step trains from them.
        initial_weights_worker.fill_revealed(unwrap(runner.model).llm, self.job, self.metrics.timer.clock,
                                             runner.optim_wrapper)
        # the weights when the warm-up ends, projected onto a vector the host reveals then
        update.report_at_warmup_end(unwrap(runner.model).llm, self.job, self.metrics.timer.clock)

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        labels = data_batch["data"]["labels"]
        self.rows.add(data_batch["data"]["input_ids"], labels)
        # The HF loss XTuner returns divides by the micro-batch's labels after the shift.
        self.losses.add(outputs["loss"], supervised_after_shift(labels), labels, self.scale)
        self.micro += 1
        per_step = self.job.micro_batches_per_step
        if self.micro % per_step == 0:
            self.rows.end_step(self.micro // per_step)
            self.losses.end_step(self.micro // per_step)

    def loss_scales(self, runner) -> None:
        """Keep in `self.scale` the factor the framework applies to each micro-batch's loss before
        backward, read from the live objects: DeepSpeed's engine divides by its
        gradient_accumulation_steps(); mmengine's OptimWrapper by `scale_loss`'s factor (the
        accumulation count, or the remainder's over the last iterations), seen as it divides:
        the same call on 1.0 gives 1 / factor exactly."""
        wrapper = runner.optim_wrapper
        if not hasattr(wrapper, "scale_loss"):  # mmengine's DeepSpeedOptimWrapper: the engine's backward
            self.scale = 1 / runner.model.model.gradient_accumulation_steps()
            return
        scale_loss = wrapper.scale_loss

        def scale_and_keep(loss):
            self.scale = scale_loss(1.0)
            return scale_loss(loss)

        wrapper.scale_loss = scale_and_keep

    def after_train(self, runner) -> None:
        self.rows.close()
        self.losses.close()
        update.report(unwrap(runner.model).llm, self.job)  # after the last step's line: the host reveals the seed
