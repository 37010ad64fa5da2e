"""The published table alone, no runs needed: a chart per framework and GPU, a line per model."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from framework_bench.present.chart_style import (DEFAULT_OUT, METRICS, RC, context_axis, ctx_label, framework_names,
                                                 save, slug)
from framework_bench.scenario.scenario import Scenario, load_all


def plot_published(out_dir: Path = DEFAULT_OUT, scenarios: list[Scenario] | None = None) -> list[Path]:
    """The published table alone (no runs needed): `published_<framework>_<gpu>.png/.svg`, a line per model."""
    import matplotlib
    from matplotlib.figure import Figure

    scenarios = load_all() if scenarios is None else scenarios
    groups: dict[tuple[str, str], list[Scenario]] = defaultdict(list)
    for s in scenarios:
        if s.reference:
            groups[(s.reference.framework, s.reference.hardware)].append(s)
    paths: list[Path] = []
    names = framework_names()
    for (framework, hw), group in sorted(groups.items()):
        by_model: dict[str, list[Scenario]] = defaultdict(list)
        for s in group:
            by_model[s.model.preset or "inline"].append(s)
        contexts = sorted({s.context_length for s in group})
        name = names.get(framework, framework)
        with matplotlib.rc_context(RC):
            fig = Figure(figsize=(13, 5.2), layout="constrained")
            axes = fig.subplots(1, 2)
            ordered = sorted(by_model.items(), key=lambda kv: kv[1][0].arch.hidden_size)
            for ax, (metric, ylabel) in zip(axes, METRICS):
                for i, (model, ss) in enumerate(ordered):
                    ss = sorted(ss, key=lambda s: s.context_length)
                    colour = matplotlib.colormaps["tab10"](i)
                    line, = ax.plot([s.context_length for s in ss], [getattr(s.reference, metric) for s in ss],
                                    marker="o", linewidth=2, color=colour, label=f"{model} ({_gpus_by_context(ss)})")
                    line.set_gid(f"{metric}-line-{slug(model)}")
                _label_values(ax, [[(s.context_length, getattr(s.reference, metric)) for s in ss]
                                   for _, ss in ordered], metric)
                context_axis(ax, contexts)
                if metric == "tgs":
                    _log_y(ax)  # 7B and 70B differ by 10-100x: a linear axis flattens the big models
                else:
                    ax.set_ylim(0, max(s.reference.tflops for s in group) * 1.25)
                ax.set_ylabel(ylabel)
                ax.legend(loc="lower left", fontsize=8, framealpha=0.9)
            fig.suptitle(f"{name} published speed benchmark: full fine-tuning on packed Alpaca, {hw}", fontsize=12)
            gpu = slug(hw.split("-")[0].lower())
            paths += save(fig, Path(out_dir), f"published_{slug(framework)}_{gpu}")
    return paths


def _gpus_by_context(scenarios: list[Scenario]) -> str:
    """`8 GPUs`, or `8 GPUs; 32 at 1M` when some rows of the table used another count."""
    counts = [s.cluster.gpus for s in scenarios]
    usual = max(set(counts), key=counts.count)
    odd = [f"{s.cluster.gpus} at {ctx_label(s.context_length)}" for s in scenarios if s.cluster.gpus != usual]
    return "; ".join([f"{usual} GPUs", *odd])


def _label_values(ax, lines: list[list[tuple[int, float]]], metric: str) -> None:
    """Write each point's value where it does not hit its neighbours at the same context:
    the highest above, the lowest below, any in between to the right."""
    import matplotlib

    at: dict[int, list[tuple[float, int]]] = defaultdict(list)
    for i, pts in enumerate(lines):
        for x, y in pts:
            at[x].append((y, i))
    for x, ys in at.items():
        ys.sort()
        for rank, (y, i) in enumerate(ys):
            if rank == len(ys) - 1:
                offset, ha, va = (0, 6), "center", "bottom"
            elif rank == 0:
                offset, ha, va = (0, -7), "center", "top"
            else:
                offset, ha, va = (7, 0), "left", "center"
            ax.annotate(f"{y:,.0f}" if metric == "tgs" else f"{y:.0f}", (x, y), xytext=offset,
                        textcoords="offset points", ha=ha, va=va, fontsize=7,
                        color=matplotlib.colormaps["tab10"](i),
                        bbox={"boxstyle": "round,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.8})


def _log_y(ax) -> None:
    """A log y axis labelled with plain numbers (1, 2, 5 per decade) rather than powers of ten."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1, 2, 5)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    low, high = ax.get_ylim()
    ax.set_ylim(low / 1.5, high * 1.5)  # room for the value labels above and below the end points
