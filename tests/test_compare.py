"""`fbench compare` with backends that end badly: every run is a stored row, and the
rows of runs that finished survive a crash, a timeout or Ctrl-C of another.

The fake backends are registered through the `fbench.backends` entry points, like any
third-party backend; their worker writes real metrics files but trains nothing, so these
tests check the host's bookkeeping, not a framework (tests/test_compare_real.py does that).
"""

import json
import signal
import sqlite3

import pytest
from typer.testing import CliRunner

from framework_bench.run import compare, design, dry_run
from framework_bench.run import round as round_
from framework_bench.run.options import RunOptions
from framework_bench.scenario import scenario
from framework_bench.cli import app
from framework_bench.store.results import ResultStore



def _run(backends, tmp_path, **kw):
    store = ResultStore(tmp_path / "results.sqlite")
    tiny = scenario.load("tiny_cpu")
    try:
        results = compare.compare([tiny], backends, RunOptions(**kw), store=store)
    except compare.Interrupted as stop:
        results = stop.args[0]
    return results, store


def test_a_crashing_backend_is_a_failed_row_and_the_other_survives(fakes, tmp_path):
    results, store = _run(["fake_crash", "fake_ok"], tmp_path)
    assert [r.status for r in results] == ["failed", "ok"]
    assert "the fake trainer fell over" in results[0].reason
    ok = results[1]
    # 512 tokens in 0.5 s per step, warm-up excluded
    assert ok.tgs == pytest.approx(1024.0) and ok.steps_measured == 5
    rows = store.list()  # the reference (fake_ok here) is stored first: the round's other runs once it judged them
    assert [(r["backend"], r["status"]) for r in rows] == [("fake_ok", "ok"), ("fake_crash", "failed")]
    assert store.get(rows[0]["id"])["steps"][0]["tokens"] == 512


@pytest.mark.slow  # starts a framework's or the host's own process
def test_a_hanging_backend_times_out(fakes, tmp_path):
    results, store = _run(["fake_hang", "fake_ok"], tmp_path, timeout=3)
    assert [r.status for r in results] == ["timeout", "ok"]
    assert "timeout" in results[0].reason
    assert sorted(r["status"] for r in store.list()) == ["ok", "timeout"]


def test_ctrl_c_keeps_the_finished_rows(fakes, tmp_path):
    # A shell that starts the tests in the background ignores SIGINT; restore Python's own
    # handler so the fake worker's SIGINT arrives as the KeyboardInterrupt Ctrl-C would raise.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        results, store = _run(["fake_noisy", "fake_interrupt", "fake_ok"], tmp_path, timeout=120)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert [r.status for r in results] == ["unverified", "interrupted"]  # the reference, last, never started
    # fake_noisy's run waited for the round's reference to judge it: stored unjudged, never lost
    assert [(r["backend"], r["status"]) for r in store.list()] == [("fake_noisy", "unverified"),
                                                                     ("fake_interrupt", "interrupted")]
    assert "the round stopped before the reference fake_ok ran" in store.list()[0]["reason"]
    # nothing half-written: every stored finished row has all its steps
    conn = sqlite3.connect(store.path)
    assert conn.execute("SELECT COUNT(*) FROM steps").fetchone()[0] == 7


@pytest.mark.slow  # starts a framework's or the host's own process
def test_cli_compare_json_table_and_charts(fakes, tmp_path):
    db, out = tmp_path / "r.sqlite", tmp_path / "plots"
    res = CliRunner().invoke(app, ["compare", "--scenario", "tiny_cpu", "--backends", "fake_ok,fake_crash",
                                   "--db", str(db), "--out", str(out), "--json"])
    assert res.exit_code == 1, res.output  # a failed run: everything is stored and drawn, and the exit says so
    records = json.loads(res.stdout)["runs"]
    assert {r["backend"]: r["status"] for r in records} == {"fake_ok": "ok", "fake_crash": "failed"}
    for r in records:
        assert {"backend", "scenario", "status", "tgs", "tflops", "mfu", "data_sha256", "result_id"} <= r.keys()
        assert r["result_id"] is not None
    assert (out / "report.html").stat().st_size > 1000
    svg = next(out.glob("tgs_tflops_*.svg")).read_text()
    assert "fake_ok" in svg and "failed" in svg


