"""The results store: every run (ok or not) as one SQLite row, its steps and its environment.

One `runs` row per backend x scenario run, holding the full validated scenario, the
aggregated figures of `RunResult`, and an environment manifest; one `steps` row per rank
and optimizer step, read from the run folder. A run and its steps are written in one
transaction, so an interrupted compare never leaves a half-written run behind.
"""

from __future__ import annotations

import contextlib
import csv
import fnmatch
import io
import json
import math
import os
import platform
import re
import shutil
import socket
import sqlite3
import subprocess
import sys
import time
from functools import cache
from pathlib import Path

from pydantic import ValidationError

from framework_bench import __version__
from framework_bench.envs import venvs as envs
from framework_bench.plugins import registry
from framework_bench.plugins.contract import StepMetric
from framework_bench.measure import statistics
from framework_bench.measure.machine import detect
from framework_bench.measure.metrics import RunResult
from framework_bench.spec.scenario import PROJECT_ROOT, Scenario
from framework_bench.worker.files import read_metrics

SCHEMA_VERSION = 7
# SQLite's header field for "which application owns this file" ("fbnc"): fbench writes only
# into a new file or one that carries it (or, from before it was set, holds fbench's tables).
APPLICATION_ID = 0x66626E63

# Migrations by the version they lead to: migration i takes a database at version i to i + 1.
_MIGRATIONS = [
    """
    CREATE TABLE runs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        created_at TEXT NOT NULL,
        backend TEXT NOT NULL,
        framework_version TEXT,
        scenario TEXT NOT NULL,
        scenario_json TEXT NOT NULL,
        context_length INTEGER NOT NULL,
        model TEXT NOT NULL,
        gpus INTEGER NOT NULL,
        sequence_parallel INTEGER NOT NULL,
        device TEXT NOT NULL,
        status TEXT NOT NULL,
        reason TEXT,
        tgs REAL, tgs_min REAL, tgs_max REAL,
        tflops REAL, model_tflops REAL, mfu REAL,
        steps_measured INTEGER NOT NULL,
        step_seconds REAL,
        peak_mem_bytes INTEGER,
        final_loss REAL,
        flags TEXT NOT NULL,
        data_sha256 TEXT,
        attention_used TEXT,
        framework_throughput TEXT NOT NULL,
        run_dir TEXT,
        wall_seconds REAL,
        manifest TEXT NOT NULL
    );
    CREATE INDEX runs_point ON runs (scenario, backend);
    CREATE TABLE steps (
        run_id INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
        step INTEGER NOT NULL CHECK (step >= 1),
        rank INTEGER NOT NULL CHECK (rank >= 0),
        seconds REAL NOT NULL CHECK (seconds > 0),
        tokens INTEGER NOT NULL CHECK (tokens >= 0),
        loss REAL,
        peak_mem_bytes INTEGER
    );
    CREATE INDEX steps_run ON steps (run_id);
    """,
    # 2: the settings in effect (read by the worker), the settings mode, the host's checks (#11).
    """
    ALTER TABLE runs ADD COLUMN settings TEXT NOT NULL DEFAULT '{}';
    ALTER TABLE runs ADD COLUMN settings_mode TEXT NOT NULL DEFAULT 'matched';
    ALTER TABLE runs ADD COLUMN checks TEXT NOT NULL DEFAULT '[]';
    """,
    # 3: what one measured step was (optimizer step or micro-iteration) and the tokens measured
    """
    ALTER TABLE runs ADD COLUMN step_unit TEXT NOT NULL DEFAULT 'optimizer';
    ALTER TABLE runs ADD COLUMN tokens_measured INTEGER;
    """,
    # 4: the backend's notes on each run (WorkerReport.notes), a JSON list
    "ALTER TABLE runs ADD COLUMN notes TEXT NOT NULL DEFAULT '[]';",
    # 5: peak reserved memory (per step and the run's max over measured steps), start-up seconds.
    """
    ALTER TABLE runs ADD COLUMN peak_reserved_bytes INTEGER;
    ALTER TABLE runs ADD COLUMN startup_seconds REAL;
    ALTER TABLE steps ADD COLUMN peak_reserved_bytes INTEGER;
    """,
    # 6: the compare's seed (the initial weights every backend starts from) and the canonical
    # loss per optimizer step, {step: loss} as JSON (issue 20).
    """
    ALTER TABLE runs ADD COLUMN seed INTEGER;
    ALTER TABLE runs ADD COLUMN loss_curve TEXT NOT NULL DEFAULT '{}';
    """,
    # 7: repeated trials (issue 26): the compare a run is a trial of, its round and its place in
    # the round; rows from before have none and read as a compare of one trial.
    """
    ALTER TABLE runs ADD COLUMN compare_id TEXT;
    ALTER TABLE runs ADD COLUMN trial_round INTEGER;
    ALTER TABLE runs ADD COLUMN trial_position INTEGER;
    CREATE INDEX runs_compare ON runs (compare_id);
    """,
]

