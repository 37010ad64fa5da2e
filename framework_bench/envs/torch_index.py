"""Which flavour an env is built in, and which torch wheel index this machine's driver can run."""

from __future__ import annotations

import re
import shutil
import subprocess

from framework_bench.envs.errors import EnvError
from framework_bench.envs.venvs import Flavour

# PyTorch's wheel indexes by CUDA build, newest first. PyPI's own torch 2.13.0 is the
# CUDA 13.0 build; a driver that supports less takes the newest index it can run.
# Assumed, not checked here (no network to the indexes, no GPU): that torch 2.13.0 is
# published on each of them; `--torch-index URL` overrides the choice.
TORCH_INDEXES = ((13, 0, None), (12, 8, "https://download.pytorch.org/whl/cu128"),
                 (12, 6, "https://download.pytorch.org/whl/cu126"))


def default_flavour() -> Flavour:
    return "cuda" if shutil.which("nvidia-smi") else "cpu"


def driver_cuda_version(run=subprocess.run) -> tuple[int, int] | None:
    """The CUDA version this machine's driver supports, from nvidia-smi's banner; None without one."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = run(["nvidia-smi"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_driver_cuda(out)


def parse_driver_cuda(nvidia_smi_output: str) -> tuple[int, int] | None:
    match = re.search(r"CUDA Version:\s*(\d+)\.(\d+)", nvidia_smi_output)
    return (int(match[1]), int(match[2])) if match else None


def torch_index_for(driver_cuda: tuple[int, int] | None) -> str | None:
    """The torch wheel index for a driver: PyPI (None) when it runs CUDA 13 builds or when no
    driver is seen (a login node: the build is for the compute nodes), else the newest older
    CUDA build it supports. A driver older than every build is an error, before anything is built."""
    if driver_cuda is None:
        return None
    for major, minor, index in TORCH_INDEXES:
        if driver_cuda >= (major, minor):
            return index
    oldest = TORCH_INDEXES[-1]
    raise EnvError(f"this machine's driver supports CUDA {driver_cuda[0]}.{driver_cuda[1]}; torch 2.13 "
                   f"needs CUDA {oldest[0]}.{oldest[1]} or newer: update the driver or pass --torch-index")
