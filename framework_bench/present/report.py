"""The report: one Markdown page and one self-contained HTML page from results-store rows.

Both pages are rendered from the same list of blocks (heading, paragraph, table, list,
image, preformatted text), so they always say the same thing. The HTML embeds its images
as base64 data URIs and its CSS inline: it can be mailed or attached as one file.

Each report is a page of its own, `report-<compare id>.md/.html`, never written over by the next
(`write_report`); `index.md/.html` lists them all, newest first, and `report.md/.html` is a copy of
the newest.
"""

from __future__ import annotations

import base64
import html
import json
import os
import re
import shutil
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from framework_bench.measure import flops
from framework_bench.present.differences import NOT_ALIGNED, speed_relevant
from framework_bench.run.reference import reference_backend
from framework_bench.plugins import registry
from framework_bench.present.chart_style import ctx_label, hardware
from framework_bench.present.verdict import Points, share_cell
from framework_bench.scenario.scenario import Scenario

REASON_LINES = 6  # of a failed run's error tail, enough to see the cause without the whole log
SPEED_MARK, OTHER_MARK = "⚠ ", "≠ "  # settings rows that differ between backends (speed-relevant / not)
LONG_CELL = 32  # characters from which a table cell is free text, wrapped anywhere so its column stays narrow
NEWEST = "report"  # the stem of the copy of the newest report: the name earlier fbench versions wrote
SUMMARY = "summary.json"  # in a report's own folder: what the index says of it


@dataclass
class Block:
    kind: str  # h1 | h2 | p | table | list | image | pre
    text: str = ""
    header: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)
    items: list[str] = field(default_factory=list)
    path: Path | None = None


class Link(str):
    """A table cell naming a page by its stem: the Markdown index links its `.md`, the HTML one its `.html`."""


def _num(x: float | None, spec: str = ",.1f") -> str:
    return "-" if x is None else format(x, spec)


def _mem(n: int | None) -> str:
    if n is None:
        return "-"
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def _tgs(r: dict) -> str:
    if r["tgs"] is None:
        return "-"
    return f"{r['tgs']:,.1f} ({r['tgs_min']:,.1f}–{r['tgs_max']:,.1f})" if r["tgs_min"] is not None else _num(r["tgs"])


def _tflops(r: dict) -> str:
    """`XTuner-formula / model-FLOPs` TFLOPs per GPU."""
    return " / ".join(_num(r[k], ".3g") for k in ("tflops", "model_tflops")) if r["tflops"] is not None else "-"


def _reference(spec: dict) -> str:
    ref = spec.get("reference")
    return f"{ref['tgs']:,.1f} TGS, {ref['tflops']:.1f} TFLOPs ({ref['hardware']})" if ref else "-"


def scenario_table(points: Points) -> list[Block]:
    """One row per backend x scenario: its figures at the median over its trials; its flags and
    notes numbered in the last column and listed under the table, where their length cannot widen
    it past the page."""
    header = ["scenario", "model", "context", "GPUs", "SP", "backend", "status", "trials", "TGS median (min–max)",
              "TGS 95% CI", f"% of {reference_backend() or 'reference'}", "TFLOPs/GPU XTuner / model", "MFU",
              "peak memory", "published", "notes"]
    body, notes = [], []
    for r in points.rows:
        summary = points.summaries[r["scenario"], r["backend"]]
        spec = r["scenario_json"]
        version = f" {r['framework_version']}" if r["framework_version"] else ""
        said = r["flags"] + r.get("notes", [])
        if said:
            notes.append(f"[{len(notes) + 1}] {r['scenario']} · {r['backend']}: " + "; ".join(said))
        body.append([
            r["scenario"], r["model"], ctx_label(r["context_length"]),
            f"{r['gpus']}" + (" (CPU)" if r["device"] == "cpu" else ""), str(r["sequence_parallel"]),
            r["backend"] + version, r["status"], str(summary.trials), _tgs(r),
            "-" if summary.low is None else f"{summary.low:,.1f}–{summary.high:,.1f}",
            share_cell(points.shares.get((r["scenario"], r["backend"]))),
            _tflops(r),
            "-" if r["mfu"] is None else f"{r['mfu']:.1%}", _mem(r["peak_mem_bytes"]), _reference(spec),
            f"[{len(notes)}]" if said else "-",
        ])
    return [Block("table", header=header, rows=body)] + ([Block("list", items=notes)] if notes else [])