# Columns holding JSON text, decoded when rows are read back, with the kind each must decode to.
_JSON_COLUMNS = ("scenario_json", "flags", "framework_throughput", "manifest", "settings", "checks", "notes",
                 "loss_curve")
_JSON_KINDS = {"scenario_json": dict, "flags": list, "framework_throughput": dict, "manifest": dict, "settings": dict,
               "checks": list, "notes": list, "loss_curve": dict}
# Columns holding numbers: a row with text there is damaged (SQLite keeps whatever it is given).
_NUMBER_COLUMNS = ("id", "context_length", "gpus", "sequence_parallel", "tgs", "tgs_min", "tgs_max", "tflops",
                   "model_tflops", "mfu", "steps_measured", "step_seconds", "peak_mem_bytes", "final_loss",
                   "wall_seconds", "tokens_measured", "peak_reserved_bytes", "startup_seconds", "seed",
                   "trial_round", "trial_position")
# What a row of an older schema (read without migrating it) has in the columns added since.
_COLUMN_DEFAULTS = {"settings": "{}", "settings_mode": "matched", "checks": "[]", "step_unit": "optimizer",
                    "tokens_measured": None, "notes": "[]", "peak_reserved_bytes": None, "startup_seconds": None,
                    "seed": None, "loss_curve": "{}", "compare_id": None, "trial_round": None,
                    "trial_position": None}
# The columns of the first schema's `runs` that another application's table of that name would hardly have.
_OWN_COLUMNS = {"backend", "scenario_json", "framework_throughput", "manifest", "steps_measured"}

# The common stack of a backend env worth naming in the manifest (those that exist are kept);
# each backend adds its framework package and its own (`BackendInfo.manifest_packages`).
_STACK_PACKAGES = ("torch", "transformers", "deepspeed", "accelerate", "peft", "flash-attn", "datasets")


class ResultsError(RuntimeError):
    """A results database this version of fbench cannot use, or a run id that is not there."""


# How long a row waits for a store another process holds locked: SQLite's own wait per try,
# then tries again with a growing pause, up to the patience; only then is it kept aside.
LOCK_WAIT = 30.0
LOCK_PATIENCE = 600.0
FIRST_PAUSE = 0.5


def _locked(e: sqlite3.Error) -> bool:
    return isinstance(e, sqlite3.OperationalError) and any(w in str(e) for w in ("locked", "busy"))


def holders(path: Path) -> list[str]:
    """The other processes of this machine that have the file `path` open ("pid N (command)"),
    read from /proc: SQLite does not say which one holds its lock, so each is named."""
    try:
        target = os.path.realpath(path)
        entries = list(Path("/proc").iterdir())
    except OSError:
        return []
    found = []
    for entry in entries:
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if any(os.path.realpath(fd) == target for fd in (entry / "fd").iterdir()):
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
                found.append(f"pid {entry.name}" + (f" ({command[:80]})" if command else ""))
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


def _nan_as_text(x: float | None) -> float | str | None:
    """SQLite stores a NaN as NULL, the same as "no loss reported": a diverged run's NaN is kept as text."""
    return "NaN" if isinstance(x, float) and math.isnan(x) else x


def _text_as_nan(x):
    return float("nan") if x == "NaN" else x


def standard_json(value):
    """`value` with every NaN or infinity as the strings "NaN", "Infinity", "-Infinity": JSON has no such numbers."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: standard_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [standard_json(v) for v in value]
    return value


def default_db() -> Path:
    return envs.fbench_home() / "results" / "results.sqlite"


@cache
def host_manifest() -> dict:
    """What this machine and this checkout are: the part of the manifest shared by every run."""
    machine = detect()
    return {
        "hostname": socket.gethostname(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "cpu": machine.cpu,
        "cpu_count": machine.cpu_count,
        "gpu": machine.gpu_name,
        "gpu_count": machine.gpus,
        "gpu_memory_gib": machine.gpu_memory_gib,
        "gpu_driver": _gpu_driver() if machine.gpus else None,
        "fbench_version": __version__,
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
    }


def manifest(backend: str) -> dict:
    """The environment a run of `backend` had: the host, plus the versions in the backend's env."""
    env = envs.inspect(backend)
    try:
        info = registry.get(backend).info
        own = [info.env.framework_package, *info.manifest_packages]
    except registry.UnknownBackend:  # uninstalled since it ran (a run stored by a later command)
        own = []
    versions = {name: v for name in dict.fromkeys([*_STACK_PACKAGES, *own]) if (v := env.version(name))}
    return {**host_manifest(), "backend_env": {"path": str(env.path), "flavour": env.flavour, "versions": versions}}


