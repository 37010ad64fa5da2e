"""No run lost, no impossible figure stored: whatever happens once a worker is
launched (a bad metrics line, an exception in the figures, a full disk, a locked store, a
dead host), exactly one row is stored per run and no process of it is left; figures no
step can give make the run `invalid`, never `inf`. The fake backends' workers train nothing:
each writes one kind of line no real measurement can be, or the plugin has one bug."""

from __future__ import annotations

import json
import math
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from framework_bench.run.launchers import local
from framework_bench.store import locks, results, unstored
from env_helpers import sdk_wheels  # noqa: F401 - a fixture
from framework_bench.cli import app
from framework_bench.store.results import ResultStore
from fbench_fixtures import end_processes_mentioning as _end, processes_mentioning


def cli(*args: str):
    res = CliRunner().invoke(app, list(args))
    assert res.exception is None or isinstance(res.exception, SystemExit), res.output  # no host traceback
    return res


def rows(db: Path) -> list[dict]:
    with ResultStore(db) as store:
        return store.list()


def run_fake(backend: str, db: Path, *extra: str):
    """One fake's run, then the reference's that judges it (fake_ok stands in: the `fakes` fixture)."""
    return cli("run", "--backend", backend, "--scenario", "tiny_cpu", "--db", str(db), *extra)


def one_row(db: Path, home: Path) -> dict:
    """The run's single stored row (beside the reference's, when the run was another backend's);
    and nothing of its worker left running."""
    stored = rows(db)
    mine = [r for r in stored if r["backend"] != "fake_ok"] or stored
    assert len(mine) == 1, stored
    assert processes_mentioning(str(home)) == []
    return mine[0]


# ---------------------------------------------------------------------------------------
# 1-6: rows lost


@pytest.mark.slow  # starts a framework's or the host's own process
def test_a_garbage_line_read_during_the_run_is_one_failed_row(fakes, fbench_home, tmp_path):
    db = tmp_path / "r.sqlite"
    res = run_fake("fake_garbage_line", db)
    row = one_row(db, fbench_home)
    assert res.exit_code == 1 and row["status"] == "failed" and "fbench_read_report" in row["reason"]


@pytest.mark.slow  # starts a framework's or the host's own process
def test_seconds_that_are_no_number_are_one_failed_row(fakes, fbench_home, tmp_path):
    db = tmp_path / "r.sqlite"
    res = run_fake("fake_slow_seconds", db)
    row = one_row(db, fbench_home)
    assert res.exit_code == 1 and row["status"] == "failed" and "seconds" in row["reason"]


def test_a_full_run_folder_costs_result_json_not_the_row(fakes, fbench_home, tmp_path):
    db = tmp_path / "r.sqlite"
    res = run_fake("fake_full_disk", db)
    row = one_row(db, fbench_home)
    assert res.exit_code == 0 and row["status"] == "ok" and row["tgs"] > 0
    assert any("result.json not written" in n and "No space left" in n for n in row["notes"]), row["notes"]


def test_a_plugin_that_removes_its_run_folder_still_gets_its_row(fakes, fbench_home, tmp_path):
    db = tmp_path / "r.sqlite"
    res = run_fake("fake_rm_run_dir", db)
    row = one_row(db, fbench_home)
    # Its report read the consumed rows back from the folder it had removed: a claim not made,
    # which leaves a contract-1 plugin's run `unverified` (never invalid), stored all the same.
    assert res.exit_code == 0 and row["status"] == "unverified" and "rows" in row["reason"]
    assert any("result.json not written" in n for n in row["notes"])


def _hold_lock(db: Path, seconds: float, held: threading.Event) -> threading.Thread:
    def hold():
        conn = sqlite3.connect(db, timeout=5, check_same_thread=False)
        conn.execute("BEGIN EXCLUSIVE")
        held.set()
        time.sleep(seconds)
        conn.rollback()
        conn.close()
    return threading.Thread(target=hold, daemon=True)


@pytest.mark.slow  # starts a framework's or the host's own process
def test_a_store_locked_for_longer_than_sqlites_wait_takes_the_row_after_backing_off(fakes, fbench_home, tmp_path,
                                                                                    monkeypatch):
    db = tmp_path / "r.sqlite"
    ResultStore(db).close()
    monkeypatch.setattr(locks, "LOCK_WAIT", 0.2)  # SQLite's own wait, short: the back-off must do the rest
    monkeypatch.setattr(locks, "LOCK_PATIENCE", 60.0)
    held = threading.Event()
    with ResultStore(db) as store:
        thread = _hold_lock(db, 3, held)
        thread.start()
        held.wait(10)
        from framework_bench.scenario import scenario
        started = time.monotonic()
        unstored.save(store, results.RunResult(backend="fake_ok", scenario="tiny_cpu", status="failed", reason="x"),
                     scenario.load("tiny_cpu"))
        assert time.monotonic() - started > 2  # it waited for the lock rather than failing
    thread.join()
    assert [r["reason"] for r in rows(db)] == ["x"]


