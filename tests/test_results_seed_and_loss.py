"""The schema migration to version 6: every row keeps the compare's seed and its canonical loss
curve; a store written before it opens with neither (NULL seed, an empty curve)."""

from __future__ import annotations

import sqlite3

from framework_bench.store import schema
from framework_bench.measure.metrics import RunResult
from framework_bench.store.results import ResultStore
from framework_bench.scenario.scenario import load


def test_seed_and_loss_curve_round_trip(tmp_path):
    with ResultStore(tmp_path / "r.sqlite") as store:
        run_id = store.add(RunResult(backend="torch", scenario="tiny_cpu", status="ok", seed=7,
                                     loss_curve={1: 6.25, 2: float("nan")}), load("tiny_cpu"), manifest_={})
        got = store.get(run_id)
    assert got["seed"] == 7
    assert got["loss_curve"]["1"] == 6.25 and got["loss_curve"]["2"] != got["loss_curve"]["2"]  # NaN kept


def test_a_version_5_store_migrates_with_its_rows(tmp_path):
    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as raw:
        for migration in schema.MIGRATIONS[:5]:
            raw.executescript(migration)
        raw.execute("INSERT INTO runs (created_at, backend, scenario, scenario_json, context_length, model, gpus, "
                    "sequence_parallel, device, status, steps_measured, flags, framework_throughput, manifest) "
                    "VALUES ('t', 'xtuner', 'tiny_cpu', '{}', 512, 'tiny-llama', 1, 1, 'cpu', 'ok', 5, '[]', '{}', '{}')")
        raw.execute("PRAGMA user_version = 5")
        raw.execute(f"PRAGMA application_id = {schema.APPLICATION_ID}")
    with ResultStore(path) as store:
        old = store.list()[0]
        assert old["seed"] is None and old["loss_curve"] == {}
    with sqlite3.connect(path) as raw:
        # every later migration too (schema 7: the trials of a compare)
        assert raw.execute("PRAGMA user_version").fetchone()[0] == schema.SCHEMA_VERSION >= 6
