"""Where fbench finds what it ships and keeps what it makes, installed or run from a checkout.

- The bundled scenarios are package data (`framework_bench/scenarios/`); the user's own, in
  the state folder's `scenarios/`, come on top (a name there wins), and `--scenario FILE` on
  top of both.
- The state folder (envs, runs, results, the user's scenarios) is `FBENCH_HOME` if set; else
  `<checkout>/.fbench` when fbench runs from a source checkout (a `pyproject.toml` naming
  framework-bench beside the package); else the user data folder (platformdirs). A set
  `FBENCH_HOME` that cannot be one (not UTF-8, too long, not writable) is refused before any
  command runs (`state_dir_problem`).
"""

from __future__ import annotations

import os
import re
from importlib import resources
from pathlib import Path

import platformdirs

CHECKOUT = Path(__file__).resolve().parents[2]  # the folder holding `framework_bench/`
BUNDLED_SCENARIOS = Path(str(resources.files("framework_bench") / "scenarios"))


def source_checkout() -> Path | None:
    """The checkout fbench runs from; None for an installed fbench (its parent is a site-packages)."""
    try:
        pyproject = (CHECKOUT / "pyproject.toml").read_text()
    except OSError:
        return None
    return CHECKOUT if re.search(r'^name\s*=\s*"framework-bench"', pyproject, re.MULTILINE) else None


HOME_ENV = "FBENCH_HOME"


def state_dir() -> Path:
    """The state folder. A relative `FBENCH_HOME` is made absolute the first time it is read, in
    the environment too: the workers (started in their run folders) and this process, wherever
    it goes after, keep the folder it named where the command was typed."""
    if value := os.environ.get(HOME_ENV):
        home = Path(value)
        if not home.is_absolute():
            home = home.absolute()
            os.environ[HOME_ENV] = str(home)
        return home
    checkout = source_checkout()
    return checkout / ".fbench" if checkout else platformdirs.user_data_path("fbench")


MAX_HOME_BYTES = 1024  # run folders, env trees and packed data nest below it, within a path's 4096 bytes


def state_dir_problem(writable: bool = True) -> str | None:
    """Why the `FBENCH_HOME` the user set cannot be the state folder, in one line; None when it
    can (or is not set: the default folders are fbench's own choice). Checked before a command
    runs, so that no command fails deep inside with a traceback on it. `writable`: also that
    fbench can create it and write into it (leaving nothing there of the check)."""
    import tempfile

    value = os.environ.get(HOME_ENV)
    if not value:
        return None
    try:
        raw = value.encode("utf-8")
    except UnicodeEncodeError:
        return (f"{HOME_ENV}={os.fsencode(value)!r} is not UTF-8 text: fbench writes the state folder's paths into "
                "job files and the results store; choose a folder whose name is")
    shown = value if len(value) <= 80 else f"{value[:60]}... ({len(raw):,} bytes)"
    longest = max((len(os.fsencode(part)) for part in Path(value).parts), default=0)
    if longest > 255 or len(raw) > MAX_HOME_BYTES:
        why = f"a name in it is {longest} bytes, over 255" if longest > 255 else f"{len(raw)} bytes"
        return (f"{HOME_ENV}={shown} is too long a path ({why}): the state folder's path must stay within "
                f"{MAX_HOME_BYTES} bytes, as run folders nest below it")
    home = Path(value).absolute()
    if home.exists() and not home.is_dir():
        return f"{HOME_ENV}={shown} is not a folder"
    if not writable:
        return None
    existing = next(p for p in (home, *home.parents) if p.exists())
    try:
        if not existing.is_dir():
            raise NotADirectoryError(20, "Not a directory")
        tempfile.TemporaryDirectory(dir=existing, prefix=".fbench-write-check-").cleanup()
    except OSError as e:
        return (f"{HOME_ENV}={shown}: cannot create or write the state folder there ({e.strerror or e}); "
                "set it to a folder you can write")
    return None


def user_scenarios() -> Path:
    return state_dir() / "scenarios"