@pytest.mark.slow  # starts a framework's or the host's own process
def test_a_store_locked_past_the_patience_keeps_the_row_for_the_next_command(fakes, fbench_home, tmp_path,
                                                                            monkeypatch):
    db = tmp_path / "r.sqlite"
    ResultStore(db).close()
    monkeypatch.setattr(locks, "LOCK_WAIT", 0.2)
    monkeypatch.setattr(locks, "LOCK_PATIENCE", 1.0)
    conn = sqlite3.connect(db, timeout=5)

    def lock_once_training_ends(*args, **kwargs):
        conn.execute("BEGIN EXCLUSIVE")  # another process holds the store when the row comes
        return real_save(*args, **kwargs)

    real_save = unstored.save
    monkeypatch.setattr(unstored, "save", lock_once_training_ends)
    res = run_fake("fake_ok", db)
    assert res.exit_code == 0 and "kept in" in res.stderr and "next fbench command stores it" in res.stderr
    conn.rollback()
    conn.close()
    monkeypatch.setattr(unstored, "save", real_save)
    assert rows(db) == []
    res = cli("results", "list", "--db", str(db))
    assert "recovered the ok run of fake_ok on tiny_cpu" in res.stderr and "database is locked" in res.stderr
    assert [r["status"] for r in rows(db)] == ["ok"]
    assert "recovered" not in cli("results", "list", "--db", str(db)).stderr  # stored once, never twice


def test_when_neither_the_store_nor_the_folder_beside_it_can_take_a_row_it_is_printed(fakes, fbench_home, tmp_path,
                                                                                     monkeypatch):
    db = tmp_path / "r.sqlite"
    ResultStore(db).close()
    (tmp_path / "r.sqlite.unstored").write_text("a file where the fallback folder belongs")
    monkeypatch.setattr(locks, "LOCK_WAIT", 0.2)
    monkeypatch.setattr(locks, "LOCK_PATIENCE", 0.5)
    conn = sqlite3.connect(db, timeout=5)
    real_save = unstored.save

    def lock_then_save(*args, **kwargs):
        conn.execute("BEGIN EXCLUSIVE")
        return real_save(*args, **kwargs)

    monkeypatch.setattr(unstored, "save", lock_then_save)
    res = run_fake("fake_ok", db)
    conn.rollback()
    assert res.exit_code == 1 and "printed above as JSON" in res.stderr
    record = json.loads(next(l for l in res.stderr.splitlines() if l.startswith("{")))
    assert record["result"]["backend"] == "fake_ok" and record["result"]["status"] == "ok"
    assert processes_mentioning(str(fbench_home)) == []


@pytest.mark.parametrize("backend", ["fake_huge_tokens", "fake_huge_memory", "fake_negative_rank"])
@pytest.mark.slow  # starts a framework's or the host's own process
def test_values_sqlite_cannot_hold_are_one_failed_row(fakes, fbench_home, tmp_path, backend):
    db = tmp_path / "r.sqlite"
    res = run_fake(backend, db)
    row = one_row(db, fbench_home)
    assert res.exit_code == 1 and row["status"] == "failed" and "fbench_read_report" in row["reason"]


def test_a_context_no_row_can_hold_is_refused_when_the_scenario_is_read(tmp_path):
    path = tmp_path / "huge.yaml"
    path.write_text("model: {preset: tiny}\ncontext_length: 1000000000000000000000000000000\nextend_positions: true\n")
    res = cli("validate", str(path))
    assert res.exit_code == 1 and "context_length" in res.stderr and "less than or equal" in res.stderr


@pytest.mark.parametrize("first", ["fake_inf_seconds", "fake_zero_tokens"])
@pytest.mark.slow  # starts a framework's or the host's own process
def test_steps_without_a_rate_do_not_abort_the_compare(fakes, fbench_home, tmp_path, first):
    db = tmp_path / "r.sqlite"
    res = cli("compare", "--scenario", "tiny_cpu", "--backends", f"{first},fake_ok", "--db", str(db),
              "--out", str(tmp_path / "plots"))
    stored = {r["backend"]: r for r in rows(db)}
    assert stored["fake_ok"]["status"] == "ok"  # the later backend ran
    assert stored[first]["status"] in ("failed", "invalid") and stored[first]["tgs"] is None
    assert res.exit_code == 1


