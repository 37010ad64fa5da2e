"""The HF Trainer's side of the worker SDK (transformers imported inside, as torch), for a
framework whose trainer is `transformers.Trainer` or a subclass of it (LLaMA-Factory's v0 SFT
trainer, ms-swift's Seq2SeqTrainer, TRL's SFTTrainer):

- `StepRecorder` (the SDK's `StepTimer` fed from trainer events, the attention and dtype the
  model really got, tokens counted from what it is fed) and `step_metrics_callback`, its callback;
- `Claims`: what the host verifies, recorded from the live trainer (rows fed, each micro-batch's
  loss with the divisor and backward scale the trainer used, the settings ledger, the parameter
  count, the initial weights revealed at `on_train_begin`, the projection of the weights when the
  warm-up ends and the update projection at the end);
- `effective_settings`, `backward_scale`, `normalization`: read from the live trainer;
- `write_run_report`: once the trainer returned, the steps counted and the worker report written.
"""

from __future__ import annotations

import time
from collections import deque
from pathlib import Path

from framework_bench.worker import (ConsumedRows, Job, MicroLosses, Report, StepTimer, adapters, dist_info,
                                    initial_weights_worker, update, write_report)
from framework_bench.worker import settings as capture

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
    for every backend) fed from a trainer's events, plus what the model really runs with. The
    logged loss arrives after the step ends (`on_log`), so a step's line is written then; the
    clock stops at the step's end, the peak is read when the line is written."""

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

    def attach(self, model) -> None:
        """Record what the model really runs with, and count the tokens it is fed."""
        self.attention_used = getattr(model.config, "_attn_implementation", None)
        self.param_dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
        if self.require_flash_attn and self.attention_used != FLASH_ATTENTION_2:
            raise RuntimeError(f"the scenario needs {FLASH_ATTENTION_2} but the trainer built the model "
                               f"with {self.attention_used!r} (flash-attn missing or refused)")
        # counted where the tokens are embedded: a trainer that splits each row inside the model
        # (ms-swift's sequence parallel, a pre-hook on the decoder) is counted for this rank's shard
        model.get_input_embeddings().register_forward_pre_hook(self._count_tokens, with_kwargs=True)

    def check_zero_stage(self, optimizer) -> None:
        """Refuse to measure anything but the ZeRO stage asked for (never a silent ZeRO 0)."""
        self.zero_stage = zero_stage_of(optimizer)
        if self.zero_stage != self.expected_zero_stage:
            raise RuntimeError(f"ZeRO stage in effect is {self.zero_stage} ({type(optimizer).__name__}), "
                               f"the scenario asks for {self.expected_zero_stage}")

    def _count_tokens(self, _module, args, kwargs) -> None:
        ids = kwargs.get("input", args[0] if args else None)
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


