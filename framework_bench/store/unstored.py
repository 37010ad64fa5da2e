"""Rows never lost: a store that cannot take a row now (locked past the patience, a full disk,
a value it cannot hold) gets it later, from a file kept next to it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import sqlite3
import time
from pathlib import Path

from framework_bench.measure import processes
from framework_bench.measure.metrics import RunResult
from framework_bench.scenario.scenario import Scenario
from framework_bench.store.provenance import manifest
from framework_bench.store.results import ResultStore


def unstored_dir(db: Path) -> Path:
    """Where rows the store `db` could not take wait for the next command."""
    return db.with_name(db.name + ".unstored")


class Unstored(Exception):
    """Neither the store nor the folder next to it could take a run: `record` is its row as JSON."""

    def __init__(self, record: str, why: str):
        super().__init__(why)
        self.record = record


def save(store: ResultStore, result: RunResult, scenario: Scenario, manifest_: dict | None = None) -> Path | None:
    """Store the run with `manifest_` (default: this machine's for its backend); when the store
    cannot take it, keep it in `unstored_dir` for the next command and return that file. Raises
    `Unstored` when that fails too. The run's claim on its folder is the run layer's to release
    (`framework_bench/run/orphans.py` `save`)."""
    try:
        manifest_ = manifest(result.backend) if manifest_ is None else manifest_
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
    return m is not None and processes.abandoned(int(m["pid"]), m["host"])


def recover(store: ResultStore) -> list[str]:
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
