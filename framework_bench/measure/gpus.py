"""The GPUs fbench knows by name: their memory (the fit check) and dense bf16 peak (MFU).

One entry per GPU model (`MODELS`), by the name `--gpu` takes; a detected device is matched by a
substring of its name (`GPUS`), most specific first. A GPU not in it has no ceiling: its runs keep
their figures with a flag saying so (metrics.figures).
"""

from __future__ import annotations

import re
from typing import NamedTuple


class Gpu(NamedTuple):
    # As nvidia-smi reports `memory.total` (what `machine.detect()` records), GiB. The memory
    # estimate adds the CUDA context and allocator slack itself, so it is compared with the
    # whole device.
    memory_gib: float
    peak_tflops: float  # dense bf16, TFLOP/s (the datasheets' "with sparsity" figure halved)


# Memory: nvidia-smi's `memory.total` in MiB / 1024; peak: the vendor's datasheet.
MODELS: dict[str, Gpu] = {
    # SXM5 80GB, 81559 MiB; https://www.nvidia.com/en-us/data-center/h100/ (BF16 1,979 TFLOPS with sparsity)
    "H100": Gpu(79.6, 989.0),
    # 143771 MiB; https://www.nvidia.com/en-us/data-center/h200/ (BF16 1,979 TFLOPS with sparsity)
    "H200": Gpu(140.4, 989.0),
    # 81920 MiB; https://www.nvidia.com/en-us/data-center/a100/ (BF16 312 TFLOPS, 624 with sparsity)
    "A100-80G": Gpu(80.0, 312.0),
    # 40960 MiB; https://www.nvidia.com/en-us/data-center/a100/ (as the 80GB)
    "A100-40G": Gpu(40.0, 312.0),
    # HGX B200, 183359 MiB; https://www.nvidia.com/en-us/data-center/hgx/ (BF16 4.5 PFLOPS per GPU with sparsity)
    "B200": Gpu(179.1, 2250.0),
    # 46068 MiB; https://www.nvidia.com/en-us/data-center/l40s/ (BF16 362.05 TFLOPS, 733 with sparsity)
    "L40S": Gpu(45.0, 362.0),
}

GPUS: dict[str, Gpu] = {
    "A100-SXM4-80GB": MODELS["A100-80G"],
    "A100-PCIE-80GB": MODELS["A100-80G"],
    "A100 80GB": MODELS["A100-80G"],
    "A100-SXM4-40GB": MODELS["A100-40G"],
    "A100-PCIE-40GB": MODELS["A100-40G"],
    "A100": MODELS["A100-40G"],  # unqualified A100: assume the smaller one
    "H100": MODELS["H100"],
    "H200": MODELS["H200"],
    "B200": MODELS["B200"],  # a GB200's too (186 GB, 2.5 PFLOPS): the lower figures
    "L40S": MODELS["L40S"],
}


def _spelling(name: str) -> str:
    """A GPU name as `named` compares it: 'NVIDIA a100 80GB', 'A100-80G' -> 'A10080G'."""
    bare = re.sub(r"[^0-9A-Z]", "", name.upper()).removeprefix("NVIDIA")
    return re.sub(r"(\d)GB$", r"\1G", bare)


def named(name: str) -> str | None:
    """A model's name in `MODELS` as the user may spell it (h200, A100-80GB, 'NVIDIA L40S'); None
    if none is. An unqualified A100 is none: which memory it has is the question asked."""
    return next((key for key in MODELS if _spelling(key) == _spelling(name)), None)


def lookup(name: str | None) -> Gpu | None:
    """The GPU by its model's name (`named`) or part of its device name, e.g. 'NVIDIA H200' or
    'A100-SXM4-80GB'; None if unknown."""
    if not name:
        return None
    if model := named(name):
        return MODELS[model]
    upper = name.upper()
    return next((gpu for key, gpu in GPUS.items() if key.upper() in upper), None)
