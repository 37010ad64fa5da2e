"""Time outside the measured steps: each lie a third-party backend can tell
with the torch reference worker and a few lines changed (tests/lying_backends) - the training
done after the last measured step, or inside warm-up step 1, the measured steps forward only;
claimed seconds moved from one step to another, the same total; the optimizer step between two
measured steps - ends `invalid` in `compare` with torch, naming the check that caught it, while
the honest copy ends `ok`. Judged again with that check off (`FBENCH_UNCHECKED`, read by the
host only: judging the same run folder again is what running the lie with the check off would
give), each lie's run ends `ok`, so the lie is live."""

from __future__ import annotations

import pytest

from backend_helpers import judged_again, tiny
from framework_bench.measure import clock, clock_checks, reveal_checks, verify
from framework_bench.run import compare
from framework_bench.run.options import RunOptions

# Rows of 256 tokens: the optimizer step moved out of the steps is then well over MAX_GAP_SHARE
# of a step on one thread as on several (at 512 tokens on one thread it was 5.1%). 17 measured
# steps: the forward-only steps of two lies mostly span more than the CPU share needs to be read
# (clock_checks.MIN_CPU_SPAN_SECONDS; not always, so judged again that check alone may say
# `unverified`), and the rows stop before the 20th, which holds no answer token at this length
# (no loss to hold against the reference's).
SCENARIO = tiny(name="tiny_outside_steps", context_length=256, steps={"warmup": 2, "measured": 17})

# lie -> (the check that must catch it, the checks switched off to show the lie is live). Under
# a heavy load the optimizer step between steps outgrows the clock's 10 % slack too.
CAUGHT_BY = {
    # (forward-only measured steps are so short that the time between them can fail `clock` and `gaps` too)
    "train_after_steps": ("losses_in_time", "losses_in_time,warmup_update,clock,gaps"),
    # `warmup` first; where it stands aside under load, `warmup_update_parity` (an invalid run is judged no further)
    "trained_in_warmup": ("warmup|warmup_update_parity", "warmup,warmup_update_parity,clock,gaps"),
    "claims_moved": ("clock", "clock"),
    "optimizer_between_steps": ("gaps", "gaps,clock,median_step,warmup_update_parity"),
}


@pytest.fixture(scope="module")
def runs(liars, tmp_path_factory):
    """One compare of the liars and the honest copy, torch the reference: {backend: RunResult}."""
    names = [f"lying_{lie}" for lie in CAUGHT_BY] + ["lying_honest"]
    results = compare.compare([SCENARIO], names, RunOptions(root=tmp_path_factory.mktemp("outside-steps")))
    return {r.backend: r for r in results}


@pytest.mark.slow  # real runs of the torch worker's copies
def test_the_honest_copy_and_the_reference_pass_every_time_check(runs):
    for name in ("lying_honest", "torch"):
        r = runs[name]
        assert r.status == "ok", (name, r.reason)
        checks = {c.name: c for c in r.checks}
        assert {checks[n].status for n in ("clock", "gaps", "warmup", "cpu")} == {"pass"}, checks
        assert checks["clock"].figures["projection_seconds"] > 0
    assert {c.name: c.status for c in runs["lying_honest"].checks}["projection_delay"] == "pass"


@pytest.mark.slow
@pytest.mark.parametrize("lie", list(CAUGHT_BY))
def test_time_outside_the_measured_steps_is_invalid_naming_its_check_and_live_without_it(lie, runs, monkeypatch):
    checks, off = CAUGHT_BY[lie]
    result = runs[f"lying_{lie}"]
    assert result.status == "invalid", (result.status, result.reason)
    status = {c.name: c.status for c in result.checks}
    caught = [check for check in checks.split("|") if status.get(check) == "fail"]
    assert caught and f"{caught[0]} check failed" in result.reason, result.reason

    again = judged_again(result, runs["torch"], SCENARIO, monkeypatch, off)
    # A lie whose measured steps run forward only can span under the 0.2 s the CPU share needs
    # (0.189 s once, on a quiet machine): that check alone may then say `unverified`, never fail.
    assert again.status == "ok" or again.reason.startswith("what the host could not measure: cpu ("), again.reason
    assert again.tgs == pytest.approx(result.tgs)


