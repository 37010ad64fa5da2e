"""Fault injection: each fault at each stage of a compare, and then exactly one
stored row for the run (or, where even the fallback folder's disk is full, the row printed
as JSON and exit 1) and no process of it left.

Faults: SIGKILL of the host; SIGSTOP of the worker (mid-training: the only stage with a
worker); ENOSPC, by filling a small tmpfs holding FBENCH_HOME (the store's own tmpfs at the
`store` stage) or, where mounting is not allowed, a read-only folder; an exclusive lock on the
store held longer than the host waits (the waits scaled down: SQLite's wait 0.5 s, the patience
1.5 s, the lock 2.5 s, where fbench's defaults are 30 s and 10 min). Stages: packing, after the
plan, mid-training, after the worker exits, figures, store, report. The host is the real CLI
in its own process; the fault is triggered from inside it on entering the stage's function.
The fake backend's worker trains nothing (0.4 s a step); one real tiny run is killed mid-training.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from fbench_fixtures import FAKES, backend_env_or_skip, end_processes_mentioning as _end, processes_mentioning

# Each case is the whole host in its own process, a fault injected into it: the slow part of the suite.
pytestmark = pytest.mark.slow

STAGES = {  # stage: (module, function) the fault is triggered on entering
    "packing": ("framework_bench.run.pipeline", "pack"),
    "after_plan": ("framework_bench.run.launchers.local", "execute"),
    "mid_training": ("framework_bench.run.readback", "read_metrics"),
    "worker_exited": ("framework_bench.run.pipeline", "finish"),
    "figures": ("framework_bench.measure.metrics", "figures"),
    "store": ("framework_bench.store.unstored", "save"),
    "report": ("framework_bench.cli.common", "charts_and_report"),
}

# The host: the CLI with one stage's function wrapped to apply the fault first.
HOST = r'''
import errno, importlib, os, signal, subprocess, sys, time
from pathlib import Path
module, function, fault, stage, full, db = sys.argv[1:7]
from framework_bench import cli
from framework_bench.store import locks
from framework_bench.data import packing
locks.LOCK_WAIT, locks.LOCK_PATIENCE = 0.5, 1.5
packing.FREE_SPACE_MARGIN = 0  # the small disks of this test hold the tiny scenario's few kB
target = importlib.import_module(module)
original = getattr(target, function)
done = []

def fill(folder):
    """ENOSPC from now on under `folder`: a tmpfs filled up, else the folder made read-only."""
    if os.path.ismount(folder):
        fd = os.open(os.path.join(folder, "filler"), os.O_WRONLY | os.O_CREAT)
        try:
            while True:
                os.write(fd, b"\0" * (1 << 16))
        except OSError as e:
            assert e.errno == errno.ENOSPC, e
        finally:
            os.close(fd)
    else:
        for root, dirs, files in os.walk(folder):
            os.chmod(root, 0o555)

def inject():
    if fault == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif fault == "enospc":
        fill(full)
    elif fault == "lock":
        locker = subprocess.Popen([sys.executable, "-c",
            "import sqlite3, sys, time; c = sqlite3.connect(sys.argv[1], timeout=30); c.execute('BEGIN EXCLUSIVE');"
            "print('held', flush=True); time.sleep(2.5)", db], stdout=subprocess.PIPE, text=True)
        locker.stdout.readline()
    elif fault == "sigstop":
        home = os.environ["FBENCH_HOME"].encode()
        for entry in Path("/proc").iterdir():
            try:
                if entry.name.isdigit() and home in (entry / "cmdline").read_bytes() and int(entry.name) != os.getpid():
                    os.kill(int(entry.name), signal.SIGSTOP)
            except OSError:
                pass

def wrapped(*args, **kwargs):
    if not done:
        if stage != "mid_training":
            done.append(1)
            inject()
        else:  # the poll's read: once two steps are written, the worker is mid-training
            steps = original(*args, **kwargs)
            if len(steps) >= 2:
                done.append(1)
                inject()
            return steps
    return original(*args, **kwargs)

setattr(target, function, wrapped)
sys.argv = ["fbench", *sys.argv[7:]]
cli.app()
'''


def _mount_tmpfs(folder: Path, size: str) -> bool:
    folder.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                          capture_output=True).returncode == 0


def _mount_disks(folder: Path) -> tuple[Path, Path, list[Path]]:
    """Two small filesystems: FBENCH_HOME's and the store's (tmpfs where mounting is allowed)."""
    home, store = folder / "home", folder / "store"
    return home, store, [d for d in (home, store) if _mount_tmpfs(d, "32m")]


def _unmount_disks(home: Path, store: Path, mounted: list[Path]) -> None:
    for d in (home, store):
        for root, dirs, files in os.walk(d):
            os.chmod(root, 0o755)
    for d in mounted:
        subprocess.run(["umount", "-l", str(d)], capture_output=True)


def _free(folder: Path) -> None:
    (folder / "filler").unlink(missing_ok=True)
    for root, dirs, files in os.walk(folder):
        os.chmod(root, 0o755)


def _wait_until_gone(text: str, seconds: float = 10) -> None:
    """Until no live process mentions `text` (at most `seconds`)."""
    deadline = time.monotonic() + seconds
    while processes_mentioning(text) and time.monotonic() < deadline:
        time.sleep(0.1)


def _rows(db: Path) -> list[tuple[str, str]]:
    if not db.exists():
        return []
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT backend, status FROM runs").fetchall()


def _inject(fault: str, stage: str, backend: str, home: Path, db: Path, full: Path, env: dict,
            *extra: str) -> subprocess.CompletedProcess:
    module, function = STAGES[stage]
    argv = [sys.executable, "-c", HOST, module, function, fault, stage, str(full), str(db),
            "compare", "--scenario", "tiny_cpu", "--backends", backend, "--db", str(db),
            "--out", str(home / "plots"), "--no-reference", *extra]  # one run: what the faults must not lose
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, env={**env, "FBENCH_HOME": str(home)})


@dataclass
class Outcome:
    """One case, read after its host and one more command (which stores what the host could not)."""
    host: subprocess.CompletedProcess
    after: subprocess.CompletedProcess
    left: list[int]  # processes of the run still alive
    rows: list[tuple[str, str]]


def _after(host: subprocess.CompletedProcess, home: Path, db: Path, env: dict) -> Outcome:
    time.sleep(0.5)
    after = subprocess.run([sys.executable, "-c", "from framework_bench.cli import app; app()", "results", "list",
                            "--db", str(db)], capture_output=True, text=True, timeout=120,
                           env={**env, "FBENCH_HOME": str(home)})
    return Outcome(host, after, processes_mentioning(str(home)), _rows(db))


def _assert_one_row_or_printed(o: Outcome) -> None:
    """One row, or the row printed as JSON; and no process of the run left."""
    assert "Traceback" not in o.host.stderr + o.after.stderr, (o.host.stderr, o.after.stderr)
    assert o.left == []
    printed = [l for l in o.host.stderr.splitlines() if l.startswith('{"result"')]
    if not o.rows and "needs" in o.host.stderr and "free some space" in o.host.stderr:
        return  # a full disk found by packing's own check: refused before anything ran, said in one line
    assert len(o.rows) + len(printed) == 1, (o.rows, o.host.returncode, o.host.stderr[-3000:], o.after.stderr)
    if printed:
        assert o.host.returncode == 1 and json.loads(printed[0])["result"]["backend"]


def _case(fault: str, stage: str, folder: Path, env: dict) -> Outcome:
    """The fake backend's compare with `fault` injected at `stage`, on its own two small disks."""
    home, store, mounted = _mount_disks(folder)
    db = store / "r.sqlite"
    full = store if stage == "store" else home
    extra = ("--timeout", "6") if fault == "sigstop" else ()
    try:
        host = _inject(fault, stage, "fake_slow", home, db, full, env, *extra)
        if fault == "lock":
            _wait_until_gone(str(db))  # the lock's holder ends (it holds the lock 2.5 s)
        _free(full)
        return _after(host, home, db, env)
    finally:
        _end(home)
        _unmount_disks(home, store, mounted)


