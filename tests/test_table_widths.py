"""Every table fbench prints, at 80, 100 and 120 columns: each figure of the record
whole, no cell ending in "…", each row one or two lines tall, the columns left out named under
the table, notes as numbered footnotes; and `gpu_check.sh --dry` finding the checkout's fbench."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from framework_bench.cli import app, common, render
from framework_bench.measure.metrics import RunResult
from framework_bench.measure.verify import Check
from framework_bench.present import run_lines, terminal_tables
from framework_bench.present.fitted_table import FittedTable
from framework_bench.run.reference import reference_backend
from framework_bench.scenario import scenario

ROOT = Path(__file__).resolve().parents[1]
FIXTURE_STORE = ROOT / "tests" / "golden" / "fixture_results.sqlite"


def fixture_copy(tmp_path: Path) -> str:
    """The fixture store, copied: the fixture stays as written, whatever a command does with the
    file it is given (tests/golden/golden.py, tests/test_results.py read it as old rows)."""
    return shutil.copy(FIXTURE_STORE, tmp_path / "fixture.sqlite")
WIDTHS = (80, 100, 120)
BACKENDS = ("torch", "xtuner", "llamafactory", "trl", "swift")  # five frameworks fit, as the bundled four and one more
STARTUP = "start-up 18.3 s: imports 10.7, data 3.3, framework_setup 4.1, model_build 0.2"
SPREAD = "TGS spread 31% over the measured steps (more than 25%): the figure is unsteady"


def rendered(renderable, width: int) -> str:
    console = Console(width=width, record=True, file=open(os.devnull, "w"), color_system=None)
    render.show(renderable, console) if isinstance(renderable, FittedTable) else console.print(renderable)
    return console.export_text()


def flat(text: str) -> str:
    return " ".join(text.split())


def table_rows(text: str) -> list[list[str]]:
    """The body rows of a boxed table, each as its lines (a row starts where its first cell does)."""
    rows: list[list[str]] = []
    body = False
    for line in text.splitlines():
        if line.startswith(("┡", "├")):
            body = True
        elif line.startswith("└"):
            body = False
        elif body and line.startswith("│"):
            if line.split("│")[1].strip() or not rows:
                rows.append([line])
            else:
                rows[-1].append(line)
    return rows


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.split("│")[1:-1]]


def more_columns(text: str) -> list[str]:
    """The column names of the "more columns: a, b (...)" line, or none."""
    said = flat(text)
    if "more columns: " not in said:
        return []
    return said.split("more columns: ")[1].split(" (")[0].split(", ")


def assert_fits(text: str, width: int, rows: int, wide: bool = False) -> list[list[str]]:
    assert "…" not in text, text
    if not wide:
        assert max(len(line) for line in text.splitlines()) <= width, text
    body = table_rows(text)
    assert len(body) == rows, text
    assert all(len(row) <= 2 for row in body), text
    return body


def compare_results() -> tuple[list[RunResult], dict]:
    """tiny_cpu_* with three backends, figures as wide as a GPU's (12,345.6), a failed run, notes."""
    names = sorted(p.stem for p in scenario.scenario_paths() if p.stem.startswith("tiny_cpu"))
    by_name = {n: scenario.load(n) for n in names}
    results = []
    for i, name in enumerate(names):
        for j, backend in enumerate(BACKENDS):
            failed = (i, j) == (1, 2)
            tgs = None if failed else 12345.678 * (1 + j / 7) / (i + 1)
            results.append(RunResult(
                backend=backend, scenario=name, status="failed" if failed else ("unverified" if j == 1 else "ok"),
                reason="the trainer fell over\nTraceback: the last line" if failed else None,
                tgs=tgs, tgs_min=tgs and tgs * 0.9, tgs_max=tgs and tgs * 1.2, tflops=tgs and tgs / 1e4,
                mfu=0.4567 if tgs else None, peak_mem_bytes=71 * 2**30 + j, peak_reserved_bytes=75 * 2**30,
                startup_seconds=18.31, notes=[STARTUP] + ([SPREAD] if j == 1 else []), steps_measured=5))
    return results, by_name


