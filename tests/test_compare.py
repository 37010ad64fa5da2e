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

from framework_bench.run import compare
from framework_bench.run.options import RunOptions
from framework_bench.spec import scenario
from framework_bench.cli import app
from framework_bench.store.results import ResultStore



def _run(backends, tmp_path, **kw):
    store = ResultStore(tmp_path / "results.sqlite")
    tiny = scenario.load("tiny_cpu")
    try:
        results = compare.compare([tiny], backends, RunOptions(**kw), on_result=lambda r, s: store.add(r, s))
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
    rows = store.list()
    assert [(r["backend"], r["status"]) for r in rows] == [("fake_crash", "failed"), ("fake_ok", "ok")]
    assert store.get(rows[1]["id"])["steps"][0]["tokens"] == 512


def test_a_hanging_backend_times_out(fakes, tmp_path):
    results, store = _run(["fake_hang", "fake_ok"], tmp_path, timeout=3)
    assert [r.status for r in results] == ["timeout", "ok"]
    assert "timeout" in results[0].reason
    assert [r["status"] for r in store.list()] == ["timeout", "ok"]


def test_ctrl_c_keeps_the_finished_rows(fakes, tmp_path):
    # A shell that starts the tests in the background ignores SIGINT; restore Python's own
    # handler so the fake worker's SIGINT arrives as the KeyboardInterrupt Ctrl-C would raise.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        results, store = _run(["fake_ok", "fake_interrupt", "fake_ok"], tmp_path, timeout=120)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert [r.status for r in results] == ["ok", "interrupted"]  # the third never started
    assert [r["status"] for r in store.list()] == ["ok", "interrupted"]
    # nothing half-written: every stored ok row has all its steps
    conn = sqlite3.connect(store.path)
    assert conn.execute("SELECT COUNT(*) FROM steps").fetchone()[0] == 7


def test_cli_compare_json_table_and_charts(fakes, tmp_path):
    db, out = tmp_path / "r.sqlite", tmp_path / "plots"
    res = CliRunner().invoke(app, ["compare", "--scenario", "tiny_cpu", "--backends", "fake_ok,fake_crash",
                                   "--db", str(db), "--out", str(out), "--json"])
    assert res.exit_code == 1, res.output  # a failed run: everything is stored and drawn, and the exit says so
    records = json.loads(res.stdout)
    assert {r["backend"]: r["status"] for r in records} == {"fake_ok": "ok", "fake_crash": "failed"}
    for r in records:
        assert {"backend", "scenario", "status", "tgs", "tflops", "mfu", "data_sha256", "result_id"} <= r.keys()
        assert r["result_id"] is not None
    assert (out / "report.html").stat().st_size > 1000
    svg = next(out.glob("tgs_tflops_*.svg")).read_text()
    assert "fake_ok" in svg and "failed" in svg


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
    return compare.compare(compare.expand(names), backends, on_result=lambda r, s: store.add(r, s)), store


def test_globs_expand_in_context_order():
    names = [s.name for s in compare.expand(["tiny_cpu*"])]
    assert names == ["tiny_cpu", "tiny_cpu_1k", "tiny_cpu_2k", "tiny_cpu_4k"]
    with pytest.raises(scenario.ScenarioError):
        compare.expand(["nothing_like_this*"])


def test_percent_of_the_reference_needs_an_ok_reference_row_on_the_same_scenario():
    rows = [(*r, "") for r in [("a", "torch", "ok", 200.0), ("a", "xtuner", "ok", 150.0), ("a", "lf", "failed", None),
                                ("b", "torch", "failed", None), ("b", "xtuner", "ok", 90.0), ("c", "xtuner", "ok", 10.0)]]
    assert compare.percent_of_reference(rows) == {("a", "torch"): 100.0, ("a", "xtuner"): 75.0}


def test_cli_compare_table_shows_the_share_of_the_reference(fakes, tmp_path, monkeypatch):
    """fake_ok standing in as the reference: every fake_ok-like row on the scenario is 100 %."""
    monkeypatch.setattr(compare, "reference_backend", lambda: "fake_ok")
    res = CliRunner().invoke(app, ["compare", "--scenario", "tiny_cpu", "--backends", "fake_ok,fake_crash",
                                   "--db", str(tmp_path / "r.sqlite"), "--out", str(tmp_path / "plots")])
    assert res.exit_code == 1, res.output  # fake_crash failed: compare says so in its exit code
    assert "% of fake_ok" in res.output
    row = next(line for line in res.output.splitlines() if "│ fake_ok" in line)
    assert "100%" in row


@pytest.mark.parametrize("k", [2, 3, 4, 5])
def test_round_orders_put_each_backend_in_each_place_and_after_each_other_equally_often(k):
    from collections import Counter
    names = [f"b{i}" for i in range(k)]
    rows = compare.round_orders(names)
    assert rows[0][0] == "b0" and all(sorted(row) == names for row in rows)
    places = Counter((row.index(b), b) for row in rows for b in row)
    after = Counter(pair for row in rows for pair in zip(row, row[1:]))
    assert len(set(places.values())) == 1 and len(places) == k * k
    assert len(set(after.values())) == 1 and len(after) == k * (k - 1)


def test_repeated_trials_are_tagged_rotated_and_judged_against_the_latest_reference(monkeypatch):
    """The loop alone (run_one stands in): a warm-up round on CPU, then `repeat` rounds."""
    from framework_bench.measure.metrics import RunResult
    monkeypatch.setattr(compare, "reference_backend", lambda: "ref")
    monkeypatch.setattr(compare.plugins, "backends", lambda: {"ref": None, "a": None, "b": None})
    calls = []

    def run_one(name, s, options, on_step, reference):
        calls.append((name, reference and (reference.trial_round, reference.trial_position)))
        return RunResult(backend=name, scenario=s.name, status="ok", tgs=1.0)

    monkeypatch.setattr(compare.pipeline, "run_one", run_one)
    results = compare.compare([scenario.load("tiny_cpu")], ["a", "b", "ref"], repeat=2)
    assert [(r.trial_round, r.trial_position, r.backend) for r in results] == [
        (0, 1, "ref"), (0, 2, "a"), (0, 3, "b"), (1, 1, "a"), (1, 2, "b"), (1, 3, "ref"),
        (2, 1, "b"), (2, 2, "ref"), (2, 3, "a")]
    assert len({r.compare_id for r in results}) == 1
    assert calls[3] == ("a", (0, 1)) and calls[8] == ("a", (2, 2))  # the reference's latest run
    assert calls[5] == ("ref", None)  # never judged against itself
    assert len(compare.compare([scenario.load("tiny_cpu")], ["a"], repeat=2, warmup_rounds=0)) == 2


def test_cli_compare_repeat_stores_each_trial_and_shows_the_interval(fakes, tmp_path, monkeypatch):
    monkeypatch.setattr(compare, "reference_backend", lambda: "fake_ok")
    db = tmp_path / "r.sqlite"
    res = CliRunner().invoke(app, ["compare", "--scenario", "tiny_cpu", "--backends", "fake_ok", "--repeat", "2",
                                   "--warmup-rounds", "0", "--db", str(db), "--out", str(tmp_path / "plots")])
    assert res.exit_code == 0, res.output
    rows = ResultStore(db).list()
    assert [(r["trial_round"], r["trial_position"]) for r in rows] == [(1, 1), (2, 1)]
    assert rows[0]["compare_id"] == rows[1]["compare_id"] is not None
    line = next(line for line in res.output.splitlines() if "│ fake_ok" in line)
    assert "1,024.0 (1,024.0–1,024.0)" in line and "100%" in line
