"""The store's runs as CSV or JSON, each with the aggregates of its compare's trials."""

from __future__ import annotations

import csv
import io
import json
import math

from framework_bench.measure import statistics
from framework_bench.store.results import ResultStore
from framework_bench.store.schema import COLUMN_DEFAULTS, JSON_COLUMNS

# What `export` adds to each run: over the counted trials of its compare (a run stored before
# trials existed is a compare of one), of its backend and scenario.
AGGREGATES = ("trials", "tgs_median", "tgs_ci_low", "tgs_ci_high", "tgs_cv",
              "pct_of_reference", "pct_ci_low", "pct_ci_high")


def standard_json(value):
    """`value` with every NaN or infinity as the strings "NaN", "Infinity", "-Infinity": JSON has no such numbers."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: standard_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [standard_json(v) for v in value]
    return value


def export(store: ResultStore, format: str, scenario_glob: str | None = None, backend: str | None = None,
           reference: str | None = None) -> str:
    """`csv`: one line per run (JSON fields as JSON text); `json`: a list of runs with their steps.
    Each run also carries the aggregates of its compare's trials of its backend and scenario
    (`AGGREGATES`; against the `reference` backend's trials of the same compare)."""
    rows = store.list(scenario_glob, backend)
    if format not in ("csv", "json"):
        raise ValueError(f"unknown export format {format!r}: use csv or json")
    aggregates = _aggregates(store.list(), reference)  # all rows: the reference's too, whatever the filter
    if format == "json":
        return json.dumps(standard_json([store.get(r["id"]) | aggregates[r["id"]] for r in rows]), indent=2,
                          allow_nan=False)
    buf = io.StringIO()
    stored = [d[1] for d in store.conn.execute("PRAGMA table_info(runs)")]  # an older schema's, with the newer
    columns = stored + [c for c in COLUMN_DEFAULTS if c not in stored] + list(AGGREGATES)
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for r in rows:
        r |= aggregates[r["id"]]
        writer.writerow({k: json.dumps(r[k]) if k in JSON_COLUMNS else r[k] for k in columns})
    return buf.getvalue()


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
