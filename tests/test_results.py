"""The results store on real SQLite files: round trip, transactions, filters, export, schema."""

from __future__ import annotations

import csv
import io
import json
import sqlite3
from pathlib import Path

import pytest

from framework_bench.store import results, schema
from framework_bench.store.export import export
from framework_bench.measure.metrics import RunResult
from framework_bench.store.results import ResultsError, ResultStore
from framework_bench.scenario.scenario import Scenario, load
from framework_bench.worker.files import MetricsWriter


def write_steps(run_dir, ranks=2, steps=7):
    for rank in range(ranks):
        w = MetricsWriter(run_dir, rank)
        for step in range(1, steps + 1):
            w.write(step, 0.5 + 0.01 * step, 512, 10.0 - step * 0.1, 2**20 * (rank + 1))
        w.close()


def ok_result(run_dir=None, backend="xtuner", scenario="tiny_cpu", tgs=1000.0) -> RunResult:
    return RunResult(backend=backend, scenario=scenario, status="ok", framework_version="0.2.0", tgs=tgs,
                     tgs_min=tgs * 0.9, tgs_max=tgs * 1.1, tflops=0.2, model_tflops=0.19, steps_measured=5,
                     step_seconds=0.5, peak_mem_bytes=2**21, final_loss=9.3, flags=["step spread 30%"],
                     data_sha256="ab" * 32, attention_used="sdpa", framework_throughput={"tokens_per_sec": 990.0},
                     run_dir=run_dir, wall_seconds=12.5)


@pytest.fixture
def store(fbench_home, tmp_path):
    with ResultStore(tmp_path / "r.sqlite") as s:
        yield s


def test_default_db_lives_under_fbench_home(fbench_home):
    assert results.default_db() == fbench_home / "results" / "results.sqlite"
    with ResultStore() as s:
        assert s.path.is_file()


def test_round_trip_with_steps_and_manifest(store, fbench_home, tmp_path):
    # A backend env record as `fbench env create` writes it: its versions go into the manifest.
    env = fbench_home / "envs" / "xtuner"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").touch()
    (env / "fbench-env.json").write_text(json.dumps({"flavour": "cpu"}))
    # mmengine: a package the xtuner backend names (`BackendInfo.manifest_packages`); numpy: one nobody names
    for name, version in {"torch": "2.13.0+cpu", "transformers": "4.48.0", "xtuner": "0.2.0", "mmengine": "0.10.7",
                          "numpy": "1.26.4"}.items():
        # versions are read from the env's installed distributions, as pip leaves them
        dist = env / "lib" / "python3.11" / "site-packages" / f"{name}-{version}.dist-info"
        dist.mkdir(parents=True)
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\nbody\n")
    run_dir = tmp_path / "run"
    write_steps(run_dir)
    scenario = load("tiny_cpu")
    result = ok_result(run_dir)

    run_id = store.add(result, scenario)

    assert result.result_id == run_id
    got = store.get(run_id)
    assert got["backend"] == "xtuner" and got["status"] == "ok" and got["tgs"] == 1000.0
    assert got["context_length"] == 512 and got["model"] == "tiny-llama" and got["gpus"] == 1
    assert got["device"] == "cpu" and got["sequence_parallel"] == 1
    assert got["flags"] == ["step spread 30%"]
    assert got["framework_throughput"] == {"tokens_per_sec": 990.0}
    assert got["run_dir"] == str(run_dir) and got["data_sha256"] == "ab" * 32
    assert Scenario.model_validate(got["scenario_json"]) == scenario
    assert len(got["steps"]) == 14
    assert [(s["step"], s["rank"]) for s in got["steps"][:3]] == [(1, 0), (1, 1), (2, 0)]
    assert got["steps"][1]["peak_mem_bytes"] == 2 * 2**20 and got["steps"][0]["tokens"] == 512
    m = got["manifest"]
    assert m["hostname"] and m["cpu_count"] >= 1 and m["fbench_version"]
    assert m["backend_env"]["versions"] == {"torch": "2.13.0+cpu", "transformers": "4.48.0", "xtuner": "0.2.0",
                                            "mmengine": "0.10.7"}
    # A second connection (a later `fbench results show`) sees the same.
    with ResultStore(store.path) as again:
        assert again.get(run_id)["steps"] == got["steps"]


def test_failed_run_without_run_folder_is_a_row(store):
    scenario = load("llama2_7b_8k")
    r = RunResult(backend="llamafactory", scenario=scenario.name, status="unsupported", reason="needs 8 GPUs")
    run_id = store.add(r, scenario, manifest_={"hostname": "h"})
    got = store.get(run_id)
    assert got["status"] == "unsupported" and got["reason"] == "needs 8 GPUs" and got["tgs"] is None
    assert got["steps"] == [] and got["manifest"] == {"hostname": "h"} and got["gpus"] == 8


