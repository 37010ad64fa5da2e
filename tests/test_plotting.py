"""Charts drawn for real with matplotlib from rows of a real results store; checked through the SVG."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from framework_bench.present import chart_style, plotting, published_chart
from framework_bench.measure.metrics import RunResult
from framework_bench.store.results import ResultStore
from framework_bench.scenario.scenario import PROJECT_ROOT, load

CPU_MANIFEST = {"hostname": "h", "cpu": "AMD EPYC", "cpu_count": 2, "gpu": None, "gpu_count": 0}


def add(store, backend, name, status="ok", tgs=None, **figures):
    r = RunResult(backend=backend, scenario=name, status=status, tgs=tgs, tgs_min=tgs and tgs * 0.8,
                  tgs_max=tgs and tgs * 1.1,
                  tflops=tgs and tgs * 1e-4, model_tflops=tgs and tgs * 9e-5, reason=None if tgs else "boom",
                  **figures)
    store.add(r, load(name), manifest_=CPU_MANIFEST)


@pytest.fixture
def rows(tmp_path):
    with ResultStore(tmp_path / "r.sqlite") as store:
        for i, name in enumerate(("tiny_cpu", "tiny_cpu_1k", "tiny_cpu_2k")):
            add(store, "xtuner", name, tgs=3000.0 / (i + 1))
            add(store, "llamafactory", name, tgs=2500.0 / (i + 1))
        add(store, "xtuner", "tiny_cpu_4k", "timeout")
        add(store, "llamafactory", "tiny_cpu_4k", "oom")
        add(store, "xtuner", "llama2_7b_8k", "unsupported")
        return store.latest_by_point()


def test_one_chart_per_model_with_every_backend_and_failure(rows, tmp_path):
    out = tmp_path / "plots"
    paths = plotting.plot_results(rows, out)
    assert sorted(p.name for p in paths) == ["tgs_tflops_llama2-7b.png", "tgs_tflops_llama2-7b.svg",
                                             "tgs_tflops_tiny-llama.png", "tgs_tflops_tiny-llama.svg"]
    for p in paths:
        assert p.stat().st_size > 20_000, p
    svg = (out / "tgs_tflops_tiny-llama.svg").read_text()
    assert 'id="settings-matched"' in svg  # the title says which settings mode the chart shows
    for metric in ("tgs", "tflops"):
        for backend in ("xtuner", "llamafactory"):
            assert f'id="{metric}-line-{backend}"' in svg and f'id="{metric}-spread-{backend}"' in svg
        assert f'id="{metric}-failed-xtuner-4k"' in svg and f'id="{metric}-status-xtuner-4k-timeout"' in svg
        assert f'id="{metric}-failed-llamafactory-4k"' in svg and f'id="{metric}-status-llamafactory-4k-oom"' in svg
        # the marks of points without a figure stand in a band below zero, never at a data height
        assert f'id="{metric}-no-figure-band"' in svg
    assert "line-published" not in svg  # the tiny model has no published figures

    svg = (out / "tgs_tflops_llama2-7b.svg").read_text()
    assert 'id="tgs-line-published"' in svg and 'id="tflops-line-published"' in svg
    assert 'id="tgs-status-xtuner-8k-unsupported"' in svg


def test_without_published_reference(rows, tmp_path):
    paths = plotting.plot_results(rows, tmp_path, published=False)
    svg = next(p for p in paths if p.name == "tgs_tflops_llama2-7b.svg").read_text()
    assert "line-published" not in svg


def test_a_backend_line_has_its_ok_points_only(rows, tmp_path):
    """The ok points make the line (3 contexts); the 4k timeout is a separate marker, not a vertex."""
    plotting.plot_results(rows, tmp_path)
    svg = (tmp_path / "tgs_tflops_tiny-llama.svg").read_text()
    group = re.search(r'<g id="tgs-line-xtuner">(.*?)</g>', svg, re.S).group(1)
    path = re.search(r'<path d="([^"]*)"', group).group(1)
    assert path.count("L") == 2  # M + 2 L = three vertices


def test_published_chart_needs_no_runs(tmp_path):
    with ResultStore(tmp_path / "r.sqlite") as store:
        assert store.list() == []
        assert plotting.plot_results(store.latest_by_point(), tmp_path) == []
    paths = published_chart.plot_published(tmp_path / "out")
    assert [p.name for p in paths] == ["published_xtuner_a100.png", "published_xtuner_a100.svg"]
    assert paths[0].stat().st_size > 50_000
    svg = paths[1].read_text()
    for model in ("llama2-7b", "yi-34b-200k", "llama2-70b"):
        assert f'id="tgs-line-{model}"' in svg and f'id="tflops-line-{model}"' in svg


def test_the_committed_reference_picture_exists():
    for ext in ("png", "svg"):
        assert (PROJECT_ROOT / "plots" / f"published_xtuner_a100.{ext}").stat().st_size > 20_000


def test_labels():
    assert [chart_style.ctx_label(n) for n in (512, 1024, 8192, 131072, 262144, 1048576, 1000)] == \
        ["512", "1k", "8k", "128k", "256k", "1M", "1000"]
    cpu = [{"gpus": 1, "device": "cpu", "manifest": CPU_MANIFEST}]
    assert chart_style.gpus_label(cpu) == "1 process (CPU)"
    assert chart_style.hardware(cpu) == "AMD EPYC CPU x 2, no GPU"
    gpu = [{"gpus": g, "device": "cuda", "manifest": {"gpu": "NVIDIA H200", "gpu_count": 8}} for g in (8, 32)]
    assert chart_style.gpus_label(gpu) == "8/32 GPUs"
    assert chart_style.hardware(gpu) == "8 x NVIDIA H200"


def test_importing_the_modules_does_not_import_matplotlib():
    code = ("import sys, framework_bench.present.plotting, framework_bench.present.report, framework_bench.store.results; "
            "assert 'matplotlib' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_point_of_several_trials_draws_its_interval_as_an_error_bar(tmp_path):
    with ResultStore(tmp_path / "r.sqlite") as store:
        for round_, tgs in enumerate((3000.0, 3100.0, 2900.0), 1):
            r = RunResult(backend="xtuner", scenario="tiny_cpu", status="ok", tgs=tgs, tgs_min=tgs * 0.9,
                          tgs_max=tgs * 1.1, tflops=tgs * 1e-4, model_tflops=tgs * 9e-5, compare_id="c1",
                          trial_round=round_, trial_position=1)
            store.add(r, load("tiny_cpu"), manifest_=CPU_MANIFEST)
        add(store, "llamafactory", "tiny_cpu", tgs=2500.0)  # one trial: its step spread
        rows = store.latest_by_point()
    plotting.plot_results(rows, tmp_path, published=False)
    svg = (tmp_path / "tgs_tflops_tiny-llama.svg").read_text()
    for metric in ("tgs", "tflops"):
        assert f'id="{metric}-ci-xtuner"' in svg and f'id="{metric}-spread-xtuner"' not in svg
        assert f'id="{metric}-spread-llamafactory"' in svg and f'id="{metric}-ci-llamafactory"' not in svg


def _path(svg: str, gid: str) -> list[tuple[float, float]]:
    """The vertices of the first path under the element with this gid, in SVG pixels (y down)."""
    group = re.search(rf'<g id="{gid}">(.*?)</g>', svg, re.S).group(1)
    d = re.search(r'<path d="([^"]*)"', group).group(1)
    return [(float(x), float(y)) for x, y in re.findall(r"[ML] ([-\d.]+) ([-\d.]+)", d)]


@pytest.fixture
def method_rows(tmp_path):
    """tiny_cpu full and LoRA (1.5x the TGS, 2/3 of the memory) on two backends, QLoRA refused on CPU."""
    with ResultStore(tmp_path / "m.sqlite") as store:
        for backend, tgs, gib in (("xtuner", 3000.0, 2.0), ("llamafactory", 2500.0, 2.5)):
            add(store, backend, "tiny_cpu", tgs=tgs, peak_mem_bytes=int(gib * 2**30))
            add(store, backend, "tiny_cpu_lora", tgs=tgs * 1.5, peak_mem_bytes=int(gib / 1.5 * 2**30))
            add(store, backend, "tiny_cpu_qlora", "unsupported")
            add(store, backend, "tiny_cpu_1k", tgs=tgs)  # a context of full fine-tuning only
        add(store, "xtuner", "llama2_7b_8k", tgs=3000.0)  # another model, full fine-tuning only
        return store.latest_by_point()


def test_a_lora_run_is_its_own_line_beside_the_full_one(method_rows, tmp_path):
    """Same model and context: the LoRA point no longer replaces the full one."""
    plotting.plot_results(method_rows, tmp_path, published=False)
    svg = (tmp_path / "tgs_tflops_tiny-llama.svg").read_text()
    for backend in ("xtuner", "llamafactory"):
        (_, full), *_ = _path(svg, f"tgs-line-{backend}")  # 512 first, then 1k
        (_, lora), = _path(svg, f"tgs-line-{backend}-lora")
        assert lora < full  # higher on the page: each line has its own point
        # The step spreads (0.8 to 1.1 x TGS) scale with each line's own TGS: 1.5x for LoRA.
        (_, low), (_, high) = _path(svg, f"tgs-spread-{backend}")
        (_, lora_low), (_, lora_high) = _path(svg, f"tgs-spread-{backend}-lora")
        assert (lora_low - lora_high) / (low - high) == pytest.approx(1.5, rel=1e-3)
        assert f'id="tgs-failed-{backend}-qlora-512"' in svg
        assert f'id="tgs-status-{backend}-qlora-512-unsupported"' in svg


def test_the_methods_chart_has_a_bar_per_backend_and_method(method_rows, tmp_path):
    paths = plotting.plot_results(method_rows, tmp_path, published=False)
    # Only the model that ran with more than one method gets one.
    assert sorted(p.name for p in paths if p.name.startswith("methods_")) == \
        ["methods_tiny-llama.png", "methods_tiny-llama.svg"]
    svg = (tmp_path / "methods_tiny-llama.svg").read_text()

    def height(gid):
        ys = [y for _, y in _path(svg, gid)]
        return max(ys) - min(ys)

    for metric, values in (("tgs", {("xtuner", "full"): 3000, ("xtuner", "lora"): 4500,
                                    ("llamafactory", "full"): 2500, ("llamafactory", "lora"): 3750}),
                           ("mem", {("xtuner", "full"): 2.0, ("xtuner", "lora"): 2.0 / 1.5,
                                    ("llamafactory", "full"): 2.5, ("llamafactory", "lora"): 2.5 / 1.5})):
        unit = height(f"{metric}-bar-xtuner-full-512") / values["xtuner", "full"]
        for (backend, method), value in values.items():
            assert height(f"{metric}-bar-{backend}-{method}-512") == pytest.approx(value * unit, rel=1e-3)
        for backend in ("xtuner", "llamafactory"):  # QLoRA has no figure on CPU: its slot shows the status
            assert f'id="{metric}-bar-{backend}-qlora-512"' not in svg
            assert f'id="{metric}-failed-{backend}-qlora-512"' in svg
            assert f'id="{metric}-status-{backend}-qlora-512-unsupported"' in svg
    # the 1k context ran full fine-tuning only: the TGS chart's, not a row of "not run" slots here
    assert "-1k" not in svg and "1k" in (tmp_path / "tgs_tflops_tiny-llama.svg").read_text()


def test_unverified_methods_bars_only_when_asked(tmp_path):
    with ResultStore(tmp_path / "m.sqlite") as store:
        add(store, "xtuner", "tiny_cpu", tgs=3000.0)
        add(store, "xtuner", "tiny_cpu_lora", "unverified", tgs=4500.0)
        rows = store.latest_by_point()
    plotting.plot_results(rows, tmp_path / "a", published=False)
    svg = (tmp_path / "a" / "methods_tiny-llama.svg").read_text()
    assert 'id="tgs-status-xtuner-lora-512-unverified"' in svg and 'id="tgs-bar-xtuner-lora-512' not in svg
    plotting.plot_results(rows, tmp_path / "b", published=False, include_unverified=True)
    svg = (tmp_path / "b" / "methods_tiny-llama.svg").read_text()
    assert 'id="tgs-bar-xtuner-lora-512-unverified"' in svg and 'id="tgs-bar-xtuner-full-512"' in svg
    # An ok run without a memory figure keeps its slot, labelled.
    assert 'id="mem-status-xtuner-full-512-no_figure"' in svg


def test_a_model_of_full_runs_only_has_no_methods_chart(rows, tmp_path):
    assert not [p for p in plotting.plot_results(rows, tmp_path) if p.name.startswith("methods_")]


def test_the_bars_legend_says_what_each_kind_of_bar_drawn_means():
    from matplotlib.figure import Figure

    from framework_bench.present.tgs_chart import _bar_keys
    ax = Figure().subplots()
    assert _bar_keys(ax) == []
    ax.vlines([1], [0], [1]).set_gid("tgs-spread-xtuner")
    assert [k.get_label() for k in _bar_keys(ax)] == ["bars: min-max over one trial's steps"]
    _, _, (stems,) = ax.errorbar([2], [1], yerr=[[0.1], [0.1]], fmt="none").lines
    stems.set_gid("tgs-ci-torch")
    assert [k.get_label() for k in _bar_keys(ax)] == ["bars: 95% interval of the median over trials",
                                                      "bars: min-max over one trial's steps"]
