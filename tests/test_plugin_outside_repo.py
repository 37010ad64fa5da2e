"""A backend package written outside the repository, from CONTRIBUTING.md alone, installed
non-editable next to fbench: its env is built from its own requirement file, and it runs
and passes `fbench check-backend`, with no edit to the host.

The package is CONTRIBUTING's minimal backend (its worker and plugin blocks, as written
there) under a pyproject of its own: a plain PyTorch loop, pinned like the torch backend
(pip's cache makes its env quick where that one was built). Its plugin comes in both forms
(`backend_helpers.PLUGIN_FORMS`): today's Backend subclass, and the module-level hooks
CONTRIBUTING showed before, which a plugin written then still has. Each form installs, lists and
gets its env; `check-backend` runs on the first (the worker is the same: both forms' hooks read
its run back in backends/torch/tests, test_contributings_minimal_backend_conforms_on_tiny_cpu).
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import framework_bench
from backend_helpers import PLUGIN_FORMS, contributing_backend
from fbench_fixtures import backend_env_or_skip

PYPROJECT = '''
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "fbench-mybackend"
version = "0.1.0"
dependencies = ["framework-bench"]

[project.entry-points."fbench.backends"]
mybackend = "{entry_point}"

[tool.setuptools]
packages = ["fbench_mybackend"]

[tool.setuptools.package-data]
fbench_mybackend = ["*.txt"]
'''

WORKER = contributing_backend()[0]
# What `fbench check-backend` judges: the run, then every host verification.
POINTS = ("run", "tokens", "steps", "rows", "throughput", "parameters", "settings", "initial_weights", "clock",
          "pauses", "cpu", "parity (tiny_cpu)")
REQUIREMENTS = "torch==2.13.0\ntransformers==5.6.0\nnumpy\n"


def make_package(root: Path, form: str) -> Path:
    entry_point, plugin = PLUGIN_FORMS[form]
    pkg = root / "fbench-mybackend"
    (pkg / "fbench_mybackend").mkdir(parents=True)
    (pkg / "pyproject.toml").write_text(PYPROJECT.replace("{entry_point}", entry_point))
    (pkg / "fbench_mybackend" / "__init__.py").write_text("")
    (pkg / "fbench_mybackend" / "plugin.py").write_text(plugin())
    (pkg / "fbench_mybackend" / "worker.py").write_text(WORKER)
    (pkg / "fbench_mybackend" / "requirements-cpu.txt").write_text(REQUIREMENTS)
    return pkg


def host_next_to_fbench(root: Path) -> Path:
    """A Python environment holding fbench as the test's own host venv does, plus whatever
    is pip-installed into it: a venv whose site reads this venv's site-packages."""
    venv = root / "host"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(sysconfig.get_paths(vars={"base": str(venv), "platbase": str(venv)})["purelib"])
    (site / "fbench_host_venv.pth").write_text(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    return venv


@pytest.fixture(scope="module")
def built_env(tmp_path_factory) -> dict:
    """{"path": the env `env create` built for the first form}: the second form's host finds it
    made by another host's package and refreshes its plugin copy, rather than building it again.
    The first form's home lies in "home", a module folder: a passing test's tmp_path goes with it."""
    return {"home": tmp_path_factory.mktemp("first-form-home")}


@pytest.mark.slow
@pytest.mark.parametrize("form", PLUGIN_FORMS)
def test_contributings_backend_outside_the_repo_installed_non_editable_passes_check_backend(tmp_path, alpaca_dir, form,
                                                                                           built_env):
    pkg = make_package(tmp_path / "elsewhere", form)
    host = host_next_to_fbench(tmp_path)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--prefix", str(host), str(pkg)],
                   check=True, capture_output=True)
    python = host / "bin" / "python"
    home = tmp_path / "fbench_home" if "path" in built_env else built_env["home"]
    env = {**os.environ, "FBENCH_HOME": str(home)}
    env.pop("PYTHONPATH", None)

    def fbench(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(python), "-c", "import sys; from framework_bench.cli import app; sys.argv[0] = 'fbench'; app()",
                               *args], capture_output=True, text=True, env=env, cwd=tmp_path)

    listed = fbench("backends")
    assert "mybackend" in listed.stdout and "PyTorch (minimal loop)" in listed.stdout, listed.stdout + listed.stderr
    env_dir = home / "envs" / "mybackend"
    if "path" in built_env:  # the env one form built, its copy of the other form's package: stale, refreshed
        env_dir.parent.mkdir(parents=True, exist_ok=True)
        env_dir.symlink_to(built_env["path"])
    created = fbench("env", "create", "mybackend")
    assert created.returncode == 0, created.stdout + created.stderr
    if "path" in built_env:
        assert "plugin copy refreshed" in created.stdout, created.stdout + created.stderr
    else:
        built_env["path"] = env_dir
    purelib = next(env_dir.glob("lib/python3*/site-packages"))
    # The installed plugin reaches its env as a copy of its own package; the host's
    # site-packages (where pip put it, next to fbench's dependencies) is not on the env's path.
    assert (purelib / "fbench_mybackend" / "worker.py").read_text() == WORKER
    assert (purelib / "fbench_mybackend" / ".fbench-copy").exists() and not (purelib / "framework_bench").exists()
    assert (purelib / "fbench_host.pth").read_text().splitlines() == [str(Path(framework_bench.__file__).parent.parent)]

    again = fbench("env", "create", "mybackend")  # reused, and the copy refreshed
    assert again.returncode == 0 and "nothing to do" in again.stdout, again.stdout + again.stderr
    assert (purelib / "fbench_mybackend" / "worker.py").read_text() == WORKER

    if form != "base class":
        return  # what its worker's run passes, read back by this form's hooks: backends/torch/tests
    # check-backend judges the loss against the torch reference's: the repo's torch env serves here
    (home / "envs" / "torch").symlink_to(backend_env_or_skip("torch").path)
    checked = fbench("check-backend", "mybackend")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    rows = [[cell.strip() for cell in line.split("│")] for line in checked.stdout.splitlines()]
    verdicts = {cells[1]: cells[2] for cells in rows if len(cells) > 3 and cells[1] in POINTS}
    assert verdicts == dict.fromkeys(POINTS, "pass"), checked.stdout
    # it declares no LoRA: the LoRA point is skipped, not failed
    assert {cells[2] for cells in rows if len(cells) > 3 and cells[1] == "parity (LoRA)"} == {"skipped"}, checked.stdout
