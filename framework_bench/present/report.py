"""The report: one Markdown page and one self-contained HTML page (`page.py`) from results-store
rows, written into the folder of reports (`report_index.py`): the answer, the results table, the
host's verification, the settings in effect (`report_settings.py`), the charts, the caveats, the
runs without a figure and the environment."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from framework_bench.measure import flops
from framework_bench.present.chart_style import ctx_label, hardware
from framework_bench.present.page import Block, to_html, to_markdown
from framework_bench.present.report_index import (NEWEST, SUMMARY, compares, own_folder, report_stem, report_summary,
                                                  write_index, write_whole)
from framework_bench.present.report_settings import modes, not_aligned, settings_sections
from framework_bench.present.verdict import Points, share_cell
from framework_bench.run.reference import reference_backend
from framework_bench.scenario.scenario import Scenario

REASON_LINES = 6  # of a failed run's error tail, enough to see the cause without the whole log


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

def blocks(rows: list[dict], charts: list[Path]) -> list[Block]:
    settings_modes = modes(rows)
    points = Points(rows, reference_backend())
    out = [Block("h1", "fbench report")]
    answers = points.answers()
    if answers:  # the compare's answer, as the terminal ends with it
        out += [Block("h2", "Answer"), Block("list", items=answers)]
    if points.with_intervals:
        out += [Block("h2", "Verdicts"), Block("list", items=points.with_intervals)]
    ids = compares(rows)
    of = f" of compare{'s' * (len(ids) > 1)} {', '.join(ids)}" if ids else ""
    out += [Block("p", f"{len(rows)} runs{of}, written {time.strftime('%Y-%m-%d %H:%M %Z')}, {settings_modes} settings. TGS "
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
        if "matched" in settings_modes:
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


def write_report(rows: list[dict], out_dir: Path, charts: list[Path]) -> tuple[Path, Path]:
    """`report-<compare id>.md` (its charts copied into the folder `report-<compare id>/` and linked
    from there: the next compare draws over the ones in `out_dir`) and `.html` (self-contained) in
    `out_dir`; `report.md/.html`, a copy of it as the newest; the index rebuilt."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    folder = own_folder(out_dir, report_stem(rows))
    own = []
    for chart in (Path(c) for c in charts if Path(c).suffix == ".png"):
        shutil.copyfile(chart, folder / chart.name)
        own.append(folder / chart.name)
    items = blocks(rows, own)
    pages = {".md": to_markdown(items, out_dir), ".html": to_html(items, f"fbench {folder.name}")}
    for suffix, text in pages.items():
        (out_dir / f"{folder.name}{suffix}").write_text(text)
        write_whole(out_dir / f"{NEWEST}{suffix}", text)
    write_whole(folder / SUMMARY, json.dumps(report_summary(rows), indent=2))
    write_index(out_dir)
    return out_dir / f"{folder.name}.md", out_dir / f"{folder.name}.html"
