"""The results store's schema: its tables, the migrations from each older version, and how a
stored row reads back (JSON columns decoded, a damaged row told apart).
"""

from __future__ import annotations

import json
import math
import sqlite3

SCHEMA_VERSION = 7
# SQLite's header field for "which application owns this file" ("fbnc"): fbench writes only
# into a new file or one that carries it (or, from before it was set, holds fbench's tables).
APPLICATION_ID = 0x66626E63

# Migrations by the version they lead to: migration i takes a database at version i to i + 1.
MIGRATIONS = [
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
    # 2: the settings in effect (read by the worker), the settings mode, the host's checks.
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
    # loss per optimizer step, {step: loss} as JSON.
    """
    ALTER TABLE runs ADD COLUMN seed INTEGER;
    ALTER TABLE runs ADD COLUMN loss_curve TEXT NOT NULL DEFAULT '{}';
    """,
    # 7: repeated trials: the compare a run is a trial of, its round and its place in the round;
    # rows from before have none and read as a compare of one trial.
    """
    ALTER TABLE runs ADD COLUMN compare_id TEXT;
    ALTER TABLE runs ADD COLUMN trial_round INTEGER;
    ALTER TABLE runs ADD COLUMN trial_position INTEGER;
    CREATE INDEX runs_compare ON runs (compare_id);
    """,
]

# Columns holding JSON text, decoded when rows are read back, with the kind each must decode to.
JSON_COLUMNS = ("scenario_json", "flags", "framework_throughput", "manifest", "settings", "checks", "notes",
                "loss_curve")
_JSON_KINDS = {"scenario_json": dict, "flags": list, "framework_throughput": dict, "manifest": dict, "settings": dict,
               "checks": list, "notes": list, "loss_curve": dict}
# Columns holding numbers: a row with text there is damaged (SQLite keeps whatever it is given).
_NUMBER_COLUMNS = ("id", "context_length", "gpus", "sequence_parallel", "tgs", "tgs_min", "tgs_max", "tflops",
                   "model_tflops", "mfu", "steps_measured", "step_seconds", "peak_mem_bytes", "final_loss",
                   "wall_seconds", "tokens_measured", "peak_reserved_bytes", "startup_seconds", "seed",
                   "trial_round", "trial_position")
# What a row of an older schema (read without migrating it) has in the columns added since.
COLUMN_DEFAULTS = {"settings": "{}", "settings_mode": "matched", "checks": "[]", "step_unit": "optimizer",
                   "tokens_measured": None, "notes": "[]", "peak_reserved_bytes": None, "startup_seconds": None,
                   "seed": None, "loss_curve": "{}", "compare_id": None, "trial_round": None,
                   "trial_position": None}
# The columns of the first schema's `runs` that another application's table of that name would hardly have.
OWN_COLUMNS = {"backend", "scenario_json", "framework_throughput", "manifest", "steps_measured"}

STEP_COLUMNS = ("step", "rank", "seconds", "tokens", "loss", "peak_mem_bytes", "peak_reserved_bytes")


def nan_as_text(x: float | None) -> float | str | None:
    """SQLite stores a NaN as NULL, the same as "no loss reported": a diverged run's NaN is kept as text."""
    return "NaN" if isinstance(x, float) and math.isnan(x) else x


def text_as_nan(x):
    return float("nan") if x == "NaN" else x


class Damaged(ValueError):
    """A stored row that cannot be read back: a column holding what no fbench wrote there."""


def decode(row: sqlite3.Row) -> dict:
    out = dict(row)
    for key, default in COLUMN_DEFAULTS.items():  # a row of an older schema gets the columns added since
        out.setdefault(key, default)
    out["final_loss"] = text_as_nan(out["final_loss"])
    for key in _NUMBER_COLUMNS:
        value = out.get(key)
        if not (value is None or isinstance(value, (int, float))):
            raise Damaged(f"column {key} holds {str(value)[:40]!r}, not a number")
    for key in JSON_COLUMNS:
        try:
            out[key] = json.loads(out[key])
        except (TypeError, ValueError) as e:
            raise Damaged(f"column {key} is not JSON ({e})") from None
        if not isinstance(out[key], _JSON_KINDS[key]):
            raise Damaged(f"column {key} holds {type(out[key]).__name__}, not {_JSON_KINDS[key].__name__}")
    return out
