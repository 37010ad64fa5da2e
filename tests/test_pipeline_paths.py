"""The hook guarantees of `framework_bench/plugins/hookspecs.py` on every path through the one
pipeline (`framework_bench/run/pipeline.py`): local, torchrun, SLURM submit (stand-in SLURM
from tests/slurm_standins), `results collect`, `--dry-run` and `check-backend`.

On each path a plugin whose `fbench_plan` raises ends as a `failed` row naming the hook (a
dry run: a `plan_error`), never a host traceback; and a plugin whose plan overwrites job.json
does not change it: the worker reads the host's job. The fake backends (tests/fake_backends)
train nothing, so these tests check the host's bookkeeping.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fbench_fixtures import backend_env_or_skip
from framework_bench.cli import app
from framework_bench.plugins.contract import Job, Machine
from framework_bench.run import pipeline
from framework_bench.run.dry_run import dry_run
from framework_bench.run.options import RunOptions
from framework_bench.scenario import scenario

STANDINS = Path(__file__).parent / "slurm_standins"
CPU = Machine(cpu_count=2)
RAISED = "fbench_plan raised ValueError: no plan for"


def _is_the_hosts(run_dir: Path, backend: str, scenario_name: str) -> None:
    job = Job.model_validate_json((Path(run_dir) / "job.json").read_text())  # not the plan's "{}"
    assert job.backend == backend and job.scenario.name == scenario_name and job.run_dir == Path(run_dir)


def _invoke(*args: str):
    res = CliRunner().invoke(app, list(args))
    assert res.exception is None or isinstance(res.exception, SystemExit), res.output  # no host traceback
    assert "Traceback (most recent call last)" not in res.stdout.split(RAISED)[0], res.output
    return res


def _rows(db: Path) -> dict[str, dict]:
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    return {r["backend"]: dict(r) for r in con.execute("SELECT * FROM runs")}


@pytest.mark.parametrize("launcher", ["local", "torchrun"])
def test_a_raising_plan_is_a_failed_row_on_the_launchers_that_run_here(fakes, tmp_path, launcher):
    db = tmp_path / "r.sqlite"
    res = _invoke("run", "--backend", "fake_plan_raises", "--scenario", "tiny_cpu", "--launcher", launcher,
                  "--db", str(db))
    assert res.exit_code == 1
    row = _rows(db)["fake_plan_raises"]
    assert row["status"] == "failed" and row["reason"].startswith(f"{RAISED} tiny_cpu"), row["reason"]
    assert "fbench_fake_backends.py" in row["reason"]  # the plugin's frames, not the host's
    assert not (Path(row["run_dir"]) / "plan.json").exists()  # nothing was launched
    _is_the_hosts(row["run_dir"], "fake_plan_raises", "tiny_cpu")


def test_job_json_is_the_hosts_on_the_local_launcher(fakes, tmp_path):
    r = pipeline.run_one("fake_plan_writes_job", scenario.load("tiny_cpu"), RunOptions(launcher="local", root=tmp_path),
                         machine=CPU)
    assert r.status == "ok", r.reason  # the fake worker read the host's job, not "{}"
    _is_the_hosts(r.run_dir, "fake_plan_writes_job", "tiny_cpu")


@pytest.fixture
def torch_python():
    """The torch env's Python, found before `fakes` points FBENCH_HOME at a private folder."""
    return backend_env_or_skip("torch").python


@pytest.mark.slow  # starts a framework's or the host's own process
def test_job_json_is_the_hosts_on_the_torchrun_launcher(torch_python, fakes, tmp_path, monkeypatch):
    # torchrun needs torch: the plan's Python is the torch env's (the fake worker needs nothing more)
    monkeypatch.setenv("FBENCH_FAKE_PYTHON", str(torch_python))
    r = pipeline.run_one("fake_plan_writes_job", scenario.load("tiny_cpu"),
                         RunOptions(launcher="torchrun", root=tmp_path, timeout=300), machine=CPU)
    plan = json.loads((r.run_dir / "plan.json").read_text())
    assert plan["launcher"] == "torchrun" and "torch.distributed.run" in plan["argv"][0]
    assert r.status == "ok", r.reason
    _is_the_hosts(r.run_dir, "fake_plan_writes_job", "tiny_cpu")


