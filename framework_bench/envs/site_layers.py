"""A venv layered over the Python that makes it: it sees that Python's packages *behind* its own.

`python -m venv --system-site-packages` run by a Python that is itself a venv (the GPU machine's
`python3` is one, at /opt/torch/.venv) gives the new venv the *base* interpreter's site-packages,
not the parent venv's: the machine's torch would be invisible. Instead, the new venv gets a .pth
naming every folder the parent reads packages from; a .pth *appends* to sys.path, so the layer's
own packages always win. Standard library only: the GPU machine runs it before pydantic is there.
"""

from __future__ import annotations

import os
import site
import subprocess
import sys
from pathlib import Path

PTH_NAME = "fbench_inherit.pth"  # sorts before fbench_host.pth; both only append


def is_venv() -> bool:
    return sys.prefix != sys.base_prefix


def visible_site_dirs() -> list[str]:
    """The folders this interpreter reads packages from, in its order: its site-packages (with a
    venv that includes system site packages, its base's too) and what their .pth files appended
    (a parent layer's folders, editable installs' source roots)."""
    sites = [s for s in site.getsitepackages() if s in sys.path]
    first = min((sys.path.index(s) for s in sites), default=len(sys.path))
    return [p for p in dict.fromkeys(sys.path[first:]) if os.path.isdir(p)]


def purelib(python: Path) -> Path:
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def inherit(python: Path, parent: Path | None = None) -> list[str]:
    """Make the venv of `python` (made without --system-site-packages) see the packages of this
    interpreter, or of the Python `parent` (another env's), behind its own; returns the folders
    it now inherits."""
    if parent is None:
        inherited = visible_site_dirs()
    else:  # this module run by that Python prints the folders it reads
        inherited = subprocess.run([str(parent), __file__], capture_output=True, text=True, check=True).stdout.splitlines()
    (purelib(python) / PTH_NAME).write_text("".join(d + "\n" for d in inherited))
    return inherited


def make_layer(path: Path) -> list[str]:
    """Create a venv at `path` that sees this interpreter's packages behind its own; returns the
    folders it inherits (none listed for a non-venv Python: its system site-packages, as usual)."""
    argv = [sys.executable, "-m", "venv", str(path)]
    if not is_venv():
        subprocess.run(argv + ["--system-site-packages"], check=True, stdout=subprocess.DEVNULL)
        return []
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    return inherit(path / "bin" / "python")


if __name__ == "__main__":  # run by another env's Python (`inherit`): the folders it reads
    print("".join(d + "\n" for d in visible_site_dirs()), end="")