@pytest.mark.parametrize("width", WIDTHS)
def test_compare_shows_each_figure_whole_and_names_what_it_leaves_out(width):
    results, by_name = compare_results()
    text = rendered(terminal_tables.results_table(render.points(results), by_name), width)
    body = assert_fits(text, width, len(results))
    header = flat(text.split("┡")[0])
    reference = {r.scenario: r.tgs for r in results if r.backend == reference_backend() and r.status == "ok"}
    share = {(r.scenario, r.backend): 100 * r.tgs / reference[r.scenario] for r in results
             if r.status == "ok" and r.scenario in reference}
    shown = [h for h in ("TGS min–max", "TFLOPs/GPU", "MFU", "peak mem", "reserved", "start-up") if h in header]
    left_out = more_columns(text)
    assert set(left_out) | set(shown) >= {"TGS min–max", "TFLOPs/GPU", "MFU", "peak mem", "reserved", "start-up"}
    assert not set(left_out) & set(shown)
    for r, row in zip(results, body):
        record = r.model_dump(mode="json")
        line = row[0]
        for figure in (record["scenario"], record["backend"], record["status"], terminal_tables.fmt(record["tgs"])):
            assert figure in cells(line), (figure, line)
        pct = share.get((r.scenario, r.backend))
        assert (f"{pct:.0f}%" if pct is not None else "-") in cells(line)
        if "TFLOPs/GPU" in shown:
            assert terminal_tables.fmt(record["tflops"], ".3g") in cells(line)
        if "TGS min–max" in shown and record["tgs"] is not None:
            assert f"{terminal_tables.fmt(record['tgs_min'])}–{terminal_tables.fmt(record['tgs_max'])}" in cells(line)
        if "peak mem" in shown:
            assert terminal_tables.gib(record["peak_mem_bytes"]) in cells(line)
    assert "% of" in header and reference_backend() in header.split()  # the header wraps between words
    # notes: numbered footnotes under the table, the same note once; the start-up breakdown not here
    assert STARTUP not in flat(text) and flat(f"[1] {SPREAD}") in flat(text)
    assert flat(text).count(SPREAD) == 1
    if width == 100:
        assert "TGS min–max" in shown  # the spread of the headline figure stays where it fits


def test_compare_wide_and_verbose_show_every_column_and_the_start_up_breakdown():
    results, by_name = compare_results()
    text = rendered(terminal_tables.results_table(render.points(results), by_name, wide=True, verbose=True), 80)
    assert_fits(text, 80, len(results), wide=True)
    assert not more_columns(text)
    for header in ("TGS min–max", "TFLOPs/GPU", "MFU", "peak mem", "reserved", "start-up"):
        assert header in flat(text.split("┡")[0])
    assert STARTUP in flat(text) and "45.7%" in text and "18.3 s" in text


@pytest.mark.parametrize("width", WIDTHS)
def test_results_list_shows_id_scenario_backend_status_and_tgs_whole(width, tmp_path):
    env = {**os.environ, "COLUMNS": str(width), "FBENCH_HOME": str(tmp_path)}
    fbench = str(Path(sys.executable).with_name("fbench"))
    store = fixture_copy(tmp_path)
    listed = subprocess.run([fbench, "results", "list", "--db", store], capture_output=True, text=True,
                            env=env, check=True).stdout
    records = json.loads(subprocess.run([fbench, "results", "export", "--format", "json", "--db", store],
                                        capture_output=True, text=True, env=env, check=True).stdout)
    body = assert_fits(listed, width, len(records))
    for record, row in zip(records, body):
        shown = cells(row[0])
        for figure in (str(record["id"]), record["scenario"], record["backend"], record["status"],
                       terminal_tables.fmt(record["tgs"])):
            assert figure in shown, (figure, row)
    if width < 120:
        assert "data sha256" in more_columns(listed) and "results export --format json" in flat(listed)


@pytest.mark.parametrize("width", WIDTHS)
def test_scenarios_table_prints_every_name_whole(width, monkeypatch):
    monkeypatch.setattr(common, "console", Console(width=width, color_system=None))
    out = CliRunner().invoke(app, ["scenarios"])
    assert out.exit_code == 0, out.output
    body = assert_fits(out.stdout, width, len(scenario.scenario_paths()))
    names = [cells(row[0])[0] for row in body]
    assert names == [p.stem for p in scenario.scenario_paths()]
    for row in body:
        assert cells(row[0])[4] in ("512", "1k", "2k", "4k", "8k", "32k", "128k", "256k", "1M")  # context, whole


