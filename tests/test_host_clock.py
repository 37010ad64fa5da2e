"""The host's own clock: each lie about time, told by a third-party
backend that is the torch reference worker with a few lines changed (tests/lying_backends),
ends `invalid` naming the check that caught it, while the honest copy ends `ok`; judged again
with the checks switched off (`FBENCH_UNCHECKED`), each lie's run ends `ok`, so the lie is
live. The switch acts in the host only (the worker never reads it), so judging the same run
folder again is what running the lie with the checks off would give."""

from __future__ import annotations

import json
import shutil
import sys

import pytest

from backend_helpers import CPU, tiny
from fbench_fixtures import LIARS
from framework_bench.measure import clock, clock_checks, verify
from framework_bench.run.launchers import base as launch
from framework_bench.plugins import registry as plugins
from framework_bench.plugins.contract import CONTRACT
from framework_bench.run import pipeline
from framework_bench.run.options import RunOptions
from framework_bench.data.packing import pack

# Four measured steps after one warm-up: a span of a second or more on this CPU.
SCENARIO = tiny(name="tiny_lies", steps={"warmup": 1, "measured": 4})


def test_each_lie_is_the_torch_worker_with_at_most_10_changed_lines(monkeypatch):
    monkeypatch.syspath_prepend(str(LIARS))
    import fbench_lying_worker as kit

    assert kit.changed_lines("honest") == 0
    for lie in kit.LIES:
        assert kit.changed_lines(lie) <= kit.MAX_CHANGED_LINES, lie
        assert kit.lied_source(lie) != kit.worker_path().read_text() or lie == "honest"


@pytest.fixture(scope="module")
def lie_runs(liars, tmp_path_factory):
    """Runs each backend of the kit once, on demand: {backend name: RunResult}."""
    data = pack(SCENARIO, progress=False, say=lambda msg: None)
    root = tmp_path_factory.mktemp("lie-runs")
    done = {}

    def run(name: str):
        if name not in done:
            done[name] = pipeline.run_one(name, SCENARIO, RunOptions(root=root), data=data, machine=CPU)
        return done[name]
    return run


def judged_again(result, monkeypatch, unchecked="clock,pauses,cpu,warmup,gaps"):
    """The same run folder read back and judged with the host clock's checks switched off (those of
    the measured steps, and those of the time around them: a lie that skips the work leaves a
    warm-up too light to read against measured steps that compute nothing)."""
    monkeypatch.setenv(verify.UNCHECKED_ENV, unchecked)
    return pipeline.finish(pipeline.Prepared.of_run_dir(result.run_dir, result.backend, None),
                           launch.Outcome("ok", 0, result.wall_seconds, ""))


# lie -> the check that must catch it
CAUGHT_BY = {
    "halved_seconds": "clock",
    "backward_untimed": "clock",
    "declared_pause": "pauses",
    "compute_then_write": "cpu",
}


@pytest.mark.slow
@pytest.mark.parametrize("lie", list(CAUGHT_BY))
def test_a_lie_about_time_is_invalid_naming_its_check_and_the_honest_copy_is_ok(lie, lie_runs, monkeypatch):
    honest = lie_runs("lying_honest")
    assert honest.status == "ok", honest.reason
    checks = {c.name: c for c in honest.checks}
    assert {checks[n].status for n in ("clock", "pauses", "cpu")} == {"pass"}, checks
    assert checks["clock"].figures["share"] >= clock_checks.MIN_CLAIMED_SHARE

    result = lie_runs(f"lying_{lie}")
    check = CAUGHT_BY[lie]
    assert result.status == "invalid", (result.status, result.reason)
    assert f"{check} check failed" in result.reason, result.reason
    assert {c.name: c.status for c in result.checks}[check] == "fail"

    off = judged_again(result, monkeypatch)
    assert off.status == "ok", off.reason
    assert not {"clock", "pauses", "cpu"} & {c.name for c in off.checks}
    assert off.tgs == pytest.approx(result.tgs or off.tgs)


@pytest.mark.slow
def test_the_claimless_fake_of_the_current_contract_is_invalid(lie_runs, monkeypatch):
    result = lie_runs("lying_no_claims")
    assert result.status == "invalid"
    assert result.reason.startswith(f"claims missing, which plugin contract {CONTRACT} requires:")
    for claim in ("clock", "rows", "throughput", "parameters", "settings", "update", "initial_reveal", "warmup_update"):
        assert claim in result.reason
    off = judged_again(result, monkeypatch, f"clock,update,{verify.CLAIMS}")
    assert off.status == "ok", off.reason
    assert len([f for f in off.flags if "unverified: " in f]) == 6  # each missing claim flagged, as before claims were required