def failures(rows: list[dict]) -> list[Block]:
    out = []
    for r in rows:
        if r["status"] != "ok" and r["reason"]:
            tail = "\n".join(r["reason"].strip().splitlines()[-REASON_LINES:])
            out += [Block("p", f"{r['backend']} on {r['scenario']} (run {r['id']}): {r['status']}"), Block("pre", tail)]
    return out


def environment(rows: list[dict]) -> list[Block]:
    """Each distinct host once, then each backend's env versions once."""
    hosts, envs_seen, blocks = [], {}, []
    for r in rows:
        m = dict(r["manifest"])
        env = m.pop("backend_env", None)
        if m not in hosts:
            hosts.append(m)
        if env is not None:
            envs_seen.setdefault(r["backend"], env)
    for m in hosts:
        blocks.append(Block("table", header=["host", m.get("hostname") or "-"],
                            rows=[[k, "-" if v is None else str(v)] for k, v in m.items() if k != "hostname"]))
    if envs_seen:
        blocks.append(Block("table", header=["backend", "env flavour", "versions"], rows=[
            [b, e.get("flavour") or "-", ", ".join(f"{k} {v}" for k, v in e.get("versions", {}).items()) or "-"]
            for b, e in sorted(envs_seen.items())]))
    return blocks


def caveats(rows: list[dict], points: Points) -> list[str]:
    out = ["Models are built from their config with random weights (nothing is downloaded), the same for every "
           "backend: each parameter is drawn from (seed, name, element index) and the host checks a sample. The "
           "loss charts show each backend's loss per step as the token mean over the step (whatever the framework "
           "divides by, named by the loss_normalization setting): backends that trained the same steps overlap."]
    specs = {r["scenario"]: Scenario.model_validate(r["scenario_json"]) for r in rows}
    cpu = sorted({r["scenario"] for r in rows if r["device"] == "cpu"})
    if cpu:
        out.append(f"CPU runs ({', '.join(cpu)}) on {hardware([r for r in rows if r['device'] == 'cpu'])}: "
                   "their TGS measures the harness and the frameworks' code paths on a CPU, not GPU speed, and "
                   "is not comparable with the published A100 figures; MFU needs a known GPU peak and is left out.")
    repeats: dict[int, list[str]] = {}
    for name, s in sorted(specs.items()):
        repeats.setdefault(s.dataset.repeat, []).append(name)
    out.append("Dataset repeat factor (copies of Alpaca en+zh before packing; raised automatically when the "
               "steps need more tokens; the published runs used 6): "
               + "; ".join(f"{k}x for {', '.join(v)}" for k, v in sorted(repeats.items())) + ".")
    flagged = [f"{r['backend']} on {r['scenario']}: {'; '.join(r['flags'])}" for r in rows if r["flags"]]
    if flagged:
        out.append("Flagged rows (too few measured steps or a wide step spread; the figure is shown, but "
                   "treat it with care): " + " | ".join(flagged) + ".")
    ratios: dict[str, list[float]] = {}
    for s in specs.values():
        a = s.arch
        if a.num_key_value_heads < a.num_attention_heads:
            ratios.setdefault(f"{s.model.preset or 'inline'} ({a.num_attention_heads} query / "
                              f"{a.num_key_value_heads} KV heads)", []).append(
                flops.mha_flops_per_token(a, s.context_length, s.activation_checkpointing)
                / flops.model_flops_per_token(a, s.context_length, s.activation_checkpointing))
    gqa = [f"{model}: x{min(r):.2f}" + (f"–{max(r):.2f}" if max(r) - min(r) >= 0.005 else "")
           for model, r in sorted(ratios.items())]
    if gqa:
        out.append("TFLOPs/GPU uses XTuner's published formula, which counts K and V projections at the full "
                   "head count and so over-counts grouped-query-attention models; the model-FLOPs column and MFU "
                   "count them at their real size. Formula / model FLOPs over the contexts run: " + ", ".join(gqa) + ".")
    if max((s.trials for s in points.summaries.values()), default=0) > 1:
        out.append("A backend's TGS is the median over its trials (each a full run; warm-up rounds and runs "
                   "not ok are left out, a failed flag is not), with its 95% interval; the % of the reference and the "
                   "verdicts carry the 95% interval of the ratio of medians, both by a seeded bootstrap over "
                   "trials (framework_bench/measure/statistics.py). One trial gives no interval.")
    if points.shares:
        reference = reference_backend()
        out.append(f"\"% of {reference}\" is a backend's TGS as a share of the {reference} "
                   "backend's on the same scenario: a plain PyTorch loop over the same packed rows (the HF model class "
                   "built from the same config, AdamW with the same hyper-parameters, the same precision and "
                   "activation checkpointing). 100 % minus it is what the framework costs over that loop (negative: "
                   "what it gains, e.g. by fused kernels).")
    not_ok = [r for r in rows if r["status"] != "ok"]
    if not_ok:
        out.append(f"{len(not_ok)} of {len(rows)} runs did not produce a figure; they stay in the table and the "
                   "charts (an x at the foot of the axis) with their status, and their error tails are listed below.")
    return out


