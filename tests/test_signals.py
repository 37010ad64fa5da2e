"""SIGTERM, SIGHUP and a second Ctrl-C: the worker's whole process group stops, the run is a
stored `interrupted` row, the exit code is 130; and how a run's end is classified (exit codes,
OOM only with evidence). The fake backends' worker trains nothing (see test_compare.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from framework_bench.run.launchers import base, local
from framework_bench.cli import app
from framework_bench.store.results import ResultStore
from fbench_fixtures import ctrl_c_reaches_it, processes_mentioning


def start_fbench(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "from framework_bench.cli import app; app()", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=ctrl_c_reaches_it)


def wait_for_worker(home: Path, proc: subprocess.Popen, mode: str) -> None:
    deadline = time.monotonic() + 120
    while not any("fbench_fake_worker" in Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace")
                  and mode in Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace")
                  for p in processes_mentioning(str(home))):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the worker never started"
        time.sleep(0.1)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_to_run_stops_the_worker_and_stores_the_run(fakes, fbench_home, tmp_path, sig):
    db = tmp_path / "r.sqlite"
    proc = start_fbench("run", "--backend", "fake_hang", "--scenario", "tiny_cpu", "--db", str(db))
    wait_for_worker(fbench_home, proc, "hang")
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in err
    assert processes_mentioning(str(fbench_home)) == []  # the worker did not train on
    with ResultStore(db) as store:
        assert [r["status"] for r in store.list()] == ["interrupted"]


@pytest.mark.slow  # starts a framework's or the host's own process
def test_sighup_to_compare_keeps_finished_rows_and_prints_them(fakes, fbench_home, tmp_path):
    db = tmp_path / "r.sqlite"
    proc = start_fbench("compare", "--scenario", "tiny_cpu", "--backends", "fake_noisy,fake_hang,fake_ok",
                        "--db", str(db), "--out", str(tmp_path / "plots"))
    wait_for_worker(fbench_home, proc, "hang")
    proc.send_signal(signal.SIGHUP)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (out, err)
    assert processes_mentioning(str(fbench_home)) == []
    with ResultStore(db) as store:
        # fake_noisy's run waited for the round's reference (fake_ok, last), which never ran: stored unjudged
        assert [(r["backend"], r["status"]) for r in store.list()] == [("fake_noisy", "unverified"),
                                                                          ("fake_hang", "interrupted")]
    assert "fake_noisy" in out and "interrupted" in out  # the table of what finished


@pytest.mark.slow  # starts a framework's or the host's own process
def test_ctrl_c_in_a_warm_up_round_leaves_rows_every_command_reads(fakes, fbench_home, tmp_path):
    """`--repeat 3` on CPU starts with a warm-up round (round 0, never counted): stopped there, its
    rows are the only runs of their backends, which no trial summarises. The compare raised a
    KeyError (exit 1, not 130), and so did every later chart, report and listing of that store."""
    db, out = tmp_path / "r.sqlite", tmp_path / "plots"
    proc = start_fbench("compare", "--scenario", "tiny_cpu", "--backends", "fake_noisy,fake_hang", "--repeat", "3",
                        "--db", str(db), "--out", str(out))
    wait_for_worker(fbench_home, proc, "hang")
    proc.send_signal(signal.SIGINT)
    stdout, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in err, (stdout, err)
    with ResultStore(db) as store:
        assert [(r["backend"], r["trial_round"]) for r in store.list()] == [("fake_noisy", 0), ("fake_hang", 0)]
    cli = CliRunner()
    for command in (["plot", "--out", str(out)], ["report", "--out", str(out)], ["results", "list"]):
        res = cli.invoke(app, [*command, "--db", str(db)])
        assert res.exit_code == 0 and "Traceback" not in res.output, (command, res.output)
    res = cli.invoke(app, ["compare", "--scenario", "tiny_cpu", "--backends", "fake_ok", "--db", str(db), "--out", str(out)])
    assert res.exit_code == 0, res.output  # its charts and report read the stopped compare's rows too


def test_warm_up_rounds_alone_are_rows_of_no_trial():
    """Two warm-up rounds stopped before any counted one: `results list` reads them as a compare of
    several rounds; the table shows each point's own run, 0 trials."""
    from framework_bench.present.verdict import Points
    rows = [{"id": i, "backend": b, "scenario": "tiny_cpu", "tgs": 900.0, "status": "ok", "trial_round": r}
            for i, (r, b) in enumerate(((-1, "a"), (-1, "ref"), (0, "a")), 1)]
    points = Points(rows, "ref")
    assert [(r["backend"], r["trials"]) for r in points.rows] == [("a", 0), ("ref", 0)]
    assert points.summaries["tiny_cpu", "a"].trials == 0 and points.lines == []