CASES = [(fault, stage) for fault in ("kill", "enospc", "lock") for stage in STAGES] + [("sigstop", "mid_training")]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[tuple[str, str], Outcome]:
    """Every case at once, four at a time: each host mostly waits (on its fake worker's steps, the
    lock, the store's back-off), so together they take a fraction of one after another."""
    site = tmp_path_factory.mktemp("site")
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(FAKES))
        import fbench_fake_backends
        fbench_fake_backends.register_through_entry_points(site)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(FAKES), str(site), os.environ.get("PYTHONPATH", "")])}
    with ThreadPoolExecutor(4) as pool:
        futures = {case: pool.submit(_case, *case, tmp_path_factory.mktemp("-".join(case)), env) for case in CASES}
    return {case: future.result() for case, future in futures.items()}


@pytest.mark.parametrize("stage", list(STAGES))
@pytest.mark.parametrize("fault", ["kill", "enospc", "lock"])
def test_each_fault_at_each_stage_leaves_one_row_and_no_process(outcomes, fault, stage):
    outcome = outcomes[fault, stage]
    if fault == "kill":
        assert outcome.host.returncode == -signal.SIGKILL
    _assert_one_row_or_printed(outcome)


def test_a_worker_stopped_mid_training_ends_as_a_timeout_row(outcomes):
    outcome = outcomes["sigstop", "mid_training"]
    assert outcome.host.returncode == 1
    _assert_one_row_or_printed(outcome)
    assert outcome.rows == [("fake_slow", "timeout")]


def test_a_real_tiny_run_killed_mid_training_is_one_failed_row_and_no_process(tmp_path):
    """The torch backend's real worker (its env from the checkout's FBENCH_HOME), its host
    killed with SIGKILL between two steps."""
    from framework_bench.envs import venvs as envs
    backend_env_or_skip("torch")
    home = tmp_path / "home"
    home.mkdir()
    (home / "envs").symlink_to(envs.fbench_home().resolve() / "envs")
    db = tmp_path / "r.sqlite"
    env = dict(os.environ)
    try:
        host = _inject("kill", "mid_training", "torch", home, db, home, env)
        assert host.returncode == -signal.SIGKILL, host.stderr[-2000:]
        outcome = _after(host, home, db, env)
        _assert_one_row_or_printed(outcome)
        assert outcome.rows == [("torch", "failed")]
    finally:
        _end(home)