def verification(rows: list[dict]) -> Block | None:
    """The host's checks of each run's claims (framework_bench/measure/verify.py): how many passed,
    each one that did not with its status (a column per check ran off the page), and the throughput
    agreement spelled out: the framework's own figure against the host's."""
    checked = [r for r in rows if r.get("checks")]
    if not checked:
        return None
    body = []
    for r in checked:
        passed = [c for c in r["checks"] if c["status"] == "pass"]
        others = "; ".join(f"{c['name']} {c['status']}" for c in r["checks"] if c["status"] != "pass") or "-"
        throughput = next((c.get("detail") or "-" for c in r["checks"] if c["name"] == "throughput"), "-")
        body.append([r["scenario"], r["backend"], r["status"], f"{len(passed)} of {len(r['checks'])}", others,
                     throughput])
    return Block("table", header=["scenario", "backend", "status", "checks passed", "not passed",
                                  "framework vs host throughput"], rows=body)


def _settings_table(runs: list[dict], keys: set[str]) -> Block:
    """These settings side by side, a column per run; rows that differ between the runs are
    marked, speed-relevant ones first (highlighted in the HTML)."""
    speed = speed_relevant()
    table = []
    for key in sorted(keys):
        values = [r["settings"].get(key) for r in runs]
        # a key one backend does not record is unknown there ("-"), not a difference
        differs = all(key in r["settings"] for r in runs) and len({repr(v) for v in values}) > 1
        mark = (SPEED_MARK if key in speed else OTHER_MARK) if differs else ""
        table.append((0 if mark == SPEED_MARK else 1 if mark else 2, mark + key,
                      ["-" if v is None else str(v) for v in values]))
    table.sort(key=lambda t: t[0])
    return Block("table", header=["setting", *(r["backend"] for r in runs)], rows=[[k, *v] for _, k, v in table])


def _keys(runs: list[dict]) -> set[str]:
    return {k for r in runs for k in r["settings"]} - {"settings_mode"}