def step_metrics_callback(recorder: StepRecorder, startup=None):
    """The HF `TrainerCallback` that feeds `recorder` (`startup`: the worker's StartupClock, whose
    framework set-up ends at the first step). Made here: transformers is the env's, not the SDK's."""
    from transformers import TrainerCallback

    class StepMetricsCallback(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
            recorder.attach(model)
            recorder.check_zero_stage(optimizer)

        def on_step_begin(self, args, state, control, **kwargs):
            if startup is not None and recorder.first_step_at is None:
                startup.mark("framework_setup")
            recorder.begin()

        def on_step_end(self, args, state, control, **kwargs):
            recorder.end()

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                recorder.loss(logs["loss"])

        def on_train_end(self, args, state, control, **kwargs):
            recorder.close()

    return StepMetricsCallback()


def effective_settings(args, model, trained_model, optimizer, loader) -> dict:
    """What an HF Trainer (or a subclass of it) really trains with, read from the live objects."""
    from accelerate.state import AcceleratorState

    state = AcceleratorState()
    ds = state.deepspeed_plugin.deepspeed_config if state.deepspeed_plugin is not None else None
    model_part = capture.model_settings(model)
    mixed = str(state.mixed_precision)  # accelerate autocasts to it; DeepSpeed casts the weights instead
    scaler = getattr(optimizer, "scaler", None)  # accelerate's GradScaler (fp16 only)
    return {
        "trainer": "hf-trainer+deepspeed" if ds else "hf-trainer",
        **capture.optimizer_settings(optimizer),
        "grad_clip": args.max_grad_norm,
        **model_part,
        "autocast_dtype": None if ds else {"bf16": "bfloat16", "fp16": "float16"}.get(mixed),
        "loss_scaler": type(scaler).__name__ if scaler is not None else "none",
        **capture.precision_recipe(model_part["param_dtype"], ds),
        "master_weights": capture.master_weights(model, optimizer),
        **capture.zero_settings(ds),
        **capture.dataloader_settings(loader),
        "seed": args.seed,
        "compile": bool(args.torch_compile),
        "ddp_find_unused_parameters": args.ddp_find_unused_parameters if args.world_size > 1 else None,
        # counting tokens seen all-gathers and syncs every micro-batch, inside the step
        "token_count_sync": str(args.include_num_input_tokens_seen) not in ("no", "False"),
        # the HF Trainer splits sequences only through accelerate's context parallelism
        "sequence_parallel": getattr(args.parallelism_config, "cp_size", 1) if args.parallelism_config else 1,
        **capture.runtime_settings(trained_model),
        **capture.versions(),
    }


class Claims:
    """Records what the host verifies (framework_bench/measure/verify.py): the rows the model was fed
    (kept by a forward pre-hook, read back after the step's clock has stopped, so no device
    sync lands inside a step), the settings in effect and the parameter count."""

    def __init__(self, job: Job, clock):
        from transformers import TrainerCallback

        claims = self

        class Callback(TrainerCallback):
            def on_train_begin(self, args, state, control, model=None, optimizer=None, train_dataloader=None, **kw):
                trained = claims.prepared if claims.prepared is not None else model
                # the fine-tuning method from the live (peft-wrapped) model: trainable count, adapters
                claims.settings = {**effective_settings(args, model, trained, optimizer, train_dataloader),
                                   **adapters.settings(model)}
                claims.probe.install()
                claims.param_count = capture.param_count(model)
                model.register_forward_pre_hook(claims.keep, with_kwargs=True)
                # the trained weights from the seed the host reveals now, after the DeepSpeed engine (its
                # fp32 copies refreshed); then read back as the first step trains from them
                started = time.perf_counter()
                initial_weights_worker.fill_revealed(model, job, clock, optimizer)
                claims.untimed(time.perf_counter() - started)  # inside HF's train_runtime
                update.report_at_warmup_end(model, job, clock, then=claims.untimed)  # the weights when the warm-up ends

            def on_step_end(self, args, state, control, **kw):
                for ids, labels in claims.fed:
                    claims.rows.add(ids, labels)
                claims.fed = []
                claims.rows.end_step(state.global_step)
                claims.losses.end_step(state.global_step)

            def on_train_end(self, args, state, control, model=None, **kw):
                claims.rows.close()
                claims.losses.close()
                update.report(model, job)  # after the last step's line (the step metrics callback runs first)

        self.callback = Callback()
        self.prepared = None  # the model as accelerate prepared it (DDP-wrapped or not); see remember_prepared
        self.rows = ConsumedRows(job.run_dir, dist_info().rank)
        self.losses = MicroLosses(job.run_dir, dist_info().rank)
        self.fed: list = []
        self.loader_labels = None  # the labels the loader handed the micro-batch in training (record_losses)
        # Where the trainer's loader splits each row before the model (DeepSpeed's Ulysses adapter):
        # the group's rows whole, (input_ids, labels) in the order their micro-batches train; the
        # backend fills it, each micro-batch in training takes the next as `row`.
        self.whole_rows: deque | None = None
        self.row = None
        self.settings: dict = {}
        self.probe = capture.KvRepeatProbe()  # installed when training begins, settled in the report
        self.param_count: int | None = None
        self.fbench_seconds = 0.0  # fbench's own work (the seeds' waits, fill, reports) timed by the trainer's runtime
        self.normalization: str | None = None  # set by the first loss computed (record_losses)

    def untimed(self, seconds: float) -> None:
        """Seconds of fbench's own work inside the trainer's runtime (`fbench_seconds`)."""
        self.fbench_seconds += seconds

    def remember_prepared(self) -> None:
        """The model that trains is the one accelerate's `prepare_model` returns (DDP when it
        distributes); the HF Trainer hands callbacks only the bare model, so keep it here.
        Under DeepSpeed accelerate builds the engine elsewhere and this stays None.

        A world of one trains the bare model: accelerate's GPU branch wraps in DDP only with
        more than one process (`Accelerator.multi_device`), but its CPU branch (MULTI_CPU)
        wraps whatever the process count, so one CPU process in a process group would carry
        DDP's buckets and hooks that a one-GPU run never has. With one process there is no
        gradient to all-reduce; the wrapper is dropped before the trainer sees it."""
        import torch
        from accelerate import Accelerator

        prepare_model = Accelerator.prepare_model

        def prepare_and_remember(accelerator, model, *args, **kwargs):
            prepared = prepare_model(accelerator, model, *args, **kwargs)
            if accelerator.num_processes == 1 and isinstance(prepared, torch.nn.parallel.DistributedDataParallel):
                prepared = prepared.module
            self.prepared = prepared
            return prepared

        Accelerator.prepare_model = prepare_and_remember

    def record_losses(self, trainer_class=None, split_rows: bool = False) -> None:
        """Each micro-batch's loss as the HF Trainer computed it, with the divisor it used:
        `num_items_in_batch` (labels counted over the step's micro-batches before the shift,
        gathered across processes under `average_tokens_across_devices`, which then scales the
        loss back up by the process count), or the model's own mean when it takes no such count.
        `split_rows`: the trainer hands compute_loss each rank's slice of the rows and returns the
        row's loss gathered over the sequence-parallel group (ms-swift's; TRL's under DeepSpeed's
        Ulysses): the records then count the whole rows the loader handed (`whole_rows` where the
        loader splits them), as every rank of a group logs its row's loss."""
        from transformers import Trainer

        cls = trainer_class or Trainer  # the class whose compute_loss the trainer runs (TRL's overrides it)

        compute_loss = cls.compute_loss

        def compute_and_record(trainer, model, inputs, *args, **kwargs):
            labels = inputs.get("labels")  # taken first: ms-swift's loss under sequence parallel pops them
            out = compute_loss(trainer, model, inputs, *args, **kwargs)
            if model.training:
                whole = self.loader_labels if split_rows else labels
                loss = out[0] if isinstance(out, tuple) else out
                items = kwargs.get("num_items_in_batch", args[1] if len(args) > 1 else None)
                if items is not None and trainer.model_accepts_loss_kwargs:
                    scaled = trainer.args.average_tokens_across_devices and trainer.accelerator.num_processes > 1
                    divisor = items / (trainer.accelerator.num_processes if scaled else 1)
                else:
                    divisor = (whole[..., 1:] != -100).sum()
                # Tensors kept as they are: read once the step's clock stopped (MicroLosses.end_step).
                self.losses.add(loss, divisor, whole, backward_scale(trainer, items))
                self.normalization = normalization(trainer, items is not None)
            return out

        cls.compute_loss = compute_and_record
        training_step = cls.training_step

        def training_step_seen(trainer, model, inputs, *args, **kwargs):
            if self.whole_rows is not None:
                self.row = self.whole_rows.popleft()
            self.loader_labels = inputs.get("labels") if self.row is None else self.row[1]
            return training_step(trainer, model, inputs, *args, **kwargs)

        cls.training_step = training_step_seen

    def keep(self, module, args, kwargs) -> None:
        # the labels the model is fed; where the trainer's loss takes them out of the model's inputs
        # (ms-swift's under sequence parallel, each rank's slice), the loader's for this micro-batch
        if module.training and self.row is not None:
            self.fed.append(self.row)
            return
        labels = kwargs.get("labels", self.loader_labels)
        if module.training and "input_ids" in kwargs and labels is not None:
            self.fed.append((kwargs["input_ids"], labels))


def backward_scale(trainer, items) -> float:
    """The factor the HF Trainer applies to the loss `compute_loss` returned before backward,
    read from the live trainer as its `training_step` decides: divided by the micro-batches of
    the step when the loss is the model's own mean (no count, or a model that takes none), then
    by accelerate's gradient_accumulation_steps in its `backward` unless DeepSpeed scales it
    (the Trainer sets that count to 1 and tells DeepSpeed not to scale)."""
    from accelerate.utils import DistributedType

    scale = 1.0
    if (not trainer.model_accepts_loss_kwargs or items is None) and trainer.compute_loss_func is None:
        scale /= getattr(trainer, "current_gradient_accumulation_steps", trainer.args.gradient_accumulation_steps)
    if trainer.accelerator.distributed_type != DistributedType.DEEPSPEED:
        scale /= trainer.accelerator.gradient_accumulation_steps
    return scale


def normalization(trainer, counted: bool) -> str:
    """The HF Trainer's loss normalisation, read from the trainer that computed the loss."""
    if counted and trainer.model_accepts_loss_kwargs:
        where = " across processes" if trainer.args.average_tokens_across_devices else ""
        return ("token sum over the step's labels counted before the shift (num_items_in_batch" + where +
                "), model_accepts_loss_kwargs")
    return "model's token mean per micro-batch (labels after the shift), divided by gradient_accumulation_steps"


def write_run_report(job: Job, recorder: StepRecorder, claims: Claims, startup, framework_version: str,
                     train_runtime: float, native_adapters: str, **extra) -> None:
    """Every rank once the trainer returned: the recorder closed, its optimizer steps counted (a
    trainer that ran other than the job's fails the worker), then rank 0's report, whose own
    throughput is the HF Trainer's `train_runtime` less what fbench's own work took inside it (the
    initial seed's wait, fill and report; the projection when the warm-up ends). `startup`: the worker's StartupClock;
    `native_adapters`: the framework's own adapter defaults, named in a native adapter run's notes."""
    from importlib.metadata import version

    recorder.close()
    if recorder.steps_written != job.steps:
        raise SystemExit(f"the trainer ran {recorder.steps_written} optimizer steps, expected {job.steps}")
    own = train_runtime - claims.fbench_seconds
    f = job.scenario.finetune
    native = [f"native {f.method}: {native_adapters}"] if f.adapters and job.settings_mode == "native" else []
    write_report(job, Report(
        framework_version=framework_version,
        attention_used=recorder.attention_used,
        settings={**claims.probe.settle(claims.settings), "loss_normalization": claims.normalization},
        param_count=claims.param_count,
        startup_seconds=round(recorder.first_step_at - startup.started, 2),
        startup_breakdown=startup.phases,
        notes=recorder.notes + native,
        throughput={"tokens_per_sec_whole_run": job.steps * job.scenario.tokens_per_gpu_step / max(own, 1e-9),
                    "train_runtime": train_runtime},
        extra={"transformers_version": version("transformers"), "torch_version": version("torch"),
               "fbench_seconds_in_train_runtime": round(claims.fbench_seconds, 4), "param_dtype": recorder.param_dtype,
               "zero_stage_in_effect": recorder.zero_stage, **extra},
    ))