def test_an_invalid_scenario_says_why_in_a_footnote(tmp_path, monkeypatch):
    (tmp_path / "bad.yaml").write_text("model: {preset: nope}\ncontext_length: 512\n")
    monkeypatch.setattr(scenario, "SCENARIO_DIR", tmp_path)
    monkeypatch.setattr(scenario.scenario_paths, "__defaults__", (tmp_path,))
    monkeypatch.setattr(common, "console", Console(width=80, color_system=None))
    out = CliRunner().invoke(app, ["scenarios"])
    body = assert_fits(out.stdout, 80, 1)
    assert cells(body[0][0])[:2] == ["bad", "invalid"] and "[1]" in body[0][0]
    assert "[1] " in out.stdout and "nope" in out.stdout


@pytest.mark.parametrize("width", WIDTHS)
def test_check_backend_keeps_points_and_verdicts_whole_and_long_details_under_the_table(width):
    from framework_bench.testing import Conformance
    long = ("the update of step 3 differs from the reference's by 12.5% of its norm, beyond the 1% bf16 allows: "
            "the framework steps its optimizer differently, or skips a micro-batch")
    points = [Check(name="run", status="pass", detail="status ok"),
              Check(name="update parity (2 processes: multiproc_tiny_cpu_1x2)", status="fail", detail=long),
              Check(name="tokens", status="pass", detail="512 tokens per step per rank"),
              Check(name="parity (grad_accum 2)", status="skipped", detail="skipped (refused: no accumulation here)")]
    report = Conformance(backend="x", scenario="tiny_cpu", points=points,
                         result=RunResult(backend="x", scenario="tiny_cpu", status="ok"))
    text = rendered(terminal_tables.points_table("x", report), width)
    body = assert_fits(text, width, len(points))
    for p, row in zip(points, body):
        assert cells(row[0])[:2] == [p.name, p.status]
        detail = " ".join(cells(line)[2] for line in row).strip()
        if detail.startswith("["):  # too long for two lines: whole, in its footnote
            assert flat(f"{detail} {p.detail}") in flat(text.split("└")[1])
        else:
            assert detail == p.detail
    assert "status ok" in cells(body[0][0]) and flat(f"] {long}") in flat(text)


@pytest.mark.parametrize("width", WIDTHS)
def test_device_check_prints_the_fitted_table_and_points_to_table_txt(width, tmp_path, monkeypatch):
    from framework_bench.device import check as device_check
    results, _ = compare_results()
    monkeypatch.setattr(device_check, "check", lambda out, budget, device, say: results)
    monkeypatch.setattr(common, "console", Console(width=width, color_system=None))
    out = CliRunner().invoke(app, ["device", "check", "--out", str(tmp_path), "--device", "cpu"])
    assert out.exit_code == 0, out.output
    table = out.stdout.split("└")[0] + "└"
    assert_fits(table, width, len(results))
    # the folder is tmp_path, which may be wider than the table: folded anywhere, even inside a word
    assert "the trainer fell over" in out.stdout and f"{tmp_path}/table.txt" in "".join(out.stdout.split())


@pytest.mark.parametrize("width", WIDTHS)
def test_run_prints_its_figures_whole_and_the_start_up_breakdown_with_verbose(width, monkeypatch, tmp_path):
    r = compare_results()[0][0]
    for verbose in (False, True):
        console = Console(width=width, record=True, file=open(os.devnull, "w"), color_system=None)
        monkeypatch.setattr(common, "console", console)
        render.say(run_lines.run_lines(r, tmp_path / "r.sqlite", verbose))
        text = console.export_text()
        assert "…" not in text and max(len(line) for line in text.splitlines()) <= width
        words = set(text.split())
        for figure in (terminal_tables.fmt(r.tgs), terminal_tables.fmt(r.tgs_min) + ",", terminal_tables.fmt(r.tgs_max) + ")"):
            assert figure in words, figure
        assert (STARTUP in flat(text)) == verbose


