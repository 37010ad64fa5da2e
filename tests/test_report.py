"""The report pages from a real store and real charts: table values, embedded images, caveats."""

from __future__ import annotations

import base64
import re

import pytest

from framework_bench.present import plotting
from framework_bench.measure.metrics import RunResult
from framework_bench.present.report import write_report
from framework_bench.store.results import ResultStore
from framework_bench.scenario.scenario import load

MANIFEST = {"hostname": "bench-host", "cpu": "AMD EPYC", "cpu_count": 2, "gpu": None, "gpu_count": 0,
            "git_commit": "0123abc", "backend_env": {"flavour": "cpu", "versions": {"torch": "2.13.0+cpu"}}}


@pytest.fixture
def report(tmp_path):
    with ResultStore(tmp_path / "r.sqlite") as store:
        store.add(RunResult(backend="xtuner", scenario="tiny_cpu", status="ok", framework_version="0.2.0",
                            tgs=2345.6, tgs_min=2100.0, tgs_max=2400.5, tflops=0.123, model_tflops=0.115,
                            peak_mem_bytes=300 * 2**20, steps_measured=2, flags=["only 2 measured steps"]),
                  load("tiny_cpu"), manifest_=MANIFEST)
        store.add(RunResult(backend="llamafactory", scenario="tiny_cpu", status="failed",
                            reason="Traceback ...\nRuntimeError: <script>alert(1)</script> went wrong"),
                  load("tiny_cpu"), manifest_=MANIFEST)
        store.add(RunResult(backend="xtuner", scenario="yi34b_8k", status="unsupported", reason="needs 32 GPUs"),
                  load("yi34b_8k"), manifest_=MANIFEST)
        rows = store.latest_by_point()
    charts = plotting.plot_results(rows, tmp_path / "plots")
    md, page = write_report(rows, tmp_path / "report", charts)
    return md.read_text(), page.read_text(), charts


def test_html_is_self_contained_with_the_charts_embedded(report):
    _, page, charts = report
    pngs = [c for c in charts if c.suffix == ".png"]
    assert len(pngs) == 2
    for png in pngs:
        assert f"data:image/png;base64,{base64.b64encode(png.read_bytes()).decode()}" in page
    assert not re.search(r'(src|href)="(?!data:)', page)  # nothing fetched from elsewhere
    assert "<script" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page


@pytest.mark.parametrize("page_index", [0, 1])
def test_table_values_and_caveats(report, page_index):
    text = report[page_index]
    for value in ("tiny_cpu", "tiny-llama", "512", "xtuner 0.2.0", "2,345.6 (2,100.0–2,400.5)", "0.123 / 0.115",
                  "300 MiB", "failed", "unsupported", "485.1 TGS, 165.6 TFLOPs (A100-SXM4-80GB)",
                  "only 2 measured steps", "went wrong", "needs 32 GPUs", "bench-host", "0123abc",
                  "torch 2.13.0+cpu"):
        assert value in text, value
    for caveat in ("random weights", "CPU runs (tiny_cpu)", "6x for yi34b_8k", "1x for tiny_cpu",
                   "Flagged rows", "over-counts grouped-query-attention", "yi-34b-200k (56 query / 8 KV heads)"):
        assert caveat in text, caveat


def test_markdown_links_the_charts_relatively(report, tmp_path):
    """To the report's own copies: the next compare draws over the charts in the folder."""
    md, _, _ = report
    [link] = re.findall(r"!\[tgs_tflops_tiny-llama\]\((report-\d{8}-\d{6}/tgs_tflops_tiny-llama\.png)\)", md)
    assert (tmp_path / "report" / link).read_bytes() == (tmp_path / "plots" / "tgs_tflops_tiny-llama.png").read_bytes()
    assert "| tiny_cpu | tiny-llama | 512 | 1 (CPU) | 1 | xtuner 0.2.0 | ok |" in md