def _gpu_driver() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = out.stdout.split()
    return lines[0] if out.returncode == 0 and lines else None


def _git(*args: str) -> str | None:
    """A git query on the project checkout; None when git or the repository is absent."""
    try:
        out = subprocess.run(["git", "-C", str(PROJECT_ROOT), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


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
        self._said_waiting = False
        if self.path.is_dir():
            raise ResultsError(f"{self.path} is a folder, not a results file: give a file path with --db")
        if self.path.exists() and not self.path.is_file():  # /dev/null, a fifo: SQLite would write beside it
            raise ResultsError(f"{self.path} is not a regular file: give a file path with --db")
        if must_exist and not self.path.exists():
            raise ResultsError(f"no results file at {self.path}: give the --db the runs were stored in")
        self.read_only = read_only and self.path.exists()
        try:
            if self.read_only:
                self.conn = sqlite3.connect(f"file:{_uri_path(self.path)}?mode=ro", uri=True, timeout=LOCK_WAIT)
            else:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self.conn = sqlite3.connect(self.path, timeout=LOCK_WAIT)
        except (OSError, sqlite3.Error) as e:
            raise ResultsError(f"cannot open the results file {self.path}: {e}") from None
        self.conn.row_factory = sqlite3.Row
        try:
            if self.read_only:
                app, self.version = self._patiently(self._state)
                self._check_ours(app, self.version)
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

    def _say_waiting(self, patience: float) -> None:
        """One line, once: the store is locked, by whom, and that this command waits for it."""
        if self._said_waiting:
            return
        self._said_waiting = True
        who = ", ".join(holders(self.path)) or "another process"
        print(f"the results file {self.path} is locked (open in {who}): waiting for it, up to {patience:.0f} s",
              file=sys.stderr, flush=True)

    def _patiently(self, step):
        """`step()`, first with a short wait: when the store is locked, say so (`_say_waiting`),
        then wait SQLite's whole wait."""
        self.conn.execute("PRAGMA busy_timeout = 200")
        try:
            return step()
        except sqlite3.OperationalError as e:
            if not _locked(e):
                raise
            self._say_waiting(LOCK_WAIT)
        finally:
            self.conn.execute(f"PRAGMA busy_timeout = {int(LOCK_WAIT * 1000)}")
        return step()

    def _check_ours(self, app: int, version: int) -> None:
        """Raise ResultsError unless the file is fbench's (or new) and of a schema this fbench knows."""
        tables = {r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        columns = {r[1] for r in self.conn.execute("PRAGMA table_info(runs)")} if "runs" in tables else set()
        ours = app == APPLICATION_ID or (app == 0 and version >= 1 and {"runs", "steps"} <= tables
                                         and _OWN_COLUMNS <= columns)
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
        if self._patiently(self._state) == (APPLICATION_ID, SCHEMA_VERSION):
            return  # the common case, without taking the write lock
        # The write lock first, then a fresh look: of several processes opening a new store at
        # once, one creates the tables and the others find them made.
        self._patiently(lambda: self.conn.execute("BEGIN IMMEDIATE"))
        try:
            app, version = self._state()
            self._check_ours(app, version)
            if 1 <= version < SCHEMA_VERSION:
                self._back_up(version)
            for target in range(version + 1, SCHEMA_VERSION + 1):
                for statement in _MIGRATIONS[target - 1].split(";"):
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
            "final_loss": _nan_as_text(result.final_loss),
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
        pause, deadline = FIRST_PAUSE, time.monotonic() + LOCK_PATIENCE
        while True:
            try:
                with self.conn:
                    cur = self.conn.execute(
                        f"INSERT INTO runs ({', '.join(row)}) VALUES ({', '.join(':' + k for k in row)})", row)
                    run_id = cur.lastrowid
                    _insert_steps(self.conn, run_id, steps)
                break
            except sqlite3.Error as e:
                if not _locked(e) or time.monotonic() + pause > deadline:
                    raise
                self._say_waiting(LOCK_PATIENCE)
                time.sleep(pause)
                pause = min(2 * pause, 30.0)
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
                rows.append(_decode(r))
            except _Damaged as e:
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
            out = _decode(row)
        except _Damaged as e:
            raise ResultsError(f"run {run_id} in {self.path} is damaged: {e}") from None
        out["steps"] = [{k: s[k] if k in s.keys() else None for k in _STEP_COLUMNS} | {"loss": _text_as_nan(s["loss"])}
                        for s in self.conn.execute("SELECT * FROM steps WHERE run_id = ? ORDER BY step, rank",
                                                   (run_id,))]
        return out

    def id_of_run(self, run_dir: Path | str) -> int | None:
        """The id of the row stored for the run folder `run_dir`, or None (read only): how `results
        collect` tells a run it stored but could not record so in the run folder."""
        return self._patiently(lambda: self.conn.execute("SELECT MAX(id) FROM runs WHERE run_dir = ?",
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

    def export(self, format: str, scenario_glob: str | None = None, backend: str | None = None,
               reference: str | None = None) -> str:
        """`csv`: one line per run (JSON fields as JSON text); `json`: a list of runs with their steps.
        Each run also carries the aggregates of its compare's trials of its backend and scenario
        (`AGGREGATES`; against the `reference` backend's trials of the same compare)."""
        rows = self.list(scenario_glob, backend)
        if format not in ("csv", "json"):
            raise ValueError(f"unknown export format {format!r}: use csv or json")
        aggregates = _aggregates(self.list(), reference)  # all rows: the reference's too, whatever the filter
        if format == "json":
            return json.dumps(standard_json([self.get(r["id"]) | aggregates[r["id"]] for r in rows]), indent=2,
                              allow_nan=False)
        buf = io.StringIO()
        stored = [d[1] for d in self.conn.execute("PRAGMA table_info(runs)")]  # an older schema's, with the newer
        columns = stored + [c for c in _COLUMN_DEFAULTS if c not in stored] + list(AGGREGATES)
        writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        for r in rows:
            r |= aggregates[r["id"]]
            writer.writerow({k: json.dumps(r[k]) if k in _JSON_COLUMNS else r[k] for k in columns})
        return buf.getvalue()


# What `export` adds to each run: over the counted trials of its compare (a run stored before
# trials existed is a compare of one), of its backend and scenario.
AGGREGATES = ("trials", "tgs_median", "tgs_ci_low", "tgs_ci_high", "tgs_cv",
              "pct_of_reference", "pct_ci_low", "pct_ci_high")


def _aggregates(rows: list[dict], reference: str | None) -> dict[int, dict]:
    by_compare: dict[object, list[dict]] = {}
    for r in rows:
        by_compare.setdefault(r["compare_id"] or r["id"], []).append(r)
    out = {}
    for trials_ in by_compare.values():
        trials = [statistics.Trial.from_record(r) for r in trials_]
        summaries = statistics.summarise(trials)
        shares = {(p.scenario, p.backend): p for p in statistics.pairs(trials, reference) if p.other == reference}
        for r in trials_:
            s, p = summaries[r["scenario"], r["backend"]], shares.get((r["scenario"], r["backend"]))
            share = [None] * 3 if p is None else [None if x is None else 100 * x for x in (p.ratio, p.low, p.high)]
            out[r["id"]] = dict(zip(AGGREGATES, (s.trials, s.median, s.low, s.high, s.cv, *share)))
    return out


def _insert_steps(conn: sqlite3.Connection, run_id: int, steps: list[StepMetric]) -> None:
    conn.executemany(
        "INSERT INTO steps (run_id, step, rank, seconds, tokens, loss, peak_mem_bytes, peak_reserved_bytes) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        [(run_id, s.step, s.rank, s.seconds, s.tokens, _nan_as_text(s.loss), s.peak_mem_bytes, s.peak_reserved_bytes)
         for s in steps])


_STEP_COLUMNS = ("step", "rank", "seconds", "tokens", "loss", "peak_mem_bytes", "peak_reserved_bytes")


class _Damaged(ValueError):
    """A stored row that cannot be read back: a column holding what no fbench wrote there."""


def _uri_path(path: Path) -> str:
    from urllib.parse import quote
    return quote(str(path), safe="/")


def _decode(row: sqlite3.Row) -> dict:
    out = dict(row)
    for key, default in _COLUMN_DEFAULTS.items():  # a row of an older schema gets the columns added since
        out.setdefault(key, default)
    out["final_loss"] = _text_as_nan(out["final_loss"])
    for key in _NUMBER_COLUMNS:
        value = out.get(key)
        if not (value is None or isinstance(value, (int, float))):
            raise _Damaged(f"column {key} holds {str(value)[:40]!r}, not a number")
    for key in _JSON_COLUMNS:
        try:
            out[key] = json.loads(out[key])
        except (TypeError, ValueError) as e:
            raise _Damaged(f"column {key} is not JSON ({e})") from None
        if not isinstance(out[key], _JSON_KINDS[key]):
            raise _Damaged(f"column {key} holds {type(out[key]).__name__}, not {_JSON_KINDS[key].__name__}")
    return out


# ---------------------------------------------------------------------------------------
# Rows never lost: a store that cannot take a row now (locked past the patience, a full disk,
# a value it cannot hold) gets it later, from a file kept next to it.


def unstored_dir(db: Path) -> Path:
    """Where rows the store `db` could not take wait for the next command."""
    return db.with_name(db.name + ".unstored")


class Unstored(Exception):
    """Neither the store nor the folder next to it could take a run: `record` is its row as JSON."""

    def __init__(self, record: str, why: str):
        super().__init__(why)
        self.record = record


def save(store: "ResultStore", result: RunResult, scenario: Scenario) -> Path | None:
    """Store the run; when the store cannot take it, keep it in `unstored_dir` for the next
    command and return that file. Raises `Unstored` when that fails too. The run's claim on
    its folder is the run layer's to release (`framework_bench/run/orphans.py` `save`)."""
    try:
        manifest_ = manifest(result.backend)
    except Exception as e:  # noqa: BLE001 - a manifest is worth less than the row
        manifest_ = {"error": f"the manifest could not be read: {type(e).__name__}: {e}"}
    try:
        store.add(result, scenario, manifest_)
        return None
    except (sqlite3.Error, OSError, OverflowError, ValueError) as e:
        error = f"{type(e).__name__}: {e}"
    record = json.dumps({"result": result.model_dump(mode="json"), "scenario": scenario.model_dump(mode="json"),
                         "manifest": manifest_, "error": error})
    folder = unstored_dir(store.path)
    path = folder / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{time.monotonic_ns()}.json"
    tmp = path.with_suffix(".tmp")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp.write_text(record)
        tmp.replace(path)  # whole or not at all: the next command never reads half a row
    except OSError as e:
        with contextlib.suppress(OSError):  # no folder at all, or a file where it belongs
            tmp.unlink(missing_ok=True)
        raise Unstored(record, f"the results file {store.path} could not take the run ({error}), "
                               f"nor could {folder} ({e})") from None
    return path


_CLAIM = re.compile(r"^(?P<name>.+\.json)\.(?P<pid>\d+)(@(?P<host>.+))?$")


def _claim_is_stale(path: Path) -> bool:
    """Whether `path` (`<row>.json.<pid>[@<host>]`) is the claim of a command of this machine that
    is gone (`kill -9`, a power cut): then the next command takes the row over."""
    m = _CLAIM.match(path.name)
    if m is None or (m["host"] is not None and m["host"] != socket.gethostname()):
        return False
    pid = int(m["pid"])
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive, another user's
        return False
    return False


def recover(store: "ResultStore") -> list[str]:
    """Store the rows kept aside for `store` by earlier commands; one line for each. A row is
    claimed while it is stored (renamed `<row>.json.<pid>@<host>`) and given back on every exit
    that leaves it unstored; a claim whose command is gone is taken over."""
    folder = unstored_dir(store.path)
    lines = []
    found = sorted(folder.iterdir()) if folder.is_dir() else []
    for path in found:
        if path.name.endswith(".json"):
            claimed = path
        elif _claim_is_stale(path):
            claimed, path = path, path.with_name(_CLAIM.match(path.name)["name"])
        else:
            continue
        taken = path.with_name(f"{path.name}.{os.getpid()}@{socket.gethostname()}")  # of two commands, one stores it
        try:
            claimed.rename(taken)
        except OSError:
            continue
        stored = False
        try:
            record = json.loads(taken.read_text())
            result = RunResult.model_validate(record["result"])
            store.add(result, Scenario.model_validate(record["scenario"]), record["manifest"])
            stored = True
        except Exception as e:  # noqa: BLE001 - kept for the next try, said now
            taken.rename(path)
            lines.append(f"a run kept in {path} could not be stored yet: {type(e).__name__}: {e}")
            continue
        except BaseException:  # Ctrl-C, a signal turned into an exception: the row is the next command's
            with contextlib.suppress(OSError):
                if stored:
                    taken.unlink()
                else:
                    taken.rename(path)
            raise
        taken.unlink()
        lines.append(f"recovered the {result.status} run of {result.backend} on {result.scenario} kept in {path} "
                     f"({record['error']}): stored as result {result.result_id}")
    return lines
