"""`fbench history --out DIR`: one chart per scenario and machine, each backend's series of
compares (median TGS, its 95 % interval as a bar) in the order `history` read them, and each
change point `change_points.find` named drawn where it came in."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from framework_bench.present.chart_style import RC, save, slug
from framework_bench.present.history import Series


def plot_history(all_series: list[Series], out_dir: Path) -> list[Path]:
    """`history_<scenario>_<machine>.png` and `.svg` per scenario and machine with a series of two
    or more compares; the paths written."""
    import matplotlib
    from matplotlib.figure import Figure

    charts: dict[tuple[str, str], list[Series]] = defaultdict(list)
    for s in all_series:
        if len(s.points) >= 2:
            charts[s.scenario, s.machine].append(s)
    paths: list[Path] = []
    for (scenario, machine), group in charts.items():
        with matplotlib.rc_context(RC):
            fig = Figure(figsize=(9, 4.5), layout="constrained")
            ax = fig.add_subplot()
            colours = matplotlib.colormaps["tab10"]
            for i, s in enumerate(group):
                x = list(range(1, len(s.points) + 1))
                y = [p.median for p in s.points]
                low = [p.median - p.low if p.low is not None else 0.0 for p in s.points]
                high = [p.high - p.median if p.high is not None else 0.0 for p in s.points]
                ax.errorbar(x, y, yerr=[low, high], marker="o", ms=4, capsize=3, color=colours(i % 10),
                            label=s.backend)
                for c in s.changes or []:
                    ax.axvline(c.at + 0.5, color=colours(i % 10), ls="--", lw=1)
                    ax.annotate(f"{s.backend} {c.ratio - 1:+.0%}", (c.at + 0.5, max(y)), rotation=90,
                                va="top", ha="right", fontsize=8, color=colours(i % 10))
            longest = max(group, key=lambda s: len(s.points))
            ax.set_xticks(range(1, len(longest.points) + 1),
                          [f"{p.date}\n{p.compare[:15]}" for p in longest.points], fontsize=7, rotation=45, ha="right")
            ax.set_ylabel("tokens / s / GPU (TGS), median and 95% interval")
            ax.set_title(f"{scenario} on {machine}: each compare in order, change points dashed")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
            paths += save(fig, out_dir, f"history_{slug(scenario)}_{slug(machine)}")
    return paths
