"""Where this worker process stands: its rank and world, as the launcher set them.

torchrun (and fbench's single-process plans) set RANK, LOCAL_RANK, WORLD_SIZE and
LOCAL_WORLD_SIZE; a process started without them is rank 0 of a world of 1.
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