@pytest.mark.parametrize("backend, needle", [("fake_missing_python", "could not start /nonexistent"),
                                             ("fake_nul_env", "embedded null byte"),
                                             ("fake_long_argv", "could not start")])
def test_a_launch_that_cannot_start_is_a_failed_row(fakes, fbench_home, tmp_path, backend, needle):
    db = tmp_path / "r.sqlite"
    res = run_fake(backend, db)
    row = one_row(db, fbench_home)
    assert res.exit_code == 1 and row["status"] == "failed" and needle in row["reason"], row["reason"]


def test_an_exception_in_the_figures_is_a_failed_row(fakes, fbench_home, tmp_path, monkeypatch):
    from framework_bench.measure import metrics

    def broken(*args, **kwargs):
        raise ArithmeticError("a bug in the figures")

    monkeypatch.setattr(metrics, "figures", broken)
    db = tmp_path / "r.sqlite"
    res = run_fake("fake_ok", db)
    row = one_row(db, fbench_home)
    assert res.exit_code == 1 and row["status"] == "failed" and "a bug in the figures" in row["reason"]


def test_an_exception_in_the_hosts_poll_stops_the_worker(tmp_path):
    marker = str(tmp_path / "poll-raises")

    def poll():
        raise RuntimeError("the host fell over")

    with pytest.raises(RuntimeError):
        local.execute([[sys.executable, "-c", "import time; time.sleep(60)", marker]], {}, tmp_path,
                       tmp_path / "w.log", poll=poll)
    assert processes_mentioning(marker) == []


# ---------------------------------------------------------------------------------------
# 7: orphans


def _start_host(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "from framework_bench.cli import app; app()", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(home: Path, proc: subprocess.Popen, text: str = "fbench_fake_worker") -> None:
    deadline = time.monotonic() + 120
    while not any(text in Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace")
                  for p in processes_mentioning(str(home))):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the worker never started"
        time.sleep(0.1)


def _gone(home: Path, within: float) -> bool:
    deadline = time.monotonic() + within
    while processes_mentioning(str(home)):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_kill_9_of_the_host_ends_its_worker(fakes, fbench_home, tmp_path):
    proc = _start_host("run", "--backend", "fake_hang", "--scenario", "tiny_cpu", "--db", str(tmp_path / "r.sqlite"))
    try:
        _wait_for(fbench_home, proc)
        proc.kill()
        proc.wait()
        assert _gone(fbench_home, 15), "the worker outlived its host"
    finally:
        _end(fbench_home)


@pytest.mark.slow  # starts a framework's or the host's own process
def test_the_next_command_stores_the_run_of_a_dead_host_and_says_so(fakes, fbench_home, tmp_path):
    db = tmp_path / "r.sqlite"
    proc = _start_host("run", "--backend", "fake_deaf", "--scenario", "tiny_cpu", "--db", str(db))
    try:
        deadline = time.monotonic() + 120
        while not list((fbench_home / "runs").glob("*/deaf")):  # the worker now ignores the parent-death signal
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        proc.kill()
        proc.wait()
        res = cli("results", "list", "--db", str(db))
        assert "ended before storing the run" in res.stderr and "now stopped" in res.stderr, res.stderr
        row = one_row(db, fbench_home)
        assert row["status"] == "failed" and "died during the run" in row["reason"]
        assert "ended before storing" not in cli("results", "list", "--db", str(db)).stderr  # once
    finally:
        _end(fbench_home)


def test_the_worker_is_given_the_hosts_pid(tmp_path):
    out = tmp_path / "env.txt"
    local.execute([[sys.executable, "-c", f"import os; open({str(out)!r}, 'w').write(os.environ['FBENCH_HOST_PID'])"]],
                   {}, tmp_path, tmp_path / "w.log")
    assert out.read_text() == str(os.getpid())


def test_a_process_left_behind_by_a_worker_that_exits_0_is_ended(fakes, fbench_home, tmp_path):
    db = tmp_path / "r.sqlite"
    try:
        res = run_fake("fake_grandchild", db)
        assert res.exit_code == 0
        assert one_row(db, fbench_home)["status"] == "ok"
    finally:
        _end(fbench_home)


def test_the_sweep_ends_only_processes_naming_the_dead_hosts_run_folder(fbench_home, tmp_path):
    from framework_bench.run import orphans
    run_dir = fbench_home / "runs" / "20260101-000000-tiny_cpu-fake_ok-000001"
    run_dir.mkdir(parents=True)
    (run_dir / orphans.HOST_FILE).write_text(json.dumps({"pid": 2**22 + 1, "started": "1", "db": None,
                                                        "hostname": __import__("socket").gethostname()}))
    named = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", str(run_dir / "job.json")],
                             start_new_session=True)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", str(tmp_path / "elsewhere")],
                             start_new_session=True)
    try:
        lines = orphans.recover(fbench_home / "runs")
        assert named.wait(timeout=10) is not None and other.poll() is None
        assert len(lines) == 1 and "1 process(es)" in lines[0]
        assert not (run_dir / orphans.HOST_FILE).exists()
    finally:
        named.kill()
        other.kill()


