"""A report per compare, never written over, an index linking them all, settings alike in every
scenario shown once, and an HTML page that keeps to 1280 px."""

from __future__ import annotations

import itertools
import json
import re

from typer.testing import CliRunner

from framework_bench.cli import app
from framework_bench.measure.metrics import RunResult
from framework_bench.present.report import write_report
from framework_bench.run import design
from framework_bench.scenario.scenario import load
from framework_bench.store.results import ResultStore


def _compare(tmp_path, backends: str) -> str:
    res = CliRunner().invoke(app, ["compare", "--scenario", "tiny_cpu", "--backends", backends,
                                   "--db", str(tmp_path / "r.sqlite"), "--out", str(tmp_path / "plots")])
    assert res.exit_code in (0, 1), res.output
    return res.output


def test_two_compares_write_two_reports_and_an_index_linking_both(fakes, tmp_path, monkeypatch):
    ids = (f"20261203-18162{n}-4242" for n in itertools.count(1))  # two compares within one second: own ids
    monkeypatch.setattr(design, "new_compare_id", lambda: next(ids))
    out = tmp_path / "plots"
    first = _compare(tmp_path, "fake_noisy")
    second = _compare(tmp_path, "fake_crash")  # a compare gone wrong comes after the good one
    assert f"report: {out / 'report-20261203-181621-4242.md'}" in first.replace("\n", "")
    assert f"report: {out / 'report-20261203-181622-4242.md'}" in second.replace("\n", "")

    older, newer = (out / "report-20261203-181621-4242", out / "report-20261203-181622-4242")
    for stem in (older, newer):
        assert stem.with_suffix(".md").is_file() and stem.with_suffix(".html").is_file()
        assert stem.is_dir() and any(stem.glob("tgs_tflops_*.png"))  # the charts the Markdown links, its own
    # the first report still says what the first compare ran: nothing written over
    old_md = older.with_suffix(".md").read_text()
    assert "| fake_noisy |" in old_md and "fake_crash" not in old_md
    assert "of compare 20261203-181621-4242" in old_md
    assert "| fake_crash |" in newer.with_suffix(".md").read_text()
    # report.md/.html: the newest report's copy, as before this change
    for suffix in (".md", ".html"):
        assert (out / f"report{suffix}").read_text() == newer.with_suffix(suffix).read_text()

    index_md, index_html = (out / "index.md").read_text(), (out / "index.html").read_text()
    assert re.findall(r"\[(report-[\d-]+)\]\(\1\.md\)", index_md) == [newer.name, older.name]  # newest first
    assert re.findall(r'<a href="(report-[\d-]+)\.html">', index_html) == [newer.name, older.name]
    assert "report.md and report.html are copies of the newest, report-20261203-181622-4242" in index_md
    [new_row, old_row] = [line for line in index_md.splitlines() if line.startswith("| 20")]
    # a report shows each backend's newest run of its scenarios: fake_noisy's from the first compare
    assert ("| 20261203-181622-4242, 20261203-181621-4242 | tiny_cpu | fake_crash, fake_noisy, fake_ok "
            "| 3: 1 failed, 2 ok | matched |") in new_row
    assert "| 20261203-181621-4242 | tiny_cpu | fake_noisy, fake_ok | 2: 2 ok | matched |" in old_row
    summary = json.loads((older / "summary.json").read_text())
    assert summary["compares"] == ["20261203-181621-4242"] and summary["runs"] == 2


def _one_run(tmp_path, compare_id: str) -> list[dict]:
    """The rows of a store holding one ok run of `compare_id`."""
    with ResultStore(tmp_path / "r.sqlite") as store:
        store.add(RunResult(backend="xtuner", scenario="tiny_cpu", status="ok", tgs=1.0, compare_id=compare_id),
                  load("tiny_cpu"), manifest_={})
        return store.latest_by_point()


def test_a_compare_reported_again_gets_a_report_of_its_own(tmp_path):
    """`fbench report` of a compare already reported: `-2`, the first one kept."""
    rows = _one_run(tmp_path, "c1")
    first, _ = write_report(rows, tmp_path / "out", [])
    second, _ = write_report(rows, tmp_path / "out", [])
    assert (first.name, second.name) == ("report-c1.md", "report-c1-2.md") and first.is_file()
    index = (tmp_path / "out" / "index.md").read_text()
    assert "[report-c1-2](report-c1-2.md)" in index and "[report-c1](report-c1.md)" in index


def test_a_compare_id_edited_into_a_path_stays_a_name_in_the_folder(tmp_path):
    rows = _one_run(tmp_path, "../../x y")
    md, _ = write_report(rows, tmp_path / "out", [])
    assert md == tmp_path / "out" / "report-.._.._x_y.md" and md.is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "r.sqlite"]