def test_a_one_trial_compare_ends_with_the_fastest_framework_and_how_to_get_an_interval(fakes, tmp_path):
    import re
    res = CliRunner().invoke(app, ["compare", "--scenario", "tiny_cpu", "--backends", "fake_noisy,fake_noisy_slow",
                                   "--db", str(tmp_path / "r.sqlite"), "--out", str(tmp_path / "plots")])
    assert res.exit_code == 0, res.output
    *_, answer, hint, closing = res.output.splitlines()
    fastest, ahead, other = re.fullmatch(r"tiny_cpu: (\S+) fastest, ([\d.]+)% above (\S+) on one trial each, beyond "
                                         r"their steps' spread: no interval; \d+% of fake_ok", answer).groups()
    assert {fastest, other} == {"fake_noisy", "fake_noisy_slow"} and float(ahead) >= 0
    assert hint.startswith("one trial per backend gives no interval: --repeat 3")
    assert "1 trial: no interval" not in res.output  # said once, in the answer, not per pair
    assert closing.startswith("3 run(s): 3 ok · exit 0")


def test_cli_compare_unknown_backend_is_one_clear_error(fakes, tmp_path):
    res = CliRunner().invoke(app, ["compare", "--scenario", "tiny_cpu", "--backends", "nope",
                                   "--db", str(tmp_path / "r.sqlite")])
    assert res.exit_code == 1
    assert "no backend named nope" in res.output and "Traceback" not in res.output


def test_published_scenario_without_the_gpus_says_what_is_missing(fakes, tmp_path):
    results, _ = _run_named(["yi34b_128k"], ["fake_ok"], tmp_path)
    r = results[0]
    assert r.status == "unsupported"
    assert "needs 4 node(s) x 8 GPUs" in r.reason and "--dry-run" in r.reason


def _run_named(names, backends, tmp_path):
    store = ResultStore(tmp_path / "results.sqlite")
    return compare.compare(compare.expand(names), backends, store=store), store


def test_globs_expand_in_context_order():
    names = [s.name for s in compare.expand(["tiny_cpu*"])]
    assert names == ["tiny_cpu", "tiny_cpu_lora", "tiny_cpu_qlora", "tiny_cpu_1k", "tiny_cpu_2k", "tiny_cpu_4k"]
    with pytest.raises(scenario.ScenarioError):
        compare.expand(["nothing_like_this*"])


def test_percent_of_the_reference_needs_an_ok_reference_row_on_the_same_scenario():
    from framework_bench.present.verdict import Points
    runs = [dict(scenario=scn, backend=b, status=status, tgs=tgs) for scn, b, status, tgs in [
        ("a", "torch", "ok", 200.0), ("a", "xtuner", "ok", 150.0), ("a", "lf", "failed", None),
        ("b", "torch", "failed", None), ("b", "xtuner", "ok", 90.0), ("c", "xtuner", "ok", 10.0)]]
    shares = Points(runs, "torch").shares
    assert {key: r.ratio * 100 for key, r in shares.items()} == {("a", "torch"): 100.0, ("a", "xtuner"): 75.0}


@pytest.mark.slow  # starts a framework's or the host's own process
def test_cli_compare_table_shows_the_share_of_the_reference(fakes, tmp_path, monkeypatch):
    """fake_ok standing in as the reference: every fake_ok-like row on the scenario is 100 %."""
    monkeypatch.setenv("FBENCH_REFERENCE", "fake_ok")
    res = CliRunner().invoke(app, ["compare", "--scenario", "tiny_cpu", "--backends", "fake_ok,fake_crash",
                                   "--db", str(tmp_path / "r.sqlite"), "--out", str(tmp_path / "plots")])
    assert res.exit_code == 1, res.output  # fake_crash failed: compare says so in its exit code
    assert "% of fake_ok" in res.output
    row = next(line for line in res.output.splitlines() if "│ fake_ok" in line)
    assert "100%" in row
    # the last line counts the runs as pytest's does, and says what the exit code means
    assert res.output.splitlines()[-1] == "2 run(s): 1 ok, 1 failed · exit 1: a run failed or was judged invalid (why above)"


@pytest.mark.parametrize("k", [2, 3, 4, 5])
def test_round_orders_put_each_backend_in_each_place_and_after_each_other_equally_often(k):
    from collections import Counter
    names = [f"b{i}" for i in range(k)]
    rows = design.round_orders(names)
    assert rows[0][0] == "b0" and all(sorted(row) == names for row in rows)
    places = Counter((row.index(b), b) for row in rows for b in row)
    after = Counter(pair for row in rows for pair in zip(row, row[1:]))
    assert len(set(places.values())) == 1 and len(places) == k * k
    assert len(set(after.values())) == 1 and len(after) == k * (k - 1)


