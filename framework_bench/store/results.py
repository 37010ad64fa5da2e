"""The results store: every run (ok or not) as one SQLite row, its steps and its environment.

One `runs` row per backend x scenario run, holding the full validated scenario, the
aggregated figures of `RunResult`, and an environment manifest; one `steps` row per rank
and optimizer step, read from the run folder. A run and its steps are written in one
transaction, so an interrupted compare never leaves a half-written run behind.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import shutil
import sqlite3
import sys
import time
from pathlib import Path

from pydantic import ValidationError

from framework_bench.envs import venvs as envs
from framework_bench.plugins.contract import StepMetric
from framework_bench.measure.metrics import RunResult
from framework_bench.scenario.scenario import Scenario
from framework_bench.store import locks
from framework_bench.store.provenance import manifest
from framework_bench.store.schema import (APPLICATION_ID, MIGRATIONS, OWN_COLUMNS, SCHEMA_VERSION, STEP_COLUMNS,
                                          Damaged, decode, nan_as_text, text_as_nan)
from framework_bench.worker.files import read_metrics


class ResultsError(RuntimeError):
    """A results database this version of fbench cannot use, or a run id that is not there."""


def default_db() -> Path:
    return envs.fbench_home() / "results" / "results.sqlite"


def read_steps(run_dir: Path | None) -> tuple[list[StepMetric], list[str]]:
    """The run's per-step records and notes on any that could not be read (a crash may cut a line)."""
    if run_dir is None or not Path(run_dir).is_dir():
        return [], []
    try:
        raw = read_metrics(run_dir)
    except ValueError as e:
        return [], [f"per-step metrics unreadable: {e}"]
    steps, bad = [], 0
    for record in raw:
        try:
            steps.append(StepMetric.model_validate(record))
        except ValidationError:
            bad += 1
    return steps, [f"{bad} invalid per-step records skipped"] if bad else []


