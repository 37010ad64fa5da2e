"""DeepSpeed's just-in-time C++ ops, built once per env at creation instead of in every run.

On the CPU, DeepSpeed's communication backend loads its shared-memory op
(`deepspeed_shm_comm`) when the process group starts, compiling it with ninja/g++ if no
build is cached: minutes on a small machine, inside the run, in every rank at once. The
cache (torch's TORCH_EXTENSIONS_DIR) is keyed by name only and rebuilt whenever the build
line differs, which it does per env (torch's include paths), so each env keeps its own
cache inside itself: built once the env is at its final path (the build line names it), as a
post-install step of each backend whose env holds DeepSpeed (`EnvSpec.post_install`, run as
`python -m framework_bench.plugins.deepspeed_jit FLAVOUR` with the env's Python), and named by
every plan.

Host side imports nothing heavy; `prebuild` runs inside the env (torch, deepspeed).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

VARIABLE = "TORCH_EXTENSIONS_DIR"


def extensions_dir(env_path: Path) -> Path:
    return Path(env_path) / "torch_extensions"


def run_env(env_path: Path) -> dict[str, str]:
    """The variable a plan sets so the run finds the env's prebuilt ops."""
    return {VARIABLE: str(extensions_dir(env_path))}


def prebuild(env_path: Path) -> str:
    """Build the ops a CPU run loads (inside the env, after pip). Returns what was done."""
    if importlib.util.find_spec("deepspeed") is None:
        return "deepspeed not installed: no ops to build"
    os.environ[VARIABLE] = str(extensions_dir(env_path))
    from deepspeed.comm.torch import build_shm_op

    return "deepspeed shm comm op: " + ("built" if build_shm_op() is not None else "not used on this accelerator")


if __name__ == "__main__":
    import sys

    # The CUDA flavour builds its ops where a GPU runs them; the env is this Python's prefix.
    print(prebuild(Path(sys.prefix)) if sys.argv[1] == "cpu" else "cuda flavour: ops are built where they run")
