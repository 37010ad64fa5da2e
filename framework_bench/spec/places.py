"""Where fbench finds what it ships and keeps what it makes, installed or run from a checkout.

- The bundled scenarios are package data (`framework_bench/scenarios/`); the user's own, in
  the state folder's `scenarios/`, come on top (a name there wins), and `--scenario FILE` on
  top of both.
- The state folder (envs, runs, results, the user's scenarios) is `FBENCH_HOME` if set; else
  `<checkout>/.fbench` when fbench runs from a source checkout (a `pyproject.toml` naming
  framework-bench beside the package); else the user data folder (platformdirs).
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


def state_dir() -> Path:
    if os.environ.get("FBENCH_HOME"):
        return Path(os.environ["FBENCH_HOME"])
    checkout = source_checkout()
    return checkout / ".fbench" if checkout else platformdirs.user_data_path("fbench")


def user_scenarios() -> Path:
    return state_dir() / "scenarios"