def test_dry_run_a_raising_plan_is_a_plan_error_and_job_json_the_hosts(fakes, tmp_path):
    for launcher in ("local", "torchrun", "slurm"):
        d = dry_run("fake_plan_raises", scenario.load("tiny_cpu"), RunOptions(launcher=launcher, root=tmp_path), CPU)
        assert d.plan_error.startswith(f"{RAISED} tiny_cpu") and d.argv == [] and d.launcher == launcher
        d = dry_run("fake_plan_writes_job", scenario.load("tiny_cpu"), RunOptions(launcher=launcher, root=tmp_path), CPU)
        assert d.plan_error is None
        _is_the_hosts(d.run_dir, "fake_plan_writes_job", "tiny_cpu")
    res = _invoke("run", "--backend", "fake_plan_raises", "--scenario", "tiny_cpu", "--dry-run", "--launcher", "slurm")
    assert res.exit_code == 0 and "no plan: fbench_plan raised ValueError" in " ".join(res.output.split())


def test_check_backend_a_raising_plan_fails_its_run_point(fakes):
    res = _invoke("check-backend", "fake_plan_raises", "--scenario", "tiny_cpu_1k")
    assert res.exit_code == 1
    flat = " ".join(res.stdout.split())
    assert re.search(r"run\s*│\s*fail\s*│\s*status failed", res.stdout) or "status failed" in flat, res.stdout
    res = _invoke("check-backend", "fake_plan_writes_job", "--scenario", "tiny_cpu_1k")
    run_dir = re.search(r"run folder (\S+)", res.stdout).group(1)
    assert "status ok" in " ".join(res.stdout.split()), res.stdout
    _is_the_hosts(run_dir, "fake_plan_writes_job", "tiny_cpu_1k")


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    """Stand-in SLURM on PATH: sbatch runs the batch script here in the background."""
    monkeypatch.setenv("FAKE_SLURM_DIR", str(tmp_path / "slurm-state"))
    monkeypatch.setenv("PATH", f"{STANDINS}:{os.environ['PATH']}")


@pytest.mark.slow  # starts a framework's or the host's own process
def test_slurm_submit_and_collect_keep_the_hook_guarantees(cluster, fakes, tmp_path):
    db = tmp_path / "r.sqlite"
    res = _invoke("compare", "--scenario", "tiny_cpu", "--backends", "fake_plan_raises,fake_plan_writes_job",
                  "--launcher", "slurm", "--db", str(db))
    assert res.exit_code == 0, res.output
    # the raising plan: a failed row at once, nothing submitted for it
    # submitted: the plan that overwrote job.json and the reference after it, in one job
    assert re.findall(r"(\w+) via slurm", res.stdout) == ["fake_plan_raises", "fake_plan_writes_job", "fake_ok"]
    assert re.findall(r"submitted: SLURM job (\d+)", res.stdout) == ["1000", "1000"]
    row = _rows(db)["fake_plan_raises"]
    assert row["status"] == "failed" and row["reason"].startswith(f"{RAISED} tiny_cpu"), row["reason"]
    _is_the_hosts(row["run_dir"], "fake_plan_raises", "tiny_cpu")
    assert not (Path(row["run_dir"]) / "submit.sbatch").exists()
    # the plan that overwrote job.json: submitted with the host's job, and its worker ran it
    deadline = time.monotonic() + 300
    while "fake_plan_writes_job" not in _rows(db):
        res = _invoke("results", "collect", "--db", str(db))
        assert res.exit_code == 0 and time.monotonic() < deadline, res.output
        time.sleep(1)
    row = _rows(db)["fake_plan_writes_job"]
    assert row["status"] == "ok", row["reason"]  # its CPU time read on the node by the watcher that started it
    _is_the_hosts(row["run_dir"], "fake_plan_writes_job", "tiny_cpu")


def _seed_of(run_dir) -> int:
    return json.loads((Path(run_dir) / "job.json").read_text())["seed"]


@pytest.mark.slow  # starts a framework's or the host's own process
def test_the_seed_reaches_the_workers_job_on_every_path(cluster, fakes, tmp_path):
    """`--seed` is the job's, not only the row's: before, every worker got the default 1024."""
    tiny = scenario.load("tiny_cpu")
    d = dry_run("fake_ok", tiny, RunOptions(seed=7, root=tmp_path), CPU)
    assert _seed_of(d.run_dir) == 7
    r = pipeline.run_one("fake_ok", tiny, RunOptions(seed=7, root=tmp_path), machine=CPU)
    assert r.status == "ok" and r.seed == 7 and _seed_of(r.run_dir) == 7
    db = tmp_path / "r.sqlite"
    res = _invoke("compare", "--scenario", "tiny_cpu", "--backends", "fake_ok", "--launcher", "slurm",
                  "--seed", "7", "--db", str(db))
    assert res.exit_code == 0, res.output
    deadline = time.monotonic() + 300
    while "fake_ok" not in _rows(db):
        assert _invoke("results", "collect", "--db", str(db)).exit_code == 0 and time.monotonic() < deadline
        time.sleep(1)
    row = _rows(db)["fake_ok"]
    assert row["status"] == "ok" and row["seed"] == 7 and _seed_of(row["run_dir"]) == 7, row
