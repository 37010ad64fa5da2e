"""The XTuner worker: `python -m fbench_xtuner.worker RUN_DIR/job.json`, run with the xtuner env's Python.

It converts the host's packed rows into the dataset the generated config loads, trains
with XTuner's own mmengine Runner, and writes the project's common metrics file (one line
per optimizer step) next to XTuner's own `vis_data/scalars.json`. Any failure raises,
so the process exits non-zero and the host records the run as failed.
"""

from __future__ import annotations

import time

STARTED = time.time()  # before the heavy imports below: start-up counts them

import os
import sys
from contextlib import contextmanager
from pathlib import Path

import mmengine
import numpy as np
import torch
import transformers
import xtuner
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.registry import RUNNERS
from mmengine.runner import Runner

from fbench_xtuner import run_layout
from fbench_xtuner.sp_binding import sequence_parallel_problems
from framework_bench.worker import (ConsumedRows, Job, MicroLosses, PeakMemory, Report, StartupClock, StepTimer, dist_info,
                                    initial_weights_worker, join, load_job, publish_once, supervised_after_shift, update,
                                    write_report)
from framework_bench.worker import adapters
from framework_bench.worker import settings as capture
from framework_bench.worker.packed import PackedRows, stream_sha256

DATA_SHA256 = "fbench-data-sha256"  # in the converted dataset's folder: the stream sha256 of what XTuner loads


def convert_rows(job: Job, out_dir: Path) -> None:
    """The packed rows as a HF dataset (`input_ids`, `labels`; -100 = no loss) for `load_from_disk`,
    written by one process of the run (the others wait for it).

    The writer checks the rows are the stream the host hashed, and the stream sha256 of the
    token ids and labels read back from the written dataset, i.e. of what XTuner will load;
    every process then checks the sha256 the writer recorded.
    """
    publish_once(out_dir, lambda tmp: _write_dataset(job, tmp))
    job.check_data((out_dir / DATA_SHA256).read_text(), f"converted dataset {out_dir}")


def _write_dataset(job: Job, tmp: Path) -> None:
    import datasets
    import pyarrow as pa

    packed = job.open_rows()
    ctx = packed.context_length

    def fixed_rows(a: np.ndarray) -> pa.Array:
        return pa.FixedSizeListArray.from_arrays(pa.array(np.ascontiguousarray(a).reshape(-1)), ctx)

    columns = {"input_ids": fixed_rows(packed.input_ids), "labels": fixed_rows(packed.labels)}
    if job.scenario.attention == "varlen":
        # What XTuner's own packer adds for varlen attention: document boundaries and
        # positions restarting at each document.
        cu = [packed.cu_seqlens(r) for r in range(packed.rows)]
        positions = [np.concatenate([np.arange(b - a) for a, b in zip(c[:-1], c[1:])]) for c in cu]
        columns["cumulative_len"] = pa.array([c.tolist() for c in cu])
        columns["position_ids"] = fixed_rows(np.stack(positions))
    datasets.Dataset(pa.table(columns)).save_to_disk(str(tmp))

    # Read back as Arrow, not through datasets' numpy formatter: with deepspeed installed
    # torchvision is imported, and that formatter then asks torchvision 0.28 for VideoReader,
    # which it no longer has (ImportError).
    table = datasets.load_from_disk(str(tmp)).data
    ids, labels = (table.column(c).combine_chunks().flatten().to_numpy().reshape(-1, ctx) for c in ("input_ids", "labels"))
    sha = stream_sha256(ids, labels, packed.doc_starts)
    job.check_data(sha, f"converted dataset {tmp}")
    (tmp / DATA_SHA256).write_text(sha)


def _unwrap(model):
    return model.module if is_model_wrapper(model) else model


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