def test_the_stamps_judge_a_run_as_written(tmp_path):
    """The judgement from stamps alone: claimed vs observed less pauses, a pause's share of
    its step, a pause without resume ending the step's window, the CPU share."""
    events = {"0": [[0.0, "begin", None, 0.0], [1.0, "end", 1, 1.0],            # warm-up: not judged
                    [1.0, "begin", None, 1.0], [1.2, "pause", None, 1.2], [1.3, "resume", None, 1.2],
                    [2.0, "pause", None, 1.3], [2.5, "end", 2, 1.3],            # window ends at the pause
                    [2.5, "begin", None, 1.3], [3.5, "end", 3, 1.4]]}
    (tmp_path / clock.STAMPS_FILE).write_text(json.dumps({"ranks": events}))
    out = {c.name: c for c in clock_checks.checks(clock_checks.load_stamps(tmp_path), 1, {0: {2: 0.9, 3: 1.0}}, cpu=True)}
    # observed 1.0 -> 3.5 = 2.5 s, less 0.1 s paused: 2.4 s; claimed 1.9 s is 79 %
    assert out["clock"].status == "fail" and out["clock"].figures["share"] == pytest.approx(1.9 / 2.4, abs=1e-4)
    assert out["pauses"].status == "fail" and out["pauses"].figures["step"] == 2  # 0.1 s of a 1.0 s step
    # CPU work 0.3 s of step 2's 1.0 s window, 0.1 s of step 3's: the median step's 20 %
    assert out["cpu"].status == "fail" and out["cpu"].figures["share"] == pytest.approx(0.2, abs=1e-3)
    fine = {c.name: c for c in clock_checks.checks(clock_checks.load_stamps(tmp_path), 1, {0: {2: 1.0, 3: 1.3}}, cpu=False)}
    assert fine["clock"].status == "pass" and "cpu" not in fine
    (tmp_path / "none").mkdir()
    (tmp_path / "none" / clock.STAMPS_FILE).write_text(json.dumps({"ranks": {}}))
    assert "no clock lines" in clock_checks.checks(clock_checks.load_stamps(tmp_path / "none"), 1, {}, cpu=True)[0].detail
    assert "no stamps" in clock_checks.checks(clock_checks.load_stamps(tmp_path / "nothing"), 1, {}, cpu=True)[0].detail


def test_the_cpu_share_is_the_median_steps_so_one_stalled_step_is_no_lie(tmp_path):
    """One measured step of three waiting on the disk (a lazy import on a cold cache: an honest
    run's first step with no warm-up, 7 s with 0.2 s of CPU work) leaves the median step busy:
    pass, where the span's share (under 50%) failed it. Asleep in two of three steps, as a worker
    replaying work done elsewhere would be to lift the median step's TGS: fail."""
    def judged(steps: list[tuple[float, float]]):
        events, now, cpu = [[0.0, "begin", None, 0.0], [1.0, "end", 1, 1.0]], 1.0, 1.0  # a warm-up step
        for step, (seconds, used) in enumerate(steps, start=2):
            events += [[now, "begin", None, cpu], [now + seconds, "end", step, cpu + used]]
            now, cpu = now + seconds, cpu + used
        (tmp_path / clock.STAMPS_FILE).write_text(json.dumps({"ranks": {"0": events}}))
        claims = {0: {step: seconds for step, (seconds, _) in enumerate(steps, start=2)}}
        return {c.name: c for c in clock_checks.checks(clock_checks.load_stamps(tmp_path), 1, claims, cpu=True)}["cpu"]

    stalled = judged([(7.0, 0.2), (0.15, 0.15), (0.15, 0.147)])
    assert stalled.status == "pass" and stalled.figures["share"] == pytest.approx(0.98)
    assert stalled.figures["span_share"] < clock_checks.MIN_CPU_SHARE
    asleep = judged([(0.15, 0.15), (0.15, 0.0075), (0.15, 0.006)])
    assert asleep.status == "fail" and asleep.figures["share"] == pytest.approx(0.05) and "median step 5%" in asleep.detail


FAKE_NVIDIA_SMI = """#!{python}
import pathlib, time
pathlib.Path({started!r}).touch()
for i in range(10000):  # as `nvidia-smi --query-gpu=index,utilization.gpu,total_energy_consumption -lms N`
    print(f"0, 97, {{1000000 + 50000 * i}}", flush=True)
    print("1, [N/A], [N/A]", flush=True)
    time.sleep(0.02)
"""


