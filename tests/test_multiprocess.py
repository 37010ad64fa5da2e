"""Data parallel over two CPU processes (gloo) through torchrun: one node x 2 processes,
and 2 "nodes" x 1 process meeting at one rendezvous on 127.0.0.1. Real trainers."""

import statistics

import pytest

from fbench_fixtures import MULTIPROCESS_TIMEOUT, backend_env_or_skip
from framework_bench.measure import clock_checks
from framework_bench.run import pipeline
from framework_bench.run.options import RunOptions
from framework_bench.scenario import scenario
from framework_bench.worker.files import read_metrics


@pytest.mark.slow
@pytest.mark.parametrize("name", ["multiproc_tiny_cpu_1x2", "multiproc_tiny_cpu_2x1"])
def test_llamafactory_two_processes(name):
    backend_env_or_skip("llamafactory")
    s = scenario.load(name)
    r = pipeline.run_one("llamafactory", s, RunOptions(timeout=MULTIPROCESS_TIMEOUT))
    assert r.status == "ok", r.reason
    plan = (r.run_dir / "plan.json").read_text()
    assert plan.count("torch.distributed.run") == s.cluster.nodes  # one torchrun per node
    steps = read_metrics(r.run_dir)
    by_rank = {rank: [m for m in steps if m["rank"] == rank] for rank in (0, 1)}
    assert [len(v) for v in by_rank.values()] == [s.steps.total] * 2  # both ranks trained every step
    assert all(m["tokens"] == s.context_length for m in steps)  # tokens of one rank, not the world
    # the host's checks hold on both ranks: each step's two rows, in the stream's order, split across the ranks
    checks = {c.name: c for c in r.checks}
    assert all(checks[n].status == "pass" for n in ("tokens", "steps", "rows", "parameters", "settings")), checks
    assert checks["steps"].detail.endswith("on each of 2 rank(s)") and checks["rows"].detail.startswith("rows 0..13")
    # accelerate wraps the model of a world of two in DDP, read from the model that trained
    assert r.settings["ddp_wrapped"] is True and r.settings["process_group_size"] == 2
    # TGS is per process: each step's tokens per rank over its slowest rank's time (each rank's the
    # longer of its claim and the host's window of it), median of measured steps
    seen = clock_checks.host_seconds(clock_checks.load_stamps(r.run_dir))
    timed = {rank: [max(m["seconds"], seen.get((rank, m["step"]), 0.0)) for m in ms] for rank, ms in by_rank.items()}
    expected = statistics.median(s.context_length / max(timed[0][i], timed[1][i])
                                 for i in range(s.steps.warmup, s.steps.total))
    assert r.tgs == pytest.approx(expected)


def test_xtuner_refuses_several_cpu_processes_without_zero():
    r = pipeline.run_one("xtuner", scenario.load("multiproc_tiny_cpu_1x2"))
    assert r.status == "unsupported" and "device_ids=[LOCAL_RANK]" in r.reason and "zero_stage 1-3" in r.reason