def verify_sequence_parallel(llm, requested: int) -> None:
    """Fail the run unless XTuner's sequence-parallel attention is what the built model runs:
    flash-attention 2, XTuner's dispatched attention forward on every attention module, an
    SP group of the requested size (the check itself: `fbench_xtuner.sp_binding`)."""
    if requested <= 1:
        return
    import torch.distributed as dist
    from transformers.utils.import_utils import is_flash_attn_2_available
    from xtuner.parallel.sequence import get_sequence_parallel_group

    group = get_sequence_parallel_group()
    size = dist.get_world_size(group) if dist.is_initialized() and group is not None else 1
    forwards = [f"{fn.__module__}.{fn.__qualname__}" for m in llm.modules() if type(m).__name__.endswith("Attention")
                for fn in [getattr(m.forward, "__func__", m.forward)]]
    problems = sequence_parallel_problems(requested, flash_attn_available=is_flash_attn_2_available(),
                                          attn_implementation=llm.config._attn_implementation,
                                          attention_forwards=forwards, sp_group_size=size)
    if problems:
        raise RuntimeError(f"XTuner's sequence parallel {requested} is not what would train: " + "; ".join(problems))


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
        llm = _unwrap(runner.model).llm
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


def effective_settings(runner, sp_size: int) -> dict:
    """What XTuner really trains with, read from the objects the Runner built."""
    from mmengine.optim import AmpOptimWrapper

    llm = _unwrap(runner.model).llm
    wrapper = runner.optim_wrapper
    strategy = getattr(runner, "strategy", None)
    ds = getattr(strategy, "config", None) if type(strategy).__name__ == "DeepSpeedStrategy" else None
    amp = isinstance(wrapper, AmpOptimWrapper)
    model = capture.model_settings(llm)
    if model["attention"] == "flash_attention_2" and model["attention_kv_repeat"]:
        model["attention_kv_repeat"] = "repeated (XTuner's dispatched flash-attn forward)"
    clip = ds.get("gradient_clipping") if ds else (wrapper.clip_grad_kwargs or {}).get("max_norm")
    accumulation = ds.get("gradient_accumulation_steps") if ds else wrapper._accumulative_counts
    return {
        "trainer": "mmengine-flexible+deepspeed" if ds else "mmengine-runner",
        **capture.optimizer_settings(wrapper),
        "grad_clip": clip,
        **model,
        "autocast_dtype": str(wrapper.cast_dtype).removeprefix("torch.") if amp else
        ("bfloat16" if ds and (ds.get("bf16") or {}).get("enabled") else None),
        "loss_scaler": type(wrapper.loss_scaler).__name__ if amp and wrapper.loss_scaler.is_enabled() else "none",
        **capture.precision_recipe(model["param_dtype"], ds),
        "master_weights": capture.master_weights(llm, wrapper),
        **capture.zero_settings(ds),
        **capture.dataloader_settings(runner.train_dataloader),
        "sequence_parallel": sp_size,
        "seed": runner.seed,
        "compile": compiled(runner),
        "token_count_sync": False,  # XTuner's ThroughputHook counts each rank's tokens with no collective
        "loss_normalization": loss_normalization(llm, sp_size, accumulation),
        "ddp_find_unused_parameters": getattr(runner.model, "find_unused_parameters", None),  # DDP-wrapped only
        **capture.runtime_settings(runner.model),
        **capture.versions(),
    }


def compiled(runner) -> bool:
    """Whether what trains went through torch.compile: mmengine's Runner replaces the model's
    `train_step` with torch.compile's wrapper (`_maybe_compile`), the FlexibleRunner's strategy
    compiles the module itself. Read from the live objects: mmengine 0.10's Runner has no
    `_compile` attribute to read (only the FlexibleRunner has)."""
    step = getattr(runner.model, "train_step", None)
    return hasattr(step, "_torchdynamo_orig_callable") or any(
        type(m).__name__ == "OptimizedModule" for m in (runner.model, getattr(runner.model, "module", None)))


