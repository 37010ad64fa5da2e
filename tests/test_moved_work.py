"""Work moved out of the measured steps where the host's time checks let it through: the whole
run trained inside the warm-up steps, a share in each (each under the `warmup` check's bound), the
measured steps forward only; and the update (clipping, the optimizer step) of the steps that make
the median moved between the steps, on most days under the `gaps` check's share of the span. Each is the torch
reference worker with a few lines changed (tests/lying_backends/fbench_lying_moved.py), ends
`invalid` in `compare` with torch by the check named below, and with the checks that can catch it off
(`FBENCH_UNCHECKED`, read by the host only: judging the same run folder again is what running the
lie with the check off would give) ends `ok`: the lie is live. The reference passes both checks.
(The honest copy of the torch worker is judged by tests/test_model_lies.py; each bundled
backend's honest run by its own tests.)"""

from __future__ import annotations

import json
import os
import time

import pytest

from backend_helpers import judged_again, passed_but_for_load, tiny
from framework_bench.measure import clock, clock_checks, median_step, reveal_checks, update, verify
from framework_bench.run import compare
from framework_bench.run.options import RunOptions
from framework_bench.worker import update as worker_update
from framework_bench.worker.steps import ClockLines

# A tiny Llama twice as wide (hidden 512) on rows of 320 tokens: its update, about a tenth of a
# step on this CPU, is then some 40 ms, well over the `median_step` check's 5% of the median step
# and its slack for the reading (10 ms of CPU work); moved out of three of six measured steps (the
# last one's after the last stamp), two updates lie between six steps, under the `gaps` check's 5%
# of the span on most days (docs/calibration.md: on a slower day 6.7 %). Four warm-up
# steps: the first trains its own step, each later one three, under the `warmup` check's 16
# forward-only measured steps.
# (The liars run on one thread: their steps' time then follows their work beside other work.)
SCENARIO = tiny(name="tiny_moved_work", context_length=320, steps={"warmup": 4, "measured": 6},
                model={"preset": "tiny-llama", "config": {"hidden_size": 512, "intermediate_size": 1376}})
# lie -> the check that catches it
CAUGHT_BY = {"trained_across_warmup": "warmup_update_parity", "update_between_windows": "median_step"}
# lie -> the checks switched off to show it is live. The moved updates' share of the span is half
# the update's share of a step, which changed from about 12 % to 20 % between two days on the same
# machine (docs/calibration.md): on the slower day `gaps` caught the moved updates too. What
# `median_step` holds that `gaps` lets through is shown on fixed stamps below.
LIVE_WITHOUT = {"trained_across_warmup": "warmup_update_parity", "update_between_windows": "gaps,median_step"}


@pytest.fixture(scope="module")
def runs(liars, tmp_path_factory):
    """One compare of the two liars, torch the reference: {backend: RunResult}."""
    import fbench_lying_moved

    site = tmp_path_factory.mktemp("moved-site")
    liars.register_through_entry_points(site, fbench_lying_moved.ENTRY_POINTS, "fbench-lying-moved")
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(site))
        mp.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ["PYTHONPATH"]]))
        results = compare.compare([SCENARIO], [f"lying_{lie}" for lie in CAUGHT_BY],
                                  RunOptions(root=tmp_path_factory.mktemp("moved-work")))
        yield {r.backend: r for r in results}


@pytest.mark.slow  # real runs of the torch worker's copies
def test_the_reference_passes_and_an_honest_warmup_projects_as_the_references(runs, monkeypatch):
    reference = runs["torch"]
    assert reference.status == "ok", reference.reason
    checks = {c.name: c for c in reference.checks}
    assert checks["warmup_update"].status == checks["median_step"].status == "pass", checks
    assert checks["warmup_update"].figures["seconds_from_reveal"] >= 0
    # the update moved between the steps in the measured steps only: its warm-up trained as the reference's
    moved = judged_again(runs["lying_update_between_windows"], reference, SCENARIO, monkeypatch,
                         LIVE_WITHOUT["update_between_windows"])
    parity = {c.name: c for c in moved.checks}["warmup_update_parity"]
    assert parity.status == "pass" and parity.figures["relative"] < 1e-6, parity.detail


