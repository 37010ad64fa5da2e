"""TRL's sequence parallel as accelerate (>= 1.12) runs it under the HF Trainer: DeepSpeed's Ulysses
(ALST), worker side. The run file's keywords become accelerate's `ParallelismConfig`; the rows
the group trains are recorded whole for the referee, as the loader adapter splits them before
the model sees them.
"""

from __future__ import annotations

from collections import deque


def parallelism_config(kwargs: dict | None):
    """accelerate's ParallelismConfig from the run file's keywords (`sft_args.sequence_parallel`)."""
    if kwargs is None:
        return None
    from accelerate.parallelism_config import ParallelismConfig
    from accelerate.utils import DeepSpeedSequenceParallelConfig

    return ParallelismConfig(**{**kwargs, "sp_handler": DeepSpeedSequenceParallelConfig(**kwargs["sp_handler"])})


def gloo_length_gather(device: str) -> None:
    """DeepSpeed 0.18.6's Ulysses loader adapter all-gathers each rank's row length, a 0-d tensor,
    into 1-element tensors (ulysses_sp.py, `refill`): NCCL takes that, gloo refuses it
    ("ProcessGroupGloo::allgather: invalid tensor size at index 0 (expected (), got (1))"). On
    CPU only, such a gather is handed the length as a 1-element tensor; the rest is DeepSpeed's."""
    if device != "cpu":
        return
    import deepspeed.comm as comm

    gather = comm.all_gather

    def all_gather(tensor_list, tensor, *args, **kwargs):
        if tensor.dim() == 0 and tensor_list and tuple(tensor_list[0].shape) == (1,):
            tensor = tensor.reshape(1)
        return gather(tensor_list, tensor, *args, **kwargs)

    comm.all_gather = all_gather


class _Seen:
    """The adapter's loader iterator, keeping the batch it hands out last."""

    def __init__(self, inner):
        self.inner, self.batch = inner, None

    def __next__(self):
        self.batch = next(self.inner)
        return self.batch


def record_whole_rows() -> deque:
    """DeepSpeed's adapter takes one batch from each rank of the group, and the group then trains
    them one after the other, each split over the ranks (rank 0's first). After each refill, the
    group's batches, whole, are all-gathered (between steps, with the adapter's own gathers) and
    appended to the deque returned as (input_ids, labels) in the order their micro-batches train."""
    import torch.distributed as dist
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPDataLoaderAdapter

    refill, rows = UlyssesSPDataLoaderAdapter.refill, deque()

    def refill_and_record(adapter):
        seen = adapter.iter = _Seen(adapter.iter)
        try:
            refill(adapter)
        finally:
            if adapter.iter is seen:
                adapter.iter = seen.inner
        mine = tuple(seen.batch[k].detach().cpu().numpy() for k in ("input_ids", "labels"))
        group = [None] * adapter.sp_world_size
        dist.all_gather_object(group, mine, group=adapter.sp_group)
        rows.extend(group)

    UlyssesSPDataLoaderAdapter.refill = refill_and_record
    return rows


def settings(trainer) -> dict:
    """What ran, from the live trainer: the group's size and the attention Ulysses wraps."""
    pc = trainer.accelerator.parallelism_config
    return {"sequence_parallel": pc.sp_size, "attention": f"{pc.sp_handler.sp_attn_implementation}_ulysses"}
