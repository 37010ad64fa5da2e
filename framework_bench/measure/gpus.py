"""The GPUs fbench knows by name: their memory (the fit check) and dense bf16 peak (MFU).

One table, matched by a substring of the device name, most specific first. A GPU not in it
has no ceiling: its runs keep their figures with a flag saying so (metrics.figures).
"""

from __future__ import annotations

from typing import NamedTuple


class Gpu(NamedTuple):
    # As nvidia-smi reports `memory.total` (what `machine.detect()` records), GiB. The memory
    # estimate adds the CUDA context and allocator slack itself, so it is compared with the
    # whole device.
    memory_gib: float
    peak_tflops: float  # dense bf16, TFLOP/s


GPUS: dict[str, Gpu] = {
    "A100-SXM4-80GB": Gpu(80.0, 312.0),  # 81920 MiB
    "A100-PCIE-80GB": Gpu(80.0, 312.0),
    "A100 80GB": Gpu(80.0, 312.0),
    "A100-SXM4-40GB": Gpu(40.0, 312.0),
    "A100-PCIE-40GB": Gpu(40.0, 312.0),
    "A100": Gpu(40.0, 312.0),  # unqualified A100: assume the smaller one
    "H100": Gpu(79.6, 989.0),  # H100 80GB HBM3: 81559 MiB
    "H200": Gpu(140.4, 989.0),  # 143771 MiB; ~139 GiB left to tensors after the CUDA context
}


def lookup(name: str | None) -> Gpu | None:
    """The GPU by (part of) its name, e.g. 'NVIDIA H200' or 'A100-SXM4-80GB'; None if unknown."""
    if not name:
        return None
    upper = name.upper()
    return next((gpu for key, gpu in GPUS.items() if key.upper() in upper), None)
