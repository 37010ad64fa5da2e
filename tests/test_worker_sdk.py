"""The worker SDK's step timer and rank info, on CPU (the torch-free parts run in the host venv)."""

from __future__ import annotations

import time

from framework_bench.worker import StepTimer, dist_info
from framework_bench.worker.files import read_metrics


def test_step_timer_writes_one_line_per_step_and_excludes_paused_time(tmp_path):
    timer = StepTimer(tmp_path, "cpu", rank=0)
    timer.begin()
    time.sleep(0.05)
    timer.add_tokens(256)
    timer.pause()
    time.sleep(0.3)  # "data loading" between micro-batches: not the step's time
    timer.resume()
    time.sleep(0.05)
    timer.add_tokens(256)
    first = timer.end(step=1, loss=2.5)
    timer.resume()  # no step open: begins one
    timer.end(step=2, loss=None, tokens=7)
    timer.close()

    lines = read_metrics(tmp_path)
    assert [line["step"] for line in lines] == [1, 2]
    assert lines[0]["tokens"] == 512 and lines[1]["tokens"] == 7
    assert 0.1 <= lines[0]["seconds"] < 0.3, lines[0]["seconds"]
    assert lines[0]["loss"] == 2.5 and lines[1]["loss"] is None
    assert lines[0]["peak_mem_bytes"] > 0 and lines[0]["peak_reserved_bytes"] is None  # CPU: max RSS only
    assert first == {k: v for k, v in lines[0].items() if k != "rank"}
    assert timer.steps_written == 2


def test_dist_info_reads_the_launcher_variables(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    alone = dist_info()
    assert (alone.rank, alone.world_size, alone.local_rank, alone.local_world_size) == (0, 1, 0, 1)
    assert alone.is_main and alone.is_local_main
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    d = dist_info()
    assert (d.rank, d.world_size, d.local_rank, d.local_world_size) == (3, 4, 1, 2)
    assert not d.is_main and not d.is_local_main