def test_rows_of_no_compare_are_named_by_the_time(tmp_path):
    with ResultStore(tmp_path / "r.sqlite") as store:
        store.add(RunResult(backend="xtuner", scenario="tiny_cpu", status="ok", tgs=1.0), load("tiny_cpu"),
                  manifest_={})
        rows = store.latest_by_point()
    md, page = write_report(rows, tmp_path / "out", [])
    assert re.fullmatch(r"report-\d{8}-\d{6}\.md", md.name) and page.with_suffix(".md") == md


SETTINGS = {"trainer": "t", "optimizer": "torch.optim.adamw.AdamW", "optimizer_impl": "foreach",
            "param_dtype": "float32", "attention": "sdpa", "zero_stage": 0}


def _settings_rows(tmp_path) -> list[dict]:
    """Two backends on three scenarios: every setting alike across the scenarios but the context,
    and optimizer_impl, which differs between the backends everywhere."""
    with ResultStore(tmp_path / "r.sqlite") as store:
        for name, context in (("tiny_cpu", 512), ("tiny_cpu_1k", 1024), ("tiny_cpu_2k", 2048)):
            for backend, impl in (("torch", "foreach"), ("xtuner", "fused")):
                store.add(RunResult(backend=backend, scenario=name, status="ok", tgs=1.0, steps_measured=5,
                                    settings={**SETTINGS, "optimizer_impl": impl, "max_length": context}),
                          load(name), manifest_={})
        return store.latest_by_point()


def test_settings_alike_in_every_scenario_are_shown_once(tmp_path):
    md, page = write_report(_settings_rows(tmp_path), tmp_path / "out", [])
    text = md.read_text()
    settings = text[text.index("## Settings in effect"):text.index("## Caveats")]
    assert "Alike in every scenario (tiny_cpu, tiny_cpu_1k, tiny_cpu_2k; matched settings)" in settings
    for row in ("| attention | sdpa | sdpa |", "| trainer | t | t |", "| ⚠ optimizer_impl | foreach | fused |"):
        assert settings.count(row) == 1, row  # once, in the shared table
    # per scenario only what is not alike everywhere: the context
    for name, context in (("tiny_cpu", 512), ("tiny_cpu_1k", 1024), ("tiny_cpu_2k", 2048)):
        assert f"{name} (matched settings): the settings not alike in every scenario" in settings
        assert f"| max_length | {context} | {context} |" in settings
    assert settings.count("| setting | torch | xtuner |") == 4  # the shared table and one per scenario
    assert '<tr class="speed"><td>⚠ optimizer_impl</td>' in page.read_text()


def test_one_scenario_keeps_its_own_table(tmp_path):
    rows = [r for r in _settings_rows(tmp_path) if r["scenario"] == "tiny_cpu"]
    text = write_report(rows, tmp_path / "out", [])[0].read_text()
    assert "Alike in every scenario" not in text and "tiny_cpu (matched settings): ⚠ differs" in text
    assert "| attention | sdpa | sdpa |" in text and "| max_length | 512 | 512 |" in text


def test_the_html_keeps_to_a_1280_px_page(tmp_path):
    """Declared, as a browser reads it: a body of at most 1280 px, every table in a box that
    scrolls rather than widen the page, free-text cells wrapped anywhere, images and logs inside."""
    rows = _settings_rows(tmp_path)
    rows[0]["flags"] = ["a flag long enough to be free text, with_a_very_long_identifier_that_has_no_spaces_at_all"]
    _, page = write_report(rows, tmp_path / "out", [])
    html = page.read_text()
    css = re.search(r"<style>(.*?)</style>", html, re.S).group(1)
    rules = {sel.strip(): body for sel, body in re.findall(r"([^{}]+)\{([^}]*)\}", css)}
    assert "max-width:1280px" in rules["body"] and "margin:0 auto" in rules["body"]
    assert "box-sizing:border-box" in rules["*"]
    assert "overflow-x:auto" in rules["div.table"] and "max-width:100%" in rules["div.table"]
    assert "overflow-wrap:anywhere" in rules["td.long"]
    assert "max-width:100%" in rules["img"]
    assert "white-space:pre-wrap" in rules["pre"]
    assert 'name="viewport"' in html
    tables = re.findall(r"(.{0,19})<table>", html)
    assert tables and all(before.endswith('<div class="table">') for before in tables)
    assert html.count("<table>") == html.count('</table></div>')
    assert not re.search(r"<(table|td|th|div)[^>]*\b(width|style)=", html)  # no fixed width anywhere
    assert "<li>[1] tiny_cpu · torch: a flag long enough" in html and "<td>[1]</td>" in html  # under the table
    assert "<td>ok</td>" in html  # a short cell keeps its words whole
