"""fbench installed, not run from a checkout: in a fresh venv, with HOME and the
working folder in a temporary folder, `pip install <repo> <repo>/backends/torch`, then
`fbench env create torch` and `fbench compare --scenario tiny_cpu --backends torch` end `ok`:
the scenarios and the Alpaca demo files come as package data, the state folder is the user
data folder, and the env gets the installed (copied) fbench and plugin. Minutes: it makes an env."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _copy_tree(dest: Path) -> Path:
    """The repository's files (tracked or not ignored): pip builds in the source folder, so not in the checkout."""
    files = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        src, dst = ROOT / name, dest / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            dst.symlink_to(os.readlink(src))
        elif src.is_file():
            shutil.copy2(src, dst)
    return dest


@pytest.mark.slow
def test_an_installed_fbench_runs_tiny_cpu_outside_the_checkout(tmp_path):
    repo = _copy_tree(tmp_path / "repo")
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FBENCH_", "VIRTUAL_ENV", "PYTHON"))}
    # pip's own configuration (where this machine's packages come from) lives in the real HOME
    pip_conf = Path.home() / ".config" / "pip" / "pip.conf"
    if pip_conf.is_file() and "PIP_CONFIG_FILE" not in env:
        env["PIP_CONFIG_FILE"] = str(pip_conf)
    env.update(HOME=str(home), XDG_DATA_HOME=str(home / ".local/share"), XDG_CACHE_HOME=str(home / ".cache"))

    def run(*argv: str, timeout: float) -> subprocess.CompletedProcess:
        out = subprocess.run(list(argv), cwd=work, env=env, capture_output=True, text=True, timeout=timeout)
        assert out.returncode == 0, f"{argv}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
        return out

    run(sys.executable, "-m", "venv", str(tmp_path / "venv"), timeout=120)
    python, fbench = tmp_path / "venv/bin/python", tmp_path / "venv/bin/fbench"
    # no build isolation: the build backend comes from this machine's packages, as setup.sh's do
    run(str(python), "-m", "pip", "install", "-q", "setuptools>=77", timeout=600)
    run(str(python), "-m", "pip", "install", "-q", "--no-build-isolation", str(repo), str(repo / "backends/torch"),
        timeout=900)
    run(str(fbench), "env", "create", "torch", timeout=1800)
    state = home / ".local/share/fbench"
    assert (state / "envs/torch").is_dir()  # the user data folder: no checkout beside the package
    out = run(str(fbench), "compare", "--scenario", "tiny_cpu", "--backends", "torch", "--json", timeout=1800)
    (record,) = json.loads(out.stdout)["runs"]
    assert record["status"] == "ok", record["reason"]
    assert (state / "results").is_dir() and not (repo / ".fbench").exists() and not (work / ".fbench").exists()
