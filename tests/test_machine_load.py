"""The `machine` check (framework_bench/measure/machine_load.py) on the watcher's stamps, and what
the answer does with a disturbed run: counts it on its first line, ranks nothing on it, quotes no
share of a disturbed reference."""

from __future__ import annotations

from framework_bench.measure import machine_load
from framework_bench.measure.verify import BLOCKING
from framework_bench.present import verdict


def stamps(others_per_step: float, cpus: int = 2, steps: int = 4) -> dict:
    """Rank 0's events for one warm-up and `steps - 1` measured steps of one second each: the run's
    tree ran 1 CPU-second a step, other processes `others_per_step` CPU-seconds."""
    events, ran, busy = [], 0.0, 0.0
    for step in range(1, steps + 1):
        t = float(step)
        events.append([t, "begin", step, ran, ran, busy])
        ran, busy = ran + 1.0, busy + 1.0 + others_per_step
        events.append([t + 1.0, "end", step, ran, ran, busy])
    return {"cpus": cpus, "ranks": {"0": events}}


def test_a_run_beside_other_work_is_disturbed_a_flag_never_a_reason_to_call_it_invalid():
    quiet = machine_load.check(stamps(0.1), warmup=1)
    assert quiet.status == "pass" and quiet.figures == {"others_share": 0.05, "cpus": 2, "steps": 3}
    busy = machine_load.check(stamps(1.6), warmup=1)  # two busy loops beside it, less what the run took
    assert busy.status == "fail" and busy.figures["others_share"] == 0.8
    assert busy.detail.startswith("disturbed: other processes kept 80% of the machine's 2 CPUs busy")
    assert machine_load.NAME not in BLOCKING


def test_no_figure_where_the_watcher_read_no_machine_time():
    assert machine_load.check(None, warmup=1) is None
    unread = {"cpus": 2, "ranks": {"0": [[1.0, "begin", 1], [2.0, "end", 1], [2.0, "begin", 2], [3.0, "end", 2]]}}
    assert machine_load.check(unread, warmup=1) is None


def run(backend: str, tgs: float, others: float, i: int) -> dict:
    check = machine_load.check(stamps(others), warmup=1)
    return {"id": i, "backend": backend, "scenario": "s", "tgs": tgs, "tgs_min": tgs * 0.99, "tgs_max": tgs * 1.01,
            "status": "ok", "compare_id": "c1", "trial_round": 1, "checks": [check.model_dump()]}


def test_the_answer_counts_disturbed_runs_first_and_ranks_none_on_them():
    runs = [run("torch", 1000.0, 1.6, 1), run("a", 1300.0, 0.0, 2), run("b", 1000.0, 0.0, 3)]
    points = verdict.Points(runs, "torch")
    first, line, _ = points.answers()
    assert first.startswith("1 of 3 runs ran on a busy machine (other processes kept over 25% of its CPUs busy")
    # a and b are apart on their steps, but the reference's share is not quoted
    assert line == "s: a fastest, 30.0% above b on one trial each, beyond their steps' spread: no interval; " \
                   "torch's run disturbed: no share of it", line
    assert ("s", "torch") in points.disturbed and "s: torch's run in round 1 was disturbed: other processes" in \
        "\n".join(points.lines)
    shaken = [run("torch", 1000.0, 0.0, 1), run("a", 1300.0, 1.6, 2), run("b", 1000.0, 0.0, 3)]
    _, line, _ = verdict.Points(shaken, "torch").answers()
    assert line == "s: a 30.0% above b on one trial each, a run of them disturbed: one trial on a busy machine " \
                   "cannot rank them; 130% of torch", line


def test_check_backend_skips_a_busy_machine_and_fails_a_check_the_run_could_not_judge():
    """`fbench check-backend` judges the backend: a disturbed run is said, not held against it."""
    from framework_bench import testing
    from framework_bench.measure.verify import Check

    busy = testing.conformance_point(machine_load.check(stamps(1.6), warmup=1))
    assert busy.status == "skipped" and busy.detail.startswith("not the backend's: disturbed: ")
    unjudged = testing.conformance_point(Check(name="cpu", status="unverified", detail="unverified: too short"))
    assert unjudged.status == "fail"