def test_each_steps_claim_is_held_to_its_own_window_and_the_gaps_to_the_span(tmp_path):
    """From stamps alone: claims moved between steps (the same total) fail the clock; time
    between steps beyond MAX_GAP_SHARE fails gaps; a warm-up step's CPU work far beyond the
    measured median fails warmup, its wall time alone is a flag (warmup_time)."""
    import json

    def stamps(ends, cpu=None):
        """Steps 1..n, one after another: (begin, end) stamps, CPU run seconds at each."""
        events = []
        for i, (b, e) in enumerate(ends, 1):
            events += [[b, "begin", None, *(cpu[i - 1][0],) * 2], [e, "end", i, *(cpu[i - 1][1],) * 2]] if cpu else \
                      [[b, "begin", None], [e, "end", i]]
        return {"ranks": {"0": events}}

    def judged(st, claims, cpu=False):
        (tmp_path / clock.STAMPS_FILE).write_text(json.dumps(st))
        return {c.name: c for c in clock_checks.checks(clock_checks.load_stamps(tmp_path), 1, {0: claims}, cpu=cpu)}

    steady = [(0.0, 1.0), (1.0, 2.0), (2.0, 3.0), (3.0, 4.0)]
    fair = judged(stamps(steady), {2: 1.0, 3: 1.0, 4: 1.0})
    assert fair["clock"].status == fair["gaps"].status == fair["warmup_time"].status == "pass"
    moved = judged(stamps(steady), {2: 0.5, 3: 0.5, 4: 2.0})  # the same 3.0 s, the median halved
    assert moved["clock"].status == "fail" and moved["clock"].figures["step_step"] == 2
    assert "under 90% of its own window" in moved["clock"].detail
    jitter = judged(stamps(steady), {2: 0.9 - clock_checks.STAMP_JITTER_SECONDS / 2, 3: 1.0, 4: 1.0})
    assert jitter["clock"].status == "pass"
    gapped = judged(stamps([(0.0, 1.0), (1.0, 1.9), (2.0, 2.9), (3.0, 3.9)]), {2: 0.9, 3: 0.9, 4: 0.9})
    assert gapped["gaps"].status == "fail" and gapped["gaps"].figures["share"] == pytest.approx(0.2 / 2.9, abs=1e-4)
    assert gapped["clock"].status == "pass"  # 2.7 of 2.9 s: within the sum's slack
    gapped_cpu = [(0, 1.0), (1.0, 1.9), (2.0, 2.9), (3.0, 3.9)]
    worked = judged(stamps([(0.0, 1.0), (1.0, 1.9), (2.0, 2.9), (3.0, 3.9)], cpu=gapped_cpu), {2: 0.9, 3: 0.9, 4: 0.9}, cpu=True)
    assert worked["gaps"].status == "fail"  # CPU work and wall time between the steps
    descheduled = judged(stamps([(0.0, 1.0), (1.0, 1.9), (2.0, 2.9), (3.0, 3.9)], cpu=[(0, 1.0), (1.0, 1.9), (1.9, 2.8), (2.8, 3.7)]),
                         {2: 0.9, 3: 0.9, 4: 0.9}, cpu=True)
    assert descheduled["gaps"].status == "pass" and descheduled["gaps"].figures["wall_share"] > clock_checks.MAX_GAP_SHARE
    stale = judged(stamps(steady, cpu=[(0, 0.9), (1.0, 1.8), (2.0, 2.7), (3.0, 3.6)]), {2: 1.0, 3: 1.0, 4: 1.0}, cpu=True)
    assert stale["gaps"].status == "pass" and stale["gaps"].figures["cpu_share"] > clock_checks.MAX_GAP_SHARE

    slow_warmup = [(0.0, 25.0), (25.0, 26.0), (26.0, 27.0), (27.0, 28.0)]
    hidden = judged(stamps(slow_warmup, cpu=[(0, 25), (25, 25.1), (25.1, 25.2), (25.2, 25.3)]), {2: 1, 3: 1, 4: 1}, cpu=True)
    assert hidden["warmup"].status == "fail" and hidden["warmup"].figures["cpu_seconds"] == 25
    assert hidden["warmup_time"].status == "fail" and "warmup_time" not in verify.BLOCKING
    compiled = judged(stamps(slow_warmup, cpu=[(0, 1), (25, 26), (26, 27), (27, 28)]), {2: 1, 3: 1, 4: 1}, cpu=True)
    assert compiled["warmup"].status == "pass" and compiled["warmup_time"].status == "fail"
    assert {"gaps", "warmup", "losses_in_time"} <= set(verify.BLOCKING) and "projection_delay" not in verify.BLOCKING