@pytest.mark.slow  # starts a framework's or the host's own process
def test_a_second_ctrl_c_while_the_worker_stops_loses_nothing(fakes, fbench_home, tmp_path, monkeypatch):
    """The stubborn worker ignores SIGTERM, so stopping it takes the host's whole grace (10 s,
    here 5 s); a second Ctrl-C in that time must neither orphan it nor lose its row or the table."""
    monkeypatch.setattr(local, "STOP_GRACE_S", 5.0)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = None

    def second_ctrl_c():
        nonlocal timer
        # once the first Ctrl-C has arrived (the worker sent it) and the host is stopping the worker
        timer = threading.Timer(2.5, os.kill, (os.getpid(), signal.SIGINT))
        timer.start()

    db = tmp_path / "r.sqlite"
    watcher = threading.Thread(target=lambda: (wait_for_stubborn(fbench_home), second_ctrl_c()), daemon=True)
    watcher.start()
    try:
        res = CliRunner().invoke(app, ["compare", "--scenario", "tiny_cpu", "--backends", "fake_noisy,fake_stubborn",
                                       "--db", str(db), "--out", str(tmp_path / "plots")])
    finally:
        signal.signal(signal.SIGINT, previous)
        if timer:
            timer.cancel()
    assert res.exit_code == 130, res.output
    with ResultStore(db) as store:
        assert [(r["backend"], r["status"]) for r in store.list()] == [("fake_noisy", "unverified"),
                                                                          ("fake_stubborn", "interrupted")]
    assert "fake_noisy" in res.stdout and "fake_stubborn" in res.stdout
    assert processes_mentioning(str(fbench_home)) == []


def wait_for_stubborn(home: Path) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if any("stubborn" in Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace")
               for p in processes_mentioning(str(home))):
            return
        time.sleep(0.1)


# 12. Exit codes

@pytest.mark.slow  # starts a framework's or the host's own process
def test_exit_codes_of_run(fakes, fbench_home, tmp_path):
    db = ["--db", str(tmp_path / "r.sqlite")]
    assert CliRunner().invoke(app, ["run", "--backend", "fake_ok", "--scenario", "tiny_cpu", *db]).exit_code == 0
    crashed = CliRunner().invoke(app, ["run", "--backend", "fake_crash", "--scenario", "tiny_cpu", *db])
    assert crashed.exit_code == 1 and "failed" in crashed.stdout
    published = CliRunner().invoke(app, ["run", "--backend", "fake_ok", "--scenario", "yi34b_128k", *db])
    assert published.exit_code == 0 and "unsupported" in published.stdout


def test_a_missing_env_is_a_failed_run_not_unsupported(fbench_home, tmp_path):
    """No env made (an empty FBENCH_HOME): the run cannot start; that is a setup to finish."""
    res = CliRunner().invoke(app, ["run", "--backend", "xtuner", "--scenario", "tiny_cpu",
                                   "--db", str(tmp_path / "r.sqlite")])
    assert res.exit_code == 1, res.output
    assert "failed" in res.stdout and "fbench env create xtuner" in res.stdout
    res = CliRunner().invoke(app, ["compare", "--scenario", "tiny_cpu", "--backends", "xtuner",
                                   "--db", str(tmp_path / "r.sqlite"), "--out", str(tmp_path / "plots")])
    assert res.exit_code == 1, res.output


# 12. OOM only with evidence

def _execute(tmp_path: Path, *codes: str) -> base.Outcome:
    return local.execute([[sys.executable, "-c", c] for c in codes], {}, tmp_path, tmp_path / "worker.log", 60)


def test_sigkill_without_evidence_is_failed_not_oom(tmp_path):
    out = _execute(tmp_path, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert out.status == "failed" and out.returncode == -signal.SIGKILL
    assert "killed by SIGKILL, with no sign of running out of memory" in out.log_tail


def test_an_oom_message_far_above_the_tail_is_found(tmp_path):
    code = ("import sys; print('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB', flush=True); "
            "[print(f'cleanup line {i}') for i in range(5000)]; sys.exit(1)")
    out = _execute(tmp_path, code)
    assert out.status == "oom" and "CUDA out of memory" not in out.log_tail  # only the whole log had it


def test_an_oom_on_another_node_counts(tmp_path):
    node0 = "import sys, time; time.sleep(1); print('rank 0: peer gone'); sys.exit(1)"
    node1 = "import time; print('CUDA out of memory. Tried to allocate 1.00 GiB', flush=True); time.sleep(60)"
    out = _execute(tmp_path, node0, node1)
    assert out.status == "oom" and "peer gone" in out.log_tail