@pytest.mark.slow
@pytest.mark.parametrize("lie", list(CAUGHT_BY))
def test_work_moved_out_of_the_measured_steps_is_invalid_naming_its_check_and_live_without_it(lie, runs, monkeypatch):
    check = CAUGHT_BY[lie]
    result = runs[f"lying_{lie}"]
    assert result.status == "invalid", (result.status, result.reason)
    assert f"{check} check failed" in result.reason, result.reason
    print(f"\n{lie}: " + next(c.detail for c in result.checks if c.name == check))  # docs/calibration.md

    again = judged_again(result, runs["torch"], SCENARIO, monkeypatch, LIVE_WITHOUT[lie])
    # Nothing else holds it: forward-only measured steps can span under the 0.2 s the CPU share
    # needs, and beside other work the checks of the warm-up's and the first window's CPU work stand
    # aside; those may say `unverified`, no check fails.
    assert again.status == "ok" or passed_but_for_load(again), again.reason
    assert again.tgs == pytest.approx(result.tgs)


def _stamps(tmp_path, windows_, cpu=None):
    """Stamps of measured steps one after another: (begin, end) wall stamps, CPU run seconds at each."""
    events = []
    for i, (b, e) in enumerate(windows_, 1):
        c = cpu[i - 1] if cpu else (None, None)
        events += [[b, "begin", None, c[0], c[0], None], [e, "end", i, c[1], c[1], None]]
    (tmp_path / clock.STAMPS_FILE).write_text(json.dumps({"warmup": 0, "ranks": {"0": events}}))
    return clock_checks.load_stamps(tmp_path)


def test_the_gaps_behind_the_median_step_are_held_to_it(tmp_path):
    """The update (0.03 s) moved out of three of five 0.3 s steps, the last one's after the last
    stamp: the median step is one without it, two gaps hold it, 4% of the span (under `gaps`' 5%
    and 15 ms): the second largest gap is a tenth of the median step, and `median_step` fails in
    wall time and CPU work alike. The same 3% after every step of an honest loop, uneven work after
    every step, one long gap alone, gaps of wall time only (descheduled) or of CPU time only (a run
    time read late) pass; the update moved out of every step is `gaps`' to fail."""
    def judged(walls, cpu=None):
        return median_step.median_step_check(_stamps(tmp_path, walls, cpu), warmup=0)

    def busy(walls):  # two threads at work throughout, between the steps too
        return judged(walls, cpu=[(2 * b, 2 * e) for b, e in walls])

    moved = [(0.0, 0.27), (0.3, 0.6), (0.6, 0.87), (0.9, 1.2), (1.2, 1.47)]
    lie = busy(moved)
    assert lie.status == "fail" and lie.figures["gaps_held"] == 2, lie.detail
    assert (lie.figures["wall_gap"], lie.figures["cpu_gap"]) == (pytest.approx(0.03), pytest.approx(0.06))
    claims = {0: {i: 0.3 for i in range(1, 6)}}
    gaps = {c.name: c for c in clock_checks.checks(_stamps(tmp_path, moved), 0, claims, cpu=False)}
    assert gaps["gaps"].status == "pass" and gaps["clock"].status == "pass"  # what the lie passes

    assert busy([(0.3 * i, 0.3 * i + 0.291) for i in range(5)]).status == "pass"  # 3% after every step
    assert busy([(0.0, 0.3), (0.3, 0.6), (1.1, 1.4), (1.4, 1.7), (1.7, 2.0)]).status == "pass"  # one 0.5 s gap
    descheduled = judged(moved, cpu=[(0.54 * i, 0.54 * (i + 1)) for i in range(5)])  # no work between the steps
    assert descheduled.status == "pass" and descheduled.figures["wall_gap"] == pytest.approx(0.03)
    steady = [(0.3 * i, 0.3 * (i + 1)) for i in range(5)]
    # each step's last 40 ms of CPU work read late, in the gap after it
    assert judged(steady, cpu=[(2 * b, 2 * e - 0.04) for b, e in steady]).status == "pass"
    # work every step pays between steps, uneven (HF Trainer's logging and next batch over two
    # processes): gaps of 5-9 % of a step, less the least of them, pass
    uneven = busy([(0.0, 0.3), (0.318, 0.618), (0.645, 0.945), (0.969, 1.269), (1.284, 1.584)])
    assert uneven.status == "pass" and uneven.figures["wall_least_gap"] == pytest.approx(0.015), uneven.detail
    # a lie that moves the update out of every step but the last fills every gap: every step as
    # light, the least gap as full; `gaps` fails it over the span
    everywhere = [(0.3 * i, 0.3 * i + 0.27) for i in range(5)]
    assert busy(everywhere).status == "pass"
    spread = {c.name: c for c in clock_checks.checks(_stamps(tmp_path, everywhere), 0,
                                                     {0: {i: 0.27 for i in range(1, 6)}}, cpu=False)}
    assert spread["gaps"].status == "fail", spread["gaps"].detail
    assert median_step.held(5) == 2 and median_step.held(2) == median_step.held(3) == 1 and median_step.held(7) == 3
    assert "median_step" in verify.BLOCKING