class ResultStore:
    """`ResultStore(path)`; `path` defaults to `default_db()`. Usable as a context manager."""

    def __init__(self, path: Path | str | None = None, must_exist: bool = False, read_only: bool = False):
        """`must_exist`: for commands that only read, a missing file is a mistyped --db, not a new store.
        `read_only`: open an existing file without writing anything into it (no migration: an older
        schema is read as it is, `version` says which); a missing one is made as for writing."""
        self.path = (Path(path) if path is not None else default_db()).absolute()
        self.damaged: dict[int, str] = {}  # rows skipped by `list`, by id: why
        if self.path.is_dir():
            raise ResultsError(f"{self.path} is a folder, not a results file: give a file path with --db")
        if self.path.exists() and not self.path.is_file():  # /dev/null, a fifo: SQLite would write beside it
            raise ResultsError(f"{self.path} is not a regular file: give a file path with --db")
        if must_exist and not self.path.exists():
            raise ResultsError(f"no results file at {self.path}: give the --db the runs were stored in")
        self.read_only = read_only and self.path.exists()
        try:
            if self.read_only:
                self._roll_back_a_killed_write()
                self.conn = sqlite3.connect(f"file:{_uri_path(self.path)}?mode=ro", uri=True,
                                            timeout=locks.LOCK_WAIT)
            else:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self.conn = sqlite3.connect(self.path, timeout=locks.LOCK_WAIT)
        except (OSError, sqlite3.Error) as e:
            raise ResultsError(f"cannot open the results file {self.path}: {e}") from None
        self.conn.row_factory = sqlite3.Row
        self._patience = locks.Patience(self.conn, self.path)
        try:
            if self.read_only:
                app, self.version = self._patience.briefly(self._state)
                self._check_ours(app, self.version)
                if self.version == 0:  # no tables: nothing to read (a writer would make the store in it)
                    size = self.path.stat().st_size
                    raise ResultsError(f"{self.path} is empty ({size} bytes, no fbench tables): no runs were stored "
                                       "in it; give the --db the runs were stored in")
            else:
                self.conn.execute("PRAGMA foreign_keys = ON")
                self._migrate()
                self.version = SCHEMA_VERSION
            bad = self.conn.execute("PRAGMA quick_check").fetchone()[0]
        except ResultsError:
            self.conn.close()
            raise
        except sqlite3.Error as e:  # not a database, a truncated one, unreadable
            self.conn.close()
            raise ResultsError(f"{self.path} is not a usable results file ({e}): give another --db") from None
        if bad != "ok":
            self.conn.close()
            raise ResultsError(f"{self.path} is damaged ({bad}): give another --db")

    def _roll_back_a_killed_write(self) -> None:
        """A process killed inside a write (`kill -9`) leaves SQLite's journal of it hot, which only
        a connection that may write can roll back: a read-only one answers "attempt to write a
        readonly database". Where a journal lies beside the file, one such connection reads it
        first, rolling the write back as SQLite does for any reader (a writer alive now holds its
        lock: this waits for it, and rolls nothing back)."""
        if not self.path.with_name(self.path.name + "-journal").exists():
            return
        try:
            with contextlib.closing(sqlite3.connect(self.path, timeout=locks.LOCK_WAIT)) as conn:
                conn.execute("PRAGMA schema_version").fetchone()
        except sqlite3.Error:
            pass  # not ours to roll back (a file we may not write): the read-only connection says why

    def _check_ours(self, app: int, version: int) -> None:
        """Raise ResultsError unless the file is fbench's (or new) and of a schema this fbench knows."""
        tables = {r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        columns = {r[1] for r in self.conn.execute("PRAGMA table_info(runs)")} if "runs" in tables else set()
        ours = app == APPLICATION_ID or (app == 0 and version >= 1 and {"runs", "steps"} <= tables
                                         and OWN_COLUMNS <= columns)
        if not ours and (app or version or tables):
            held = ", ".join(sorted(tables)) or "no tables"
            raise ResultsError(f"{self.path} belongs to another application (application id {app}, {held}): "
                               "fbench will not write into it; give another --db")
        if version > SCHEMA_VERSION:
            raise ResultsError(f"{self.path} has schema version {version}; this fbench knows up to "
                               f"{SCHEMA_VERSION}: use a newer fbench or another --db")

    def check_writable(self) -> None:
        """Raise ResultsError unless a run's row could be written now (checked before launching,
        so an unwritable store is not found only after the training)."""
        try:
            self.conn.execute("BEGIN IMMEDIATE")
            self.conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            self.conn.rollback()
        except sqlite3.Error as e:
            raise ResultsError(f"cannot write to the results file {self.path}: {e}") from None

    def __enter__(self) -> "ResultStore":
        return self

    def __exit__(self, *_exc) -> None:
        self.close()

    def close(self) -> None:
        self.conn.close()

    def _migrate(self) -> None:
        if self._patience.briefly(self._state) == (APPLICATION_ID, SCHEMA_VERSION):
            return  # the common case, without taking the write lock
        # The write lock first, then a fresh look: of several processes opening a new store at
        # once, one creates the tables and the others find them made.
        self._patience.briefly(lambda: self.conn.execute("BEGIN IMMEDIATE"))
        try:
            app, version = self._state()
            self._check_ours(app, version)
            if 1 <= version < SCHEMA_VERSION:
                self._back_up(version)
            for target in range(version + 1, SCHEMA_VERSION + 1):
                for statement in MIGRATIONS[target - 1].split(";"):
                    if statement.strip():
                        self.conn.execute(statement)
                self.conn.execute(f"PRAGMA user_version = {target}")
            self.conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            self.conn.commit()
        except BaseException:
            self.conn.rollback()
            raise

    def _back_up(self, version: int) -> None:
        """A copy of the store as it is, beside it, before it is migrated from `version` (an older
        fbench refuses the migrated file). Taken under the write lock: nothing changes it meanwhile."""
        backup = self.path.with_name(f"{self.path.name}.schema{version}.bak")
        if backup.exists():
            backup = self.path.with_name(f"{self.path.name}.schema{version}-{time.strftime('%Y%m%d-%H%M%S')}.bak")
        try:
            shutil.copyfile(self.path, backup)
        except OSError as e:
            raise ResultsError(f"{self.path} has schema version {version} and is migrated to {SCHEMA_VERSION} "
                               f"on this write, but no backup could be made first ({e}): not migrated") from None
        print(f"the results file {self.path} was of schema version {version}: migrated to {SCHEMA_VERSION}, "
              f"the file as it was is kept in {backup}", file=sys.stderr, flush=True)

    def _state(self) -> tuple[int, int]:
        return (self.conn.execute("PRAGMA application_id").fetchone()[0],
                self.conn.execute("PRAGMA user_version").fetchone()[0])

    def add(self, result: RunResult, scenario: Scenario, manifest_: dict | None = None) -> int:
        """Record one run with its steps (one transaction); sets and returns `result.result_id`."""
        steps, notes = read_steps(result.run_dir)
        row = {
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "backend": result.backend,
            "framework_version": result.framework_version,
            "scenario": result.scenario,
            "scenario_json": json.dumps(scenario.model_dump(mode="json")),
            "context_length": scenario.context_length,
            "model": scenario.model.preset or "inline",
            "gpus": scenario.cluster.gpus,
            "sequence_parallel": scenario.sequence_parallel,
            "device": scenario.cluster.device,
            "status": result.status,
            "reason": result.reason,
            "final_loss": nan_as_text(result.final_loss),
            **{k: getattr(result, k) for k in ("tgs", "tgs_min", "tgs_max", "tflops", "model_tflops", "mfu",
                                                "steps_measured", "step_seconds", "peak_mem_bytes",
                                                "data_sha256", "attention_used", "wall_seconds",
                                                "step_unit", "tokens_measured", "peak_reserved_bytes",
                                                "startup_seconds")},
            "flags": json.dumps(result.flags + notes),
            "framework_throughput": json.dumps(result.framework_throughput),
            "settings": json.dumps(result.settings),
            "settings_mode": result.settings_mode,
            "checks": json.dumps([c.model_dump() for c in result.checks]),
            "notes": json.dumps(result.notes),
            "seed": result.seed,
            "compare_id": result.compare_id,
            "trial_round": result.trial_round,
            "trial_position": result.trial_position,
            "loss_curve": json.dumps(result.loss_curve),
            "run_dir": str(result.run_dir) if result.run_dir else None,
            "manifest": json.dumps(manifest_ if manifest_ is not None else manifest(result.backend)),
        }

        def insert() -> int:
            with self.conn:
                run_id = self.conn.execute(
                    f"INSERT INTO runs ({', '.join(row)}) VALUES ({', '.join(':' + k for k in row)})", row).lastrowid
                _insert_steps(self.conn, run_id, steps)
            return run_id

        run_id = self._patience.fully(insert)
        result.result_id = run_id
        return run_id

    def list(self, scenario_glob: str | None = None, backend: str | None = None) -> list[dict]:
        """Runs, oldest first, without their steps; `scenario_glob` like `tiny_cpu*`."""
        query, args = "SELECT * FROM runs", []
        if backend is not None:
            query, args = query + " WHERE backend = ?", [backend]
        rows = []
        for r in self.conn.execute(query + " ORDER BY id", args):
            try:
                rows.append(decode(r))
            except Damaged as e:
                self.damaged[r["id"]] = f"run {r['id']} is damaged and skipped: {e}"
        if scenario_glob is not None:
            rows = [r for r in rows if fnmatch.fnmatchcase(r["scenario"], scenario_glob)]
        return rows

    def get(self, run_id: int) -> dict:
        """One run with its steps (ordered by step, then rank) and its manifest."""
        if not -(2**63) <= run_id < 2**63:  # beyond SQLite's integers: no such run
            raise ResultsError(f"no run with id {run_id} in {self.path}")
        row = self.conn.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            raise ResultsError(f"no run with id {run_id} in {self.path}")
        try:
            out = decode(row)
        except Damaged as e:
            raise ResultsError(f"run {run_id} in {self.path} is damaged: {e}") from None
        out["steps"] = [{k: s[k] if k in s.keys() else None for k in STEP_COLUMNS} | {"loss": text_as_nan(s["loss"])}
                        for s in self.conn.execute("SELECT * FROM steps WHERE run_id = ? ORDER BY step, rank",
                                                   (run_id,))]
        return out

    def id_of_run(self, run_dir: Path | str) -> int | None:
        """The id of the row stored for the run folder `run_dir`, or None (read only): how `results
        collect` tells a run it stored but could not record so in the run folder."""
        return self._patience.briefly(lambda: self.conn.execute("SELECT MAX(id) FROM runs WHERE run_dir = ?",
                                                                (str(run_dir),)).fetchone()[0])

    def latest_by_point(self, scenario_glob: str | None = None, backend: str | None = None,
                        settings_mode: str | None = None) -> list[dict]:
        """The newest run of each backend x scenario (whatever its status) with the other trials of its
        compare, oldest first: what charts and reports show; `settings_mode` keeps one mode's runs
        (matched and native runs are never mixed in one chart)."""
        rows = [r for r in self.list(scenario_glob, backend)
                if settings_mode is None or r["settings_mode"] == settings_mode]
        latest: dict[tuple[str, str], dict] = {}
        for r in rows:
            latest[(r["backend"], r["scenario"])] = r  # ordered by id: later runs replace earlier ones
        newest = {point: r["compare_id"] or r["id"] for point, r in latest.items()}
        trials = [r for r in rows if newest[r["backend"], r["scenario"]] in (r["compare_id"], r["id"])]
        return sorted(trials, key=lambda r: (r["model"], r["context_length"], r["scenario"], r["backend"], r["id"]))


def _insert_steps(conn: sqlite3.Connection, run_id: int, steps: list[StepMetric]) -> None:
    conn.executemany(
        "INSERT INTO steps (run_id, step, rank, seconds, tokens, loss, peak_mem_bytes, peak_reserved_bytes) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        [(run_id, s.step, s.rank, s.seconds, s.tokens, nan_as_text(s.loss), s.peak_mem_bytes, s.peak_reserved_bytes)
         for s in steps])


def _uri_path(path: Path) -> str:
    from urllib.parse import quote
    return quote(str(path), safe="/")

