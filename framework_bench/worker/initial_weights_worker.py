"""The same initial weights for every backend (worker side, torch): see
`framework_bench.worker.initial_weights_host`, the numpy twin the host checks with.

- `fill(model, seed, hf_config)`: right after the framework built the model, before any
  optimizer, DDP or DeepSpeed engine sees it (under ZeRO-3 inside `GatheredParameters`),
  overwrite every parameter in place from (seed, canonical name, element index).
- `fill_revealed(model, job, clock, optimizer)`: once the framework set everything up, just
  before the first step, every rank says so on its clock ("ready"), waits for the seed the host
  reveals then, fills the trained tensors from it in place (ZeRO-3 partitions and FSDP2 shards
  too; DeepSpeed's fp32 copies refreshed) and reports. Training before the first step is then
  training from weights nobody knew yet, and the host's clock sees the time from the reveal on.
- `report(model, seed, run_dir)`: when training is about to start, read the sampled
  elements back from the live parameters into `RUN_DIR/initial_weights.json` (rank 0), so the
  host sees what the framework really trains from, not what `fill` wrote; parameters sharded by
  ZeRO-3 or FSDP2 (DTensors) are read whole (`gathered`, `whole`: collectives every rank enters).
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

from framework_bench.worker.initial_weights_host import (_STREAM_A, _STREAM_B, MASK32, REPORT_FILE, canonical_name, hash32,
                                                    kind, sample_indices, starts_revealed, tensor_key)
from framework_bench.worker.dist import dist_info
from framework_bench.worker.files import INITIAL_REVEAL_FILE, REVEAL_TIMEOUT, wait_for_seed

CHUNK = 1 << 22  # elements per fill chunk: float64 temporaries of 32 MiB, whatever the model size


@contextmanager
def gathered(params, modifier_rank):
    """ZeRO-3 keeps each rank's partition only: gather the full tensors while they are read or
    written (the modifier rank's writes are scattered back on exit); a no-op otherwise."""
    if any(hasattr(p, "ds_id") for p in params):
        import deepspeed

        with deepspeed.zero.GatheredParameters(params, modifier_rank=modifier_rank):
            yield
    else:
        yield


def whole(p):
    """The parameter's values, whole: an FSDP2 shard (a DTensor) all-gathered, a collective every
    rank enters, in the same order; a ZeRO-3 partition is whole inside `gathered`."""
    import torch

    if torch.distributed.is_available():
        from torch.distributed.tensor import DTensor

        if isinstance(p.data, DTensor):
            return p.data.full_tensor()
    return p.data


def standard_normal(indices, key: int):
    """float64 N(0, 1) at the flat element `indices` (an int64 tensor) of the tensor with this key."""
    import torch

    base = hash32((indices ^ key) & MASK32)
    u1 = (hash32(base ^ _STREAM_A).to(torch.float64) + 1.0) / 2.0**32
    u2 = hash32(base ^ _STREAM_B).to(torch.float64) / 2.0**32
    return torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2.0 * torch.pi * u2)