def test_repeated_trials_are_tagged_rotated_and_judged_against_their_rounds_reference(monkeypatch, tmp_path):
    """The loop alone (run_one stands in): a warm-up round on CPU, then `repeat` rounds; the
    reference rotates with the others (last in the first round), and judges its round's runs once
    they all ended. While runs after it in its round run, its folder is off the disk (nothing to
    copy); it is back, as it was, when the round ends."""
    from framework_bench.measure.metrics import RunResult
    monkeypatch.setenv("FBENCH_REFERENCE", "ref")
    monkeypatch.setattr(compare.plugins, "backends", lambda pinned=(): {"ref": None, "a": None, "b": None})
    judged, handed, seen = [], [], []

    def run_one(name, s, options, on_step):
        seen.append((name, sorted(p.name for p in tmp_path.iterdir())))  # what a run starting now finds
        run_dir = tmp_path / f"{len(seen)}-{name}"
        run_dir.mkdir()
        (run_dir / "update_projection.json").write_text(f'{{"run": "{name} {len(seen)}"}}')
        return RunResult(backend=name, scenario=s.name, status="ok", tgs=1.0, run_dir=run_dir)

    monkeypatch.setattr(round_.pipeline, "run_one", run_one)
    monkeypatch.setattr(round_.referee, "judge", lambda r, ref, s, why, run_twin: judged.append(
        (r.backend, r.trial_round, ref and (ref.backend, ref.trial_round))))
    results = compare.compare([scenario.load("tiny_cpu")], ["a", "b"], repeat=2,
                              on_result=lambda r, s: handed.append(r.backend))
    assert [(r.trial_round, r.trial_position, r.backend) for r in results] == [
        (0, 1, "a"), (0, 2, "b"), (0, 3, "ref"), (1, 1, "b"), (1, 2, "ref"), (1, 3, "a"),
        (2, 1, "ref"), (2, 2, "a"), (2, 3, "b")]
    assert len({r.compare_id for r in results}) == 1
    assert judged == [(b, n, ("ref", n)) for n, order in ((0, "ab"), (1, "ba"), (2, "ab")) for b in order]
    assert handed == ["ref", "a", "b", "ref", "b", "a", "ref", "a", "b"]  # the reference's row first, once all ran
    # round 1's reference (run 5) is not there for a (run 6); round 2's (run 7) not for a and b
    assert "5-ref" not in seen[5][1] and "7-ref" not in seen[7][1] + seen[8][1]
    assert {"3-ref", "5-ref"} <= set(seen[7][1])  # earlier rounds' references are back
    assert all((tmp_path / f"{n}-ref" / "update_projection.json").read_text() == f'{{"run": "ref {n}"}}' for n in (3, 5, 7))
    judged.clear()
    assert len(compare.compare([scenario.load("tiny_cpu")], ["a"], repeat=2, warmup_rounds=0,
                               no_reference=True)) == 2
    assert judged == [("a", 1, None), ("a", 2, None)]  # judged without a reference: never ok


def test_an_interrupt_after_a_rotated_reference_puts_its_folder_back_and_judges_the_finished_runs(monkeypatch, tmp_path):
    """Ctrl-C in the last run of a round whose reference ran second: the reference's folder is back
    on the disk, its row handed on, and the run before it judged against it; the interrupted run
    passes through, and no judging reference is started after the Ctrl-C."""
    from framework_bench.measure.metrics import RunResult
    monkeypatch.setenv("FBENCH_REFERENCE", "ref")
    monkeypatch.setattr(compare.plugins, "backends", lambda pinned=(): {"ref": None, "a": None, "b": None})
    judged, handed, started = [], [], []

    def run_one(name, s, options, on_step):
        started.append(name)
        run_dir = tmp_path / f"{len(started)}-{name}"
        run_dir.mkdir()
        return RunResult(backend=name, scenario=s.name, run_dir=run_dir, tgs=1.0,
                         status="interrupted" if len(started) == 6 else "ok")

    monkeypatch.setattr(round_.pipeline, "run_one", run_one)
    monkeypatch.setattr(round_.referee, "judge", lambda r, ref, s, why, run_twin: judged.append((r.backend, ref and ref.backend)))
    with pytest.raises(compare.Interrupted):
        compare.compare([scenario.load("tiny_cpu")], ["a", "b"], repeat=2,
                        on_result=lambda r, s: handed.append((r.backend, r.status)))
    assert started == ["a", "b", "ref", "b", "ref", "a"]  # round 1: b, ref, then a interrupted
    assert (tmp_path / "5-ref").is_dir()
    assert handed[3:] == [("ref", "ok"), ("b", "ok"), ("a", "interrupted")]
    assert judged[2:] == [("b", "ref"), ("a", "ref")]


