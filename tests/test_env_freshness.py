"""An env is ready only when a run's worker can import the worker SDK there, and only while its
copy of the plugin is the plugin the host loads. Real venvs and pip, offline:
wheels written here, the SDK's numpy packed from the host's own install (tests/env_helpers.py)."""

from __future__ import annotations

import ast
import importlib
import json
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from env_helpers import build_wheel, sdk_wheels  # noqa: F401 - sdk_wheels is a fixture
from framework_bench.envs import venvs as envs
from framework_bench.envs.creation import create
from framework_bench.envs.errors import EnvError
from framework_bench.envs.host_packages import link_packages
from framework_bench.envs.pip_options import Options
from framework_bench.envs.sdk_check import SDK_REQUIREMENTS, sdk_import_error
from framework_bench.plugins.contract import EnvSpec

SDK = Path(envs.__file__).resolve().parents[1] / "worker"


@pytest.fixture
def tiny_spec(tmp_path) -> EnvSpec:
    req = tmp_path / "requirements.txt"
    req.write_text("fbench_tiny_a==0.1\n")
    return EnvSpec(requirements={"cpu": req, "cuda": req}, framework_package="fbench_tiny_a")


def offline(*houses: Path) -> Options:
    return Options(find_links=[str(h) for h in houses], no_index=True)


def test_the_sdk_requirements_are_what_the_sdk_imports():
    """Every module-level import of the worker SDK outside the standard library and fbench is an
    SDK requirement (torch is imported inside the helpers that need it, never at import)."""
    imported = set()
    for source in SDK.glob("*.py"):
        for node in ast.parse(source.read_text()).body:  # module level only
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            imported |= {n.split(".")[0] for n in names}
    third_party = imported - set(sys.stdlib_module_names) - {"framework_bench", "__future__"}
    assert third_party == set(SDK_REQUIREMENTS)


def test_an_env_whose_python_lacks_numpy_is_never_ready(fbench_home, tiny_spec):
    """A bare venv (no pip, no numpy) with fbench linked and a record as `env create` writes it:
    every run's worker would die importing the SDK, so inspect says so and the plugin refuses."""
    from framework_bench.plugins.base import Backend
    from framework_bench.plugins.contract import Machine
    from framework_bench.scenario import scenario

    path = envs.env_path("bare")
    venv.create(path, with_pip=False)
    python = path / "bin" / "python"
    linked = link_packages(python, ("framework_bench",))
    record = {"flavour": "cpu", "requirements_sha256": envs.requirements_hash(tiny_spec, "cpu"), "linked": linked}
    (path / envs.RECORD).write_text(json.dumps(record))
    assert sdk_import_error(python) == "ModuleNotFoundError: No module named 'numpy'"
    env = envs.inspect("bare", tiny_spec)
    assert not env.ready and "framework_bench.worker" in env.problem and "'numpy'" in env.problem
    assert "fbench env create bare" in env.problem

    class Bare(Backend):
        def info(self):
            raise NotImplementedError

    refusal = Bare().check(scenario.load("tiny_cpu"), Machine(gpus=0, cpu_count=2), env)
    assert refusal and "No module named 'numpy'" in refusal


@pytest.mark.slow  # starts a framework's or the host's own process
def test_env_create_installs_the_sdk_requirements_and_refuses_an_env_where_it_does_not_import(
        fbench_home, tiny_spec, tmp_path, sdk_wheels):
    house = tmp_path / "house"
    build_wheel(house, "fbench_tiny_a", "0.1")
    # Without numpy to install (the backend's requirements do not name it): never "ready"
    with pytest.raises(EnvError, match="exited"):  # pip: no numpy in the wheelhouse
        create("tiny", tiny_spec, "cpu", options=offline(house))
    assert "No matching distribution found for numpy" in (fbench_home / "envs" / "tiny.create.log").read_text()
    assert not envs.inspect("tiny", tiny_spec).ready
    # A numpy that installs but does not import (built for another machine, say): the smoke import catches it
    broken = tmp_path / "broken"
    build_wheel(broken, "numpy", "2.4.6", source="raise ImportError('numpy built for another CPU')\n")
    with pytest.raises(EnvError, match="does not import in the tiny env: ImportError: numpy built for another CPU"):
        create("tiny", tiny_spec, "cpu", options=offline(house, broken))
    assert not envs.inspect("tiny", tiny_spec).ready and not envs.env_path("tiny").exists()
    # With the wheel at hand, the requirements file still silent about numpy: installed, imported, ready
    env = create("tiny", tiny_spec, "cpu", options=offline(house, sdk_wheels))
    assert env.ready and env.has("numpy") and sdk_import_error(env.python) is None
    assert json.loads((env.path / envs.RECORD).read_text())["sdk_import"] == "ok"