def _shared(by_scenario: dict[str, list[dict]]) -> tuple[set[str], list[dict]]:
    """The settings every scenario ran with alike: recorded in each scenario, and each backend
    with one value for it (or none) wherever it ran; with one run per backend standing for all of
    its scenarios in their table (a backend's first, by scenario name)."""
    def alike(key: str) -> bool:
        seen: dict[str, str | None] = {}
        for runs in by_scenario.values():
            for r in runs:
                value = repr(r["settings"][key]) if key in r["settings"] else None  # None: not recorded
                if seen.setdefault(r["backend"], value) != value:
                    return False
        return True
    common = set.intersection(*(_keys(runs) for runs in by_scenario.values()))
    columns: dict[str, dict] = {}
    for _, runs in sorted(by_scenario.items()):
        for r in runs:
            columns.setdefault(r["backend"], r)
    return {k for k in common if alike(k)}, list(columns.values())


def settings_sections(rows: list[dict]) -> list[Block]:
    """The settings each backend really ran with (one trial of each: `Points.rows`), side by side.
    One scenario: its table. Several: the settings they all share once, then per scenario only
    the ones that differ from scenario to scenario (five near-identical tables said nothing more)."""
    by_scenario: dict[str, list[dict]] = {}
    for r in rows:
        if r.get("settings"):
            by_scenario.setdefault(r["scenario"], []).append(r)
    legend = (f"{SPEED_MARK.strip()} differs between backends and can move TGS, {OTHER_MARK.strip()} differs "
              "without a known effect on speed.")
    shared, columns = _shared(by_scenario) if len(by_scenario) > 1 else (set(), [])
    out = []
    if shared:
        out += [Block("p", f"Alike in every scenario ({', '.join(sorted(by_scenario))}; {_modes(rows)} settings): "
                           f"{legend}"), _settings_table(columns, shared)]
    for name, runs in sorted(by_scenario.items()):
        rest = _keys(runs) - shared
        if not rest:
            out.append(Block("p", f"{name} ({_modes(runs)} settings): every setting as in the table above."))
            continue
        what = "the settings not alike in every scenario, marked as above." if shared else legend
        out += [Block("p", f"{name} ({_modes(runs)} settings): {what}"), _settings_table(runs, rest)]
    return out


def _modes(rows: list[dict]) -> str:
    return "/".join(sorted({r.get("settings_mode") or "matched" for r in rows})) or "matched"


def not_aligned(rows: list[dict]) -> list[str]:
    """What matched settings leave to the frameworks: the common notes, then each installed
    backend's own (`BackendInfo.report_notes`) for the backends in `rows`."""
    installed = registry.backends()
    notes = list(NOT_ALIGNED)
    for name in sorted({r["backend"] for r in rows} & set(installed)):
        notes += installed[name].info.report_notes
    return list(dict.fromkeys(notes))  # a note two backends share (their engine's) once


def _compares(rows: list[dict]) -> list[str]:
    """The compares the rows are trials of, newest first."""
    return list(dict.fromkeys(r["compare_id"] for r in sorted(rows, key=lambda r: -(r.get("id") or 0))
                              if r.get("compare_id")))


def blocks(rows: list[dict], charts: list[Path]) -> list[Block]:
    modes = _modes(rows)
    points = Points(rows, reference_backend())
    out = [Block("h1", "fbench report")]
    answers = points.answers()
    if answers:  # the compare's answer, as the terminal ends with it
        out += [Block("h2", "Answer"), Block("list", items=answers)]
    if points.with_intervals:
        out += [Block("h2", "Verdicts"), Block("list", items=points.with_intervals)]
    compares = _compares(rows)
    of = f" of compare{'s' * (len(compares) > 1)} {', '.join(compares)}" if compares else ""
    out += [Block("p", f"{len(rows)} runs{of}, written {time.strftime('%Y-%m-%d %H:%M %Z')}, {modes} settings. TGS "
                       "is tokens per second per GPU, the median of the measured steps (warm-up excluded), with the "
                       "min–max over steps.")]
    out += [Block("h2", "Results"), *scenario_table(points)]
    checks = verification(rows)
    if checks:
        out += [Block("h2", "Host verification"),
                Block("p", "What the host checked of each worker's claims: tokens per step, every step present, the "
                           "rows consumed against the packed stream, the parameter count, the settings recorded "
                           "(a failure makes the run invalid), and the framework's own throughput against the "
                           "host's (flagged beyond 10 %)."), checks]
    settings = settings_sections(points.rows)
    if settings:
        out += [Block("h2", "Settings in effect"), *settings]
        if "matched" in modes:
            out += [Block("p", "Not aligned by matched settings (inside the frameworks' own code):"),
                    Block("list", items=not_aligned(rows))]
    pngs = [c for c in charts if c.suffix == ".png"]
    if pngs:
        out.append(Block("h2", "Charts"))
        out += [Block("image", text=c.stem, path=c) for c in pngs]
    out += [Block("h2", "Caveats"), Block("list", items=caveats(rows, points))]
    fails = failures(rows)
    if fails:
        out += [Block("h2", "Runs without a figure"), *fails]
    out += [Block("h2", "Environment"), *environment(rows)]
    return out


