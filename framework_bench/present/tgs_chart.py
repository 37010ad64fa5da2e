"""The TGS and TFLOPs/GPU chart of one model: a line per backend and method against context
length, the published figures beside them.

Each element a test or a reader may look for in the SVG carries a gid: `<metric>-line-<series>`,
`<metric>-ci-<series>` (the 95% interval over trials, from two), `<metric>-spread-<series>`
(min-max over steps, for a point of one trial), `<metric>-line-published`,
`<metric>-failed-<series>-<context>` (the x of a point without a figure),
`<metric>-status-<series>-<context>-<status>` (its label), with metric `tgs` or `tflops` and
series the backend, `<backend>-lora` or `<backend>-qlora` for adapter runs.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from framework_bench.present.chart_style import (METHODS, METRICS, RC, context_axis, ctx_label, framework_names,
                                                 gpus_label, hardware, method_of, save, slug)
from framework_bench.scenario.scenario import Scenario

# One run per (backend, method) on a chart: the method by its line style and marker.
_METHOD_STYLE = {"full": ("-", "o"), "lora": ("--", "^"), "qlora": ("-.", "v")}


def references(model: str, rows: list[dict], scenarios: list[Scenario] | None = None) -> dict[str, list[dict]]:
    """Published points for `model`, by line label: from the rows' scenarios and the scenario files."""
    specs = [r["scenario_json"] for r in rows] + [s.model_dump(mode="json") for s in (scenarios or [])]
    points: dict[str, dict[int, dict]] = defaultdict(dict)
    names = framework_names()
    for spec in specs:
        ref = spec.get("reference")
        if not ref or (spec["model"].get("preset") or "inline") != model:
            continue
        label = f"{names.get(ref['framework'], ref['framework'])} published ({ref['hardware']})"
        points[label].setdefault(spec["context_length"], {
            "context_length": spec["context_length"], "tgs": ref["tgs"], "tflops": ref["tflops"],
            "gpus": spec["cluster"]["gpus"]})
    return {label: sorted(p.values(), key=lambda p: p["context_length"]) for label, p in points.items()}


def _series(backend: str, method: str) -> tuple[str, str]:
    """The label and gid part of a backend's runs of one method: the backend alone for full
    fine-tuning, so the charts of full runs read as they did before the method axis."""
    if method == "full":
        return backend, slug(backend)
    return f"{backend} {METHODS[method]}", f"{slug(backend)}-{method}"


