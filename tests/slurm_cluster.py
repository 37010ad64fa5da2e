"""A real one-node Slurm of this machine, for the tests that submit to one: munged, slurmctld and
slurmd as the user running the tests, every file of theirs (config, key, sockets, state, spool,
logs) in a temporary folder, started once per session and stopped after. Debian's slurm-wlm and
munge provide them (`scripts/install-slurm.sh`, which CI runs): where they are not installed the
tests are skipped saying so, except under CI, where that fails (a skip must never pass there).

`slurm_cluster`: the session's cluster (its `slurm.conf`); `real_slurm`: a test's environment
pointing Slurm's commands at it (`SLURM_CONF`).
"""

from __future__ import annotations

import getpass
import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "squeue", "scontrol", "sinfo")
READY_S = 60  # for slurmd to register and the node to take jobs


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node_line(slurmd: str) -> str:
    """This machine as slurmd sees it ("NodeName=vm CPUs=2 Boards=1 ..."), its memory left out:
    a node configured with more than it has would be drained."""
    first = subprocess.run([slurmd, "-C"], capture_output=True, text=True, check=True).stdout.splitlines()[0]
    return " ".join(f for f in first.split() if not f.startswith("RealMemory="))


def _write_conf(folder: Path) -> Path:
    node = _node_line(shutil.which("slurmd"))
    name = node.split()[0].removeprefix("NodeName=")
    user = getpass.getuser()
    conf = folder / "slurm.conf"
    conf.write_text("\n".join([
        "ClusterName=fbench-tests",
        f"SlurmctldHost={name}(127.0.0.1)",
        f"SlurmUser={user}",
        f"SlurmdUser={user}",
        f"SlurmctldPort={_free_port()}",
        f"SlurmdPort={_free_port()}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={folder / 'munge.socket'}",
        f"StateSaveLocation={folder / 'state'}",
        f"SlurmdSpoolDir={folder / 'spool'}",
        f"SlurmctldPidFile={folder / 'slurmctld.pid'}",
        f"SlurmdPidFile={folder / 'slurmd.pid'}",
        f"SlurmctldLogFile={folder / 'slurmctld.log'}",
        f"SlurmdLogFile={folder / 'slurmd.log'}",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SchedulerType=sched/builtin",
        "MpiDefault=none",
        "ReturnToService=2",
        "AccountingStorageType=accounting_storage/none",
        "JobAcctGatherType=jobacct_gather/none",
        "JobCompType=jobcomp/none",
        f"{node} NodeAddr=127.0.0.1 State=UNKNOWN",
        "PartitionName=tests Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
    ]) + "\n")
    (folder / "state").mkdir()
    (folder / "spool").mkdir()
    return conf


def _stop(folder: Path) -> None:
    """TERM each daemon its pid file names, the last started first; wait for each to go."""
    for pid_file in ("slurmd.pid", "slurmctld.pid", "munged.pid"):
        try:
            pid = int((folder / pid_file).read_text().strip())
            os.kill(pid, signal.SIGTERM)
        except (OSError, ValueError):
            continue
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)


def _logs(folder: Path) -> str:
    return "\n".join(f"--- {log.name}:\n" + "\n".join(log.read_text(errors="replace").splitlines()[-15:])
                     for log in sorted(folder.glob("*.log")))


def start(folder: Path) -> Path:
    """Start munged, slurmctld and slurmd with every file in `folder`; returns the slurm.conf once
    the node takes jobs. Each daemon forks away (none is a child of the tests' process, whose
    own runs read the CPU time of its descendants)."""
    conf = _write_conf(folder)
    key = folder / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    env = {**os.environ, "SLURM_CONF": str(conf)}
    starts = [
        ["munged", "--force", f"--socket={folder / 'munge.socket'}", f"--key-file={key}",
         f"--pid-file={folder / 'munged.pid'}", f"--log-file={folder / 'munged.log'}",
         f"--seed-file={folder / 'munged.seed'}"],
        ["slurmctld", "-f", str(conf)],
        ["slurmd", "-f", str(conf)],
    ]
    try:
        for argv in starts:
            proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
            if proc.returncode != 0:
                raise RuntimeError(f"{shlex.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
        deadline = time.monotonic() + READY_S
        while (state := subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True,
                                       text=True).stdout.strip()) != "idle":
            if time.monotonic() > deadline:
                raise RuntimeError(f"the node is {state or 'not answering'} after {READY_S} s")
            time.sleep(0.5)
    except BaseException as e:  # Ctrl-C too: no daemon is left behind
        _stop(folder)
        if not isinstance(e, Exception):
            raise
        raise RuntimeError(f"the one-node Slurm did not start: {e}\n{_logs(folder)}") from None
    return conf


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory) -> Path:
    """The session's one-node Slurm: its slurm.conf."""
    missing = [tool for tool in DAEMONS + CLIENTS if shutil.which(tool) is None]
    if missing:
        message = f"Slurm is not installed here ({', '.join(missing)} missing): scripts/install-slurm.sh installs it"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    folder = tmp_path_factory.mktemp("slurm")
    conf = start(folder)
    yield conf
    _stop(folder)


@pytest.fixture
def real_slurm(slurm_cluster, monkeypatch) -> Path:
    """Slurm's commands in this test talk to the session's cluster."""
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster))
    return slurm_cluster