PROBE_PLUGIN = """
from pathlib import Path

from framework_bench.plugins.base import Backend
from framework_bench.plugins.contract import CONTRACT, BackendInfo, Capabilities, EnvSpec

VERSION = {version!r}


class Probe(Backend):
    def info(self):
        requirements = Path({requirements!r})
        return BackendInfo(name="probe", framework="a probe", contract=CONTRACT,
                           capabilities=Capabilities(cpu=True, gpu=False, sequence_parallel=False, varlen=False),
                           env=EnvSpec(requirements={{"cpu": requirements, "cuda": requirements}},
                                       framework_package="fbench_tiny_a"))
{line}
"""


@pytest.mark.slow  # starts a framework's or the host's own process
def test_a_copied_plugin_that_changed_makes_its_env_stale_until_env_create(
        fbench_home, tiny_spec, tmp_path, sdk_wheels, monkeypatch):
    """A plugin installed as files (non-editable, one module here) is copied into its env: its
    files changed in place, or a new version, make the env stale, saying which, in `fbench env
    list` and in the verdict a run is refused by; `fbench env create` refreshes the copy."""
    from typer.testing import CliRunner

    from backend_helpers import CPU
    from framework_bench.cli import app
    from framework_bench.plugins import registry
    from framework_bench.run import refusals
    from framework_bench.scenario import scenario

    house = tmp_path / "house"
    build_wheel(house, "fbench_tiny_a", "0.1")
    site = tmp_path / "site"

    def install(version: str, line: str) -> None:
        source = PROBE_PLUGIN.format(version=version, requirements=str(tiny_spec.requirements["cpu"]), line=line)
        wheel = build_wheel(tmp_path / "plugin-wheels" / version, "fbench_probe_plugin", version, source=source)
        for old in site.glob("*.dist-info"):  # pip --target leaves the old version's metadata behind
            shutil.rmtree(old)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--upgrade",
                        "--target", str(site), str(wheel)], check=True, capture_output=True)
        (next(site.glob("*.dist-info")) / "entry_points.txt").write_text(
            "[fbench.backends]\nprobe = fbench_probe_plugin:Probe\n")
        importlib.invalidate_caches()

    def fbench(*args: str) -> str:
        result = CliRunner().invoke(app, list(args), env={"COLUMNS": "400"})
        assert result.exit_code == 0, result.output
        return result.output

    install("0.1", "# first")
    monkeypatch.syspath_prepend(str(site))
    wheels = ["--no-index", "--find-links", str(house), "--find-links", str(sdk_wheels)]
    fbench("env", "create", "probe", "--flavour", "cpu", *wheels)
    env = envs.inspect("probe", tiny_spec)
    linked = json.loads((env.path / envs.RECORD).read_text())["linked"]
    assert env.ready and linked["fbench_probe_plugin"]["copied"] and linked["fbench_probe_plugin"]["version"] == "0.1"
    assert linked["framework_bench"] == {"source": str(SDK.parent), "copied": False}  # a checkout: followed live

    module = site / "fbench_probe_plugin.py"
    module.write_text(module.read_text() + "# edited in place\n")
    env = envs.inspect("probe", tiny_spec)
    assert not env.ready and env.problem.startswith("stale: plugin changed since env create (fbench_probe_plugin "
                                                    "source sha256 ")
    install("0.2", "# second")
    env = envs.inspect("probe", tiny_spec)
    assert not env.ready and "fbench_probe_plugin version 0.1→0.2" in env.problem, env.problem
    assert "fbench env create probe" in env.problem
    state = " ".join(line.split("│")[-2].strip() for line in fbench("env", "list").splitlines() if "│" in line)
    assert "stale: plugin changed since env create (fbench_probe_plugin version 0.1→0.2" in state, state
    _, verdict = refusals.refusals_for(registry.get("probe"), scenario.load("tiny_cpu"), CPU)
    assert verdict.check == f"the probe env is not ready: {env.problem}"  # what the run is refused with

    said = fbench("env", "create", "probe", "--flavour", "cpu", *wheels)
    env = envs.inspect("probe", tiny_spec)
    assert env.ready and f"probe: ready at {env.path} (plugin copy refreshed)" in said  # no rebuild
    copy = next(env.path.glob("lib/python3*/site-packages")) / "fbench_probe_plugin.py"
    assert copy.read_text() == module.read_text() and "VERSION = '0.2'" in copy.read_text()
