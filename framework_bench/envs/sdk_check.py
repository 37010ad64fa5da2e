"""What the worker SDK (`framework_bench.worker`) needs in every env, and whether it imports there.

Its requirements beyond the standard library, by distribution, are installed into every env
whatever the backend's requirements say (its file need not name them), and checked by `inspect`
(tests/test_env_freshness.py holds them to the SDK's imports).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

SDK_REQUIREMENTS = ("numpy",)
# Every module of the SDK, imported as a worker would; the old names' DeprecationWarnings are not errors.
SDK_IMPORT = """
import importlib, pkgutil, warnings
import framework_bench.worker as sdk
warnings.simplefilter("ignore", DeprecationWarning)
for module in pkgutil.iter_modules(sdk.__path__):
    importlib.import_module(sdk.__name__ + "." + module.name)
"""


def _canonical(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()


def sdk_missing(versions: dict[str, str]) -> list[str]:
    """The SDK's requirements an env's metadata does not list (milliseconds: no process started)."""
    have = {_canonical(d) for d in versions}
    return [r for r in SDK_REQUIREMENTS if _canonical(r) not in have]


def sdk_import_error(python: Path) -> str | None:
    """None when every module of the worker SDK imports with the env's Python, else the error's
    last line. As a run's worker finds it: through the env's own site-packages and .pth files
    (the host's `framework_bench`, inherited layers); the host's PYTHONPATH is left out, so that
    the env stands on its own."""
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    proc = subprocess.run([str(python), "-c", SDK_IMPORT], capture_output=True, text=True, env=environ)
    if proc.returncode == 0:
        return None
    lines = proc.stderr.strip().splitlines()
    return lines[-1] if lines else f"exited {proc.returncode}"
