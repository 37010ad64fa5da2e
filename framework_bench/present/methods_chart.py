"""The methods chart of one model: full / LoRA / QLoRA side by side per backend and context.

Its SVG gids: `<metric>-bar-<backend>-<method>-<context>` (`-unverified` added when it is),
`<metric>-failed-<backend>-<method>-<context>` (the x of a slot without a figure) and
`<metric>-status-<backend>-<method>-<context>-<status>` (its label; status also `not_run`,
`no_figure`), with metric `tgs` or `mem`.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from framework_bench.present.chart_style import (METHODS, METRICS, RC, ctx_label, gpus_label, hardware, method_of, save,
                                                 slug)


def plot_methods(model: str, rows: list[dict], out_dir: Path, shown: tuple[str, ...]) -> list[Path]:
    """`methods_<model>.png/.svg`: full / LoRA / QLoRA side by side per backend and context, TGS
    (left) and peak memory (right), the two things adapters trade. A slot whose run has no figure
    (failed, unsupported, not shown) keeps an x with the run's status, one never run says so.
    None where no context ran more than one method."""
    import matplotlib
    from matplotlib.figure import Figure
    from matplotlib.transforms import blended_transform_factory

    # Only a context where more than one method ran compares methods (a full-only context is the
    # TGS chart's): the main job's context sweep would otherwise be slots saying "not run".
    ran: dict[int, set[str]] = defaultdict(set)
    for r in rows:
        ran[r["context_length"]].add(method_of(r))
    rows = [r for r in rows if len(ran[r["context_length"]]) > 1]
    if not rows:
        return []
    methods = [m for m in METHODS if any(method_of(r) == m for r in rows)]
    groups = sorted({(r["backend"], r["context_length"]) for r in rows}, key=lambda g: (g[1], g[0]))
    contexts = sorted({c for _, c in groups})
    run = {(r["backend"], method_of(r), r["context_length"]): r for r in rows}
    colours = {m: matplotlib.colormaps["Set2"](i) for i, m in enumerate(METHODS)}
    width = 0.8 / len(methods)
    panels = (("tgs", METRICS[0][1], lambda r: r["tgs"], "{:,.0f}"),
              ("mem", "peak memory, GiB (allocated per GPU; max RSS on CPU)",
               lambda r: r["peak_mem_bytes"] and r["peak_mem_bytes"] / 2**30, "{:.1f}"))
    with matplotlib.rc_context(RC):
        fig = Figure(figsize=(13, 5.2), layout="constrained")
        for ax, (metric, ylabel, value, fmt) in zip(fig.subplots(1, 2), panels):
            bottom = blended_transform_factory(ax.transData, ax.transAxes)
            labelled: dict[str, tuple[int, bool]] = {}  # legend label -> its place: full, LoRA, QLoRA
            for g, (backend, context) in enumerate(groups):
                for k, method in enumerate(methods):
                    x = g + (k - (len(methods) - 1) / 2) * width
                    gid = f"{metric}-{{}}-{slug(backend)}-{method}-{ctx_label(context)}"
                    r = run.get((backend, method, context))
                    y = value(r) if r and r["status"] in shown else None
                    if y is not None:
                        unverified = r["status"] == "unverified"  # asked for: never drawn like a vouched figure
                        label = METHODS[method] + (" (unverified)" if unverified else "")
                        bar = ax.bar([x], [y], width * 0.9, color=colours[method], edgecolor="0.3",
                                     alpha=0.45 if unverified else 1, hatch="//" if unverified else None,
                                     label=None if label in labelled else label)
                        labelled[label] = (k, unverified)
                        bar[0].set_gid(gid.format("bar") + ("-unverified" if unverified else ""))
                        ax.bar_label(bar, [fmt.format(y)], fontsize=7, padding=2)
                        continue
                    if r is None:
                        status = "not run"
                    elif r["status"] in shown:  # a shown run without this figure (no memory reading)
                        status = "no figure"
                    else:
                        status = r["status"]
                    marker, = ax.plot([x], [0.03], transform=bottom, marker="x", markersize=9, markeredgewidth=2,
                                      color=colours[method], linestyle="none")
                    marker.set_gid(gid.format("failed"))
                    text = ax.annotate(status, (x, 0.03), xycoords=bottom, xytext=(0, 8), textcoords="offset points",
                                       rotation=90, ha="center", va="bottom", fontsize=8, color="0.3")
                    text.set_gid(gid.format("status") + f"-{slug(status)}")  # SVG text is drawn as paths
            ax.set_xticks(range(len(groups)), [b if len(contexts) == 1 else f"{b}\n{ctx_label(c)}" for b, c in groups])
            ax.set_xlim(-0.6, len(groups) - 0.4)
            ax.set_ylim(bottom=0, top=ax.get_ylim()[1] * 1.15)  # room for the value labels and the legend
            ax.set_ylabel(ylabel)
            ax.grid(True, axis="y", alpha=0.3)
            if labelled:  # a panel of failures only has no bars to name
                handles, labels = ax.get_legend_handles_labels()
                ordered = sorted(zip(handles, labels), key=lambda hl: labelled[hl[1]])
                ax.legend(*zip(*ordered), loc="best", fontsize=8, framealpha=0.9)
        at = ", ".join(ctx_label(c) for c in contexts)
        fig.suptitle(f"{model}: {' / '.join(METHODS[m] for m in methods)} fine-tuning at {at} context; "
                     f"{gpus_label(rows)} per run; measured on {hardware(rows)}", fontsize=12)
        return save(fig, Path(out_dir), f"methods_{slug(model)}")
