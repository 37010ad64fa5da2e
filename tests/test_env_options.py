"""`fbench env create`: arguments checked before anything is touched, a failed creation
leaves the old env intact, offline wheelhouses, extra packages, the system's packages, and
versions re-read on every inspection. Real venvs and pip, with a tiny wheel built here."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from env_helpers import build_wheel, sdk_wheels  # noqa: F401 - sdk_wheels is a fixture
from framework_bench.envs import venvs as envs
from framework_bench.envs.creation import create
from framework_bench.envs.errors import EnvError
from framework_bench.envs.host_packages import link_packages
from framework_bench.envs.pip_options import Options
from framework_bench.envs.smoke import smoke_test
from framework_bench.envs.torch_index import parse_driver_cuda, torch_index_for
from framework_bench.plugins.contract import EnvSpec


@pytest.fixture
def tiny_spec(tmp_path) -> EnvSpec:
    req = tmp_path / "requirements.txt"
    req.write_text("fbench_tiny_a==0.1\n")
    return EnvSpec(requirements={"cpu": req, "cuda": req}, framework_package="fbench_tiny_a")


@pytest.fixture
def wheelhouse(tmp_path, sdk_wheels) -> Path:
    house = tmp_path / "wheelhouse"
    build_wheel(house, "fbench_tiny_a", "0.1")
    for wheel in sdk_wheels.iterdir():  # every env gets the worker SDK's requirements
        (house / wheel.name).symlink_to(wheel)
    build_wheel(house, "fbench_tiny_b", "0.2")
    return house


def offline(house: Path, **kw) -> Options:
    return Options(find_links=[str(house)], no_index=True, **kw)


@pytest.mark.slow  # starts a framework's or the host's own process
def test_wheelhouse_with_and_reinspection(fbench_home, tiny_spec, wheelhouse, tmp_path):
    env = create("tiny", tiny_spec, "cpu", options=offline(wheelhouse))
    assert env.ready and env.version("fbench_tiny_a") == "0.1" and not env.has("fbench_tiny_b")
    # a package installed by hand is seen by the next inspection (no re-creation)
    subprocess.run([str(env.python), "-m", "pip", "install", "-q", "--no-index", "--find-links", str(wheelhouse),
                    "fbench_tiny_b"], check=True)
    assert envs.inspect("tiny", tiny_spec).version("fbench_tiny_b") == "0.2"
    # --with: an extra wheel by path; a change of options rebuilds the env
    extra = build_wheel(tmp_path / "elsewhere", "fbench_tiny_c", "0.3")
    env = create("tiny", tiny_spec, "cpu", options=offline(wheelhouse, with_specs=[str(extra)]))
    assert env.version("fbench_tiny_c") == "0.3" and not env.has("fbench_tiny_b")  # rebuilt from scratch
    out = subprocess.run([str(env.python), "-c", "import fbench_tiny_c; print(fbench_tiny_c.VERSION)"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "0.3"  # the swapped-in env runs from its final path
    record = json.loads((env.path / envs.RECORD).read_text())
    assert record["options"]["with_specs"] == [str(extra)] and record["smoke_test"] is None


@pytest.mark.slow  # starts a framework's or the host's own process
def test_system_site_packages(fbench_home, tiny_spec, wheelhouse):
    """This test's host Python is a venv (.venv): the env must see *its* packages (not the base
    interpreter's) behind the env's own."""
    import sys

    assert sys.prefix != sys.base_prefix, "run from fbench's venv"
    build_wheel(wheelhouse, "pluggy", "99.0")  # a host package the env shadows with its own copy
    env = create("tiny", tiny_spec, "cpu",
                 options=offline(wheelhouse, system_site_packages=True, with_specs=["pluggy==99.0"]))
    record = json.loads((env.path / envs.RECORD).read_text())
    host_site = next(p for p in sys.path if p.startswith(sys.prefix) and p.endswith("site-packages"))
    assert host_site in record["site_dirs"], "the host venv's site-packages are inherited and recorded"
    out = subprocess.run([str(env.python), "-c", "import pluggy, typer, fbench_tiny_a; "
                          "print(getattr(pluggy, 'VERSION', None)); print(typer.__file__)"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "99.0", "the env's own package wins over the host's"
    assert out[1].startswith(host_site), "a host-only package comes from the host venv"
    assert env.version("typer") and env.version("fbench_tiny_a") == "0.1"


@pytest.mark.slow  # starts a framework's or the host's own process
def test_bad_arguments_touch_nothing(fbench_home, tiny_spec, wheelhouse):
    env = create("tiny", tiny_spec, "cpu", options=offline(wheelhouse))
    before = sorted(p.name for p in env.path.iterdir())
    for flavour, options, message in (("gpu", offline(wheelhouse), "unknown flavour 'gpu'"),
                                      ("cpu", Options(find_links=["/no/such/folder"]), "no such folder")):
        with pytest.raises(EnvError, match=message):
            create("tiny", tiny_spec, flavour, options=options)
    assert sorted(p.name for p in env.path.iterdir()) == before
    assert envs.inspect("tiny", tiny_spec).ready


@pytest.mark.slow  # starts a framework's or the host's own process
def test_failed_creation_leaves_the_old_env(fbench_home, tiny_spec, wheelhouse):
    env = create("tiny", tiny_spec, "cpu", options=offline(wheelhouse))
    # pip fails (a package the wheelhouse lacks): the old env stays, no half-built folder is left
    with pytest.raises(EnvError, match="exited"):
        create("tiny", tiny_spec, "cpu", options=offline(wheelhouse, with_specs=["fbench_tiny_missing"]))
    again = envs.inspect("tiny", tiny_spec)
    assert again.ready and again.version("fbench_tiny_a") == "0.1"
    assert [p.name for p in env.path.parent.iterdir() if p.name.startswith(".")] == []
    assert "fbench_tiny_missing" in (env.path.parent / "tiny.create.log").read_text()


def test_cli_flavour_typo_is_one_line(fbench_home, tmp_path):
    from typer.testing import CliRunner

    from framework_bench.cli import app

    result = CliRunner().invoke(app, ["env", "create", "xtuner", "--flavour", "gpu"])
    assert result.exit_code == 1 and "unknown flavour 'gpu'" in result.output
    assert "Traceback" not in result.output and not (fbench_home / "envs").exists()


@pytest.mark.parametrize("banner, index", [
    ("| NVIDIA-SMI 580.65.06   Driver Version: 580.65.06   CUDA Version: 13.0 |", None),
    ("| NVIDIA-SMI 570.86.15   Driver Version: 570.86.15   CUDA Version: 12.8 |", "https://download.pytorch.org/whl/cu128"),
    ("| NVIDIA-SMI 565.57.01   Driver Version: 565.57.01   CUDA Version: 12.7 |", "https://download.pytorch.org/whl/cu126"),
])
def test_driver_picks_the_torch_index(banner, index):
    assert torch_index_for(parse_driver_cuda(banner)) == index


def test_old_driver_and_no_driver():
    with pytest.raises(EnvError, match="CUDA 12.4"):
        torch_index_for((12, 4))
    assert parse_driver_cuda("bash: nvidia-smi: command not found") is None
    assert torch_index_for(None) is None  # a login node builds for the compute nodes: PyPI's


def test_smoke_test_without_gpu_is_not_a_pass(tmp_path):
    assert smoke_test(Path("/nonexistent/python"), gpu_here=False) == {"status": "not run: no GPU here"}


@pytest.mark.slow  # starts a framework's or the host's own process
def test_smoke_test_records_deepspeed_and_flash_attn_never_requires_them(tmp_path, monkeypatch):
    """Run in a real env (torch's): no CUDA here, so it fails on that alone; a deepspeed that is
    installed but fails to import is recorded as such, an absent flash-attn as absent."""
    from fbench_fixtures import backend_env_or_skip

    env = backend_env_or_skip("torch")
    broken = tmp_path / "site" / "deepspeed"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise RuntimeError('CUDA_HOME does not exist')\n")
    monkeypatch.setenv("PYTHONPATH", str(broken.parent))
    found = smoke_test(env.python, gpu_here=True)
    assert found["cuda_available"] is False and found["status"] == "failed"
    assert found["deepspeed"] == "import fails: RuntimeError: CUDA_HOME does not exist"
    assert found["flash_attn"] == "absent"


@pytest.mark.slow  # starts a framework's or the host's own process
def test_an_optional_package_that_failed_to_import_is_not_counted(fbench_home, tiny_spec, wheelhouse):
    """`env.has` reads metadata: a deepspeed the cuda smoke test saw fail to import must not make
    the plugins accept ZeRO scenarios. (The record is written as a cuda env's smoke test writes it:
    no GPU here to run one.)"""
    build_wheel(wheelhouse, "deepspeed", "0.18.4")
    # the cuda flavour (the one with a smoke test; not run here, no GPU): the cpu one would prebuild ops
    env = create("tiny", tiny_spec, "cuda", options=offline(wheelhouse, with_specs=["deepspeed==0.18.4"]))
    assert env.has("deepspeed")
    record_file = env.path / envs.RECORD
    record = json.loads(record_file.read_text())
    record["smoke_test"] = {"status": "passed", "deepspeed": "import fails: RuntimeError: CUDA_HOME does not exist",
                            "flash_attn": "absent"}
    record_file.write_text(json.dumps(record))
    again = envs.inspect("tiny", tiny_spec)
    assert again.ready and not again.has("deepspeed") and again.version("fbench_tiny_a") == "0.1"


@pytest.mark.parametrize("installed", [False, True], ids=["source-folder", "installed-files"])
def test_a_one_module_plugin_is_importable_in_its_env(tmp_path, monkeypatch, installed):
    """A plugin that is one module (`name.py`, as many llm-* plugins are) gets into its env like
    a package: its folder listed by the env's .pth, or, installed as files, copied in."""
    import sys
    import venv

    if installed:  # pip writes the module and a RECORD listing it
        wheel = build_wheel(tmp_path / "wheels", "fbench_one_module", "0.1")
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target",
                        str(tmp_path / "site"), str(wheel)], check=True)
        folder = tmp_path / "site"
    else:
        folder = tmp_path / "src"
        folder.mkdir()
        (folder / "fbench_one_module.py").write_text("VERSION = '0.1'\n")
    monkeypatch.syspath_prepend(str(folder))
    venv.create(tmp_path / "env", with_pip=False)
    python = tmp_path / "env" / "bin" / "python"
    link_packages(python, ("fbench_one_module",))
    out = subprocess.run([str(python), "-c", "import fbench_one_module as m; print(m.VERSION, m.__file__)"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    version, where = out.stdout.split()
    assert version == "0.1"
    assert (Path(where).parent == folder) != installed  # a copy inside the env when installed as files
    link_packages(python, ("fbench_one_module",))  # again: the earlier copy is ours, refreshed