def test_cut_metrics_line_keeps_the_run_and_says_so(store, tmp_path):
    run_dir = tmp_path / "run"
    write_steps(run_dir, ranks=1, steps=2)
    with (run_dir / "metrics" / "rank0.jsonl").open("a") as fh:
        fh.write('{"step": 3, "seco')  # the worker was killed mid-line
    run_id = store.add(ok_result(run_dir).model_copy(update={"status": "timeout"}), load("tiny_cpu"))
    got = store.get(run_id)
    assert got["status"] == "timeout" and got["steps"] == []
    assert any("unreadable" in f for f in got["flags"])


def test_invalid_step_records_are_skipped_not_fatal(store, tmp_path):
    run_dir = tmp_path / "run"
    write_steps(run_dir, ranks=1, steps=2)
    with (run_dir / "metrics" / "rank0.jsonl").open("a") as fh:
        fh.write(json.dumps({"step": 0, "seconds": 0, "tokens": 1, "loss": None, "peak_mem_bytes": None}) + "\n")
    got = store.get(store.add(ok_result(run_dir), load("tiny_cpu")))
    assert len(got["steps"]) == 2 and "1 invalid per-step records skipped" in got["flags"]


def test_add_is_one_transaction(store, tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    write_steps(run_dir)
    real_insert = results._insert_steps

    def insert_then_die(conn, run_id, steps):
        real_insert(conn, run_id, steps)  # the run row and every step are written...
        raise KeyboardInterrupt  # ...then Ctrl-C arrives before the commit

    monkeypatch.setattr(results, "_insert_steps", insert_then_die)
    with pytest.raises(KeyboardInterrupt):
        store.add(ok_result(run_dir), load("tiny_cpu"))
    assert store.list() == []
    with sqlite3.connect(store.path) as raw:
        assert raw.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 0
        assert raw.execute("SELECT COUNT(*) FROM steps").fetchone()[0] == 0
    monkeypatch.setattr(results, "_insert_steps", real_insert)
    assert store.get(store.add(ok_result(run_dir), load("tiny_cpu")))["steps"]  # the store is still usable


def test_step_rows_are_checked_by_the_database(store, tmp_path):
    """Constraints are the last guard: a bad step row aborts the whole run, never half of it."""
    run_id = store.add(ok_result(), load("tiny_cpu"), manifest_={})
    with pytest.raises(sqlite3.IntegrityError):
        with store.conn:
            store.conn.execute("INSERT INTO steps (run_id, step, rank, seconds, tokens) VALUES (?, 1, 0, 0.0, 1)",
                               (run_id,))
    with pytest.raises(sqlite3.IntegrityError):
        with store.conn:
            store.conn.execute("INSERT INTO steps (run_id, step, rank, seconds, tokens) VALUES (999, 1, 0, 1.0, 1)")


def test_list_filters_and_latest_by_point(store):
    for name in ("tiny_cpu", "tiny_cpu_1k"):
        for backend in ("xtuner", "llamafactory"):
            store.add(ok_result(backend=backend, scenario=name), load(name), manifest_={})
    newer = store.add(ok_result(backend="xtuner", scenario="tiny_cpu", tgs=2000.0), load("tiny_cpu"), manifest_={})
    assert len(store.list()) == 5
    assert {r["scenario"] for r in store.list(scenario_glob="tiny_cpu_*")} == {"tiny_cpu_1k"}
    assert {r["backend"] for r in store.list(backend="llamafactory")} == {"llamafactory"}
    latest = store.latest_by_point()
    assert len(latest) == 4
    assert [r["tgs"] for r in latest if r["backend"] == "xtuner" and r["scenario"] == "tiny_cpu"] == [2000.0]
    assert newer in {r["id"] for r in latest}
    assert [r["context_length"] for r in latest] == [512, 512, 1024, 1024]


def test_export_csv_and_json_parse_back(store, tmp_path):
    run_dir = tmp_path / "run"
    write_steps(run_dir, ranks=1, steps=3)
    store.add(ok_result(run_dir), load("tiny_cpu"), manifest_={"hostname": "h"})
    store.add(RunResult(backend="llamafactory", scenario="tiny_cpu", status="oom", reason="a, \"quoted\"\nreason"),
              load("tiny_cpu"), manifest_={"hostname": "h"})

    rows = list(csv.DictReader(io.StringIO(export(store, "csv"))))
    assert [r["status"] for r in rows] == ["ok", "oom"]
    assert float(rows[0]["tgs"]) == 1000.0 and rows[1]["tgs"] == ""
    assert rows[1]["reason"] == "a, \"quoted\"\nreason"
    assert json.loads(rows[0]["flags"]) == ["step spread 30%"]
    assert json.loads(rows[0]["scenario_json"])["name"] == "tiny_cpu"

    runs = json.loads(export(store, "json"))
    assert [r["status"] for r in runs] == ["ok", "oom"]
    assert len(runs[0]["steps"]) == 3 and runs[0]["manifest"] == {"hostname": "h"}
    assert json.loads(export(store, "json", backend="llamafactory"))[0]["reason"].endswith("reason")
    with pytest.raises(ValueError, match="csv or json"):
        export(store, "xml")


def test_schema_version_is_recorded_and_a_newer_one_refused(tmp_path):
    path = tmp_path / "r.sqlite"
    ResultStore(path).close()
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == schema.SCHEMA_VERSION
        raw.execute("PRAGMA user_version = 99")
    with pytest.raises(ResultsError, match="schema version 99"):
        ResultStore(path)


def test_get_unknown_id(store):
    with pytest.raises(ResultsError, match="no run with id 42"):
        store.get(42)


def trial(backend: str, tgs: float, compare: str | None, round_: int | None) -> RunResult:
    return ok_result(backend=backend, tgs=tgs).model_copy(
        update={"compare_id": compare, "trial_round": round_, "trial_position": round_ and 1})


def test_latest_by_point_is_every_trial_of_the_newest_compare_and_an_old_row_is_one_trial(store):
    store.add(trial("xtuner", 900.0, None, None), load("tiny_cpu"), manifest_={})  # before trials: alone
    for round_, tgs in enumerate((1000.0, 1010.0, 990.0), 1):
        store.add(trial("xtuner", tgs, "c1", round_), load("tiny_cpu"), manifest_={})
        store.add(trial("torch", tgs / 2, "c1", round_), load("tiny_cpu"), manifest_={})
    store.add(trial("llamafactory", 800.0, None, None), load("tiny_cpu"), manifest_={})
    latest = store.latest_by_point()
    assert [(r["backend"], r["tgs"], r["trial_round"]) for r in latest] == [
        ("llamafactory", 800.0, None), ("torch", 500.0, 1), ("torch", 505.0, 2), ("torch", 495.0, 3),
        ("xtuner", 1000.0, 1), ("xtuner", 1010.0, 2), ("xtuner", 990.0, 3)]
    store.add(trial("xtuner", 700.0, "c2", 1), load("tiny_cpu"), manifest_={})  # a newer compare replaces c1's
    assert [r["tgs"] for r in store.latest_by_point(backend="xtuner")] == [700.0]


def test_export_keeps_one_row_per_trial_with_its_compares_aggregates(store):
    for round_, tgs in enumerate((1000.0, 1010.0, 990.0), 1):
        store.add(trial("xtuner", tgs, "c1", round_), load("tiny_cpu"), manifest_={})
        store.add(trial("torch", tgs / 2, "c1", round_), load("tiny_cpu"), manifest_={})
    store.add(trial("xtuner", 900.0, None, None), load("tiny_cpu"), manifest_={})
    rows = list(csv.DictReader(io.StringIO(export(store, "csv", backend="xtuner", reference="torch"))))
    assert [(r["trial_round"], r["trials"], r["tgs_median"], r["pct_of_reference"]) for r in rows] == [
        ("1", "3", "1000.0", "200.0"), ("2", "3", "1000.0", "200.0"), ("3", "3", "1000.0", "200.0"),
        ("", "1", "900.0", "")]  # the old row: a compare of one trial, without the reference
    assert float(rows[0]["tgs_ci_low"]) <= 1000.0 <= float(rows[0]["tgs_ci_high"]) and rows[3]["tgs_ci_low"] == ""
    runs = json.loads(export(store, "json", reference="torch"))
    assert {r["pct_ci_low"] for r in runs if r["backend"] == "torch"} == {None}  # the reference itself
    assert all(r["pct_ci_low"] <= 200.0 <= r["pct_ci_high"] for r in runs if r["compare_id"] and r["backend"] == "xtuner")


def test_a_store_from_before_trials_reads_its_rows_as_single_trials(tmp_path):
    """Schema 6 (the golden fixture's): migrated on open, its rows get no compare, one trial each."""
    path = tmp_path / "old.sqlite"
    path.write_bytes((Path(__file__).parent / "golden" / "fixture_results.sqlite").read_bytes())
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == 6  # nobody opened the fixture itself
    with ResultStore(path) as store:
        rows = store.list()
        assert rows and all(r["compare_id"] is None and r["trial_round"] is None for r in rows)
        assert {r["trials"] for r in json.loads(export(store, "json"))} <= {0, 1}


def test_results_list_groups_the_trials_of_a_compare_and_gives_its_verdicts(fbench_home, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from framework_bench.cli import app
    monkeypatch.setenv("FBENCH_REFERENCE", "torch")
    monkeypatch.setenv("COLUMNS", "200")
    db = tmp_path / "r.sqlite"
    with ResultStore(db) as store:
        store.add(trial("xtuner", 900.0, None, None), load("tiny_cpu"), manifest_={})
        for round_, wobble in enumerate((1.0, 1.01, 0.99), 1):
            for backend, tgs in (("xtuner", 1000.0), ("torch", 500.0)):
                store.add(trial(backend, tgs * wobble, "c1", round_), load("tiny_cpu"), manifest_={})
    out = CliRunner().invoke(app, ["results", "list", "--db", str(db)]).output
    rows = [[line.split("│")[i].strip() for i in (3, 4, 6)] for line in out.splitlines() if "│ tiny_cpu" in line]
    assert rows == [["-", "-", "xtuner"], *[["c1", f"{r}·1", b] for b in ("torch", "xtuner") for r in (1, 2, 3)]]
    lines = out.splitlines()
    assert lines[lines.index("compare c1:") + 1].startswith("  tiny_cpu: xtuner is 100.0% faster than torch (95% CI ")


# ---------------------------------------------------------------------------------------
# A store is never made unreadable or altered by reading.


def _cli(*args: str):
    from typer.testing import CliRunner

    from framework_bench.cli import app
    res = CliRunner().invoke(app, list(args))
    assert res.exception is None or isinstance(res.exception, SystemExit), res.output  # no traceback
    return res


def test_one_damaged_row_is_skipped_and_named_by_list_export_plot_and_report(fbench_home, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    db = tmp_path / "r.sqlite"
    with ResultStore(db) as s:
        for backend in ("xtuner", "llamafactory", "torch"):
            s.add(ok_result(backend=backend), load("tiny_cpu"), manifest_={})
    with sqlite3.connect(db) as raw:
        raw.execute("UPDATE runs SET flags = '[not json' WHERE id = 2")  # bad JSON in a column
        raw.execute("UPDATE runs SET tgs = 'fast' WHERE id = 3")  # text in a number column
    for command in (["results", "list"], ["results", "export"], ["results", "export", "--format", "json"],
                    ["plot", "--out", str(tmp_path / "p")], ["report", "--out", str(tmp_path / "p")]):
        res = _cli(*command, "--db", str(db))
        assert res.exit_code == 0, (command, res.output)
        assert "run 2" in res.stderr and "run 3" in res.stderr and "skipped" in res.stderr, (command, res.stderr)
    assert "xtuner" in _cli("results", "list", "--db", str(db)).stdout
    exported = json.loads(_cli("results", "export", "--format", "json", "--db", str(db)).stdout)
    assert [r["id"] for r in exported] == [1]


def test_a_path_that_is_no_regular_file_is_refused_in_one_line(tmp_path):
    import os
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (Path("/dev/null"), fifo):
        with pytest.raises(ResultsError, match="not a regular file"):
            ResultStore(path)
    assert not Path("/dev/null-journal").exists() and not (tmp_path / "fifo-journal").exists()


def test_another_applications_file_with_runs_and_steps_is_refused_not_altered(tmp_path):
    path = tmp_path / "other.sqlite"
    with sqlite3.connect(path) as raw:
        raw.execute("CREATE TABLE runs (id INTEGER PRIMARY KEY, name TEXT)")
        raw.execute("CREATE TABLE steps (id INTEGER PRIMARY KEY, run INTEGER)")
        raw.execute("PRAGMA user_version = 3")  # its own schema version, no application id
    before = path.read_bytes()
    with pytest.raises(ResultsError, match="another application"):
        ResultStore(path)
    assert path.read_bytes() == before


def _old_store(tmp_path) -> Path:
    path = tmp_path / "old.sqlite"
    path.write_bytes((Path(__file__).parent / "golden" / "fixture_results.sqlite").read_bytes())
    return path


def _version(path: Path) -> int:
    with sqlite3.connect(path) as raw:
        return raw.execute("PRAGMA user_version").fetchone()[0]


def test_reading_commands_read_an_older_store_without_migrating_it(fbench_home, tmp_path):
    path = _old_store(tmp_path)
    assert _version(path) == 6
    with ResultStore(path, must_exist=True, read_only=True) as s:
        rows = s.list()
        assert rows and all(r["compare_id"] is None and r["trial_round"] is None for r in rows)
        assert s.get(rows[0]["id"])["steps"] is not None
        assert json.loads(export(s, "json"))
    for command in (["results", "list"], ["results", "export"], ["results", "show", str(rows[0]["id"])]):
        res = _cli(*command, "--db", str(path))
        assert res.exit_code == 0, (command, res.output)
    assert _version(path) == 6 and not list(tmp_path.glob("*.bak"))


def test_the_first_write_migrates_an_older_store_after_a_backup_beside_it(tmp_path):
    path = _old_store(tmp_path)
    before = path.read_bytes()
    ResultStore(path).close()
    assert _version(path) == schema.SCHEMA_VERSION
    backups = list(tmp_path.glob("old.sqlite.schema6*.bak"))
    assert len(backups) == 1 and backups[0].read_bytes() == before


@pytest.mark.slow  # starts a framework's or the host's own process
def test_a_locked_store_says_who_holds_it_and_that_it_waits(fbench_home, tmp_path, monkeypatch, capsys):
    import subprocess
    import sys
    db = tmp_path / "r.sqlite"
    with ResultStore(db) as s:
        s.add(ok_result(), load("tiny_cpu"), manifest_={})
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sqlite3, sys, time\n"
        f"c = sqlite3.connect({str(db)!r}); c.execute('BEGIN EXCLUSIVE'); print('held', flush=True); time.sleep(3)\n"
        "c.rollback()")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with ResultStore(db, must_exist=True, read_only=True) as s:
            assert len(s.list()) == 1
    finally:
        holder.wait()
    err = capsys.readouterr().err
    assert str(db) in err and f"pid {holder.pid}" in err and "waiting" in err


def test_an_ok_run_with_a_failed_flag_counts_in_list_export_verdicts_charts_and_report(fbench_home, tmp_path, monkeypatch):
    """One rule for which trials count: an `ok` run whose flag failed (the framework's own
    throughput off the host's, a non-blocking check) counts in `results list`'s verdicts, the
    export's aggregates, the table's summary, the chart and the report (whose caveats said a trial
    that failed a check was not counted), none of which names it left out: the verdict pairs all 3
    rounds (a compare's trials pair by round)."""
    from framework_bench.measure.verify import Check
    from framework_bench.present import plotting
    from framework_bench.present.verdict import Points

    monkeypatch.setenv("FBENCH_REFERENCE", "torch")
    monkeypatch.setenv("COLUMNS", "200")
    db = tmp_path / "r.sqlite"
    flag = Check(name="throughput", status="fail", detail="framework 3,291.1 vs host 3,718.0 (-11.5%)")
    with ResultStore(db) as store:
        for round_ in (1, 2, 3):
            for backend, tgs in (("llamafactory", 1000.0 + round_), ("torch", 500.0 + round_)):
                r = trial(backend, tgs, "c1", round_)
                if backend == "llamafactory" and round_ == 2:
                    r = r.model_copy(update={"checks": [flag], "flags": [f"throughput: {flag.detail}"]})
                store.add(r, load("tiny_cpu"), manifest_={})
        rows = store.latest_by_point()
    listed = _cli("results", "list", "--db", str(db)).output
    assert "not counted" not in listed and "paired over 3 rounds" in listed, listed
    exported = {r["backend"]: r for r in json.loads(_cli("results", "export", "--db", str(db), "--format",
                                                          "json").stdout) if r["trial_round"] == 2}
    assert exported["llamafactory"]["trials"] == 3
    points = Points(rows, "torch")
    assert points.summaries["tiny_cpu", "llamafactory"].trials == 3
    assert not any("not counted" in line for line in points.lines)
    charts = plotting.plot_results(rows, tmp_path / "plots")
    svg = next(p for p in charts if p.suffix == ".svg").read_text()
    assert 'id="tgs-line-llamafactory"' in svg
    from framework_bench.present.report import write_report
    md = write_report(rows, tmp_path / "report", charts)[0].read_text()
    row = next(line for line in md.splitlines() if line.startswith("| tiny_cpu |") and "| llamafactory" in line)
    assert "| ok | 3 |" in row and "not counted" not in md, md[md.find("not counted") - 300:]  # counted, as in the table
    assert "throughput: framework 3,291.1 vs host 3,718.0" in md  # and says its flag, under the table
