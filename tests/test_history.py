"""`fbench history` and its change points (present/history.py, measure/change_points.py): series
of stored compares, one where a hidden version is 25% slower from some compare on, one A/A."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from typer.testing import CliRunner

from framework_bench.cli import app
from framework_bench.measure import change_points
from framework_bench.measure.metrics import RunResult
from framework_bench.scenario import scenario
from framework_bench.store.results import ResultStore

MACHINE = {"cpu": "Test CPU", "cpu_count": 2, "gpu": None}


def store_series(db, slow_from: int | None, compares: int = 12, rounds: int = 3, seed: int = 3,
                 scenario_name: str = "tiny_cpu") -> None:
    """`compares` compares of `rounds` trials of trl, 2% noise between trials; from compare
    `slow_from` on, transformers 5.23.0 instead of 5.6.0 and 25% slower (None: one version all along)."""
    rng = np.random.default_rng(seed)
    s = scenario.load(scenario_name)
    with ResultStore(db) as store:
        for c in range(compares):
            slow = slow_from is not None and c >= slow_from
            versions = {"torch": "2.13.0", "transformers": "5.23.0" if slow else "5.6.0"}
            for round_ in range(1, rounds + 1):
                tgs = 1000.0 * (0.75 if slow else 1.0) * float(np.exp(rng.normal(0, 0.02)))
                store.add(RunResult(backend="trl", scenario=scenario_name, status="ok", tgs=tgs, framework_version="1.16.0",
                                    compare_id=f"20261206-{seed:02d}{c:02d}00-aaaa", trial_round=round_,
                                    trial_position=1), s,
                          manifest_={**MACHINE, "backend_env": {"versions": versions}})


def fbench(*args: str):
    return CliRunner().invoke(app, list(args))


def test_a_version_25_percent_slower_is_named_at_the_compare_it_came_in(tmp_path, fbench_home):
    db = tmp_path / "r.sqlite"
    store_series(db, slow_from=7)
    res = fbench("history", "--db", str(db), "--json")
    assert res.exit_code == 0, res.output
    (series,) = json.loads(res.stdout)["series"]
    assert len(series["points"]) == 12 and not series["insufficient_data"]
    (change,) = series["changes"]
    assert change["at"] == 7 and change["compare"] == series["points"][7]["compare"]
    assert change["ratio"] == pytest.approx(0.75, abs=0.03) and change["p"] < change_points.ALPHA / 2
    assert "transformers 5.6.0 → 5.23.0" in change["sentence"] and "slower" in change["sentence"]


def test_an_a_a_series_names_no_change(tmp_path, fbench_home):
    db = tmp_path / "r.sqlite"
    store_series(db, slow_from=None)
    res = fbench("history", "--db", str(db))
    assert res.exit_code == 0, res.output
    assert "no change point" in res.stdout and "slower" not in res.stdout


def test_fail_on_change_exits_1_on_a_slowdown_and_0_on_an_a_a_series(tmp_path, fbench_home):
    slowed, same = tmp_path / "slowed.sqlite", tmp_path / "same.sqlite"
    store_series(slowed, slow_from=5)
    store_series(same, slow_from=None)
    failed = fbench("history", "--db", str(slowed), "--fail-on-change")
    assert failed.exit_code == 1 and "speed changed: tiny_cpu · trl" in failed.output
    assert fbench("history", "--db", str(same), "--fail-on-change").exit_code == 0


def test_a_short_series_is_insufficient_data_not_a_verdict(tmp_path, fbench_home):
    db = tmp_path / "r.sqlite"
    store_series(db, slow_from=3, compares=change_points.MIN_POINTS - 1)
    res = fbench("history", "--db", str(db), "--fail-on-change")
    assert res.exit_code == 0 and f"insufficient data: {change_points.MIN_POINTS - 1} point(s)" in res.stdout


def test_ordered_by_version_the_series_follows_the_versions_not_the_dates(tmp_path, fbench_home):
    """The slow version stored first: by date the change is where it went away, by version the
    older transformers comes first."""
    db = tmp_path / "r.sqlite"
    store_series(db, slow_from=0, compares=5, seed=1)
    store_series(db, slow_from=None, compares=5, seed=2)
    by_version = json.loads(fbench("history", "--db", str(db), "--json", "--by", "version").stdout)["series"][0]
    assert [p["versions"]["transformers"] for p in by_version["points"]] == ["5.6.0"] * 5 + ["5.23.0"] * 5
    assert by_version["changes"][0]["at"] == 5 and by_version["changes"][0]["ratio"] < 0.8
    by_date = json.loads(fbench("history", "--db", str(db), "--json").stdout)["series"][0]
    assert by_date["changes"][0]["ratio"] > 1.25  # faster once 5.23.0 left


def test_the_search_finds_two_steps_and_none_in_noise_alone():
    rng = np.random.default_rng(0)
    levels = [1.0] * 8 + [0.7] * 8 + [1.0] * 8
    found = change_points.find(list(np.array(levels) * np.exp(rng.normal(0, 0.02, 24))))
    assert [c.at for c in found] == [8, 16]
    assert change_points.find(list(np.exp(rng.normal(0, 0.02, 24)))) == []
    assert change_points.find([1.0] * 20) == []  # no spread at all


def test_out_draws_each_scenarios_series_with_its_change(tmp_path, fbench_home):
    db, out = tmp_path / "r.sqlite", tmp_path / "charts"
    store_series(db, slow_from=6)
    res = fbench("history", "--db", str(db), "--out", str(out))
    assert res.exit_code == 0, res.output
    drawn = sorted(p.name for p in out.iterdir())
    assert drawn == ["history_tiny_cpu_Test_CPU_CPU_x_2_no_GPU.png", "history_tiny_cpu_Test_CPU_CPU_x_2_no_GPU.svg"]
    assert all(name in res.stdout for name in drawn)
    assert re.search(r"<!-- trl [-−]2[4-6]% -->", (out / drawn[1]).read_text())  # the change, where it came in
