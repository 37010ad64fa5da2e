"""The charts of a set of results-store rows (the dicts `ResultStore.list()`/`latest_by_point()`
return): per model the TGS/TFLOPs chart (`tgs_chart`) and the methods chart (`methods_chart`),
per scenario the loss chart (`loss_chart`). What they share: `chart_style`.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from framework_bench.present.chart_style import DEFAULT_OUT, backend_colours, method_of
from framework_bench.present.loss_chart import plot_loss_curves
from framework_bench.present.methods_chart import plot_methods
from framework_bench.present.tgs_chart import plot_tgs, references
from framework_bench.present.verdict import Points
from framework_bench.scenario.scenario import load_all


def _latest_per_point(rows: list[dict]) -> list[dict]:
    """One row per backend x method x context (the newest), so a re-run replaces the older point
    and a LoRA run never replaces the full one of the same model and context."""
    latest: dict[tuple[str, str, int], dict] = {}
    for r in sorted(rows, key=lambda r: r.get("id") or 0):
        latest[(r["backend"], method_of(r), r["context_length"])] = r
    return list(latest.values())


def plot_results(rows: list[dict], out_dir: Path = DEFAULT_OUT, published: bool = True,
                 include_unverified: bool = False) -> list[Path]:
    """Per model: `tgs_tflops_<model>.png/.svg`, TGS and TFLOPs/GPU against context, a line per
    backend and method, and `methods_<model>.png/.svg` where it ran with more than one method;
    per scenario `loss_<scenario>.png/.svg`. `ok` runs only, and `unverified` ones (an
    old-contract plugin's missing claims) if asked."""
    shown = ("ok", "unverified") if include_unverified else ("ok",)
    scenarios = load_all() if published else []
    by_model: dict[str, list[dict]] = defaultdict(list)
    for r in _latest_per_point(Points(rows, reference=None).rows):  # the trials of a point as one, at their median
        by_model[r["model"]].append(r)
    colours = backend_colours(rows)
    paths: list[Path] = []
    for model, mrows in sorted(by_model.items()):
        refs = references(model, mrows, scenarios) if published else {}
        paths += plot_tgs(model, mrows, refs, colours, out_dir, shown)
        paths += plot_methods(model, mrows, out_dir, shown)
    return paths + plot_loss_curves(rows, out_dir, include_unverified)