def _md_cell(text: str) -> str:
    if isinstance(text, Link):
        return f"[{text}]({text}.md)"
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(items: list[Block], base: Path) -> str:
    lines: list[str] = []
    for b in items:
        if b.kind == "h1":
            lines += [f"# {b.text}", ""]
        elif b.kind == "h2":
            lines += [f"## {b.text}", ""]
        elif b.kind == "p":
            lines += [b.text, ""]
        elif b.kind == "table":
            lines.append("| " + " | ".join(map(_md_cell, b.header)) + " |")
            lines.append("|" + "---|" * len(b.header))
            lines += ["| " + " | ".join(map(_md_cell, row)) + " |" for row in b.rows]
            lines.append("")
        elif b.kind == "list":
            lines += [f"- {item}" for item in b.items] + [""]
        elif b.kind == "image":
            lines += [f"![{b.text}]({Path(os.path.relpath(b.path, base)).as_posix()})", ""]
        elif b.kind == "pre":
            lines += ["```", b.text, "```", ""]
    return "\n".join(lines)


# The page fits 1280 px: the body is at most that wide, and no table is wider than the body.
# Free-text cells (LONG_CELL) wrap anywhere, so their columns give way; a table still wider
# (many columns of whole words) scrolls inside its own box instead of widening the page.
_CSS = """*{box-sizing:border-box}
body{font-family:system-ui,sans-serif;margin:0 auto;padding:1.5em 2em;color:#222;max-width:1280px;
overflow-wrap:break-word}
div.table{max-width:100%;overflow-x:auto;margin:1em 0}
table{border-collapse:collapse;font-size:0.85em}
th,td{border:1px solid #ccc;padding:0.3em 0.5em;text-align:left;vertical-align:top}
td.long{overflow-wrap:anywhere;min-width:10em}
th{background:#f3f3f3}img{max-width:100%;height:auto;border:1px solid #ddd;margin:0.5em 0}
figure{margin:1em 0}
pre{background:#f6f6f6;padding:0.6em;overflow-x:auto;white-space:pre-wrap;overflow-wrap:anywhere;font-size:0.85em}
tr.speed td{background:#fff3cd;font-weight:600}"""


def _th(name: str) -> str:
    """A column name that may break after `_` or `/`: the host checks' names (`initial_weights`,
    `projection_delay`) set the width of twenty columns."""
    return "<th>" + re.sub(r"([_/])", r"\1<wbr>", html.escape(name)) + "</th>"


def _td(cell: str) -> str:
    if isinstance(cell, Link):
        return f'<td><a href="{html.escape(cell)}.html">{html.escape(cell)}</a></td>'
    return f'<td class="long">{html.escape(cell)}</td>' if len(cell) >= LONG_CELL else f"<td>{html.escape(cell)}</td>"