def plot_tgs(model: str, rows: list[dict], refs: dict[str, list[dict]], colours: dict, out_dir: Path,
             shown: tuple[str, ...]) -> list[Path]:
    """`tgs_tflops_<model>.png/.svg`: TGS (left) and TFLOPs/GPU (right) of the model's `rows`
    (one per backend, method and context) and its published points `refs` (`references`)."""
    import matplotlib
    from matplotlib.figure import Figure
    from matplotlib.transforms import blended_transform_factory

    contexts = sorted({r["context_length"] for r in rows} | {p["context_length"] for pts in refs.values() for p in pts})
    series = sorted({(r["backend"], method_of(r)) for r in rows}, key=lambda s: (s[0], list(METHODS).index(s[1])))
    with matplotlib.rc_context(RC):
        fig = Figure(figsize=(13, 5.2), layout="constrained")
        axes = fig.subplots(1, 2)
        for ax, (metric, ylabel) in zip(axes, METRICS):
            bottom = blended_transform_factory(ax.transData, ax.transAxes)
            band, lane = 0.0, 0  # the axis fraction the marks of points without a figure take, below zero; their row
            for i, (backend, method) in enumerate(series):
                label, key = _series(backend, method)
                linestyle, mark = _METHOD_STYLE[method]
                brows = sorted((r for r in rows if (r["backend"], method_of(r)) == (backend, method)),
                               key=lambda r: r["context_length"])
                ok = [r for r in brows if r["status"] in shown and r[metric] is not None]
                verified = [r for r in ok if r["status"] == "ok"]
                line, = ax.plot([r["context_length"] for r in verified], [r[metric] for r in verified],
                                marker=mark, linestyle=linestyle, color=colours[backend], linewidth=2,
                                # adapters' markers hollow and larger: a LoRA point on a full one shows both
                                markersize=6 if method == "full" else 9,
                                markerfacecolor=colours[backend] if method == "full" else "none",
                                # a series without a figure (QLoRA on CPU) has its x marks, no legend entry
                                label=label if verified else f"_{label}")
                line.set_gid(f"{metric}-line-{key}")
                unverified = [r for r in ok if r["status"] == "unverified"]
                if unverified:  # asked for: a figure no check vouches for is never drawn like one that is
                    line, = ax.plot([r["context_length"] for r in unverified], [r[metric] for r in unverified],
                                    marker=mark, markerfacecolor="none", linestyle=":", color=colours[backend],
                                    label=f"{label} (unverified)", linewidth=1.5)
                    line.set_gid(f"{metric}-line-{key}-unverified")
                dodge = 2 ** (0.03 * (i - (len(series) - 1) / 2))  # the series' bars side by side
                # The 95% interval of the median over trials (TFLOPs scale with TGS) as an error bar.
                trials = [r for r in ok if r.get("tgs_low") is not None]
                if trials:
                    y = [r[metric] for r in trials]
                    bars = ax.errorbar([r["context_length"] * dodge for r in trials], y, yerr=[
                        [v - v * r["tgs_low"] / r["tgs"] for v, r in zip(y, trials)],
                        [v * r["tgs_high"] / r["tgs"] - v for v, r in zip(y, trials)]],
                        fmt="none", ecolor=colours[backend], capsize=4, linewidth=1.5)
                    _, _, (stems,) = bars.lines  # the container has no gid of its own: its bars carry it
                    stems.set_gid(f"{metric}-ci-{key}")
                # A point of one trial: the step-to-step spread (min-max of step TGS) as a bar instead.
                spread = [r for r in ok if r.get("tgs_low") is None and r["tgs_min"] is not None
                          and r["tgs_max"] is not None and r["tgs"]]
                if spread:
                    bars = ax.vlines([r["context_length"] * dodge for r in spread],
                                     [r[metric] * r["tgs_min"] / r["tgs"] for r in spread],
                                     [r[metric] * r["tgs_max"] / r["tgs"] for r in spread],
                                     color=colours[backend], alpha=0.5, linewidth=4)
                    bars.set_gid(f"{metric}-spread-{key}")
                # Points without a figure stay visible: an x in a shaded band below zero (no TGS is
                # there), with the status.
                missing = [r for r in brows if r not in ok]
                y = 0.03 + 0.05 * lane
                lane += bool(missing)
                for r in missing:
                    band = max(band, y + 0.03)
                    marker, = ax.plot([r["context_length"]], [y], transform=bottom, marker="x", markersize=9,
                                      markeredgewidth=2, color=colours[backend], linestyle="none")
                    marker.set_gid(f"{metric}-failed-{key}-{ctx_label(r['context_length'])}")
                    last = r["context_length"] == contexts[-1]  # write inwards so the text stays inside
                    status = r["status"] if method == "full" else f"{METHODS[method]} {r['status']}"
                    text = ax.annotate(status, (r["context_length"], y), xycoords=bottom,
                                       xytext=(-7 if last else 7, 0), textcoords="offset points",
                                       ha="right" if last else "left", va="center", fontsize=8,
                                       color=colours[backend])
                    # SVG text is drawn as paths, so the status is also spelled out in the gid.
                    text.set_gid(f"{metric}-status-{key}-{ctx_label(r['context_length'])}-{r['status']}")
            for label, pts in refs.items():
                line, = ax.plot([p["context_length"] for p in pts], [p[metric] for p in pts], linestyle="--",
                                marker="s", markersize=5, color="0.35", label=label)
                line.set_gid(f"{metric}-line-published")
            context_axis(ax, contexts)
            top = ax.get_ylim()[1] * 1.12  # headroom keeps the legend off the lines
            if band:  # the marks' band below zero: the axis fraction `band` maps to [-x, 0]
                ax.set_ylim(bottom=-top * band / (1 - band), top=top)
                ax.axhspan(-top * band / (1 - band), 0, color="0.93", zorder=0, gid=f"{metric}-no-figure-band")
                ax.set_yticks([t for t in ax.get_yticks() if 0 <= t <= top])
                ax.set_ylim(bottom=-top * band / (1 - band), top=top)
            else:
                ax.set_ylim(bottom=0, top=top)
            ax.set_ylabel(ylabel)
            handles, labels = ax.get_legend_handles_labels()
            handles += _bar_keys(ax)
            if handles:  # failures only: their x marks say it all
                ax.legend(handles=handles, loc="best", fontsize=8, framealpha=0.9)
        modes = "/".join(sorted({r.get("settings_mode") or "matched" for r in rows}))
        trials = sorted({r.get("trials") or 1 for r in rows if r["status"] in shown and r["tgs"] is not None}) or [0]
        counted = f"{trials[0]} trial" if trials == [1] else f"{trials[0]}-{trials[-1]} trials"
        fig.suptitle(f"{model}: {', '.join(dict.fromkeys(b for b, _ in series))} by context length, {counted} per "
                     f"point\n{gpus_label(rows)} per run; measured on {hardware(rows)}; {modes} settings",
                     fontsize=12, gid=f"settings-{modes}")
        return save(fig, Path(out_dir), f"tgs_tflops_{slug(model)}")


def _bar_keys(ax) -> list:
    """Legend keys saying what the chart's vertical bars are (each kind that is drawn): the 95%
    interval of the median over trials, or, for a point of one trial, min-max over its steps."""
    from matplotlib.lines import Line2D
    gids = {child.get_gid() or "" for child in ax.get_children()}
    keys = []
    if any("-ci-" in g for g in gids):
        keys.append(Line2D([], [], color="0.3", linewidth=1.5, marker="_", markersize=8,
                           label="bars: 95% interval of the median over trials"))
    if any("-spread-" in g for g in gids):
        keys.append(Line2D([], [], color="0.3", alpha=0.5, linewidth=4, label="bars: min-max over one trial's steps"))
    return keys
