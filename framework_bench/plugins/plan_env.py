"""The environment a plan gives its processes, whatever launcher starts them.

Below the run layer: a backend's plan (`framework_bench/plugins/base.py`) builds it, and the
launchers (`framework_bench/run/launchers/`) read it back.
"""

from __future__ import annotations

import os
import socket

from framework_bench.plugins.contract import Job


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_group_env(job: Job) -> dict[str, str]:
    """The variables torchrun would set, for a run started as one process without it.

    Both frameworks need an initialised process group on a GPU or with DeepSpeed even for
    one process (DeepSpeed otherwise falls back to MPI discovery; XTuner's dispatched
    attention calls `dist.get_rank()`): a one-process job is a world of one on a free port.
    Several processes get these from torchrun, so nothing is returned for them."""
    if job.nprocs * job.nnodes > 1:
        return {}
    return {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}


def visible_gpus_env(job: Job, environ: dict[str, str] | None = None) -> dict[str, str]:
    """`CUDA_VISIBLE_DEVICES` naming the job's GPUs per node: the first `nprocs` of those
    already visible (the user's or the scheduler's choice), else 0..nprocs-1. Without it a
    one-process job on an 8-GPU host sees 8 GPUs (LLaMA-Factory's HF Trainer then raises)."""
    if job.device != "cuda":
        return {}
    environ = os.environ if environ is None else environ
    visible = [d.strip() for d in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    chosen = visible[:job.nprocs] if len(visible) >= job.nprocs else [str(i) for i in range(job.nprocs)]
    return {"CUDA_VISIBLE_DEVICES": ",".join(chosen)}


CUDA_ALLOC_CONF = "expandable_segments:True"


def cuda_allocator_env(job: Job, environ: dict[str, str] | None = None) -> dict[str, str]:
    """`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` for every CUDA plan, both settings
    modes, unless the user set the variable (theirs then reaches the worker unchanged).
    Expandable segments grow one mapping instead of caching fixed blocks, so a step whose
    tensor sizes change between phases (activations, then the optimizer's temporaries)
    leaves little reserved-but-unusable memory: the same allocator for every backend. The
    workers record the value in effect (`cuda_alloc_conf` in their settings)."""
    environ = os.environ if environ is None else environ
    if job.device != "cuda" or "PYTORCH_CUDA_ALLOC_CONF" in environ:
        return {}
    return {"PYTORCH_CUDA_ALLOC_CONF": CUDA_ALLOC_CONF}