def test_a_heavy_warmup_beside_other_work_is_unverified_never_invalid(tmp_path):
    """The same 25 s warm-up of CPU work: `invalid` where the machine's other processes were idle
    meanwhile, `unverified` where they kept half of its CPUs busy (from the machine's busy time
    the watcher stamps), and judged as before from stamps that lack it."""
    import json

    def judged(others_per_second, cpus=2):
        ran = [(0, 25), (25, 25.1), (25.1, 25.2), (25.2, 25.3)]
        walls = [(0.0, 25.0), (25.0, 26.0), (26.0, 27.0), (27.0, 28.0)]
        events = []
        for i, ((b, e), (rb, re_)) in enumerate(zip(walls, ran), 1):
            busy = None if others_per_second is None else (rb + others_per_second * cpus * b, re_ + others_per_second * cpus * e)
            events += [[b, "begin", None, rb, rb, busy and busy[0]], [e, "end", i, re_, re_, busy and busy[1]]]
        (tmp_path / clock.STAMPS_FILE).write_text(json.dumps({"cpus": cpus, "ranks": {"0": events}}))
        return {c.name: c for c in clock_checks.checks(clock_checks.load_stamps(tmp_path), 1, {0: {2: 1, 3: 1, 4: 1}},
                                                       cpu=True)}["warmup"]

    quiet = judged(0.02)
    assert quiet.status == "fail" and quiet.figures["others_share"] == pytest.approx(0.02, abs=1e-3)
    loaded = judged(0.5)
    assert loaded.status == "unverified" and "other processes kept 50% of the machine's CPUs busy" in loaded.detail
    assert judged(None).status == "fail" and "others_share" not in judged(None).figures
    assert clock.machine_busy_seconds() > 0  # read on this machine


def test_the_projection_delay_is_held_to_the_references(tmp_path):
    from framework_bench.measure.metrics import RunResult
    from framework_bench.measure.verify import Check

    def run(backend, **figures):
        return RunResult.model_construct(backend=backend, checks=[Check(name="clock", status="pass", figures=figures)])

    reference = run("torch", projection_seconds=0.3, median_step_seconds=0.08)
    ok = reveal_checks.projection_delay_check(run("a", projection_seconds=1.1, median_step_seconds=0.1), reference)
    assert ok.status == "pass" and ok.figures["limit"] == pytest.approx(1.2)  # 4x the reference's
    assert reveal_checks.projection_delay_check(run("b", projection_seconds=1.3, median_step_seconds=0.1), reference).status == "fail"
    assert reveal_checks.projection_delay_check(run("c", projection_seconds=0.55), run("torch", projection_seconds=0.1)).status == "pass"
    # an honest run at a busier moment than its reference's: within 6 of its own median steps
    busy = run("f", projection_seconds=6.0, median_step_seconds=2.2)
    assert reveal_checks.projection_delay_check(busy, reference).status == "pass"
    deferred = run("g", projection_seconds=46.6, median_step_seconds=0.9)
    late = reveal_checks.projection_delay_check(deferred, reference)
    assert late.status == "fail" and "work done after the last measured step" in late.detail
    assert reveal_checks.projection_delay_check(run("d"), reference) is None  # no update claim: its update check says why
    assert reveal_checks.projection_delay_check(run("e", projection_seconds=1.0), run("torch")).status == "unverified"