def loss_normalization(llm, sp_size: int, accumulation: int) -> str:
    """How XTuner's step loss is normalised: SupervisedFinetune returns the HF model's loss (a
    mean over the micro-batch's labels after the shift; with SP, XTuner's token-weighted
    reduction over the SP group), and mmengine (or DeepSpeed) divides each micro-batch's
    loss by the accumulation count: a mean of per-micro-batch means."""
    micro = ("token mean over the SP group (reduce_sequence_parallel_loss)" if sp_size > 1 else
             f"{type(llm).__name__} token mean per micro-batch, labels counted after the shift")
    return f"{micro}; mean over the step's {accumulation} micro-batch(es)"


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
        self.settings = {**effective_settings(runner, self.metrics.sp_size), **adapters.settings(_unwrap(runner.model).llm)}
        self.probe.install()
        self.param_count = capture.param_count(_unwrap(runner.model).llm)
        self.loss_scales(runner)
        # The weights the first step trains from, read after mmengine's init_weights ran.
        initial_weights_worker.report(_unwrap(runner.model).llm, self.job.seed, self.job.run_dir)

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
        update.report(_unwrap(runner.model).llm, self.job)  # after the last step's line: the host reveals the seed


def adapter_notes(job: Job) -> list[str]:
    """What a LoRA/QLoRA report says about how XTuner's LoRA path was set up (nothing for full runs)."""
    finetune = job.scenario.finetune
    notes = []
    if finetune.adapters and job.settings_mode == "native":
        notes.append("LoRA as XTuner's configs set it (native settings), not the scenario's: r=64, lora_alpha=16, "
                     "lora_dropout=0.1, bias none, on what XTuner's find_all_linear_names finds (every linear but the "
                     "LM head); the frozen weights stay fp32, as XTuner's _prepare_for_lora (peft's "
                     "prepare_model_for_kbit_training) upcasts them also without quantization.")
    elif finetune.adapters:
        frozen = finetune.compute_dtype if finetune.method == "qlora" else finetune.base_dtype
        if frozen != "fp32":
            notes.append(f"XTuner's _prepare_for_lora upcasts every 16-bit weight to fp32 (peft's "
                         f"prepare_model_for_kbit_training, also without quantization); matched settings cast the "
                         f"frozen ones back to the scenario's {frozen}.")
    if finetune.method == "qlora":
        notes.append("The 4-bit base is quantized from the seed's weights by transformers' bitsandbytes quantizer, "
                     "in the steps of from_pretrained(quantization_config=...) through which XTuner's QLoRA configs "
                     "load a checkpoint: a random-init model is built from its config, which takes no quantization.")
    return notes


def zero_stage_in_effect(runner) -> int:
    """The ZeRO stage of the engine that really trains: 0 unless the model is wrapped by a
    DeepSpeed engine (mmengine's MMDeepSpeedEngineWrapper holds it as `.model`)."""
    deepspeed = sys.modules.get("deepspeed")  # imported by the DeepSpeed strategy only
    engine = getattr(runner.model, "model", None)
    return engine.zero_optimization_stage() if deepspeed and isinstance(engine, deepspeed.DeepSpeedEngine) else 0


@contextmanager
def cpu_process_group_setup(device: str):
    """mmengine's `init_dist` ("pytorch" launcher) calls `torch.cuda.set_device(LOCAL_RANK)`
    before it initialises the process group, whatever the backend; the CPU torch build has no
    CUDA bindings, so that call raises. On CPU only, and only while the runner sets up its
    process group (gloo), that one call does nothing; everything else is mmengine's own path."""
    if device != "cpu":
        yield
        return
    set_device = torch.cuda.set_device
    torch.cuda.set_device = lambda device: None
    try:
        yield
    finally:
        torch.cuda.set_device = set_device


