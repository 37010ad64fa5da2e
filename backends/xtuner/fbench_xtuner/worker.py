"""The XTuner worker: `python -m fbench_xtuner.worker RUN_DIR/job.json`, run with the xtuner env's Python.

It converts the host's packed rows into the dataset the generated config loads (rows.py),
trains with XTuner's own mmengine Runner, built here as `xtuner train` would build it, with
fbench's hooks registered (hooks.py), and writes the project's common metrics file (one line
per optimizer step) next to XTuner's own `vis_data/scalars.json`, then the run's report. Any
failure raises, so the process exits non-zero and the host records the run as failed.
"""

from __future__ import annotations

import time

STARTED = time.time()  # before the heavy imports below: start-up counts them

import os
import sys
from contextlib import contextmanager

import mmengine
import torch
import transformers
import xtuner
from mmengine.config import Config
from mmengine.registry import RUNNERS
from mmengine.runner import Runner

from fbench_xtuner import run_layout
from fbench_xtuner.hooks import Claims, CommonMetrics, StepPeak, StepStart
from fbench_xtuner.rows import convert_rows
from framework_bench.worker import Job, Report, StartupClock, StepTimer, dist_info, exit_now, join, load_job, write_report
from framework_bench.worker.packed import PackedRows


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
    nothing: a 7B model then runs out of memory on one H200 (docs/calibration.md). So when
    the plan gave a world of one its process-group variables (every CUDA run: XTuner's
    dispatched attention calls dist.get_rank()), the worker initialises the group itself and
    keeps the launcher "none": mmengine then trains the bare model (`ddp_wrapped` false)."""
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
    exit_now()  # the report is written: no second of interpreter teardown in every run
