"""The host's clock watcher as a SLURM job's task on each node (`python -m
framework_bench.measure.clock RUN_DIR WARMUP STEPS RANKS [cpu|all] -- COMMAND...`): on the first
node it starts the worker and reads its CPU time, as the local launcher's watcher does; elsewhere
it becomes the worker. The seed it is piped never reaches a worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from framework_bench.measure import clock

# A worker of one step: its clock lines around 0.5 s of CPU work, and what its standard input held.
WORKER = """
import json, sys, time
from pathlib import Path
clock = Path("clock/rank0.jsonl")
def event(name):
    with clock.open("a") as f:
        f.write(json.dumps({"event": name, "step": 1}) + "\\n")
event("begin")
end = time.process_time() + 0.5
while time.process_time() < end:
    pass
event("end")
Path("stdin.txt").write_text(repr(sys.stdin.read()))
"""


def _node_task(run_dir: Path, reads: list[str], command: list[str], node: str = "0") -> subprocess.CompletedProcess:
    run_dir.mkdir(exist_ok=True)
    argv = [sys.executable, "-m", "framework_bench.measure.clock", str(run_dir), "0", "1", "1", *reads, "--", *command]
    return subprocess.run(argv, input="424242\n", text=True, capture_output=True, cwd=run_dir, timeout=60,
                          env={**os.environ, "SLURM_NODEID": node})


@pytest.mark.slow  # starts processes of its own
def test_the_first_nodes_watcher_reads_the_cpu_time_of_the_worker_it_starts(tmp_path):
    proc = _node_task(tmp_path / "run", ["cpu"], [sys.executable, "-c", WORKER])
    assert proc.returncode == 0, proc.stderr
    stamps = json.loads((tmp_path / "run" / clock.STAMPS_FILE).read_text())
    (begin, *_, end) = stamps["ranks"]["0"]
    assert stamps["cpu_read"] and [begin[1], end[1]] == ["begin", "end"]
    assert end[4] - begin[4] >= 0.4  # the worker's CPU seconds between its two lines: it is the watcher's child
    assert stamps["reveal"]["seed"] == 424242  # revealed after the last step, as the batch script gave it
    assert (tmp_path / "run" / "stdin.txt").read_text() == "''"  # the worker could not read it


@pytest.mark.slow  # starts processes of its own
@pytest.mark.parametrize("command, status", [("raise SystemExit(3)", 3), ("import os; os.kill(os.getpid(), 9)", 137)],
                         ids=["exit 3", "killed"])
def test_the_watcher_ends_with_its_workers_exit_status(tmp_path, command, status):
    """The batch script's `status=$?` is the worker's: its run's `slurm-exit-code`, how it ended."""
    proc = _node_task(tmp_path / "run", ["cpu"], [sys.executable, "-c", command])
    assert proc.returncode == status and (tmp_path / "run" / clock.STAMPS_FILE).exists()


@pytest.mark.slow  # starts processes of its own
def test_on_another_node_the_watcher_becomes_the_worker_without_the_seed(tmp_path):
    """Only the first node watches (the other ranks' lines reach it through the shared filesystem):
    elsewhere the task is the worker itself, its standard input emptied of the seed srun gives
    every task."""
    proc = _node_task(tmp_path / "run", ["cpu"], [sys.executable, "-c",
                                                  "import os, sys; print(os.getppid(), repr(sys.stdin.read()))"],
                      node="1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(os.getpid()), "''"]  # our child itself: the watcher became it
    assert not (tmp_path / "run" / clock.STAMPS_FILE).exists()