def test_a_host_killed_between_storing_the_row_and_ending_its_claim_is_stored_once(fbench_home, tmp_path):
    from framework_bench.measure.metrics import RunResult
    from framework_bench.run import orphans
    from framework_bench.scenario import scenario
    db, tiny = tmp_path / "r.sqlite", scenario.load("tiny_cpu")
    run_dir = fbench_home / "runs" / "20260101-000000-tiny_cpu-fake_ok-000004"
    orphans.claim(run_dir, db, "fake_ok", tiny, "matched")
    with ResultStore(db) as store:
        store.add(RunResult(backend="fake_ok", scenario="tiny_cpu", status="ok", run_dir=run_dir), tiny, {})
    record = json.loads((run_dir / orphans.HOST_FILE).read_text())
    (run_dir / orphans.HOST_FILE).write_text(json.dumps({**record, "pid": 2**22 + 1}))  # its host is gone
    lines = orphans.recover(fbench_home / "runs")
    assert len(lines) == 1 and "its row was stored" in lines[0], lines
    assert [r["status"] for r in rows(db)] == ["ok"] and not (run_dir / orphans.HOST_FILE).exists()


def test_a_run_of_another_machine_sharing_fbench_home_is_left_alone(fbench_home, tmp_path):
    from framework_bench.run import orphans
    run_dir = fbench_home / "runs" / "20260101-000000-tiny_cpu-fake_ok-000003"
    run_dir.mkdir(parents=True)
    (run_dir / orphans.HOST_FILE).write_text(json.dumps({"pid": 2**22 + 1, "started": "1", "db": None,
                                                        "hostname": "another-login-node"}))
    assert orphans.recover(fbench_home / "runs") == [] and (run_dir / orphans.HOST_FILE).exists()


def test_a_live_hosts_run_is_left_alone(fbench_home, tmp_path):
    from framework_bench.run import orphans
    run_dir = fbench_home / "runs" / "20260101-000000-tiny_cpu-fake_ok-000002"
    run_dir.mkdir(parents=True)
    from framework_bench.scenario import scenario
    orphans.claim(run_dir, tmp_path / "r.sqlite", "fake_ok", scenario.load("tiny_cpu"), "matched")  # this process is the host
    assert orphans.recover(fbench_home / "runs") == [] and (run_dir / orphans.HOST_FILE).exists()


def test_sigterm_to_check_backend_stops_its_worker_and_says_so(fakes, fbench_home):
    proc = _start_host("check-backend", "fake_hang")
    try:
        _wait_for(fbench_home, proc)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 130 and "interrupted" in err, (out, err)
        assert processes_mentioning(str(fbench_home)) == []
    finally:
        _end(fbench_home)


def test_sigterm_to_env_create_removes_the_half_built_env_and_its_children(fakes, fbench_home):
    proc = _start_host("env", "create", "fake_ok", "--flavour", "cpu")
    try:
        deadline = time.monotonic() + 120
        while not processes_mentioning(".fake_ok.building-"):  # `python -m venv` is building it
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 130 and "interrupted" in err, (out, err)
        assert not list((fbench_home / "envs").glob(".fake_ok.building-*"))
        assert _gone(fbench_home, 5)
    finally:
        _end(fbench_home)


# A requirement whose build waits: pip runs the build backend's hook as its child, in the env.
SLOW_PROJECT = '[build-system]\nrequires = []\nbuild-backend = "slow_backend"\nbackend-path = ["."]\n' \
               '[project]\nname = "fbench_slow"\nversion = "0.1"\n'
SLOW_BACKEND = '''
import os, time

def _wait(*args, **kwargs):
    open(os.environ["FBENCH_TEST_BUILDING"], "w").close()
    time.sleep(600)

get_requires_for_build_wheel = prepare_metadata_for_build_wheel = build_wheel = _wait
'''


def _pip_running(folder: Path) -> list[int]:
    return [p for p in processes_mentioning(str(folder))
            if b"\0pip\0install\0" in Path(f"/proc/{p}/cmdline").read_bytes()]