def test_settings_side_by_side_with_differences_marked_and_named(tmp_path):
    from framework_bench.present.differences import setting_differences
    from framework_bench.measure.verify import Check

    base = {"trainer": "t", "optimizer": "torch.optim.adamw.AdamW", "optimizer_impl": "foreach", "seed": 1,
            "param_dtype": "float32", "attention": "sdpa", "activation_checkpointing": False, "zero_stage": 0}
    runs = [RunResult(backend="xtuner", scenario="tiny_cpu", status="ok", settings={**base, "trainer": "mmengine-runner"},
                      checks=[Check(name="throughput", status="pass", detail="framework 99 vs host 100 (-1.0%)"),
                              Check(name="warmup_time", status="fail", detail="a compile"),
                              Check(name="cpu", status="unverified", detail="too short")]),
            RunResult(backend="llamafactory", scenario="tiny_cpu", status="ok",
                      settings={**base, "trainer": "hf-trainer", "optimizer_impl": "fused", "seed": 42})]
    with ResultStore(tmp_path / "r.sqlite") as store:
        for r in runs:
            store.add(r, load("tiny_cpu"), manifest_=MANIFEST)
        rows = store.latest_by_point(settings_mode="matched")
    diffs = setting_differences(rows)["tiny_cpu"]
    assert [(key, speed) for key, _, speed in diffs] == [("optimizer_impl", True), ("trainer", True), ("seed", False)]
    assert diffs[0][1] == {"llamafactory": "fused", "xtuner": "foreach"}
    md, page = write_report(rows, tmp_path / "report", [])
    text = md.read_text()
    assert "## Settings in effect" in text and "tiny_cpu (matched settings)" in text
    assert "| ⚠ optimizer_impl | fused | foreach |" in text and "| ≠ seed | 42 | 1 |" in text
    assert "| attention | sdpa | sdpa |" in text  # equal: shown, not marked
    assert "framework 99 vs host 100 (-1.0%)" in text and "## Host verification" in text
    # per run: how many checks passed and each other one by name, not a column per check
    assert "| tiny_cpu | xtuner | ok | 1 of 3 | warmup_time fail; cpu unverified | framework 99 vs host 100" in text
    assert "Not aligned by matched settings" in text
    # the common notes, then each backend's own (`BackendInfo.report_notes`), from its plugin
    assert "Rows are fed in the host's order" in text
    assert "mmengine, which reads the norm back" in text and "only in its v1 trainer (FSDP2 + Ulysses)" in text
    assert '<tr class="speed"><td>⚠ optimizer_impl</td>' in page.read_text()


def test_framework_tgs_as_a_share_of_the_torch_reference(tmp_path):
    with ResultStore(tmp_path / "r.sqlite") as store:
        for backend, tgs in (("torch", 4000.0), ("xtuner", 3000.0), ("llamafactory", 5000.0)):
            store.add(RunResult(backend=backend, scenario="tiny_cpu", status="ok", tgs=tgs, steps_measured=5,
                                notes=[f"{backend} note"]), load("tiny_cpu"), manifest_=MANIFEST)
        store.add(RunResult(backend="xtuner", scenario="tiny_cpu_1k", status="ok", tgs=100.0, steps_measured=5),
                  load("tiny_cpu_1k"), manifest_=MANIFEST)  # no torch row for this scenario: no share
        rows = store.latest_by_point()
    md, _ = write_report(rows, tmp_path / "report", [])
    text = md.read_text()
    assert "% of torch" in text and "framework costs over that loop" in text
    table = {line.split(" | ")[0].strip("| ") + "/" + line.split(" | ")[5].strip(): line
             for line in text.splitlines() if line.startswith("| tiny_cpu")}
    assert "| 75% |" in table["tiny_cpu/xtuner"] and "| 125% |" in table["tiny_cpu/llamafactory"]
    assert "| 100% |" in table["tiny_cpu/torch"] and "| 100.0 | - |" in table["tiny_cpu_1k/xtuner"]
    # its note numbered in the row, said in full under the table (a note's length never widens it)
    number = table["tiny_cpu/xtuner"].rstrip(" |").rsplit("| ", 1)[1]
    assert f"- {number} tiny_cpu · xtuner: xtuner note" in text and "xtuner note" not in table["tiny_cpu/xtuner"]


def test_repeated_trials_open_the_report_with_verdicts_and_show_their_intervals(tmp_path):
    """The rounds of one compare pair their trials: the verdict says so."""
    with ResultStore(tmp_path / "r.sqlite") as store:
        for round_, wobble in enumerate((1.0, 1.01, 0.99, 1.02, 0.98), 1):
            for backend, tgs in (("torch", 4000.0), ("xtuner", 3000.0)):
                store.add(RunResult(backend=backend, scenario="tiny_cpu", status="ok", tgs=tgs * wobble,
                                    steps_measured=5, compare_id="c1", trial_round=round_, trial_position=1),
                          load("tiny_cpu"), manifest_=MANIFEST)
        rows = store.latest_by_point()
    md, _ = write_report(rows, tmp_path / "report", [])
    text = md.read_text()
    assert text.index("## Verdicts") < text.index("## Results")
    assert "- tiny_cpu: xtuner is 25.0% slower than torch (95% CI " in text and "paired over 5 rounds)" in text
    [xtuner] = [line for line in text.splitlines() if line.startswith("| tiny_cpu") and "| xtuner" in line]
    assert "| 5 | 3,000.0 |" in xtuner and "| 75% (" in xtuner
    assert "median over its trials" in text