def test_run_prints_a_check_of_every_status(tmp_path, monkeypatch):
    """A native adapter run's `update_parity` is `skipped` (its adapters are not the reference's):
    `fbench run` prints it as it prints the others."""
    statuses = ("pass", "fail", "unverified", "skipped")
    r = compare_results()[0][0]
    r = r.model_copy(update={"checks": [Check(name=f"c_{s}", status=s, detail=f"why {s}") for s in statuses]})
    console = Console(width=100, record=True, file=open(os.devnull, "w"), color_system=None)
    monkeypatch.setattr(common, "console", console)
    render.say(run_lines.run_lines(r, tmp_path / "r.sqlite"))
    lines = console.export_text().splitlines()
    assert all(any(line.split()[:3] == [s, f"c_{s}", "why"] for line in lines) for s in statuses), lines


def test_results_show_keeps_the_start_up_breakdown(tmp_path, monkeypatch):
    monkeypatch.setenv("FBENCH_HOME", str(tmp_path))
    out = CliRunner().invoke(app, ["results", "show", "1", "--db", fixture_copy(tmp_path)])
    assert out.exit_code == 0, out.output
    assert any(n.startswith("start-up 9.4 s: imports") for n in json.loads(out.stdout)["notes"])


@pytest.mark.parametrize("width", WIDTHS)
def test_settings_that_differ_are_one_per_line_with_values_aligned(width):
    """Five backends' values side by side where their longest words fit (120 columns), else one
    line per backend under each setting (80, 100): never a word cut or folded."""
    values = {"optimizer_impl": ("for-loop", "foreach", "fused", "fused", "foreach"),
              "trainer": ("torch-loop", "mmengine-runner", "hf-trainer", "hf-trainer", "hf-trainer+deepspeed"),
              "loss_normalization": ("token mean", "token mean per micro-batch, labels counted after the shift",
                                     "token sum over the step's labels counted before the shift",
                                     "token sum over the step's labels counted before the shift", "token mean")}
    records = [{"scenario": "tiny_cpu", "backend": b, "settings": {k: v[i] for k, v in values.items()}}
               for i, b in enumerate(BACKENDS)]
    console = Console(width=width, record=True, file=open(os.devnull, "w"), color_system=None)
    render.print_differences(records, "matched", console)
    text = console.export_text()
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= width
    assert {word for value in values.values() for v in value for word in v.split()} <= set(text.split()), text
    lines = text.splitlines()
    assert lines[0] == "tiny_cpu: 3 setting(s) differ between backends (matched settings)"
    first = sorted(BACKENDS)[0]  # the backends in name order
    if width < 120:
        assert lines[1].split() == ["setting", "backend", "value"], text
        for key, by_backend in values.items():
            at = next(i for i, line in enumerate(lines) if key in line.split()[:2])
            named = [line for line in lines[at:] if set(line.split()) & set(BACKENDS)]  # not a value's wrapped lines
            for line, backend in zip(named, sorted(BACKENDS)):  # short values on their backend's line
                assert backend in line.split() and (key == "loss_normalization" or by_backend[BACKENDS.index(backend)]
                                                   in line.split()), text
        return
    assert lines[1].split() == ["setting", *sorted(BACKENDS)]
    starts = set()
    for key, by_backend in values.items():
        line = next(line for line in lines if key in line.split()[:2])  # its own line, after "speed" or not
        starts.add(line.index(by_backend[BACKENDS.index(first)].split()[0], line.index(key) + len(key)))
        if key != "loss_normalization":  # short values: on the setting's line, whole
            assert all(v in line.split() for v in by_backend), line
    assert starts == {lines[1].index(first)}, text  # the first backend's values in one column, under its name


def test_gpu_check_dry_finds_the_checkouts_own_fbench(tmp_path):
    """No fbench on PATH and no FBENCH: the checkout's .venv/bin/fbench, as the README's commands."""
    checkout = tmp_path / "checkout"
    (checkout / "benchmarks").mkdir(parents=True)
    shutil.copy(ROOT / "benchmarks" / "gpu_check.sh", checkout / "benchmarks")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    refused = subprocess.run(["bash", str(checkout / "benchmarks" / "gpu_check.sh"), "--dry"], capture_output=True,
                             text=True, env=env)
    assert refused.returncode == 2 and "scripts/setup.sh" in refused.stderr, refused.stderr
    stub = checkout / ".venv" / "bin" / "fbench"
    stub.parent.mkdir(parents=True)
    stub.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "calls"}\n')
    stub.chmod(0o755)
    done = subprocess.run(["bash", str(checkout / "benchmarks" / "gpu_check.sh"), "--dry"], capture_output=True,
                          text=True, env=env)
    assert done.returncode == 0, done.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls[0].startswith("compare --scenario tiny_cuda") and "--dry-run" in calls[0]
    assert calls[1] == "device estimate --budget 420"