def test_on_gpu_nvml_is_recorded_never_judged_and_unavailable_where_unreadable(tmp_path, monkeypatch):
    from framework_bench.worker.steps import ClockLines

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    started = tmp_path / "nvidia-smi started"
    (bin_dir / "nvidia-smi").write_text(FAKE_NVIDIA_SMI.format(python=sys.executable, started=str(started)))
    (bin_dir / "nvidia-smi").chmod(0o755)

    def watched_run(run_dir, gpus):
        import time
        lines = ClockLines(run_dir, 0)
        with clock.Watcher(run_dir, warmup=0, cpu=False, gpus=gpus):
            deadline = time.monotonic() + 60  # a loaded machine starts its Python late
            while not started.exists() and time.monotonic() < deadline and shutil.which("nvidia-smi"):
                time.sleep(0.05)
            time.sleep(0.1)
            lines.write("begin")
            time.sleep(0.5)
            lines.write("end", 1)
            time.sleep(0.1)
        lines.close()
        return clock_checks.checks(clock_checks.load_stamps(run_dir), 0, {0: {1: 0.5}}, cpu=False)[0]

    monkeypatch.setenv("PATH", f"{bin_dir}:{tmp_path / 'nothing'}")
    seen = watched_run(tmp_path / "a", "0,1")
    assert seen.status == "pass" and seen.figures["nvml_busy_percent"] == 97
    assert seen.figures["nvml_samples"] >= 10 and seen.figures["nvml_energy_joules"] is None  # GPU 1 has no counter
    assert "NVML 97% busy" in seen.detail
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    unread = watched_run(tmp_path / "b", "0")
    assert unread.status == "pass" and unread.figures["nvml"].startswith("unavailable: nvidia-smi cannot run")


def test_an_mfu_above_80_percent_of_the_dense_bf16_peak_is_impossible():
    from framework_bench.measure import metrics
    from framework_bench.scenario import scenario
    from framework_bench.plugins.contract import StepMetric

    s = scenario.load("tiny_cpu")
    s = s.model_copy(update={"cluster": s.cluster.model_copy(update={"device": "cuda"})})  # a GPU's run: the GPU rule, not this CPU's ceiling
    steps = [StepMetric(step=i, seconds=0.01, tokens=s.context_length) for i in range(1, s.steps.total + 1)]
    model_tflops = metrics.figures(s, steps, peak_tflops=None)["model_tflops"]
    below = metrics.figures(s, steps, peak_tflops=model_tflops / 0.79, gpu_name="NVIDIA H200")
    assert "impossible" not in below and below["mfu"] == pytest.approx(0.79)
    above = metrics.figures(s, steps, peak_tflops=model_tflops / 0.81, gpu_name="NVIDIA H200")
    assert "MFU 81% is above the peak a GPU sustains, 80% of the NVIDIA H200's dense bf16" in above["impossible"]
    assert above.get("mfu") is None and above.get("tgs") is None


def test_the_slurm_watcher_ends_on_sigterm_with_its_stamps_written_and_reveals_the_seed_it_was_given(tmp_path):
    """The batch script pipes the round's projection seed to each run's watcher and stops it with
    SIGTERM once the workers end: it must end each time (a handler setting an Event deadlocked now
    and then, leaving the job waiting forever), having stamped the lines and revealed that seed."""
    import signal
    import subprocess
    import time

    for attempt in range(5):
        run_dir = tmp_path / f"run{attempt}"
        proc = subprocess.Popen([sys.executable, "-m", "framework_bench.measure.clock", str(run_dir), "0", "1", "1"],
                                stdin=subprocess.PIPE, text=True)
        proc.stdin.write("424242\n")
        proc.stdin.close()
        deadline = time.monotonic() + 30
        while not (run_dir / "clock").exists():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(0.05 * attempt)
        (run_dir / "clock" / "rank0.jsonl").write_text(json.dumps({"event": "end", "step": 1}) + "\n")
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        stamps = json.loads((run_dir / clock.STAMPS_FILE).read_text())
        assert stamps["ranks"]["0"][0][1:3] == ["end", 1] and stamps["reveal"]["seed"] == 424242


@pytest.mark.slow
def test_claims_shaved_within_the_clock_check_gain_nothing(lie_runs, monkeypatch):
    """A worker claiming 0.95 of each step passes the clock check (90%), but the figures are never
    better than the host's own windows: its TGS is the host's, as the honest copy's is; taking
    its claims instead (the old figure) would have flattered it by about 1/0.95."""
    from framework_bench.measure import metrics
    from framework_bench.worker.files import read_metrics
    from framework_bench.plugins.contract import StepMetric

    result = lie_runs("lying_shaved_seconds")
    assert result.status == "ok", result.reason
    stamps = clock_checks.load_stamps(result.run_dir)
    claims = [StepMetric(**m) for m in read_metrics(result.run_dir)]
    seen = clock_checks.host_seconds(stamps)
    measured = [m for m in claims if m.step > SCENARIO.steps.warmup]
    assert all(m.seconds < seen[m.rank, m.step] for m in measured)  # every claim under the host's window
    by_claims = metrics.figures(SCENARIO, claims, None)["tgs"]
    by_host = metrics.figures(SCENARIO, clock_checks.never_above_the_host(claims, stamps), None)["tgs"]
    # By how much the claims would flatter it is no fixed figure: 1/0.95 of the worker's own timer,
    # which spans a little more than the host's window, and a median of other steps (fresh-clone
    # CIs saw 1.040 and 1.022); under the host's window in every step, they flatter it.
    assert result.tgs == pytest.approx(by_host) and by_claims > result.tgs