@pytest.mark.slow  # starts a framework's or the host's own process
def test_kill_9_of_env_create_takes_pip_with_it_and_the_next_create_ends_the_rest(fakes, fbench_home, tmp_path,
                                                                                 sdk_wheels, monkeypatch):
    """pip ran on after its fbench was killed, and the next create left the half-built env (and
    the build step still running from it) where it was when it found the env ready."""
    project = tmp_path / "slow"
    project.mkdir()
    (project / "pyproject.toml").write_text(SLOW_PROJECT)
    (project / "slow_backend.py").write_text(SLOW_BACKEND)
    (tmp_path / "slow.txt").write_text(f"{project}\n")
    monkeypatch.setenv("FBENCH_TEST_BUILDING", str(tmp_path / "building"))
    proc = _start_host("env", "create", "fake_ok", "--flavour", "cpu", "--no-index", "--find-links", str(sdk_wheels),
                       "--requirements", str(tmp_path / "slow.txt"))
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "building").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        [building] = (fbench_home / "envs").glob(".fake_ok.building-*")
        assert _pip_running(building)
        proc.kill()
        proc.communicate()
        deadline = time.monotonic() + 10
        while _pip_running(building):  # the kernel kills it with its parent
            assert time.monotonic() < deadline, "pip outlived the fbench that started it"
            time.sleep(0.1)
        from framework_bench.envs.creation import sweep_building  # what every create does first
        assert sweep_building("fake_ok") == [building]
        assert not building.exists() and _gone(building, 5)  # the build step pip left
    finally:
        _end(fbench_home)


def test_a_killed_creations_leftovers_go_even_when_the_env_needs_nothing(fbench_home, tmp_path, monkeypatch):
    """An env already ready with these options: the create said "nothing to do" and left the
    killed creation's half-built env (gigabytes for a real one) for ever."""
    from framework_bench.envs import creation, venvs as envs
    from framework_bench.envs.pip_options import Options
    from framework_bench.envs.sdk_check import SDK_REQUIREMENTS
    from framework_bench.plugins.contract import EnvSpec

    (tmp_path / "requirements.txt").write_text("")
    spec = EnvSpec(requirements={"cpu": tmp_path / "requirements.txt"}, framework_package="fbench_tiny")
    env = envs.env_path("tiny")
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").touch()
    site = env / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    for name in SDK_REQUIREMENTS:
        (site / f"{name}-1.0.dist-info").mkdir(parents=True)
        (site / f"{name}-1.0.dist-info" / "METADATA").write_text(f"Name: {name}\nVersion: 1.0\n")
    (env / envs.RECORD).write_text(json.dumps({"flavour": "cpu", "requirements_sha256": envs.requirements_hash(spec, "cpu"),
                                               "options": Options().model_dump(), "linked": {}}))
    assert envs.inspect("tiny", spec).ready
    dead = env.with_name(".tiny.building-4194305")  # above any pid Linux hands out
    (dead / "bin").mkdir(parents=True)
    monkeypatch.setattr(creation, "link_packages", lambda python, packages: {})  # no host packages into a fake env
    said: list[str] = []
    creation.create("tiny", spec, "cpu", say=said.append)
    assert said == [f"tiny: removed {dead}, left by a creation that was killed", f"tiny: ready at {env} (nothing to do)"]
    assert not dead.exists()


def test_a_half_built_env_left_by_a_killed_create_is_swept(fbench_home):
    from framework_bench.envs import venvs as envs
    from framework_bench.envs.creation import sweep_building
    stale = envs.env_path("fake_ok").with_name(".fake_ok.building-4194305")  # above any pid Linux hands out
    (stale / "bin").mkdir(parents=True)
    live = envs.env_path("fake_ok").with_name(f".fake_ok.building-{os.getpid()}")
    live.mkdir()
    assert sweep_building("fake_ok") == [stale]
    assert not stale.exists() and live.exists()


# ---------------------------------------------------------------------------------------
# 9: impossible figures


@pytest.mark.slow  # starts a framework's or the host's own process
def test_a_step_too_short_to_time_makes_the_run_invalid_never_inf(fakes, fbench_home, tmp_path):
    db = tmp_path / "r.sqlite"
    res = run_fake("fake_tiny_seconds", db)
    row = one_row(db, fbench_home)
    # the figure is the host's window, never the 1e-320 s claim: finite, and the claim fails the clock
    assert res.exit_code == 1 and row["status"] == "invalid" and row["reason"].startswith("clock check failed")
    assert row["tgs"] is not None and 0 < row["tgs"] < float("inf")
    assert "Infinity" not in cli("results", "export", "--format", "json", "--db", str(db)).stdout


