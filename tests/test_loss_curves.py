"""The report draws loss vs step per scenario for every backend, from the
canonical loss curves the store keeps."""

from __future__ import annotations

import re

from framework_bench.present import plotting
from framework_bench.measure.metrics import RunResult
from framework_bench.present.report import write_report
from framework_bench.store.results import ResultStore
from framework_bench.scenario.scenario import load


def test_one_loss_chart_per_scenario_with_a_line_per_backend(tmp_path):
    curve = {1: 6.276, 2: 6.209, 3: 6.112}
    with ResultStore(tmp_path / "r.sqlite") as store:
        for backend in ("torch", "xtuner", "llamafactory"):
            store.add(RunResult(backend=backend, scenario="tiny_cpu", status="ok", tgs=100.0, seed=1024,
                                loss_curve=curve), load("tiny_cpu"), manifest_={})
        store.add(RunResult(backend="xtuner", scenario="tiny_cpu_1k", status="ok", tgs=90.0, seed=1024,
                            loss_curve={1: 7.0, 2: 6.5}), load("tiny_cpu_1k"), manifest_={})
        store.add(RunResult(backend="torch", scenario="tiny_cpu_1k", status="failed", reason="boom"),
                  load("tiny_cpu_1k"), manifest_={})
        rows = store.list()
    paths = plotting.plot_results(rows, tmp_path / "plots", published=False)
    names = {p.name for p in paths}
    assert {"loss_tiny_cpu.png", "loss_tiny_cpu.svg", "loss_tiny_cpu_1k.png", "loss_tiny_cpu_1k.svg"} <= names
    svg = (tmp_path / "plots" / "loss_tiny_cpu.svg").read_text()
    assert all(f'id="loss-line-{b}"' in svg for b in ("torch", "xtuner", "llamafactory"))
    other = (tmp_path / "plots" / "loss_tiny_cpu_1k.svg").read_text()
    assert 'id="loss-line-xtuner"' in other and 'id="loss-line-torch"' not in other  # no curve: no line
    ticks = re.findall(r"<!-- ([\d.]+) -->", svg)  # matplotlib writes each tick label's text beside its glyphs
    assert {"1", "2", "3"} <= set(ticks) and not {"1.25", "1.50", "2.50"} & set(ticks)  # whole steps only
    md, _ = write_report(rows, tmp_path / "report", paths)
    assert "loss_tiny_cpu" in md.read_text()


def test_an_unverified_run_is_drawn_only_when_asked_and_then_marked_as_such(tmp_path):
    """A run no check vouches for (every claim declared unclaimed, no reference...) is left out of
    the loss and TGS charts; with --include-unverified it is drawn in both, marked unverified,
    never like an `ok` one."""
    curve = {1: 6.276, 2: 6.209, 3: 6.112}
    with ResultStore(tmp_path / "r.sqlite") as store:
        for backend, status in (("torch", "ok"), ("claimless", "unverified")):
            store.add(RunResult(backend=backend, scenario="tiny_cpu", status=status, tgs=100.0, seed=1024,
                                loss_curve=curve), load("tiny_cpu"), manifest_={})
        rows = store.list()
    plotting.plot_results(rows, tmp_path / "plots", published=False)
    loss, tgs = ((tmp_path / "plots" / name).read_text() for name in ("loss_tiny_cpu.svg", "tgs_tflops_tiny-llama.svg"))
    assert 'id="loss-line-torch"' in loss and "claimless" not in loss
    assert 'id="tgs-line-claimless-unverified"' not in tgs
    plotting.plot_results(rows, tmp_path / "asked", published=False, include_unverified=True)
    loss, tgs = ((tmp_path / "asked" / name).read_text() for name in ("loss_tiny_cpu.svg", "tgs_tflops_tiny-llama.svg"))
    assert 'id="loss-line-claimless-unverified"' in loss and 'id="loss-line-claimless"' not in loss
    assert 'id="tgs-line-claimless-unverified"' in tgs
