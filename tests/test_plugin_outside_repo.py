"""Plugin mechanics, end to end: a backend package written outside the repository, installed
non-editable next to fbench, gets its env built, runs tiny_cpu and ends `ok`, with no edit to
the host.

This tests the plugin machinery (entry point, env creation from the plugin's requirement
file, the plugin's own package reaching its env as a copy, launch, metrics, report), not a
framework: the probe's worker trains a numpy bigram model on the verified packed rows. Its
work is real, but it is no training framework and this is no backend benchmark.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

import framework_bench

PYPROJECT = '''
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "fbench-mechanics-probe"
version = "0.1.0"
dependencies = ["framework-bench"]

[project.entry-points."fbench.backends"]
mechanics_probe = "fbench_mechanics_probe.plugin"

[tool.setuptools]
packages = ["fbench_mechanics_probe"]

[tool.setuptools.package-data]
fbench_mechanics_probe = ["*.txt"]
'''

PLUGIN = '''
from pathlib import Path

from framework_bench import worker_io
from framework_bench.backend import BackendInfo, Capabilities, EnvSpec, LaunchPlan, StepMetric, WorkerReport
from framework_bench.hookspecs import hookimpl

HERE = Path(__file__).resolve().parent


@hookimpl
def fbench_backend_info():
    return BackendInfo(name="mechanics_probe", framework="numpy bigram",
                       capabilities=Capabilities(cpu=True, gpu=False, sequence_parallel=False, varlen=False),
                       env=EnvSpec(requirements={"cpu": HERE / "requirements-cpu.txt"}, framework_package="numpy"))


@hookimpl
def fbench_check(scenario, machine, env):
    return None if env.ready else f"the mechanics_probe env is {env.problem}"


@hookimpl
def fbench_plan(job, env):
    return LaunchPlan(python=env.python, module="fbench_mechanics_probe.worker", args=[str(job.job_file)])


@hookimpl
def fbench_read_report(job):
    worker = worker_io.read_worker_report(job.run_dir)
    return WorkerReport(steps=[StepMetric.model_validate(m) for m in worker_io.read_metrics(job.run_dir)],
                        data_sha256=worker.get("data_sha256"), framework_version=worker.get("framework_version"),
                        notes=[f"worker imported from {worker.get('imported_from')}"])
'''

WORKER = '''
"""A bigram next-token model in numpy, trained by SGD on the packed rows, on the worker SDK."""
import sys

import numpy as np

import fbench_mechanics_probe
from framework_bench import worker_io
from framework_bench.packed import IGNORE_INDEX, PackedRows
from framework_bench.worker import LEARNING_RATE, StepTimer, dist_info


def main(job_file):
    job = worker_io.load_job(job_file)
    scenario, dist = job["scenario"], dist_info()
    rows = PackedRows(job["data_dir"])
    sha = rows.sha256()
    if sha != job["data_sha256"]:
        raise SystemExit(f"packed data has sha256 {sha}, the host expected {job['data_sha256']}")
    vocab = job["hf_config"]["vocab_size"]
    weights = np.zeros((vocab, vocab))
    timer = StepTimer(job["run_dir"], job["device"], rank=dist.rank)
    mb = scenario["micro_batch"]
    for step in range(1, scenario["steps"]["warmup"] + scenario["steps"]["measured"] + 1):
        ids = np.asarray(rows.input_ids[(step - 1) * mb:step * mb])
        labels = np.asarray(rows.labels[(step - 1) * mb:step * mb])
        timer.begin()
        x, y = ids[:, :-1].reshape(-1), labels[:, 1:].reshape(-1)
        keep = y != IGNORE_INDEX
        x, y = x[keep], y[keep]
        logits = weights[x]
        probs = np.exp(logits - logits.max(axis=1, keepdims=True))
        probs /= probs.sum(axis=1, keepdims=True)
        loss = float(-np.log(probs[np.arange(len(y)), y]).mean())
        probs[np.arange(len(y)), y] -= 1.0
        np.add.at(weights, x, -LEARNING_RATE * 1e4 * probs / len(y))
        timer.add_tokens(ids.size)
        timer.end(step, loss)
    timer.close()
    worker_io.write_worker_report(job["run_dir"], data_sha256=sha, framework_version=np.__version__,
                                  imported_from=fbench_mechanics_probe.__file__)


if __name__ == "__main__":
    main(sys.argv[1])
'''


def make_probe_package(root: Path) -> Path:
    pkg = root / "fbench-mechanics-probe"
    (pkg / "fbench_mechanics_probe").mkdir(parents=True)
    (pkg / "pyproject.toml").write_text(PYPROJECT)
    (pkg / "fbench_mechanics_probe" / "__init__.py").write_text("")
    (pkg / "fbench_mechanics_probe" / "plugin.py").write_text(textwrap.dedent(PLUGIN))
    (pkg / "fbench_mechanics_probe" / "worker.py").write_text(textwrap.dedent(WORKER))
    (pkg / "fbench_mechanics_probe" / "requirements-cpu.txt").write_text("numpy\n")
    return pkg


def host_next_to_fbench(root: Path) -> Path:
    """A Python environment holding fbench as the test's own host venv does, plus whatever
    is pip-installed into it: a venv whose site reads this venv's site-packages."""
    venv = root / "host"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(sysconfig.get_paths(vars={"base": str(venv), "platbase": str(venv)})["purelib"])
    (site / "fbench_host_venv.pth").write_text(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    return venv


@pytest.mark.slow
def test_plugin_mechanics_outside_the_repo_installed_non_editable(tmp_path, alpaca_dir):
    pkg = make_probe_package(tmp_path / "elsewhere")
    host = host_next_to_fbench(tmp_path)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--prefix", str(host), str(pkg)],
                   check=True, capture_output=True)
    python = host / "bin" / "python"
    env = {**os.environ, "FBENCH_HOME": str(tmp_path / "fbench_home")}
    env.pop("PYTHONPATH", None)

    def fbench(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(python), "-c", "import sys; from framework_bench.cli import app; sys.argv[0] = 'fbench'; app()",
                               *args], capture_output=True, text=True, env=env, cwd=tmp_path)

    listed = fbench("backends")
    assert "mechanics_probe" in listed.stdout and "numpy bigram" in listed.stdout, listed.stdout + listed.stderr
    created = fbench("env", "create", "mechanics_probe")
    assert created.returncode == 0, created.stdout + created.stderr
    probe_env = tmp_path / "fbench_home" / "envs" / "mechanics_probe"
    purelib = next(probe_env.glob("lib/python3*/site-packages"))
    # The installed plugin reaches its env as a copy of its own package; the host's
    # site-packages (where pip put it, next to fbench's dependencies) is not on the env's path.
    assert (purelib / "fbench_mechanics_probe" / "worker.py").read_text() == textwrap.dedent(WORKER)
    assert (purelib / "fbench_mechanics_probe" / ".fbench-copy").exists() and not (purelib / "framework_bench").exists()
    assert (purelib / "fbench_host.pth").read_text().splitlines() == [str(Path(framework_bench.__file__).parent.parent)]

    again = fbench("env", "create", "mechanics_probe")  # reused, and the copy refreshed
    assert again.returncode == 0 and "nothing to do" in again.stdout, again.stdout + again.stderr
    assert (purelib / "fbench_mechanics_probe" / "worker.py").read_text() == textwrap.dedent(WORKER)

    ran = fbench("run", "--backend", "mechanics_probe", "--scenario", "tiny_cpu", "--json")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    result = json.loads(ran.stdout)
    assert result["status"] == "ok", result["reason"]
    assert result["steps_measured"] == 5 and result["tgs"] > 0
    assert result["notes"] == [f"worker imported from {purelib / 'fbench_mechanics_probe' / '__init__.py'}"]
    steps = [json.loads(line) for line in (Path(result["run_dir"]) / "metrics" / "rank0.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == list(range(1, 8)) and all(s["tokens"] == 512 for s in steps)
    assert steps[-1]["loss"] < steps[0]["loss"]
