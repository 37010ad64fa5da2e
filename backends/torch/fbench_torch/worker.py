"""The reference worker: `python -m fbench_torch.worker RUN_DIR/job.json`, in the torch env.

A plain PyTorch loop, built only on the worker SDK: the HF model from its config with random
weights made where they train (on the GPU), AdamW with the shared hyper-parameters (fused on
CUDA in both settings modes, torch's own choice on CPU), bf16 autocast when the scenario
asks, activation checkpointing when it asks, DDP when there are several processes (NCCL on
GPUs, gloo on CPU); a world of one is never wrapped, also inside a process group. Rows are
read in order from the host's packed stream: data-parallel rank r takes micro-batch g's
rows [(g * world + r) * micro_batch, ... + micro_batch).
"""

from __future__ import annotations

import time

STARTED = time.time()  # before the heavy imports below: start-up counts them

import os
import sys
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch
import transformers

from framework_bench.worker import files as worker_io
from framework_bench.worker.packed import PackedRows
from framework_bench.worker import (ADAM_BETAS, ADAM_EPS, LEARNING_RATE, MAX_GRAD_NORM, WEIGHT_DECAY, StartupClock,
                                    StepTimer, dist_info)
from framework_bench.worker import init_weights
from framework_bench.worker import settings as capture
from framework_bench.worker.losses import MicroLosses, supervised_after_shift
from framework_bench.worker.rows import ConsumedRows


def build_model(job: dict, device: torch.device) -> torch.nn.Module:
    cfg = dict(job["hf_config"])
    config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    torch.manual_seed(job["seed"])
    # Built on the device it trains on: initialising 7B fp32 weights on the CPU and copying
    # them over takes minutes, and the start-up column would measure that, not the loop.
    with device:
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    init_weights.fill(model, job["seed"], job["hf_config"])  # every backend's weights, on every rank
    if job["scenario"]["activation_checkpointing"]:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model.to(device).train()


def adamw(params, cuda: bool) -> torch.optim.AdamW:
    """The shared hyper-parameters; fused on CUDA in both settings modes (less time and memory
    than foreach: no parameter-sized temporary), torch's own choice on CPU (the for-loop),
    as every backend's CPU runs (the AdamW table: README)."""
    return torch.optim.AdamW(params, lr=LEARNING_RATE, betas=ADAM_BETAS, eps=ADAM_EPS, weight_decay=WEIGHT_DECAY,
                             fused=True if cuda else None)


def micro_batches(packed: PackedRows, scenario: dict, rank: int, world: int):
    """Per optimizer step, its micro-batches as (input_ids, labels) int64 CPU tensors."""
    mb, ga = scenario["micro_batch"], scenario["grad_accum"]
    steps = scenario["steps"]["warmup"] + scenario["steps"]["measured"]
    needed = steps * ga * world * mb
    if needed > packed.rows:
        raise SystemExit(f"the run needs {needed} rows, the packed stream has {packed.rows}")
    for step in range(steps):
        batch = []
        for micro in range(ga):
            lo = ((step * ga + micro) * world + rank) * mb
            ids = torch.from_numpy(np.asarray(packed.input_ids[lo:lo + mb], dtype=np.int64))
            labels = torch.from_numpy(np.asarray(packed.labels[lo:lo + mb], dtype=np.int64))
            batch.append((ids, labels))
        yield batch