def launcher_for(cfg: Config, device: str) -> str:
    """mmengine's launcher, after setting up the process group a world of one needs.

    Several processes, or DeepSpeed (which otherwise falls back to MPI discovery), go
    through mmengine's "pytorch" launcher: it reads RANK/LOCAL_RANK/WORLD_SIZE/MASTER_*
    (set by torchrun, or by the plan for one process) and initialises the group. For one
    process without DeepSpeed that launcher would also make mmengine wrap the model in
    MMDistributedDataParallel, whose buckets hold a second copy of every gradient for
    nothing: ~25 GiB for a 7B model, an out-of-memory run on one H200. So when the plan gave
    a world of one its process-group variables (every CUDA run: XTuner's dispatched
    attention calls dist.get_rank()), the worker initialises the group itself and keeps
    the launcher "none": mmengine then trains the bare model (`ddp_wrapped` false)."""
    if dist_info().world_size > 1 or "strategy" in cfg:
        return "pytorch"
    if "MASTER_ADDR" in os.environ:
        join(device)
    return "none"


def data_parallel_groups(cfg: Config) -> None:
    """XTuner builds its data- and sequence-parallel groups only inside its DeepSpeed strategy,
    but its SequenceParallelSampler asks for the data-parallel group whenever a process group
    exists ("data parallel group is not initialized" otherwise). Without DeepSpeed (ZeRO 0 in
    a process group: a world of one, or mmengine's DDP) the worker builds them as the strategy
    would, with sequence parallel 1; the runner builds the sampler later, in `train()`."""
    if "strategy" not in cfg and torch.distributed.is_initialized():
        from xtuner.parallel.sequence import init_sequence_parallel

        init_sequence_parallel(1)


def build_runner(cfg: Config, device: str) -> Runner:
    """As `xtuner train` does: DeepSpeed configs name the FlexibleRunner."""
    with cpu_process_group_setup(device):
        if "runner_type" in cfg:
            return RUNNERS.build(cfg)
        return Runner.from_cfg(cfg)


def main(job_file: str) -> None:
    startup = StartupClock(STARTED)
    job = load_job(job_file)
    run_dir = job.run_dir
    convert_rows(job, run_dir / run_layout.DATA_DIR)

    # xtuner/model/sft.py asks `get_torch_device().is_bf16_supported()`, which on CPU is
    # torch.cpu, and torch.cpu has no is_bf16_supported: answer False (it only picks the
    # dtype for flash-attn, which CPU runs never use).
    if not hasattr(torch.cpu, "is_bf16_supported"):
        torch.cpu.is_bf16_supported = lambda *args, **kwargs: False

    cfg = Config.fromfile(str(run_dir / run_layout.CONFIG_NAME))
    startup.mark("data")
    cfg.launcher = launcher_for(cfg, job.device)
    runner = build_runner(cfg, job.device)  # builds the model (on the GPU: model_builder.py)
    data_parallel_groups(cfg)
    startup.mark("model_build")
    timer = StepTimer(run_dir, job.device)
    timer.memory = StepPeak(job.device)
    metrics = CommonMetrics(job, timer)
    start = StepStart(timer, job.micro_batches_per_step, startup)
    runner.register_hook(start, priority="LOWEST")
    runner.register_hook(metrics, priority="HIGHEST")
    claims = Claims(job, metrics)
    runner.register_hook(claims, priority="NORMAL")
    runner.train()

    write_report(job, Report(
        framework_version=xtuner.__version__,
        attention_used=metrics.attention_used,
        settings=claims.probe.settle(claims.settings),
        param_count=claims.param_count,
        startup_seconds=round(start.first_step_at - STARTED, 2),
        startup_breakdown=startup.phases,
        notes=adapter_notes(job),
        extra={"rows_converted": PackedRows(job.data_dir).rows, "sequence_parallel_in_effect": metrics.sp_size,
               "deepspeed": "strategy" in cfg, "zero_stage_in_effect": metrics.zero_stage,
               "transformers_version": transformers.__version__, "mmengine_version": mmengine.__version__,
               "torch_version": torch.__version__, "work_dir": str(runner.log_dir)},
    ))


if __name__ == "__main__":
    main(sys.argv[1])
