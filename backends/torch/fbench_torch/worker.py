"""The reference worker: `python -m fbench_torch.worker RUN_DIR/job.json`, in the torch env.

A plain PyTorch loop, built only on the worker SDK: the HF model from its config with random
weights made where they train (on the GPU), AdamW with the shared hyper-parameters (fused on
CUDA in both settings modes: less time and memory than foreach; torch's own choice on CPU, as
every backend's CPU runs), bf16 autocast when the scenario asks, activation checkpointing
when it asks, DDP when there are several processes (NCCL on GPUs, gloo on CPU); a world of
one is never wrapped, also inside a process group. ZeRO-2/3 is FSDP2 (`shard`), in any world,
a world of one included; sequence parallel is DeepSpeed-Ulysses (`ulysses`). A LoRA/QLoRA scenario wraps the model in
peft's adapters as the scenario sets them (`framework_bench.worker.adapters`); the optimizer
steps what takes gradients. Rows are read in order from the host's
packed stream (`Job.batches`).
"""

from __future__ import annotations

import time

STARTED = time.time()  # before the heavy imports below: start-up counts them

import sys
from contextlib import nullcontext

import torch
import transformers

from framework_bench.worker import adapters
from framework_bench.worker import (ADAM_BETAS, ADAM_EPS, LEARNING_RATE, MAX_GRAD_NORM, WEIGHT_DECAY, Report, StartupClock,
                                    StepLog, dist_info, exit_now, initial_weights_worker, join, leave, load_job, settings,
                                    update, write_report)
from framework_bench.worker.losses import loss_divisors
from framework_bench.worker.models import from_config

from fbench_torch import ulysses


def adamw(params, cuda: bool) -> torch.optim.AdamW:
    """The shared hyper-parameters; fused on CUDA in both settings modes, torch's own choice
    (the for-loop) on CPU, as every backend's CPU runs (the AdamW table: docs/fairness.md)."""
    return torch.optim.AdamW(params, lr=LEARNING_RATE, betas=ADAM_BETAS, eps=ADAM_EPS, weight_decay=WEIGHT_DECAY,
                             fused=True if cuda else None)


def summed_over_ranks(device):
    """count -> (its sum over the process group, the group's size): world_label_mean's divisor,
    as HF Trainer gathers num_items_in_batch; (count, 1) outside a group."""
    if not torch.distributed.is_initialized():
        return lambda count: (count, 1)

    def over_ranks(count: int) -> tuple[int, int]:
        total = torch.tensor(count, device=device)
        torch.distributed.all_reduce(total)
        return int(total), torch.distributed.get_world_size()

    return over_ranks


def shard(model, zero_stage: int) -> None:
    """ZeRO-2/3 as FSDP2 (`fully_shard`), applied as torchtitan does: each decoder layer a unit,
    then the root (embeddings, final norm, head; FSDP2 keeps the root gathered after forward:
    the backward starts there). Parameters, gradients and AdamW states are sharded at both
    stages; ZeRO-3 frees each layer's gathered weights after its forward and gathers them again
    for its backward, ZeRO-2 keeps them until then. No mixed-precision policy: fp32 weights are
    gathered and gradients reduce-scattered in fp32, autocast casting per op, as unsharded."""
    from torch.distributed.fsdp import fully_shard

    blocks = set(model._no_split_modules)  # the decoder layer classes, as accelerate's FSDP wraps them
    for layer in [m for m in model.modules() if type(m).__name__ in blocks]:
        fully_shard(layer, reshard_after_forward=zero_stage == 3)
    fully_shard(model)


