"""Every process a worker started ends with its run, even one in a new
session whose command line does not name the run: a daemon's double fork, or a torchrun
worker (torchrun starts each in its own session) left behind when torchrun is killed. The
launcher runs in this process, as the host does: pytest's other children must live on."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fbench_fixtures import backend_env_or_skip
from framework_bench.run.launchers import local

# Not naming the run: nothing in it says fbench, the run folder or the worker.
DAEMON = [sys.executable, "-c", "import time; time.sleep(600)"]
# The intermediate: starts the daemon in a new session, writes its pid to argv[1], exits.
DOUBLE_FORK = ("import subprocess, sys; "
               f"d = subprocess.Popen({DAEMON!r}, start_new_session=True, stdin=subprocess.DEVNULL, "
               "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); open(sys.argv[1], 'w').write(str(d.pid))")


def worker(pid_file: Path, then: str) -> list[str]:
    """A worker that daemonises a process, then does `then`."""
    return [sys.executable, "-c", "import os, signal, subprocess, sys, time; "
            f"subprocess.run([sys.executable, '-c', {DOUBLE_FORK!r}, {str(pid_file)!r}], check=True); {then}"]


def alive(pid: int) -> bool:
    """Whether `pid` is a live process (not a zombie)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] not in ("Z", "X")
    except OSError:
        return False


def ended(pid: int, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not alive(pid)


def end(pid_file: Path) -> None:
    """Kill what a test left alive (the daemon, where the launcher did not end it)."""
    if pid_file.exists() and alive(pid := int(pid_file.read_text())):
        os.kill(pid, signal.SIGKILL)


@pytest.fixture
def bystander():
    """A child of this process that was there before the run: not the run's to end."""
    proc = subprocess.Popen(DAEMON)
    yield proc
    proc.kill()
    proc.wait()


CTRL_C = "os.kill(int(os.environ['FBENCH_HOST_PID']), signal.SIGINT); time.sleep(600)"  # as if pressed in the host


@pytest.mark.parametrize("then, timeout, status", [("sys.exit(0)", None, "ok"),
                                                   ("time.sleep(600)", 1.0, "timeout"),
                                                   ("sys.exit(3)", None, "failed"),
                                                   (CTRL_C, None, "interrupted")],
                         ids=["exits_0", "timeout", "fails", "ctrl_c"])
def test_a_daemon_the_worker_started_ends_with_the_run(tmp_path, bystander, then, timeout, status):
    pid_file = tmp_path / "daemon.pid"
    # Ctrl-C raises KeyboardInterrupt, as in a host started from a terminal: pytest started in
    # the background of a script inherits SIGINT ignored, and the worker would sleep its 600 s.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        out = local.execute([worker(pid_file, then)], {}, tmp_path, tmp_path / "w.log", timeout)
        assert out.status == status, out.log_tail
        daemon = int(pid_file.read_text())
        assert ended(daemon), f"the daemon {daemon} outlived the run"
        assert bystander.poll() is None  # this process's own child lives on
    finally:
        signal.signal(signal.SIGINT, previous)
        end(pid_file)


@pytest.mark.slow  # imports torch in torchrun
def test_a_torchrun_worker_deaf_to_sigterm_ends_with_the_run(tmp_path, monkeypatch):
    """torchrun, stopped by the host, forwards SIGTERM to its worker (in a session of its
    own, out of torchrun's process group) and waits 30 s; fbench KILLs torchrun after its grace
    and the worker is left to itself."""
    monkeypatch.setattr(local, "STOP_GRACE_S", 1.0)
    python = backend_env_or_skip("torch").python
    pid_file = tmp_path / "worker.pid"
    script = tmp_path / "deaf_worker.py"
    script.write_text("import os, signal, sys, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                      f"open({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(600)\n")
    argv = [str(python), "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1", str(script)]

    def stop_once_the_worker_runs() -> None:  # torchrun imports torch first: no fixed timeout fits
        if pid_file.exists():
            raise TimeoutError("the host gives up")

    try:
        with pytest.raises(TimeoutError):
            local.execute([argv], {}, tmp_path, tmp_path / "w.log", poll=stop_once_the_worker_runs)
        assert ended(int(pid_file.read_text())), "torchrun's worker outlived the run"
    finally:
        end(pid_file)


def test_a_daemon_of_a_host_killed_9_is_ended_by_the_next_commands_sweep(fbench_home, tmp_path):
    """The host's adoptions die with it: the daemon goes to init. The sweep of the dead host's
    run finds it by the run folder in its environment (its command line does not name it)."""
    from framework_bench.measure import processes
    from framework_bench.run import orphans
    run_dir = fbench_home / "runs" / "20260101-000000-tiny_cpu-fake_ok-000001"
    run_dir.mkdir(parents=True)
    pid_file = tmp_path / "daemon.pid"
    host = subprocess.Popen([sys.executable, "-c", "import sys; from pathlib import Path; "
                             "from framework_bench.run.launchers import local; run = Path(sys.argv[1]); "
                             f"local.execute([{worker(pid_file, 'time.sleep(600)')!r}], {{}}, run, run / 'w.log')",
                             str(run_dir)])
    # A run of another folder whose name starts with this one's: not the sweep's to end.
    other = subprocess.Popen(DAEMON, env={**os.environ, "FBENCH_RUN_DIR": f"{run_dir}0"}, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not pid_file.exists():
            assert host.poll() is None and time.monotonic() < deadline, "the worker never started its daemon"
            time.sleep(0.05)
        (run_dir / orphans.HOST_FILE).write_text(json.dumps({"pid": host.pid, "started": processes.start_time(host.pid),
                                                            "db": None, "hostname": socket.gethostname()}))
        host.kill()
        host.wait()
        daemon = int(pid_file.read_text())
        assert alive(daemon)  # the daemon outlived its host
        lines = orphans.recover(fbench_home / "runs")
        assert ended(daemon), "the daemon outlived the sweep of its run"
        assert len(lines) == 1 and other.poll() is None, lines
    finally:
        host.kill()
        other.kill()
        end(pid_file)


def host_fails() -> None:
    raise RuntimeError("the host fell over")


@pytest.mark.parametrize("then, poll", [("pass", lambda: None), ("time.sleep(600)", host_fails)],
                         ids=["worker_ended", "host_failed"])
def test_a_ctrl_c_while_the_daemon_stops_does_not_leave_it_running(tmp_path, monkeypatch, then, poll):
    """The worker ended well (or the host failed); its daemon, told to stop, presses Ctrl-C in
    the host and goes on: the host ends it all the same (KILL after the grace), then raises the
    Ctrl-C."""
    monkeypatch.setattr(local, "STOP_GRACE_S", 1.0)
    pid_file = tmp_path / "daemon.pid"
    daemon = ("import os, signal, sys, time; host = int(os.environ['FBENCH_HOST_PID']); "
              "signal.signal(signal.SIGTERM, lambda *_: os.kill(host, signal.SIGINT)); "
              "open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(600)")
    argv = [sys.executable, "-c", "import os, subprocess, sys, time; "
            f"subprocess.Popen([sys.executable, '-c', {daemon!r}, {str(pid_file)!r}], start_new_session=True)\n"
            f"while not os.path.exists({str(pid_file)!r}): time.sleep(0.01)\n{then}"]
    try:
        with pytest.raises(KeyboardInterrupt):
            local.execute([argv], {}, tmp_path, tmp_path / "w.log", poll=poll)
        assert ended(int(pid_file.read_text())), "the daemon outlived the run"
    finally:
        end(pid_file)
