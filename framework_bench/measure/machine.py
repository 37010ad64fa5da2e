"""What this machine has, found without importing torch (nvidia-smi, /proc/cpuinfo)."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from functools import cache

from framework_bench.plugins.contract import Machine


@cache
def detect() -> Machine:
    gpus, name, mem = 0, None, None
    if shutil.which("nvidia-smi"):
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True, text=True,
        )
        lines = [l for l in out.stdout.splitlines() if l.strip()] if out.returncode == 0 else []
        if lines:
            gpus = len(lines)
            name, mib = (p.strip() for p in lines[0].split(",", 1))
            mem = round(float(mib) / 1024, 1)
    return Machine(gpus=gpus, gpu_name=name, gpu_memory_gib=mem, cpu=_cpu_name(), cpu_count=os.cpu_count() or 1)


def _cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