def initial_values(indices, name: str, seed: int, std: float, row: int | None, pad_token_id: int | None):
    """float64 initial values at the flat `indices` of the parameter `name` (`row`: its last
    dimension, None for a 1-D tensor)."""
    import torch

    how = kind(canonical_name(name), 1 if row is None else 2)
    if how != "normal":
        return torch.full(indices.shape, 1.0 if how == "ones" else 0.0, dtype=torch.float64, device=indices.device)
    values = standard_normal(indices, tensor_key(seed, name)) * std
    if canonical_name(name).endswith("embed_tokens.weight") and pad_token_id is not None:
        values[indices // row == pad_token_id] = 0.0
    return values


def chunks(numel: int, device):
    """(first index, flat element indices) of a tensor, `CHUNK` at a time (int64 tensors on `device`)."""
    import torch

    for lo in range(0, numel, CHUNK):
        yield lo, torch.arange(lo, min(lo + CHUNK, numel), dtype=torch.int64, device=device)


def init_args(p, hf_config: dict) -> tuple[float, int | None, int | None]:
    """(std, row, pad token id): what `initial_values` needs besides the name and seed."""
    return (float(hf_config.get("initializer_range", 0.02)), p.shape[-1] if p.dim() > 1 else None,
            hf_config.get("pad_token_id"))


def fill(model, seed: int, hf_config: dict, only=None) -> None:
    """Overwrite every parameter of the model in place (tied ones once; `only`: those whose
    name it accepts). Each rank fills its own rows of an FSDP2 shard (a DTensor)."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if getattr(p, "quant_state", None) is not None or (only is not None and not only(name)):
                continue  # QLoRA's 4-bit base holds packed bytes: it was quantized from filled weights
            with gathered([p], modifier_rank=0):  # one tensor at a time: a 70B model never whole on a rank
                if p.numel() >= 2**32:
                    raise ValueError(f"{name} has {p.numel()} elements; the generator indexes fewer than 2**32")
                local, first = _local(p)
                flat, args = local.view(-1), init_args(p, hf_config)
                for lo, idx in chunks(flat.numel(), flat.device):
                    flat[lo:lo + idx.numel()].copy_(initial_values(idx + first, name, seed, *args))


def _local(p):
    """(the values this rank holds, the flat index of their first element in the whole tensor):
    an FSDP2 parameter (a DTensor sharded on dim 0 over one mesh dimension, torch.chunk's split)
    holds a run of whole rows, filled where it is without a collective; any other, all of it."""
    import torch

    if torch.distributed.is_available():
        from torch.distributed.tensor import DTensor, Shard

        if isinstance(p.data, DTensor):
            shards = [(dim, s) for dim, s in enumerate(p.data.placements) if isinstance(s, Shard)]
            if len(shards) != 1 or shards[0][1].dim != 0:
                raise ValueError(f"placements {p.data.placements}: fill takes one dim-0 shard (FSDP2's)")
            mesh_dim = shards[0][0]
            rows = -(-p.shape[0] // p.data.device_mesh.size(mesh_dim))  # torch.chunk's rows per shard
            first_row = min(p.data.device_mesh.get_local_rank(mesh_dim) * rows, p.shape[0])
            return p.data.to_local(), first_row * (p.numel() // max(p.shape[0], 1))
    return p.data, 0


def revealed_initial_seed(run_dir: str | Path) -> int | None:
    """The seed the host revealed for the trained weights (`fill_revealed`), None where none was
    (a worker that never said it was ready: its trained weights started from the job's seed)."""
    return wait_for_seed(Path(run_dir) / INITIAL_REVEAL_FILE, "initial_seed", timeout=0)


def fill_revealed(model, job, clock, optimizer=None) -> None:
    """Every rank, once the framework has set the model and optimizer up, right before its first
    step: say "ready" on the step timer's `clock` (a `steps.ClockLines`), wait for the seed the
    host reveals once every rank said so, fill the tensors the run trains from it
    (`initial_weights_host.starts_revealed`), bring a DeepSpeed optimizer's fp32 copies of them up
    to date (`refresh_fp32_params`, found on `optimizer` or what it wraps) and report the initial
    weights. The optimizer must not have stepped yet (AdamW's state is empty)."""
    clock.write("ready")
    seed = wait_for_seed(Path(job.run_dir) / INITIAL_REVEAL_FILE, "initial_seed")
    if seed is None:
        raise RuntimeError(f"fbench: no initial seed revealed in {REVEAL_TIMEOUT:.0f} s after this worker said it was "
                           "ready: is the host's clock watching the run?")
    adapters = bool(job.scenario.finetune.adapters)
    # the job's config, as the host's check reads it (a framework may have changed the model's pad id since)
    fill(model, seed, job.hf_config, only=lambda name: starts_revealed(name, adapters))
    while optimizer is not None and not hasattr(optimizer, "refresh_fp32_params"):
        optimizer = getattr(optimizer, "optimizer", None)  # accelerate's and mmengine's wrappers hold DeepSpeed's
    if optimizer is not None:
        optimizer.refresh_fp32_params()
    report(model, job.seed, job.run_dir, trained_seed=seed)


def live_values(p, data):
    """(the parameter's values, their dtype's name) from `data`, its whole values (`whole`): a
    bitsandbytes 4-bit weight (QLoRA's base) dequantized, its dtype its quant type ("nf4", "fp4")."""
    state = getattr(p, "quant_state", None)
    if state is None:
        return data, str(p.dtype).removeprefix("torch.")
    import bitsandbytes.functional as F

    return F.dequantize_4bit(data, state), state.quant_type


def report(model, seed: int, run_dir: str | Path, trained_seed: int | None = None) -> None:
    """Rank 0 writes the sampled elements of every parameter, read from the live model (and the
    seed its trained tensors were filled from, where the host revealed one)."""
    import torch

    rank = dist_info().rank
    tensors = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            with gathered([p], modifier_rank=None):  # every rank gathers (a collective); rank 0 reads
                data = whole(p)  # every rank too: an FSDP2 shard's all-gather
                if rank == 0:
                    values, dtype = live_values(p, data)
                    idx = torch.from_numpy(sample_indices(seed, name, values.numel()))
                    tensors[canonical_name(name)] = {
                        "shape": list(values.shape), "dtype": dtype,
                        "values": values.reshape(-1)[idx.to(values.device)].float().cpu().tolist()}
    if rank != 0:
        return
    path = Path(run_dir) / REPORT_FILE
    path.write_text(json.dumps({"seed": seed, **({} if trained_seed is None else {"trained_seed": trained_seed}),
                                "tensors": tensors}))