@pytest.mark.slow  # starts a framework's or the host's own process
def test_cli_compare_repeat_stores_each_trial_and_shows_the_interval(fakes, tmp_path, monkeypatch):
    monkeypatch.setenv("FBENCH_REFERENCE", "fake_ok")
    db = tmp_path / "r.sqlite"
    res = CliRunner().invoke(app, ["compare", "--scenario", "tiny_cpu", "--backends", "fake_ok", "--repeat", "2",
                                   "--warmup-rounds", "0", "--db", str(db), "--out", str(tmp_path / "plots")])
    assert res.exit_code == 0, res.output
    rows = ResultStore(db).list()
    assert [(r["trial_round"], r["trial_position"]) for r in rows] == [(1, 1), (2, 1)]
    assert rows[0]["compare_id"] == rows[1]["compare_id"] is not None
    line = next(line for line in res.output.splitlines() if "│ fake_ok" in line)
    assert "1,024.0 (1,024.0–1,024.0)" in line and "100%" in line


def _synthetic_trials(monkeypatch, tgs):
    """The loop alone, as above: run_one stands in, each run's TGS from `tgs(name)`; the referee
    passes each run as it is (these runs record no losses to judge: `a` would never count)."""
    from framework_bench.measure.metrics import RunResult
    monkeypatch.setenv("FBENCH_REFERENCE", "ref")
    monkeypatch.setattr(compare.plugins, "backends", lambda pinned=(): {"ref": None, "a": None})
    monkeypatch.setattr(round_.pipeline, "run_one", lambda name, s, options, on_step: RunResult(
        backend=name, scenario=s.name, status="ok" if tgs(name) else "failed", tgs=tgs(name)))
    monkeypatch.setattr(round_.referee, "judge", lambda result, reference, s, absent, run_twin: result)


def _auto(precision, warmup_rounds=0):
    stops = []
    results = compare.compare([scenario.load("tiny_cpu")], ["a", "ref"], repeat="auto", precision=precision,
                              warmup_rounds=warmup_rounds, on_auto=stops.append)
    [stop] = stops
    return results, stop



def test_repeat_auto_adds_rounds_until_every_interval_is_within_the_precision(monkeypatch):
    import numpy as np
    from framework_bench.measure import statistics
    from framework_bench.measure.statistics import Trial
    from framework_bench.present.verdict import auto_stop_sentence

    def noisy() -> None:  # seeded trial-to-trial noise of 3%, the same draws each time
        rng = np.random.default_rng(7)
        _synthetic_trials(monkeypatch, lambda name: 1000.0 * (1 + 0.03 * rng.standard_normal()))
    noisy()
    results, _ = _auto(precision=1e-9)  # to the cap: the widest interval after each round
    widest = {n: statistics.widest_half_width([Trial.from_record(r.model_dump(mode="json")) for r in results[:2 * n]],
                                              "ref") for n in range(design.AUTO_MIN_ROUNDS, design.AUTO_MAX_ROUNDS + 1)}
    # the precision asked: the first round after the fewest whose interval is narrower than all before it
    rounds = next(n for n in range(design.AUTO_MIN_ROUNDS + 1, design.AUTO_MAX_ROUNDS)
                  if widest[n] < min(widest[m] for m in range(design.AUTO_MIN_ROUNDS, n)))
    precision = widest[rounds]
    noisy()
    results, stop = _auto(precision=precision)
    assert stop.rounds == rounds and not stop.capped and len(results) == 2 * rounds and stop.widest == precision
    assert auto_stop_sentence(stop) == (f"tiny_cpu: every 95% interval within ±{precision:g}% after {stop.rounds} "
                                        f"rounds (widest ±{stop.widest:.1f}%)")


def test_repeat_auto_stops_at_its_cap_and_says_so(monkeypatch):
    from framework_bench.present.verdict import auto_stop_sentence
    tgs = iter(range(1000, 10**6, 37))  # trials ever further apart: no interval narrows
    _synthetic_trials(monkeypatch, lambda name: float(next(tgs)))
    results, stop = _auto(precision=0.5, warmup_rounds=None)  # tiny_cpu: one warm-up round by default
    assert stop.rounds == design.AUTO_MAX_ROUNDS and stop.capped
    assert [r.trial_round for r in results[::2]] == list(range(0, design.AUTO_MAX_ROUNDS + 1))
    assert auto_stop_sentence(stop).startswith(f"tiny_cpu: --repeat auto stopped at its cap of "
                                               f"{design.AUTO_MAX_ROUNDS} rounds: the widest 95% interval is ±")
    assert auto_stop_sentence(stop).endswith("%, not within ±0.5%")