def to_html(items: list[Block], title: str = "fbench report") -> str:
    e = html.escape
    parts = ["<!DOCTYPE html>", f'<html lang="en"><head><meta charset="utf-8"><title>{e(title)}</title>',
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             f"<style>{_CSS}</style></head><body>"]
    for b in items:
        if b.kind in ("h1", "h2", "p"):
            parts.append(f"<{b.kind}>{e(b.text)}</{b.kind}>")
        elif b.kind == "table":
            parts.append('<div class="table"><table><thead><tr>' + "".join(map(_th, b.header)) + "</tr></thead><tbody>")
            parts += [("<tr class=\"speed\">" if row and row[0].startswith(SPEED_MARK) else "<tr>")
                      + "".join(map(_td, row)) + "</tr>" for row in b.rows]
            parts.append("</tbody></table></div>")
        elif b.kind == "list":
            parts.append("<ul>" + "".join(f"<li>{e(i)}</li>" for i in b.items) + "</ul>")
        elif b.kind == "image":
            data = base64.b64encode(b.path.read_bytes()).decode()
            parts.append(f'<figure><img alt="{e(b.text)}" src="data:image/png;base64,{data}">'
                         f"<figcaption>{e(b.text)}</figcaption></figure>")
        elif b.kind == "pre":
            parts.append(f"<pre>{e(b.text)}</pre>")
    parts.append("</body></html>")
    return "\n".join(parts)


def report_stem(rows: list[dict]) -> str:
    """`report-<id>`: the newest compare the rows are trials of (the one that wrote the report), or
    the time for rows of no compare. An id is fbench's own (`design.new_compare_id`), but the
    store is a file anyone can edit: any other character becomes `_`, and it stays a file name."""
    compares = _compares(rows)
    name = compares[0] if compares else time.strftime("%Y%m%d-%H%M%S")
    return f"{NEWEST}-{re.sub(r'[^A-Za-z0-9_.-]', '_', name)[:100]}"


def _own_folder(out_dir: Path, stem: str) -> Path:
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


def _summary(rows: list[dict]) -> dict:
    """What the index says of a report (its name is its folder's)."""
    statuses = Counter(r["status"] for r in rows)
    return {"written": time.time(), "compares": _compares(rows),
            "scenarios": sorted({r["scenario"] for r in rows}), "backends": sorted({r["backend"] for r in rows}),
            "runs": len(rows), "statuses": dict(sorted(statuses.items())), "settings": _modes(rows)}


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


def _write(path: Path, text: str) -> None:
    """Whole or not at all: a reader (a browser refreshing the index) never sees half a page."""
    part = path.with_name(f".{path.name}.part")
    part.write_text(text)
    os.replace(part, path)


def write_index(out_dir: Path) -> None:
    """`index.md` and `index.html` in `out_dir`: every report there, each linked in its own format."""
    items = index_blocks(_summaries(out_dir))
    _write(out_dir / "index.md", to_markdown(items, out_dir))
    _write(out_dir / "index.html", to_html(items, "fbench reports"))


def write_report(rows: list[dict], out_dir: Path, charts: list[Path]) -> tuple[Path, Path]:
    """`report-<compare id>.md` (its charts copied into the folder `report-<compare id>/` and linked
    from there: the next compare draws over the ones in `out_dir`) and `.html` (self-contained) in
    `out_dir`; `report.md/.html`, a copy of it as the newest; the index rebuilt."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    folder = _own_folder(out_dir, report_stem(rows))
    own = []
    for chart in (Path(c) for c in charts if Path(c).suffix == ".png"):
        shutil.copyfile(chart, folder / chart.name)
        own.append(folder / chart.name)
    items = blocks(rows, own)
    pages = {".md": to_markdown(items, out_dir), ".html": to_html(items, f"fbench {folder.name}")}
    for suffix, text in pages.items():
        (out_dir / f"{folder.name}{suffix}").write_text(text)
        _write(out_dir / f"{NEWEST}{suffix}", text)
    _write(folder / SUMMARY, json.dumps(_summary(rows), indent=2))
    write_index(out_dir)
    return out_dir / f"{folder.name}.md", out_dir / f"{folder.name}.html"
