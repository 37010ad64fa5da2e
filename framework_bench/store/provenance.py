"""Where a stored run ran: the machine, the checkout, and the versions in the backend's env,
kept with each row as its manifest.
"""

from __future__ import annotations

import platform
import socket
import subprocess
from functools import cache

from framework_bench import __version__
from framework_bench.envs import venvs as envs
from framework_bench.measure.machine import detect
from framework_bench.plugins import registry
from framework_bench.scenario.scenario import PROJECT_ROOT

# The common stack of a backend env worth naming in the manifest (those that exist are kept);
# each backend adds its framework package and its own (`BackendInfo.manifest_packages`).
_STACK_PACKAGES = ("torch", "transformers", "deepspeed", "accelerate", "peft", "flash-attn", "datasets")


@cache
def host_manifest() -> dict:
    """What this machine and this checkout are: the part of the manifest shared by every run."""
    machine = detect()
    return {
        "hostname": socket.gethostname(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "cpu": machine.cpu,
        "cpu_count": machine.cpu_count,
        "gpu": machine.gpu_name,
        "gpu_count": machine.gpus,
        "gpu_memory_gib": machine.gpu_memory_gib,
        "gpu_driver": _gpu_driver() if machine.gpus else None,
        "fbench_version": __version__,
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
    }


def manifest(backend: str) -> dict:
    """The environment a run of `backend` had: the host, plus the versions in the backend's env."""
    env = envs.inspect(backend)
    try:
        info = registry.get(backend).info
        own = [info.env.framework_package, *info.manifest_packages]
    except registry.UnknownBackend:  # uninstalled since it ran (a run stored by a later command)
        own = []
    versions = {name: v for name in dict.fromkeys([*_STACK_PACKAGES, *own]) if (v := env.version(name))}
    return {**host_manifest(), "backend_env": {"path": str(env.path), "flavour": env.flavour, "versions": versions}}


def _gpu_driver() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = out.stdout.split()
    return lines[0] if out.returncode == 0 and lines else None


def _git(*args: str) -> str | None:
    """A git query on the project checkout; None when git or the repository is absent."""
    try:
        out = subprocess.run(["git", "-C", str(PROJECT_ROOT), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None
