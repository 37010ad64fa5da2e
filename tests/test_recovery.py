"""What the next command stores of a compare whose fbench was killed (`kill -9`): every run folder
once, each row with its compare id, round and place in the round, and with how its run ended: a
run that had ended is stored with its own status (`unverified` where it ended `ok`: its round
never judged it), one still running `failed` saying the host died. Two commands starting at once
recover each run once, even where the kill left SQLite's journal of a write half done."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fbench_fixtures import end_processes_mentioning, processes_mentioning
from framework_bench.cli import app
from framework_bench.measure.metrics import RunResult
from framework_bench.run import orphans
from framework_bench.run.options import Trial
from framework_bench.scenario import scenario
from framework_bench.store.results import ResultStore

DEAD = 2**22 + 1  # above any pid Linux hands out


def cli(*args: str):
    res = CliRunner().invoke(app, list(args))
    assert res.exception is None or isinstance(res.exception, SystemExit), res.output  # no host traceback
    return res


def stored_once(db: Path) -> dict[str, dict]:
    """The rows by backend, after `results list` and `results export` read them: every run folder once."""
    listed, exported = cli("results", "list", "--all", "--db", str(db)), cli("results", "export", "--format", "json",
                                                                                "--db", str(db))
    assert listed.exit_code == 0 and exported.exit_code == 0, listed.output + exported.output
    rows = json.loads(exported.stdout)
    assert len({r["run_dir"] for r in rows}) == len(rows), rows
    return {r["backend"]: r for r in rows}


def _dead_hosts_run(runs: Path, db: Path, backend: str, position: int, ended: str | None) -> Path:
    """A run folder claimed by a host that is gone, as trial `position` of round 2 of compare `c1`;
    `ended`: the status of the result.json its read-back left (None: it was still running)."""
    run_dir = runs / f"20260101-000000-tiny_cpu-{backend}-00000{position}"
    orphans.claim(run_dir, db, backend, scenario.load("tiny_cpu"), "matched",
                  Trial(compare_id="c1", trial_round=2, trial_position=position))
    (run_dir / "job.json").write_text("{}")
    if ended:
        (run_dir / "result.json").write_text(RunResult(backend=backend, scenario="tiny_cpu", status=ended, tgs=100.0,
                                                       run_dir=run_dir).model_dump_json())
    record = json.loads((run_dir / orphans.HOST_FILE).read_text())
    (run_dir / orphans.HOST_FILE).write_text(json.dumps(record | {"pid": DEAD, "started": "1"}))
    return run_dir


def test_a_dead_hosts_runs_are_stored_as_the_trials_they_were_with_how_they_ended(fbench_home, tmp_path):
    db, runs = tmp_path / "r.sqlite", fbench_home / "runs"
    ResultStore(db).close()  # made by the compare before its first run
    _dead_hosts_run(runs, db, "fake_a", 1, "ok")
    _dead_hosts_run(runs, db, "fake_b", 2, "oom")
    _dead_hosts_run(runs, db, "fake_c", 3, None)
    rows = stored_once(db)
    assert {b: (r["compare_id"], r["trial_round"], r["trial_position"]) for b, r in rows.items()} == {
        "fake_a": ("c1", 2, 1), "fake_b": ("c1", 2, 2), "fake_c": ("c1", 2, 3)}
    assert rows["fake_a"]["status"] == "unverified" and "never judged" in rows["fake_a"]["reason"]
    assert rows["fake_a"]["tgs"] == 100.0  # its figures, as read back before the host died
    assert rows["fake_b"]["status"] == "oom"
    assert rows["fake_c"]["status"] == "failed" and "died during the run" in rows["fake_c"]["reason"]
    assert not list(runs.glob(f"*/{orphans.HOST_FILE}*"))
    assert "ended before storing" not in cli("results", "list", "--db", str(db)).stderr  # once


def _start_host(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "from framework_bench.cli import app; app()", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow  # the host in its own process, killed
def test_kill_9_of_a_compare_then_the_next_command_stores_its_trials_once_with_their_round(fakes, fbench_home,
                                                                                             tmp_path):
    db = tmp_path / "r.sqlite"
    proc = _start_host("compare", "--scenario", "tiny_cpu", "--backends", "fake_noisy,fake_slow", "--warmup-rounds",
                       "0", "--db", str(db), "--out", str(tmp_path / "plots"))
    try:
        deadline = time.monotonic() + 120
        while not any(b"fake_slow" in Path(f"/proc/{p}/cmdline").read_bytes() for p in processes_mentioning(
                str(fbench_home))):  # fake_noisy ended ok; fake_slow trains
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        proc.kill()
        proc.communicate()
        rows = stored_once(db)
    finally:
        end_processes_mentioning(fbench_home)
    assert sorted(rows) == ["fake_noisy", "fake_slow"]
    assert len({r["compare_id"] for r in rows.values()} - {None}) == 1
    assert {b: (r["trial_round"], r["trial_position"]) for b, r in rows.items()} == {"fake_noisy": (1, 1),
                                                                                    "fake_slow": (1, 2)}
    # fake_noisy had ended (ok, unless a loaded machine failed one of its own checks): stored as it ended,
    # never judged; fake_slow was training
    ended = json.loads((Path(rows["fake_noisy"]["run_dir"]) / "result.json").read_text())["status"]
    assert rows["fake_noisy"]["status"] == {"ok": "unverified"}.get(ended, ended), rows["fake_noisy"]["reason"]
    assert "died during the run" not in (rows["fake_noisy"]["reason"] or "")
    assert ended != "ok" or "never judged" in rows["fake_noisy"]["reason"]
    assert rows["fake_slow"]["status"] == "failed" and "died during the run" in rows["fake_slow"]["reason"]


def _kill_mid_write(db: Path) -> None:
    """A process killed inside a write transaction on `db`: SQLite's journal of it is left hot, to be
    rolled back by the next connection that may write."""
    code = ("import os, signal, sqlite3, sys\nconn = sqlite3.connect(sys.argv[1])\n"
            "conn.execute('PRAGMA cache_size = 1')\nconn.execute('BEGIN IMMEDIATE')\n"  # written through to the file
            "conn.execute(\"UPDATE runs SET reason = 'half written'\")\nconn.execute('CREATE TABLE half (x)')\n"
            "for _ in range(200): conn.execute('INSERT INTO half VALUES (randomblob(500))')\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n")
    subprocess.run([sys.executable, "-c", code, str(db)])
    assert db.with_name(db.name + "-journal").exists()


@pytest.mark.slow  # two commands in their own processes at once
def test_two_commands_at_once_after_a_kill_mid_write_recover_each_run_once(fbench_home, tmp_path):
    db, runs = tmp_path / "r.sqlite", fbench_home / "runs"
    with ResultStore(db) as store:
        store.add(RunResult(backend="fake_ok", scenario="tiny_cpu", status="ok", compare_id="c1", trial_round=2,
                            trial_position=4), scenario.load("tiny_cpu"), {})
    for position, backend in enumerate(("fake_a", "fake_b", "fake_c"), 1):
        _dead_hosts_run(runs, db, backend, position, "ok")
    _kill_mid_write(db)
    procs = [_start_host("results", "list", "--db", str(db)) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert sum(err.count("ended before storing") for _, err in outs) == 3, outs
    rows = stored_once(db)
    assert sorted(rows) == ["fake_a", "fake_b", "fake_c", "fake_ok"]
    assert all(r["compare_id"] == "c1" and r["trial_round"] == 2 for r in rows.values())
    assert rows["fake_ok"]["reason"] is None  # the killed write rolled back
    assert not list(runs.glob(f"*/{orphans.HOST_FILE}*"))


def test_a_store_left_mid_write_by_a_killed_process_is_read(fbench_home, tmp_path):
    db = tmp_path / "r.sqlite"
    with ResultStore(db) as store:
        store.add(RunResult(backend="fake_ok", scenario="tiny_cpu", status="ok"), scenario.load("tiny_cpu"), {})
    _kill_mid_write(db)
    assert [r["status"] for r in stored_once(db).values()] == ["ok"]


def test_the_claim_on_a_run_folder_names_the_trial(fbench_home, tmp_path):
    run_dir = tmp_path / "run"
    orphans.claim(run_dir, tmp_path / "r.sqlite", "fake_ok", scenario.load("tiny_cpu"), "matched",
                  Trial(compare_id="c1", trial_round=3, trial_position=2))
    record = json.loads((run_dir / orphans.HOST_FILE).read_text())
    assert record["trial"] == {"compare_id": "c1", "trial_round": 3, "trial_position": 2}
    assert record["pid"] == os.getpid() and record["hostname"] == socket.gethostname()


def test_a_run_its_dead_host_had_submitted_to_slurm_is_left_to_results_collect(fbench_home, tmp_path):
    """Killed between sbatch and recording the trial: the job is the run's, not a failed row (which
    `results collect` would have stored a second time), and it is collected as its trial."""
    from framework_bench.run.launchers.base import Submission
    db = tmp_path / "r.sqlite"
    ResultStore(db).close()
    run_dir = _dead_hosts_run(fbench_home / "runs", db, "fake_a", 2, None)
    Submission(job_id="1001", backend="fake_a", scenario="tiny_cpu", run_dir=run_dir, submitted_at="x",
               time_limit="00:11:00", db=str(db)).save()  # as sbatch's answer left it: no trial yet
    lines = orphans.recover(fbench_home / "runs")
    assert len(lines) == 1 and "SLURM job 1001" in lines[0] and "results collect" in lines[0], lines
    sub = Submission.load(run_dir)
    assert (sub.compare_id, sub.trial_round, sub.trial_position) == ("c1", 2, 2)
    assert ResultStore(db).list() == [] and not (run_dir / orphans.HOST_FILE).exists()