@pytest.mark.slow  # starts a framework's or the host's own process
def test_a_nan_loss_is_stored_as_nan_not_as_no_loss(fakes, fbench_home, tmp_path):
    db = tmp_path / "r.sqlite"
    run_fake("fake_nan_loss", db)
    row = one_row(db, fbench_home)
    assert math.isnan(row["final_loss"])
    with ResultStore(db) as store:
        assert all(math.isnan(s["loss"]) for s in store.get(row["id"])["steps"])
    exported = cli("results", "export", "--format", "json", "--db", str(db)).stdout
    mine = next(r for r in json.loads(exported) if r["backend"] == "fake_nan_loss")
    assert mine["final_loss"] == "NaN"  # standard JSON: no bare NaN


def test_an_mfu_above_the_gpus_peak_makes_the_figures_impossible():
    from framework_bench.measure import metrics
    from framework_bench.scenario import scenario
    from framework_bench.plugins.contract import StepMetric
    s = scenario.load("tiny_cpu")
    steps = [StepMetric(step=i, seconds=1e-9, tokens=s.context_length) for i in range(1, s.steps.total + 1)]
    out = metrics.figures(s, steps, peak_tflops=1.0, gpu_name="NVIDIA H100")
    assert "above the peak" in out["impossible"] and out.get("mfu") is None and out.get("tgs") is None


def test_the_share_of_torch_pairs_runs_by_their_stored_definition(tmp_path, fbench_home):
    from framework_bench.present import report
    from framework_bench.scenario import scenario
    short = scenario.load("tiny_cpu")
    longer = short.model_copy(update={"context_length": 2048})  # the same file, edited between the runs
    db = tmp_path / "r.sqlite"
    with ResultStore(db) as store:
        store.add(results.RunResult(backend="torch", scenario="tiny_cpu", status="ok", tgs=400.0), longer, manifest_={})
        store.add(results.RunResult(backend="xtuner", scenario="tiny_cpu", status="ok", tgs=1600.0), short, manifest_={})
        rows = store.latest_by_point()
    from framework_bench.present.verdict import Points
    points = Points(rows, "torch")
    table = report.scenario_table(points)[0]
    assert "400%" not in str(table) and "400 %" not in str(table)
    assert ("tiny_cpu", "xtuner") not in points.shares


# ---------------------------------------------------------------------------------------
# 13, 15: edges and defaults


def test_a_long_scenario_name_is_refused_when_read(tmp_path):
    path = tmp_path / f"{'a' * 240}.yaml"
    path.write_text("model: {preset: tiny}\ncontext_length: 512\n")
    res = cli("validate", str(path))
    assert res.exit_code == 1 and "name" in res.stderr and "at most 64" in res.stderr


def test_an_infinite_reference_figure_is_refused(tmp_path):
    path = tmp_path / "inf_ref.yaml"
    path.write_text("model: {preset: tiny}\ncontext_length: 512\nreference: {tgs: .inf, tflops: 1.0, hardware: A100}\n")
    res = cli("validate", str(path))
    assert res.exit_code == 1 and "reference.tgs" in res.stderr


def test_check_backend_refuses_a_negative_timeout():
    res = cli("check-backend", "torch", "--timeout", "-1")
    assert res.exit_code == 1 and "--timeout" in res.stderr


@pytest.mark.parametrize("command", [["results", "list"], ["results", "show", "1"], ["results", "export"], ["report"]])
def test_a_mistyped_db_on_a_reading_command_creates_nothing(tmp_path, fbench_home, command):
    db = tmp_path / "typo" / "resluts.sqlite"
    res = cli(*command, "--db", str(db))
    assert res.exit_code == 1 and "no results file" in res.stderr
    assert not db.parent.exists()


def test_a_full_disk_under_out_is_one_line_after_the_rows_are_stored(fakes, fbench_home, tmp_path, monkeypatch):
    from framework_bench.present import plotting

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(plotting, "plot_results", full)
    db = tmp_path / "r.sqlite"
    res = cli("compare", "--scenario", "tiny_cpu", "--backends", "fake_ok", "--db", str(db), "--out", str(tmp_path / "p"))
    assert res.exit_code == 1 and "the runs are stored" in res.stderr and "No space left" in res.stderr
    assert [r["status"] for r in rows(db)] == ["ok"]


