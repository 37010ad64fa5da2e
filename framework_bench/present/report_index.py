"""The folder of reports: each report a page of its own, `report-<compare id>.md/.html`, never
written over by the next, its charts and summary in a folder of the same name; `index.md/.html`
lists them all, newest first, and `report.md/.html` is a copy of the newest."""

from __future__ import annotations

import json
import os
import re
import time
from collections import Counter
from pathlib import Path

from framework_bench.present.page import Block, Link, to_html, to_markdown
from framework_bench.present.report_settings import modes

NEWEST = "report"  # the stem of the copy of the newest report: the name earlier fbench versions wrote
SUMMARY = "summary.json"  # in a report's own folder: what the index says of it


def compares(rows: list[dict]) -> list[str]:
    """The compares the rows are trials of, newest first."""
    return list(dict.fromkeys(r["compare_id"] for r in sorted(rows, key=lambda r: -(r.get("id") or 0))
                              if r.get("compare_id")))


def report_stem(rows: list[dict]) -> str:
    """`report-<id>`: the newest compare the rows are trials of (the one that wrote the report), or
    the time for rows of no compare. An id is fbench's own (`design.new_compare_id`), but the
    store is a file anyone can edit: any other character becomes `_`, and it stays a file name."""
    ids = compares(rows)
    name = ids[0] if ids else time.strftime("%Y%m%d-%H%M%S")
    return f"{NEWEST}-{re.sub(r'[^A-Za-z0-9_.-]', '_', name)[:100]}"


def own_folder(out_dir: Path, stem: str) -> Path:
    """A folder no other report has, made now (so two reports written at once never share one):
    `stem`, else `stem-2`, `stem-3`... (a compare reported again, e.g. by `fbench report`)."""
    n = 1
    while True:
        folder = out_dir / (stem if n == 1 else f"{stem}-{n}")
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            n += 1


def report_summary(rows: list[dict]) -> dict:
    """What the index says of a report (its name is its folder's)."""
    statuses = Counter(r["status"] for r in rows)
    return {"written": time.time(), "compares": compares(rows),
            "scenarios": sorted({r["scenario"] for r in rows}), "backends": sorted({r["backend"] for r in rows}),
            "runs": len(rows), "statuses": dict(sorted(statuses.items())), "settings": modes(rows)}


def _summaries(out_dir: Path) -> list[dict]:
    """Every report's summary in `out_dir`, newest first. One unreadable (its folder half-deleted)
    is left out of the index, not a reason to fail the report being written."""
    found = []
    for path in out_dir.glob(f"{NEWEST}-*/{SUMMARY}"):
        try:
            found.append(json.loads(path.read_text()) | {"report": path.parent.name})
        except (OSError, ValueError):
            continue
    return sorted(found, key=lambda s: (s["written"], s["report"]), reverse=True)


def index_blocks(summaries: list[dict]) -> list[Block]:
    """The index of the reports in a folder, newest first."""
    def runs(s: dict) -> str:
        return f"{s['runs']}: " + ", ".join(f"{n} {status}" for status, n in s["statuses"].items())
    rows = [[time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(s["written"])), Link(s["report"]),
             ", ".join(s["compares"]) or "-", ", ".join(s["scenarios"]), ", ".join(s["backends"]), runs(s),
             s["settings"]] for s in summaries]
    newest = (f" {NEWEST}.md and {NEWEST}.html are copies of the newest, {summaries[0]['report']}."
              if summaries else "")
    return [Block("h1", "fbench reports"),
            Block("p", f"{len(summaries)} report(s) in this folder, newest first: one per compare (or run of fbench "
                       f"report), none written over by the next.{newest}"),
            Block("table", header=["written", "report", "compare", "scenarios", "backends", "runs", "settings"],
                  rows=rows)]


def write_whole(path: Path, text: str) -> None:
    """Whole or not at all: a reader (a browser refreshing the index) never sees half a page."""
    part = path.with_name(f".{path.name}.part")
    part.write_text(text)
    os.replace(part, path)


def write_index(out_dir: Path) -> None:
    """`index.md` and `index.html` in `out_dir`: every report there, each linked in its own format."""
    items = index_blocks(_summaries(out_dir))
    write_whole(out_dir / "index.md", to_markdown(items, out_dir))
    write_whole(out_dir / "index.html", to_html(items, "fbench reports"))