def test_repeat_auto_starts_no_round_its_budget_cannot_hold_and_says_it_did_not_settle(monkeypatch):
    """Each run takes 10 s of the compare's clock, a round 20 s: within a 65 s budget a fourth round
    would end at 80 s, so three run; no interval narrows to 1e-9%: not settled, said so."""
    import types

    from framework_bench.present.verdict import auto_stop_sentence
    clock = [0.0]
    tgs = iter(range(1000, 10**6, 37))

    def run(name):  # asked twice a run (its status, its TGS): 10 s a run
        clock[0] += 5.0
        return float(next(tgs))
    _synthetic_trials(monkeypatch, run)
    monkeypatch.setattr(compare, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    stops = []
    results = compare.compare([scenario.load("tiny_cpu")], ["a", "ref"], repeat="auto", precision=1e-9,
                              warmup_rounds=0, on_auto=stops.append, budget_s=65.0)
    [stop] = stops
    assert (stop.rounds, stop.out_of_budget, stop.budget_s, len(results)) == (3, True, 65.0, 6)
    assert not stop.capped and clock[0] == 60.0
    assert auto_stop_sentence(stop).startswith("tiny_cpu: not settled within the budget: its share of --budget "
                                               "(1 min 5 s) spent after 3 rounds; the widest 95% interval is ±")


def test_repeat_auto_never_takes_the_references_interval_for_a_candidate_none_of_whose_trials_counted(monkeypatch):
    """The only interval was the reference's own: "every 95% interval within ±2%" was said of a
    candidate that never counted. Only pairs with trials on both sides count."""
    from framework_bench.measure import statistics
    from framework_bench.measure.statistics import Trial
    from framework_bench.present.verdict import auto_stop_sentence
    reference = [Trial("ref", "tiny_cpu", 1000.0 + i, "ok", f"run {i}") for i in range(5)]
    failed = [Trial("a", "tiny_cpu", None, "failed", f"run {i + 5}") for i in range(5)]
    assert statistics.widest_half_width(reference + failed, "ref") is None
    assert statistics.widest_half_width(reference, "ref") < 1  # a scenario of one backend alone: its median's
    _synthetic_trials(monkeypatch, lambda name: 1000.0 if name == "ref" else None)  # a fails every round
    results, stop = _auto(precision=2)
    assert stop.rounds == design.AUTO_MIN_ROUNDS and stop.widest is None
    assert auto_stop_sentence(stop, ["a"]) == (f"tiny_cpu: --repeat auto stopped after {design.AUTO_MIN_ROUNDS} "
                                               "rounds: no trial of a counted, no interval to narrow")


@pytest.mark.slow  # starts a framework's or the host's own process
def test_repeat_auto_says_which_backend_no_trial_of_counted(fakes, tmp_path):
    """fake_crash fails every round, the reference fake_ok never does."""
    res = CliRunner().invoke(app, ["run", "--backend", "fake_crash", "--scenario", "tiny_cpu", "--repeat", "auto",
                                   "--precision", "2", "--warmup-rounds", "0", "--db", str(tmp_path / "r.sqlite")])
    said = " ".join(res.output.split())
    assert "no trial of fake_crash counted, no interval to narrow" in said and "every 95% interval" not in said, said


def test_repeat_auto_stops_when_no_trial_counts(monkeypatch):
    _synthetic_trials(monkeypatch, lambda name: None)  # every run failed: more rounds narrow nothing
    results, stop = _auto(precision=2)
    assert stop.rounds == design.AUTO_MIN_ROUNDS and stop.widest is None and not stop.capped
    assert len(results) == 2 * design.AUTO_MIN_ROUNDS


@pytest.mark.parametrize("argv, said", [
    (["--repeat", "auto"], "--repeat auto needs --precision P"),
    (["--repeat", "auto", "--precision", "0"], "--repeat auto needs --precision P"),
    (["--repeat", "3", "--precision", "2"], "--precision goes with --repeat auto"),
    (["--repeat", "0"], "give a number of trials from 1, or auto"),
    (["--repeat", "²"], "give a number of trials from 1, or auto"),  # isdigit, yet int() refuses it
    (["--repeat", "٣"], "give a number of trials from 1, or auto"),  # an Arabic-Indic 3: digits 0-9 only
    (["--repeat", "9" * 26], "at most 1000 trials"),  # the dry run's estimate was ~1e24 hours
    (["--repeat", "9" * 5000], "(5000 digits): at most 1000 trials"),  # beyond what int() reads
    (["--repeat", "1001"], "--repeat 1001: at most 1000 trials"),
    (["--warmup-rounds", "9" * 26], "at most 1000"),
    (["--repeat", "auto", "--precision", "5", "--launcher", "slurm"], "--repeat auto and --warmup-rounds run here only"),
    (["--warmup-rounds", "1", "--launcher", "slurm"], "--repeat auto and --warmup-rounds run here only"),
    (["--repeat", "3", "--budget", "5m"], "--budget goes with --repeat auto"),
    (["--repeat", "auto", "--precision", "2", "--budget", "soon"], "--budget 'soon': a time above 0, such as 90s"),
    (["--repeat", "auto", "--precision", "2", "--budget", "0m"], "a time above 0"),
])
@pytest.mark.parametrize("command", [["compare", "--scenario"], ["run", "--backend", "torch", "--scenario"]])
def test_repeat_options_that_cannot_hold_are_one_clear_error(command, argv, said):
    res = CliRunner().invoke(app, [*command, "tiny_cpu", *argv])
    assert res.exit_code == 1 and said in " ".join(res.output.split()), res.output


@pytest.mark.slow  # starts a framework's or the host's own process
def test_run_repeat_is_the_trial_loop_with_one_backend(fakes, tmp_path):
    """fake_noisy's trials draw their step time from a seeded distribution (3% apart): five rounds
    give its median an interval narrower than 10%, so --repeat auto stops at its fewest rounds."""
    db = tmp_path / "r.sqlite"
    res = CliRunner().invoke(app, ["run", "--backend", "fake_noisy", "--scenario", "tiny_cpu", "--repeat", "auto",
                                   "--precision", "10", "--warmup-rounds", "0", "--db", str(db)])
    assert res.exit_code == 0, res.output
    rows = [r for r in ResultStore(db).list() if r["backend"] == "fake_noisy"]
    assert [(r["trial_round"], r["trial_position"], r["status"]) for r in rows] == [(n, 2 - n % 2, "ok") for n in range(1, 6)]
    assert len({r["tgs"] for r in rows}) == 5 and len({r["compare_id"] for r in rows}) == 1
    # the reference (fake_ok here) ran after it in odd rounds, before it in even ones, and judged it
    assert [(r["trial_round"], r["trial_position"]) for r in ResultStore(db).list() if r["backend"] == "fake_ok"] \
        == [(n, 1 + n % 2) for n in range(1, 6)]
    line = next(line for line in res.output.splitlines() if "│ fake_noisy" in line)
    cells = [cell.strip() for cell in line.split("│")]
    assert "5" in cells and any("–" in cell and "(" in cell for cell in cells)  # five trials, the median's interval
    assert f"tiny_cpu: every 95% interval within ±10% after {design.AUTO_MIN_ROUNDS} rounds" in res.output


def test_ctrl_c_while_a_twin_judges_keeps_the_rounds_runs_and_ends_the_compare(monkeypatch):
    """A Ctrl-C that lands in a judging run (an fp32 twin here, a loss-scheme reference alike)
    ends the compare after that round, its runs judged and kept; before, the next round started."""
    from framework_bench.measure.metrics import RunResult
    monkeypatch.setenv("FBENCH_REFERENCE", "ref")
    monkeypatch.setattr(compare.plugins, "backends", lambda pinned=(): {"ref": None, "a": None})
    started, handed = [], []

    def run_one(name, s, options, on_step=None):
        started.append((name, s.name))
        status = "interrupted" if s.name.endswith("_fp32_twin") else "ok"
        return RunResult(backend=name, scenario=s.name, status=status, tgs=1.0)

    monkeypatch.setattr(round_.pipeline, "run_one", run_one)
    with pytest.raises(compare.Interrupted):
        compare.compare([scenario.load("tiny_cuda")], ["a"], repeat=3, warmup_rounds=0,
                        on_result=lambda r, s: handed.append(r))
    assert started == [("a", "tiny_cuda"), ("ref", "tiny_cuda"), ("a", "tiny_cuda_fp32_twin")]  # no round 2
    assert [r.backend for r in handed] == ["ref", "a"]  # both kept
    twin_check = {c.name: c for c in handed[1].checks}["fp32_twin"]
    assert twin_check.status == "unverified" and "interrupted" in twin_check.detail


def test_dry_run_gives_the_cost_of_the_trials_on_a_gpu_scenario(monkeypatch):
    from framework_bench.plugins.contract import Machine
    from framework_bench.run.dry_run import DryRun
    from framework_bench.run.launchers.slurm_time import estimate_time
    from framework_bench.run.refusals import Refusals
    s = scenario.load("llama2_7b_8k_1gpu")

    def plan(backend, **refusal):
        return DryRun(backend=backend, scenario=s.name, launcher="local", check=None,
                      refusals=Refusals(backend=backend, **refusal), argv=[], env={}, files={}, run_dir="/nowhere")

    planned = [plan("a"), plan("b", machine="no GPU here", memory="GPU memory unknown"), plan("c", check="no ZeRO-3")]
    machine = Machine()
    cost = dry_run.trial_cost(s, planned, machine, 5, None, reference=None)  # --no-reference
    estimate = estimate_time(s, None)  # no GPU here, none named by the scenario: the weakest GPU's peak
    assert cost.backends == ["a", "b"]  # c refuses the scenario: stored at once; b is judged on this machine
    assert cost.warmup == 0 and cost.training_s == pytest.approx(estimate.steps * estimate.step_seconds)
    assert cost.summary().startswith("5 trials + 0 warm-up of 2 backend(s) (a, b): 10 runs, ~")
    assert "more" not in cost.summary()
    assert dry_run.trial_cost(s, planned, machine, 3, 1, reference=None).summary().startswith(
        "3 trials + 1 warm-up of 2 backend(s) (a, b): 8 runs")
    assert "5 to 10 (--repeat auto) trials" in dry_run.trial_cost(s, planned, machine, "auto", None,
                                                                  reference=None).summary()
    assert dry_run.trial_cost(s, planned, machine, 1, None, reference=None) is None  # one run each: nothing multiplied
    assert dry_run.trial_cost(scenario.load("tiny_cpu"), planned, machine, 5, None, reference=None) is None  # GPU only
    # The reference runs in every round, chosen or not (5 runs were said where 10 were made), and
    # may run once more a round for each other run, to judge it with that run's loss scheme or adapters.
    assert dry_run.trial_cost(s, planned, machine, 5, None, reference="a").summary().startswith(
        "5 trials + 0 warm-up of 2 backend(s) (a (the reference), b): 10 runs, ~")
    refusal: dict = {}
    monkeypatch.setattr(dry_run.plugins, "get", lambda name: name)
    monkeypatch.setattr(dry_run, "refusals_for", lambda backend, s, machine: (
        None, Refusals(backend=backend, **refusal)))
    cost = dry_run.trial_cost(s, [plan("x")], machine, 5, None, reference="torch")
    assert cost.summary().startswith("5 trials + 0 warm-up of 2 backend(s) (x, torch (the reference)): 10 runs, ~")
    assert ("; up to 5 more of torch, one a round for each run whose loss normalisation or native adapters differ "
            "from its own (it judges that run, and is not stored)") in cost.summary()
    assert cost.summary().endswith("; and each round an fp32 twin of each judged run and of torch, 5 steps each (the "
                                   "training step judged at fp32's tolerances; not stored; not under SLURM)")
    refusal["check"] = "torch: no such GPU"  # a reference that refuses the scenario is stored at once, for nothing
    assert dry_run.trial_cost(s, [plan("x")], machine, 5, None, reference="torch").backends == ["x"]


@pytest.mark.slow  # starts a framework's or the host's own process
def test_compare_repeat_on_seeded_fakes_finds_no_difference_in_an_aa_pair_and_the_20_percent_slowdown(fakes, tmp_path):
    """Through the whole loop (every check, the store, the table): fake_noisy and fake_noisy_twin
    draw their trials' step times alike, fake_noisy_slow's steps take 25% longer (TGS 20% lower).
    The compare's rounds pair the trials, and its 6 comparisons are one family (Holm)."""
    import re
    res = CliRunner().invoke(app, ["compare", "--scenario", "tiny_cpu", "--backends",
                                   "fake_noisy,fake_noisy_twin,fake_noisy_slow", "--repeat", "3", "--warmup-rounds", "0",
                                   "--db", str(tmp_path / "r.sqlite"), "--out", str(tmp_path / "plots")])
    assert res.exit_code == 0, res.output
    assert "no difference detected between fake_noisy and fake_noisy_twin (95% CI \u2212" in res.output
    low, high = map(float, re.search(r"fake_noisy_slow is [\d.]+% slower than fake_noisy_twin "
                                     r"\(95% CI ([\d.]+) to ([\d.]+)%, paired over 3 rounds\)", res.output).groups())
    assert low <= 20 <= high
    # the answer last: the fastest framework, against the next, no faster than its A/A twin
    *_, answer, closing = res.output.splitlines()
    assert re.fullmatch(r"tiny_cpu: no difference detected between (fake_noisy|fake_noisy_twin) and "
                        r"(fake_noisy_twin|fake_noisy) \(95% CI \S+ to \S+%, paired over 3 rounds\); \d+% \(.+\) of fake_ok",
                        answer), answer
    assert re.fullmatch(r"12 run\(s\): 12 ok · exit 0: .+", closing), closing


@pytest.mark.slow  # starts a framework's or the host's own process
def test_compare_json_carries_the_verdicts_and_fail_if_slower_gates_on_them(fakes, tmp_path, monkeypatch):
    """`--json` is one object: the runs, each backend's summary, each pair's ratio, interval and
    verdict word. `--fail-if-slower 5` exits 1 where a verdict says a backend is more than 5% slower
    than the reference (fake_noisy_slow: 25% longer steps), 0 on an A/A pair (fake_noisy beside its
    twin, the reference here)."""
    monkeypatch.setenv("FBENCH_REFERENCE", "fake_noisy_twin")

    def compare(backends: str, db: str):
        return CliRunner().invoke(app, ["compare", "--scenario", "tiny_cpu", "--backends", backends, "--repeat", "3",
                                        "--warmup-rounds", "0", "--db", str(tmp_path / db), "--out",
                                        str(tmp_path / "plots"), "--json", "--fail-if-slower", "5"])
    res = compare("fake_noisy,fake_noisy_slow", "slow.sqlite")
    assert res.exit_code == 1, res.output
    out = json.loads(res.stdout)
    assert {r["backend"] for r in out["runs"]} == {"fake_noisy", "fake_noisy_slow", "fake_noisy_twin"}
    assert {s["backend"] for s in out["summaries"]} == {"fake_noisy", "fake_noisy_slow", "fake_noisy_twin"}
    assert all(s["trials"] + len(s["excluded"]) == 3 for s in out["summaries"])
    verdicts = {(p["backend"], p["other"]): p["verdict"] for p in out["pairs"]}
    assert verdicts["fake_noisy_slow", "fake_noisy_twin"] == "slower"
    assert verdicts["fake_noisy", "fake_noisy_twin"] == "no difference"
    assert "fake_noisy_slow" in res.stderr and "fake_noisy (" not in res.stderr
    aa = compare("fake_noisy", "aa.sqlite")
    assert aa.exit_code == 0, aa.output



@pytest.mark.slow  # starts the fakes' worker processes
def test_each_compare_draws_a_fresh_seed_each_round_its_own_shared_by_its_backends(fakes, tmp_path):
    """No run can replay an earlier compare's training (same weights, same rows): unless pinned,
    a compare draws its seed, and each round derives its own from it; every backend of a round,
    the reference judging them included, starts from the round's. A pinned seed is the first
    round's, and each row says that replay is then not excluded."""
    tiny = scenario.load("tiny_cpu")

    def seeds(options: RunOptions) -> tuple[list[list[int]], list]:
        results = compare.compare([tiny], ["fake_noisy", "fake_ok"], options, repeat=2, warmup_rounds=0)
        assert [r.status for r in results] == ["ok"] * 4 and all(r.reason is None for r in results)
        by_round: dict[int, list[int]] = {}
        for r in results:
            by_round.setdefault(r.trial_round, []).append(r.seed)
        return [by_round[1], by_round[2]], results

    (first, drawn), (second, _) = seeds(RunOptions()), seeds(RunOptions())
    for rounds in (first, second):
        assert all(len(set(seeds_)) == 1 for seeds_ in rounds) and rounds[0][0] != rounds[1][0]
    assert first[0][0] != second[0][0]
    assert not any(design.PINNED_SEED_NOTE in r.notes for r in drawn)
    rounds, pinned = seeds(RunOptions(seed=7))
    assert rounds == [[7, 7], [design.round_seed(7, 1)] * 2]
    assert all(design.PINNED_SEED_NOTE in r.notes for r in pinned)


def test_each_progress_line_times_its_own_run_and_a_refusal_takes_none(fakes, tmp_path):
    """Each run's line stops its clock when the run ends: a refusal's line said how long the whole
    compare had run so far (0:04:36 in the README's main job), every line the compare's time."""
    res = CliRunner().invoke(app, ["compare", "--scenario", "llama2_7b_8k", "--scenario", "tiny_cpu", "--backends",
                                   "fake_slow", "--db", str(tmp_path / "r.sqlite"), "--out", str(tmp_path / "plots")])
    assert res.exit_code == 0, res.output
    lines = {line.split(" · ")[1].split()[0]: line for line in res.stderr.splitlines() if "fake_slow · " in line}
    assert "unsupported" in lines["llama2_7b_8k"] and lines["llama2_7b_8k"].rstrip().endswith("0:00:00"), lines
    assert not lines["tiny_cpu"].rstrip().endswith("0:00:00")  # a run that trained took its time