def main(job_file: str) -> None:
    startup, job, dist = StartupClock(STARTED), load_job(job_file), dist_info()
    rows = job.open_rows()
    startup.mark("data")
    device, cuda, zero, sp = join(job.device), job.device == "cuda", job.scenario.zero_stage, job.scenario.sequence_parallel
    ddp = dist.world_size > 1 and not zero
    lay = ulysses.layout(sp, dist.rank, dist.world_size) if sp > 1 else None
    if job.labels_rolled and not lay:
        sys.exit("labels_rolled: the loop rolls the labels of a row split by sequence parallel only")
    model = from_config(job, device, attn_implementation=ulysses.register(lay) if lay else "sdpa", dtype=torch.float32)
    startup.mark("model_build")
    if zero:
        shard(model, zero)  # in place, after `from_config` filled the shared weights; then the optimizer sees the shards
    train_model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dist.local_rank] if cuda else None) if ddp else model
    optimizer = adamw([p for p in model.parameters() if p.requires_grad], cuda)
    startup.mark("framework_setup")
    bf16 = job.scenario.precision == "bf16"
    autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if bf16 else nullcontext
    log = StepLog(job, dist.rank)
    update.report_at_warmup_end(model, job, log.timer.clock)  # the weights when the warm-up ends, projected then
    # the trained weights from the seed the host reveals now, every rank ready for its first step
    initial_weights_worker.fill_revealed(model, job, log.timer.clock, optimizer)
    startup.mark("initial_weights")
    probe = settings.KvRepeatProbe().install()  # how the first attention call gets grouped K/V heads
    # Under SP every rank of a group reads the group's rows (each trains its slice of them).
    dp_rank, dp_world = (lay.dp_rank, lay.dp_world) if lay else (dist.rank, dist.world_size)
    for step, batch in enumerate(job.batches(rows, dp_rank, dp_world), start=1):
        # The step's loss is the mean over its labelled tokens, whichever micro-batch holds
        # them (as HF Trainer's num_items_in_batch does): a micro-batch of prompt rows only
        # adds nothing, where a per-micro-batch mean would be 0/0. A job naming another
        # `loss_scheme` (the reference for a framework that normalises otherwise) gets that one.
        divisors = loss_divisors(job.loss_scheme, [labels for _, labels in batch], summed_over_ranks(device))
        if step == 1:
            startup.mark("data")  # the first batch's rows
        log.begin(step)
        for i, ((ids, labels), labelled) in enumerate(zip(batch, divisors)):
            x, y = (torch.from_numpy(a).to(device, non_blocking=True) for a in (ids, labels))
            # DDP all-reduces gradients on the last micro-batch of the step only; FSDP2
            # reduce-scatters every micro-batch's (ZeRO-2/3 keep sharded gradients, as DeepSpeed's).
            with nullcontext() if i == len(batch) - 1 or not ddp else train_model.no_sync():
                with autocast():
                    if lay:  # this rank's share of the row's loss to backpropagate; the row's loss to log
                        share, loss = ulysses.loss(train_model, model.loss_function, x, y, labelled, lay, job.labels_rolled)
                    else:
                        share = loss = train_model(input_ids=x, labels=y, num_items_in_batch=labelled).loss
                share.backward()
            # the row's loss as backward weighed it (scale 1); rows read once the clock stopped
            log.micro(ids, labels, loss, labelled, scale=1.0, tokens=ids.size // sp)
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        log.end(step)  # the step's loss: its token mean, as the loop computed it
    log.close()
    update.report(model, job)  # (final - initial) weights onto the vector the host reveals now
    settings_in_effect = probe.settle(settings.torch_loop_settings(
        model, optimizer, trainer="torch-loop+fsdp2" if zero else "torch-loop+ddp" if ddp else "torch-loop",
        grad_clip=MAX_GRAD_NORM, sequence_parallel=sp,
        autocast_dtype="bfloat16" if bf16 else None, seed=job.seed, train_model=train_model,
        # What the loop above divides by (the host judges the recorded divisors and scales).
        loss_normalization=job.loss_scheme or "token mean over the optimizer step, labels counted after the shift, per rank"))
    if job.labels_rolled:  # the target a judging run trained, as the run it judges claims it
        settings_in_effect["labels_rolled"] = True
    engine = f"FSDP2 (ZeRO-{zero})" if zero else "DDP" if ddp else None
    report = Report(
        framework_version=torch.__version__, attention_used=model.config._attn_implementation,
        settings={**settings_in_effect, **adapters.settings(model)},
        param_count=settings.param_count(model),
        startup_seconds=startup.total, startup_breakdown=startup.phases,
        notes=[f"{engine} over {dist.world_size} processes ({'nccl' if cuda else 'gloo'})"
               + (f", Ulysses sequence parallel over groups of {sp}" if lay else "")] if engine else [],
        extra={"loop_throughput": log.throughput(), "torch_version": torch.__version__,
               "transformers_version": transformers.__version__,
               "param_dtype": str(next(model.parameters()).dtype).removeprefix("torch.")})
    leave()  # after the settings were read from the live objects (the process group's size among them)
    write_report(job, report)


if __name__ == "__main__":
    main(sys.argv[1])
    exit_now()  # the report is written: no second of interpreter teardown in every run