def main(job_file: str) -> None:
    startup = StartupClock(STARTED)
    job = worker_io.load_job(job_file)
    scenario = job["scenario"]
    dist = dist_info()
    packed = PackedRows(job["data_dir"])
    sha = packed.sha256()
    if sha != job["data_sha256"]:
        raise SystemExit(f"packed data in {job['data_dir']} has sha256 {sha}, the host expected {job['data_sha256']}")
    startup.mark("data")

    cuda = job["device"] == "cuda"
    if cuda:
        torch.cuda.set_device(dist.local_rank)
    device = torch.device("cuda", dist.local_rank) if cuda else torch.device("cpu")
    # Several processes come from torchrun; one process joins a group only when its launcher
    # gave it one (MASTER_ADDR): the loop needs none, but stays bare inside one.
    if dist.world_size > 1 or "MASTER_ADDR" in os.environ:
        torch.distributed.init_process_group("nccl" if cuda else "gloo")
    model = build_model(job, device)
    startup.mark("model_build")
    train_model = model
    if dist.world_size > 1:
        train_model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dist.local_rank] if cuda else None)
    optimizer = adamw(model.parameters(), cuda)
    init_weights.report(model, job["seed"], job["run_dir"])
    startup.mark("framework_setup")
    bf16 = scenario["precision"] == "bf16"
    autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if bf16 else nullcontext

    timer = StepTimer(job["run_dir"], job["device"], rank=dist.rank)
    consumed = ConsumedRows(job["run_dir"], dist.rank)
    losses = MicroLosses(job["run_dir"], dist.rank)
    warmup = scenario["steps"]["warmup"]
    measured_tokens, measured_from = 0, None
    for step, batch in enumerate(micro_batches(packed, scenario, dist.rank, dist.world_size), start=1):
        if step == warmup + 1:
            measured_from = time.perf_counter()
        # The step's loss is the mean over its labelled tokens, whichever micro-batch holds
        # them (as HF Trainer's num_items_in_batch does): a micro-batch of prompt rows only
        # adds nothing, where a per-micro-batch mean would be 0/0.
        labelled = sum(supervised_after_shift(labels) for _, labels in batch)
        if step == 1:
            startup.mark("data")  # the first batch's rows
        timer.begin()
        step_loss = torch.zeros((), device=device)
        for i, (ids, labels) in enumerate(batch):
            ids, labels = ids.to(device, non_blocking=True), labels.to(device, non_blocking=True)
            # DDP all-reduces gradients on the last micro-batch of the step only.
            last = i == len(batch) - 1
            sync = nullcontext() if last or train_model is model else train_model.no_sync()
            with sync:
                with autocast():
                    loss = train_model(input_ids=ids, labels=labels, num_items_in_batch=max(labelled, 1)).loss
                loss.backward()
            step_loss += loss.detach()
            losses.add(loss, max(labelled, 1), labels)
            timer.add_tokens(ids.numel())
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        record = timer.end(step, step_loss.item() if labelled else None)
        for ids, labels in batch:  # the CPU copies of what was fed: recorded after the step's clock stopped
            consumed.add(ids, labels)
        consumed.end_step(step)
        losses.end_step(step)
        if step > warmup:
            measured_tokens += record["tokens"]
    loop_seconds = time.perf_counter() - measured_from if measured_from is not None else None
    timer.close()
    consumed.close()
    losses.close()
    ddp = train_model is not model
    settings = {
        **capture.torch_loop_settings(model, optimizer, trainer="torch-loop+ddp" if ddp else "torch-loop",
                                      grad_clip=MAX_GRAD_NORM, autocast_dtype="bfloat16" if bf16 else None, seed=job["seed"],
                                      train_model=train_model),
        "settings_mode": job.get("settings_mode", "matched"),
        "ddp_find_unused_parameters": False if ddp else None,
        # The step's summed token loss over its supervised tokens after the shift (the loop above).
        "loss_normalization": "token mean over the optimizer step, labels counted after the shift, per rank",
    }
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()

    worker_io.write_worker_report(
        job["run_dir"],
        data_sha256=sha,
        framework_version=torch.__version__,
        torch_version=torch.__version__,
        transformers_version=transformers.__version__,
        attention_used=model.config._attn_implementation,
        param_dtype=str(next(model.parameters()).dtype).removeprefix("torch."),
        settings=settings,
        param_count=capture.param_count(model),
        startup_seconds=startup.total,
        startup_breakdown=startup.phases,
        # The loop's own clock from the first measured step's start to the last one's end,
        # data preparation included: set beside the host's TGS from the per-step seconds.
        loop_throughput={"tokens_per_sec": measured_tokens / loop_seconds} if loop_seconds else {},
        notes=[f"DDP over {dist.world_size} processes ({'nccl' if cuda else 'gloo'})"] if dist.world_size > 1 else [],
    )


if __name__ == "__main__":
    main(sys.argv[1])