def test_the_watcher_reveals_the_warmup_seed_once_every_rank_ended_the_warmup_and_stamps_the_claim(tmp_path):
    """The seed of the projection at the warm-up's end is revealed when every rank's end line of the
    last warm-up step arrived, not before; a claim in place before rank 0's first measured step
    began passes, one written after it fails."""
    def watched(run_dir, claim_before_begin: bool):
        run_dir.mkdir()
        lines = [ClockLines(run_dir, rank) for rank in (0, 1)]
        seed_file, claim_file = run_dir / worker_update.WARMUP_REVEAL_FILE, run_dir / worker_update.WARMUP_UPDATE_FILE
        reveal = update.Reveal(after_step=3, ranks=2, seed=7, initial_seed=8)
        with clock.Watcher(run_dir, warmup=2, cpu=False, reveal=reveal):
            for line in lines:
                line.write("begin"), line.write("end", 1)
            lines[0].write("begin"), lines[0].write("end", 2)
            time.sleep(0.2)
            before = seed_file.exists()  # rank 1 still in its warm-up
            lines[1].write("begin"), lines[1].write("end", 2)
            seed = worker_update.wait_for_reveal(run_dir, timeout=10, reveal_file=worker_update.WARMUP_REVEAL_FILE)
            claim = json.dumps({"projection_seed": seed, "projection": 0.5, "norm": 1.0, "parts": {}})
            if claim_before_begin:
                claim_file.write_text(claim)
            lines[0].write("begin")
            if not claim_before_begin:
                time.sleep(0.1)
                claim_file.write_text(claim)
            lines[0].write("end", 3), lines[1].write("begin"), lines[1].write("end", 3)
            time.sleep(0.2)
        stamps = clock_checks.load_stamps(run_dir)
        return before, stamps, reveal_checks.warmup_update_check(stamps, run_dir)

    before, stamps, in_time = watched(tmp_path / "a", claim_before_begin=True)
    assert not before
    assert stamps["warmup_reveal"]["seed"] == update.derived_warmup_seed(7) != 7
    assert stamps["warmup_reveal"]["stamp"] == stamps["ranks"]["1"][3][0]  # with rank 1's end of step 2
    assert in_time.status == "pass", in_time.detail
    _, _, late = watched(tmp_path / "b", claim_before_begin=False)
    assert late.status == "fail" and "after it began" in late.detail