@pytest.mark.slow  # starts a framework's or the host's own process
def test_a_worker_writing_200k_extra_steps_gets_a_short_reason(fakes, fbench_home, tmp_path):
    db = tmp_path / "r.sqlite"
    run_fake("fake_extra_steps", db)
    row = one_row(db, fbench_home)
    assert row["status"] == "invalid" and "repeated or extra" in row["reason"]
    assert len(row["reason"].splitlines()) <= 61 and len(row["reason"]) < 4200  # was 1.5 MB on one line


def test_out_defaults_to_the_state_folder(fakes, fbench_home, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = cli("compare", "--scenario", "tiny_cpu", "--backends", "fake_ok", "--db", str(tmp_path / "r.sqlite"))
    assert res.exit_code == 0, res.output
    assert (fbench_home / "plots" / "report.md").is_file() and not (tmp_path / "plots").exists()


def test_results_list_shows_the_latest_50_unless_asked(tmp_path, fbench_home):
    from framework_bench.scenario import scenario
    db = tmp_path / "r.sqlite"
    with ResultStore(db) as store:
        for i in range(60):
            store.add(results.RunResult(backend="x", scenario="tiny_cpu", status="failed", reason=str(i)),
                      scenario.load("tiny_cpu"), manifest_={})
    shown = cli("results", "list", "--db", str(db)).stdout
    assert "the latest 50 of 60 runs" in shown and "│ 10 " not in shown and "│ 11 " in shown
    assert "latest" not in cli("results", "list", "--all", "--db", str(db)).stdout
    assert "the latest 5 of 60" in cli("results", "list", "--limit", "5", "--db", str(db)).stdout


# ---------------------------------------------------------------------------------------
# The store's side: a claim on a kept row is released on every exit and a dead command's claim
# is taken over; every path written into a run folder is absolute.


def _keep_a_row(db: Path) -> Path:
    from framework_bench.scenario import scenario
    folder = unstored.unstored_dir(db)
    folder.mkdir()
    result = results.RunResult(backend="fake_ok", scenario="tiny_cpu", status="ok")
    path = folder / "20260101-000000-1-1.json"
    path.write_text(json.dumps({"result": result.model_dump(mode="json"),
                                "scenario": scenario.load("tiny_cpu").model_dump(mode="json"),
                                "manifest": {}, "error": "OperationalError: database is locked"}))
    return path


def test_a_kept_row_claimed_by_a_command_that_died_is_taken_over_by_the_next(fbench_home, tmp_path):
    db = tmp_path / "r.sqlite"
    kept = _keep_a_row(db)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    kept.rename(kept.with_name(f"{kept.name}.{dead.pid}"))  # as `kill -9` left it, mid-claim
    with ResultStore(db) as store:
        lines = unstored.recover(store)
        assert [r["backend"] for r in store.list()] == ["fake_ok"]
    assert any("recovered the ok run of fake_ok" in line for line in lines), lines
    assert list(unstored.unstored_dir(db).iterdir()) == []


def test_a_kept_row_claimed_by_a_live_command_is_left_to_it(fbench_home, tmp_path):
    db = tmp_path / "r.sqlite"
    kept = _keep_a_row(db)
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        kept.rename(kept.with_name(f"{kept.name}.{live.pid}"))
        with ResultStore(db) as store:
            assert unstored.recover(store) == [] and store.list() == []
    finally:
        live.kill()
        live.wait()


def test_ctrl_c_while_storing_a_kept_row_gives_it_back(fbench_home, tmp_path, monkeypatch):
    db = tmp_path / "r.sqlite"
    kept = _keep_a_row(db)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    with ResultStore(db) as store:
        monkeypatch.setattr(store, "add", interrupted)
        with pytest.raises(KeyboardInterrupt):
            unstored.recover(store)
    assert [p.name for p in unstored.unstored_dir(db).iterdir()] == [kept.name]


def test_the_db_written_into_host_json_is_absolute(fbench_home, tmp_path, monkeypatch):
    from framework_bench.run import orphans
    from framework_bench.scenario import scenario
    monkeypatch.chdir(tmp_path)
    orphans.claim(tmp_path / "run", Path("results.sqlite"), "fake_ok", scenario.load("tiny_cpu"), "matched")
    assert json.loads((tmp_path / "run" / orphans.HOST_FILE).read_text())["db"] == str(tmp_path / "results.sqlite")
    with ResultStore(Path("results.sqlite")) as store:
        assert store.path == tmp_path / "results.sqlite"


def _dead_hosts_run(fbench_home: Path, tmp_path: Path) -> Path:
    from framework_bench.run import orphans
    from framework_bench.scenario import scenario
    run_dir = fbench_home / "runs" / "20260101-000000-tiny_cpu-fake_ok-000009"
    orphans.claim(run_dir, tmp_path / "r.sqlite", "fake_ok", scenario.load("tiny_cpu"), "matched")
    record = json.loads((run_dir / orphans.HOST_FILE).read_text())
    (run_dir / orphans.HOST_FILE).write_text(json.dumps(record | {"pid": 2**22 + 1, "started": "1"}))  # a dead host
    return run_dir


def test_ctrl_c_while_recovering_a_dead_hosts_run_gives_its_host_file_back(fbench_home, tmp_path, monkeypatch):
    from framework_bench.run import orphans
    run_dir = _dead_hosts_run(fbench_home, tmp_path)

    def interrupted(run_dir):
        raise KeyboardInterrupt  # during the 5-second wait for its processes to end

    monkeypatch.setattr(orphans, "end_leftovers", interrupted)
    with pytest.raises(KeyboardInterrupt):
        orphans.recover(fbench_home / "runs")
    assert [p.name for p in run_dir.iterdir() if p.name.startswith(orphans.HOST_FILE)] == [orphans.HOST_FILE]
    monkeypatch.undo()
    assert len(orphans.recover(fbench_home / "runs")) == 1
    assert [r["status"] for r in rows(tmp_path / "r.sqlite")] == ["failed"]


def test_a_dead_hosts_run_claimed_by_a_command_that_died_is_taken_over(fbench_home, tmp_path):
    from framework_bench.run import orphans
    run_dir = _dead_hosts_run(fbench_home, tmp_path)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (run_dir / orphans.HOST_FILE).rename(run_dir / f"{orphans.HOST_FILE}.{dead.pid}")  # killed mid-recovery
    lines = orphans.recover(fbench_home / "runs")
    assert len(lines) == 1 and "ended before storing the run" in lines[0], lines
    assert [r["status"] for r in rows(tmp_path / "r.sqlite")] == ["failed"]
    assert not [p for p in run_dir.iterdir() if p.name.startswith(orphans.HOST_FILE)]



def _by_round(db: Path) -> dict[tuple[int, str], dict]:
    """Each stored row by (round, backend); every run folder once, every row in one compare."""
    stored = rows(db)
    assert len({r["run_dir"] for r in stored}) == len(stored), [r["run_dir"] for r in stored]
    assert len({r["compare_id"] for r in stored}) == 1 and None not in {r["compare_id"] for r in stored}, stored
    return {(r["trial_round"], r["backend"]): r for r in stored}


def test_a_full_disk_when_the_held_reference_folder_is_written_back_loses_no_row(fakes, fbench_home, tmp_path,
                                                                                 monkeypatch):
    """Round 2 runs the reference first, its folder held in memory until the round's runs end: a
    full disk then (ENOSPC writing it back) was a traceback, and the round's rows were lost."""
    import errno
    import tarfile

    real = tarfile.TarFile.makefile

    def full_in_round_2(self, tarinfo, targetpath):
        if "result.json" in targetpath:  # some of the folder is written back, then the disk is full
            raise OSError(errno.ENOSPC, "No space left on device", targetpath)
        return real(self, tarinfo, targetpath)

    monkeypatch.setattr(tarfile.TarFile, "makefile", full_in_round_2)
    db = tmp_path / "r.sqlite"
    res = cli("compare", "--scenario", "tiny_cpu", "--backends", "fake_noisy", "--repeat", "2", "--warmup-rounds", "0",
              "--db", str(db), "--out", str(tmp_path / "plots"))
    assert res.exit_code == 0, res.output
    stored = _by_round(db)
    assert sorted(stored) == [(1, "fake_noisy"), (1, "fake_ok"), (2, "fake_noisy"), (2, "fake_ok")]
    assert {stored[1, "fake_noisy"]["status"], stored[2, "fake_ok"]["status"]} <= {"ok", "unverified"}
    lost = stored[2, "fake_noisy"]
    assert lost["status"] == "unverified" and "could not be written back" in lost["reason"], lost["reason"]
    assert "No space left" in lost["reason"]
    assert any("could not be written back" in n for n in stored[2, "fake_ok"]["notes"])
    assert not Path(stored[2, "fake_ok"]["run_dir"]).exists()  # no half folder for a later run to read
    listed = cli("results", "list", "--all", "--db", str(db))
    exported = json.loads(cli("results", "export", "--format", "json", "--db", str(db)).stdout)
    assert listed.exit_code == 0 and len(exported) == 4
    assert {(r["compare_id"], r["trial_round"]) for r in exported} == {(lost["compare_id"], 1), (lost["compare_id"], 2)}
