"""The loss chart of one scenario: the canonical loss per optimizer step of each backend's latest run."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from framework_bench.present.chart_style import DEFAULT_OUT, RC, backend_colours, save, slug


def plot_loss_curves(rows: list[dict], out_dir: Path = DEFAULT_OUT, include_unverified: bool = False) -> list[Path]:
    """Per scenario: `loss_<scenario>.png/.svg`, the canonical loss per optimizer step (the token
    mean, framework_bench/measure/losses.py) of each backend's latest run: from the same initial
    weights and rows, backends that computed the same steps draw one curve. `ok` runs only, and
    `unverified` ones, dotted and labelled so, if asked."""
    shown = ("ok", "unverified") if include_unverified else ("ok",)
    import matplotlib
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    latest: dict[tuple[str, str], dict] = {}  # the newest run per scenario and backend
    for r in sorted(rows, key=lambda r: r.get("id") or 0):
        if r.get("loss_curve") and r["status"] in shown:
            latest[(r["scenario"], r["backend"])] = r
    by_scenario: dict[str, list[dict]] = defaultdict(list)
    for (scenario, _), r in latest.items():
        by_scenario[scenario].append(r)
    colours = backend_colours(rows)
    paths: list[Path] = []
    for name, runs in sorted(by_scenario.items()):
        with matplotlib.rc_context(RC):
            fig = Figure(figsize=(7, 4.5), layout="constrained")
            ax = fig.subplots()
            # Identical curves would hide each other: later backends are drawn thinner, on top, each
            # 1.2 points under the one before it, the last at 1 (five backends: 5.8 down to 1).
            for i, r in enumerate(sorted(runs, key=lambda r: r["backend"])):
                curve = sorted((int(step), loss) for step, loss in r["loss_curve"].items())
                unverified = r["status"] == "unverified"
                line, = ax.plot([s for s, _ in curve], [loss for _, loss in curve], marker="o", markersize=4,
                                linewidth=1 + 1.2 * (len(runs) - 1 - i), color=colours[r["backend"]],
                                linestyle=":" if unverified else "-", markerfacecolor="none" if unverified else None,
                                label=f"{r['backend']} (seed {r.get('seed')}{', unverified' if unverified else ''})")
                line.set_gid(f"loss-line-{slug(r['backend'])}" + ("-unverified" if unverified else ""))
            ax.set_xlabel("optimizer step")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole: no 1.25
            ax.set_ylabel("loss (token mean over the step)")
            ax.legend(loc="best", fontsize=8, framealpha=0.9)
            fig.suptitle(f"{name}: loss per step", fontsize=12)
            paths += save(fig, Path(out_dir), f"loss_{slug(name)}")
    return paths
