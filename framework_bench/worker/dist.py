"""Where this worker process stands: its rank and world, as the launcher set them.

torchrun (and fbench's single-process plans) set RANK, LOCAL_RANK, WORLD_SIZE and
LOCAL_WORLD_SIZE; a process started without them is rank 0 of a world of 1. This module is
the only place a worker reads them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int

    @property
    def is_main(self) -> bool:
        """Rank 0 of the whole job: the one that writes job-wide files (the worker report)."""
        return self.rank == 0

    @property
    def is_local_main(self) -> bool:
        """Local rank 0: the one per node that prepares node-local files (converted data)."""
        return self.local_rank == 0


def dist_info() -> DistInfo:
    env = os.environ
    world = int(env.get("WORLD_SIZE", "1"))
    return DistInfo(rank=int(env.get("RANK", "0")), world_size=world, local_rank=int(env.get("LOCAL_RANK", "0")),
                    local_world_size=int(env.get("LOCAL_WORLD_SIZE", str(world))))


def sync(device: str) -> None:
    """Wait for the device's queued work, so that a clock read after it covers that work."""
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def join(device: str):
    """This rank's torch device, in the process group when there is one to join: several
    processes (torchrun), or one whose launcher gave it a group (MASTER_ADDR: fbench's
    single-process GPU plans; NCCL on GPUs, gloo on CPU)."""
    import torch

    dist = dist_info()
    if device == "cuda":
        torch.cuda.set_device(dist.local_rank)
    if dist.world_size > 1 or "MASTER_ADDR" in os.environ:
        torch.distributed.init_process_group("nccl" if device == "cuda" else "gloo")
    return torch.device("cuda", dist.local_rank) if device == "cuda" else torch.device("cpu")


def leave() -> None:
    """Leave the process group `join` joined, if any."""
    import torch

    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
