"""A SLURM compare of several rounds, on the stand-in scheduler (tests/slurm_standins, first on
PATH: a real sbatch installed here is never asked): a waited campaign exits by its runs' statuses
as a local one does, and a Ctrl-C in round 2, wherever it lands, leaves every run folder stored
once, with its compare id and round: the rounds' jobs collected by `results collect`, a round
never submitted kept `interrupted` at once."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from framework_bench.cli import app

STANDINS = Path(__file__).parent / "slurm_standins"
FINE = {"ok", "unverified"}  # how an honest fake's run ends (unverified: a claim its plugin's contract lacks)


@pytest.fixture
def cluster(fakes, tmp_path, monkeypatch):
    """The stand-in SLURM commands first on PATH, their jobs' state in a folder of the test's."""
    monkeypatch.setenv("FAKE_SLURM_DIR", str(tmp_path / "slurm-state"))
    monkeypatch.setenv("PATH", f"{STANDINS}{os.pathsep}{os.environ['PATH']}")
    return tmp_path / "slurm-state"


def cli(*args: str):
    res = CliRunner().invoke(app, list(args))
    assert res.exception is None or isinstance(res.exception, SystemExit), res.output  # no host traceback
    return res


def collect_until_done(db: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while True:
        res = cli("results", "collect", "--db", str(db))
        assert res.exit_code == 0, res.output
        if "no submitted runs" in res.stdout:
            return
        assert time.monotonic() < deadline, res.stdout
        time.sleep(0.5)


def trials(db: Path) -> dict[tuple[int, str], str]:
    """{(round, backend): status} of every stored row, after `results list` and `results export` read
    them: each run folder once, every row a trial of one compare."""
    assert cli("results", "list", "--all", "--db", str(db)).exit_code == 0
    exported = cli("results", "export", "--format", "json", "--db", str(db))
    assert exported.exit_code == 0, exported.output
    rows = json.loads(exported.stdout)
    assert len({r["run_dir"] for r in rows}) == len(rows), [r["run_dir"] for r in rows]
    assert len({r["compare_id"] for r in rows}) == 1 and rows[0]["compare_id"], rows
    return {(r["trial_round"], r["backend"]): r["status"] for r in rows}


def test_a_waited_slurm_campaign_whose_runs_failed_exits_1(cluster, tmp_path):
    db = tmp_path / "r.sqlite"
    res = cli("compare", "--scenario", "tiny_cpu", "--backends", "fake_crash", "--launcher", "slurm", "--repeat", "2",
              "--wait", "--poll", "0.2", "--db", str(db))
    assert res.exit_code == 1, res.output  # as the local launcher's: a run failed
    stored = trials(db)
    assert sorted(stored) == [(1, "fake_crash"), (1, "fake_ok"), (2, "fake_crash"), (2, "fake_ok")]
    assert stored[1, "fake_crash"] == stored[2, "fake_crash"] == "failed"
    assert {stored[1, "fake_ok"], stored[2, "fake_ok"]} <= FINE


def _interrupt_round_2(monkeypatch, where: str) -> None:
    """Ctrl-C in round 2's submission: `sbatch`, its job not submitted; or `recorded`, once its job
    was submitted and slurm.json written into the first of its runs' folders only."""
    from framework_bench.run.launchers import base, slurm

    calls = {"sbatch": 0}
    real_run, real_save = slurm.subprocess.run, base.Submission.save

    def run(argv, *args, **kwargs):
        if argv[0] == "sbatch":
            calls["sbatch"] += 1
            if where == "sbatch" and calls["sbatch"] == 2:
                raise KeyboardInterrupt
        return real_run(argv, *args, **kwargs)

    def save(self):
        real_save(self)
        if where == "recorded" and calls["sbatch"] == 2 and self.compare_id is None:
            raise KeyboardInterrupt

    monkeypatch.setattr(slurm.subprocess, "run", run)
    monkeypatch.setattr(base.Submission, "save", save)


@pytest.mark.parametrize("where", ["sbatch", "recorded"])
def test_ctrl_c_in_round_2_of_a_slurm_compare_stores_every_run_once_with_its_round(cluster, tmp_path, where):
    db = tmp_path / "r.sqlite"
    with pytest.MonkeyPatch.context() as mp:
        _interrupt_round_2(mp, where)
        res = cli("compare", "--scenario", "tiny_cpu", "--backends", "fake_noisy", "--launcher", "slurm", "--repeat",
                  "2", "--db", str(db))
    assert res.exit_code == 130 and "interrupted" in res.stderr, res.output
    collect_until_done(db)
    stored = trials(db)
    assert sorted(stored) == [(1, "fake_noisy"), (1, "fake_ok"), (2, "fake_noisy"), (2, "fake_ok")]
    assert {stored[1, "fake_noisy"], stored[1, "fake_ok"]} <= FINE
    if where == "sbatch":  # round 2's job never submitted: its runs kept interrupted, saying so
        assert stored[2, "fake_noisy"] == stored[2, "fake_ok"] == "interrupted"
        with sqlite3.connect(db) as conn:
            reasons = [r for (r,) in conn.execute("SELECT reason FROM runs WHERE trial_round = 2")]
        assert all("before its round's job was submitted" in r for r in reasons), reasons
    else:  # round 2's job ran: its runs collected as the trials they are, with how they ended
        assert {stored[2, "fake_noisy"], stored[2, "fake_ok"]} <= FINE
    assert "ended before storing" not in cli("results", "list", "--db", str(db)).stderr