def test_losses_must_be_written_by_the_reveal_and_kept_as_written(tmp_path):
    """The watcher notes, at the seed's reveal, how far each rank's loss records reach and their
    digest; rank 0's must reach the step before the last, and none may change after."""
    import json

    from framework_bench.measure.update import Reveal
    from framework_bench.worker.losses import LOSSES_DIR
    from framework_bench.worker.steps import ClockLines

    def record(step):
        return json.dumps({"step": step, "micro": 0, "loss": 2.0, "divisor": 10.0, "supervised": 10}) + "\n"

    def watched(run_dir, written_by_reveal, written_after=""):
        (run_dir / LOSSES_DIR).mkdir(parents=True)
        losses = run_dir / LOSSES_DIR / "rank0.jsonl"
        losses.write_text(written_by_reveal + '{"step": 4, "mic')  # a record half written: left out
        lines = ClockLines(run_dir, 0)
        with clock.Watcher(run_dir, warmup=0, cpu=False, reveal=Reveal(after_step=4, ranks=1, seed=7, initial_seed=8)):
            for step in range(1, 5):
                lines.write("begin"), lines.write("end", step)
            while not (run_dir / "projection_seed.json").exists():
                time.sleep(0.005)
        lines.close()
        losses.write_text(written_by_reveal + written_after)
        return reveal_checks.losses_in_time_check(clock_checks.load_stamps(run_dir), run_dir)

    import time
    in_time = watched(tmp_path / "a", "".join(record(s) for s in (1, 2, 3)), record(4))
    assert in_time.status == "pass" and in_time.figures["rank0_to_step_at_reveal"] == 3, in_time.detail
    late = watched(tmp_path / "b", record(1), "".join(record(s) for s in (2, 3, 4)))
    assert late.status == "fail" and "steps 2-3 were computed after" in late.detail
    rewritten = watched(tmp_path / "c", "".join(record(s) for s in (1, 2, 3)), record(4))
    (tmp_path / "c" / "losses" / "rank0.jsonl").write_text(record(1).replace("2.0", "1.9") + record(2) + record(3) + record(4))
    again = reveal_checks.losses_in_time_check(clock_checks.load_stamps(tmp_path / "c"), tmp_path / "c")
    assert rewritten.status == "pass" and again.status == "fail" and "changed after it" in again.detail
    (tmp_path / "d").mkdir()
    assert reveal_checks.losses_in_time_check(None, tmp_path / "d") is None


def test_the_watcher_stamps_the_update_claim_as_it_is_renamed_into_the_run_folder(tmp_path):
    """projection_seconds: from the seed's reveal (the last step's end) to the moment the worker's
    update claim appeared, as the worker SDK writes it (a temporary file renamed into place)."""
    import time

    from framework_bench.measure.update import Reveal
    from framework_bench.worker.files import REVEAL_FILE, UPDATE_FILE
    from framework_bench.worker.steps import ClockLines

    lines = ClockLines(tmp_path, 0)
    with clock.Watcher(tmp_path, warmup=0, cpu=False, reveal=Reveal(after_step=1, ranks=1, seed=7, initial_seed=8)):
        lines.write("begin")
        time.sleep(0.05)
        lines.write("end", 1)
        while not (tmp_path / REVEAL_FILE).exists():
            time.sleep(0.005)
        time.sleep(0.3)  # the projection
        (tmp_path / "update.tmp").write_text("{}")
        (tmp_path / "update.tmp").replace(tmp_path / UPDATE_FILE)
        renamed = time.monotonic()
        time.sleep(0.2)
    lines.close()
    stamps = clock_checks.load_stamps(tmp_path)
    assert abs(stamps["update_claim"]["stamp"] - renamed) < 0.05
    figures = {c.name: c for c in clock_checks.checks(stamps, 0, {0: {1: 0.05}}, cpu=False)}["clock"].figures
    assert 0.3 <= figures["projection_seconds"] < 0.4



def test_a_cpu_figure_the_host_cannot_read_is_unverified_never_a_pass(tmp_path):
    """A span under MIN_CPU_SPAN_SECONDS (or no /proc) makes the cpu check
    `unverified`, saying why; a warm-up's CPU work too little to read, the warmup check."""
    import json

    events = [[0.0, "begin", None, 0.0, 0.0], [0.05, "end", 1, 0.1, 0.1],  # 20x the measured steps', 0.1 s
              [0.05, "begin", None, 0.1, 0.1], [0.1, "end", 2, 0.105, 0.105], [0.1, "begin", None, 0.105, 0.105],
              [0.15, "end", 3, 0.11, 0.11]]
    (tmp_path / clock.STAMPS_FILE).write_text(json.dumps({"ranks": {"0": events}}))
    out = {c.name: c for c in clock_checks.checks(clock_checks.load_stamps(tmp_path), 1, {0: {2: 0.05, 3: 0.05}}, cpu=True)}
    assert out["cpu"].status == "unverified" and "0.100 s of measured steps is too short" in out["cpu"].detail
    assert out["warmup"].status == "unverified" and "too little to read" in out["warmup"].detail
    assert set(clock_checks.HOST_MEASURED) == {"cpu", "warmup"}
    no_proc = [e[:3] for e in events]
    (tmp_path / clock.STAMPS_FILE).write_text(json.dumps({"ranks": {"0": no_proc}}))
    out = {c.name: c for c in clock_checks.checks(clock_checks.load_stamps(tmp_path), 1, {0: {2: 0.05, 3: 0.05}}, cpu=True)}
    assert out["cpu"].detail == "unverified: no /proc to read" and out["warmup"].status == "unverified"