def test_runs_of_a_scenario_that_ended_alike_for_one_reason_share_one_line():
    why = "QLoRA runs on CUDA only: bitsandbytes has no CPU 4-bit kernels"
    runs = [RunResult(backend=b, scenario="tiny_cpu_qlora", status="unsupported", reason=f"{b}: {why}")
            for b in ("torch", "llamafactory", "xtuner")]
    runs.append(RunResult(backend="xtuner", scenario="tiny_cpu", status="failed", reason="xtuner: it fell over\ntail 1"))
    with common.console.capture() as said:
        render.say(run_lines.reason_lines(runs))
    assert said.get().splitlines() == [f"tiny_cpu_qlora / torch, llamafactory, xtuner: unsupported: {why}",
                                       "tiny_cpu / xtuner: failed: it fell over", "    tail 1"]


def repeated_results() -> tuple[list[RunResult], dict]:
    """`compare_results`' points, each over three rounds of one compare (figures 3% apart)."""
    results, by_name = compare_results()
    repeated = []
    for round_ in (1, 2, 3):
        for r in results:
            scale = 1 + (round_ - 2) * 0.03
            repeated.append(r.model_copy(update={
                "compare_id": "c1", "trial_round": round_, "result_id": len(repeated) + 1,
                **({k: getattr(r, k) * scale for k in ("tgs", "tgs_min", "tgs_max")} if r.tgs else {})}))
    return repeated, by_name


@pytest.mark.parametrize("width", WIDTHS)
def test_the_repeat_table_keeps_each_interval_whole(width):
    """With --repeat every point shows its median with its 95% interval and its share of the
    reference with its own: at 80 columns too, each part whole within its cell (wrapped at a
    space, at 80 also after an interval's dash: rows of up to three lines)."""
    results, by_name = repeated_results()
    points = render.points(results)
    text = rendered(terminal_tables.results_table(points, by_name), width)
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= width, text
    body = table_rows(text)
    assert len(body) == len(points.rows) and all(len(row) <= 3 for row in body), text
    for row, r in zip(body, points.rows):
        joined = " ".join(" ".join(cells(line)[i] for line in row) for i in range(len(cells(row[0]))))
        joined = joined.replace("– ", "–")  # at 80 columns an interval breaks after its dash
        summary = points.summaries[r["scenario"], r["backend"]]
        if summary.trials >= 2:
            low, high = f"{summary.low:,.1f}", f"{summary.high:,.1f}"
            assert f"{summary.median:,.1f}" in joined and f"({low}–{high})" in flat(joined), (joined, row)
        share = points.shares.get((r["scenario"], r["backend"]))
        if share is not None and share.low is not None:
            assert f"({share.low * 100:.0f}–{share.high * 100:.0f}%)" in flat(joined), (joined, row)


def test_scenarios_whose_backends_differ_alike_share_one_grid():
    """A context sweep: the same settings differ the same way on every context, said once."""
    settings = {"trainer": ("torch-loop", "mmengine-runner", "hf-trainer", "hf-trainer", "hf-trainer")}
    records = [{"scenario": s, "backend": b, "settings": {k: v[i] for k, v in settings.items()} | {"lora_rank": r}}
               for s, r in (("tiny_cpu", 8), ("tiny_cpu_1k", 8), ("tiny_cpu_lora", 8)) for i, b in enumerate(BACKENDS)]
    records[-1]["settings"]["lora_rank"] = 64  # one scenario differs otherwise
    console = Console(width=100, record=True, file=open(os.devnull, "w"), color_system=None)
    render.print_differences(records, "matched", console)
    heads = [line for line in console.export_text().splitlines() if "differ between backends" in line]
    assert heads == ["tiny_cpu, tiny_cpu_1k: 1 setting(s) differ between backends (matched settings)",
                     "tiny_cpu_lora: 2 setting(s) differ between backends (matched settings)"]
