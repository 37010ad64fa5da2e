"""Charts: TGS and TFLOPs/GPU against context length, per model, from results-store rows.

Rows are the dicts `ResultStore.list()`/`latest_by_point()` return. matplotlib is imported
inside the drawing functions only (so `fbench --help` stays fast), and figures are drawn
on a bare `Figure` (Agg, no pyplot state). Each element a test or a reader may look for in
the SVG carries a gid: `<metric>-line-<series>`, `<metric>-ci-<series>` (the 95% interval
over trials, from two), `<metric>-spread-<series>` (min-max over steps, for a point of one
trial), `<metric>-line-published`,
`<metric>-failed-<series>-<context>` (the x of a point without a figure),
`<metric>-status-<series>-<context>-<status>` (its label), with metric `tgs` or `tflops` and
series the backend, `<backend>-lora` or `<backend>-qlora` for adapter runs. The methods chart
(full vs LoRA vs QLoRA) has `<metric>-bar-<backend>-<method>-<context>` (`-unverified` added
when it is), `<metric>-failed-...` and `<metric>-status-...-<status>` likewise (status also
`not_run`, `no_figure`), metric `tgs` or `mem`.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

from framework_bench.plugins import registry
from framework_bench.present.verdict import Points
from framework_bench.spec.scenario import Scenario, load_all

DEFAULT_OUT = Path("plots")
METRICS = (("tgs", "tokens / s / GPU (TGS)"), ("tflops", "TFLOPs / GPU (XTuner formula)"))
METHODS = {"full": "full", "lora": "LoRA", "qlora": "QLoRA"}  # in the order they are drawn
# One run per (backend, method) on a chart: the method by its line style and marker.
_METHOD_STYLE = {"full": ("-", "o"), "lora": ("--", "^"), "qlora": ("-.", "v")}
# Fixed so committed SVGs only change when the picture does.
_RC = {"svg.hashsalt": "fbench", "font.size": 10}
_SAVE_META = {"png": {"Software": None}, "svg": {"Date": None}}


def ctx_label(n: int) -> str:
    """512, 1k, 8k, 128k, 1M: binary multiples, as the published table writes them."""
    for div, suffix in ((1024 * 1024, "M"), (1024, "k")):
        if n % div == 0:
            return f"{n // div}{suffix}"
    return str(n)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "x"


def hardware(rows: list[dict]) -> str:
    """The machines the rows ran on, from their manifests (this machine when there are none)."""
    machines = [r["manifest"] for r in rows if r.get("manifest")]
    if not machines:
        from framework_bench.measure.machine import detect
        m = detect()
        machines = [{"gpu": m.gpu_name, "gpu_count": m.gpus, "cpu": m.cpu, "cpu_count": m.cpu_count}]
    names = []
    for m in machines:
        name = f"{m['gpu_count']} x {m['gpu']}" if m.get("gpu_count") else f"{m['cpu']} CPU x {m['cpu_count']}, no GPU"
        if name not in names:
            names.append(name)
    return " / ".join(names)


def gpus_label(rows: list[dict]) -> str:
    """What one run used: `8 GPUs`, `8/32 GPUs` across contexts, `1 process (CPU)`."""
    counts = sorted({r["gpus"] for r in rows})
    on_cpu = all(r.get("device") == "cpu" for r in rows)
    unit = ("process" if counts == [1] else "processes") + " (CPU)" if on_cpu else ("GPU" if counts == [1] else "GPUs")
    return f"{'/'.join(map(str, counts))} {unit}"


def framework_names() -> dict[str, str]:
    """How to name the framework a published figure is attributed to (a scenario's
    `reference.framework`, a backend name): the installed backend's own display name."""
    return {name: backend.info.framework for name, backend in registry.backends().items()}


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


def _context_axis(ax, contexts: list[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(contexts, [ctx_label(c) for c in contexts])
    ax.minorticks_off()
    ax.set_xlim(min(contexts) / 1.5, max(contexts) * 1.5)
    ax.set_xlabel("context length (tokens per packed row)")
    ax.grid(True, alpha=0.3)


def _save(fig, out_dir: Path, stem: str) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for ext in ("png", "svg"):
        path = out_dir / f"{stem}.{ext}"
        fig.savefig(path, dpi=120, metadata=_SAVE_META[ext])
        paths.append(path)
    return paths


def method_of(row: dict) -> str:
    """full, lora or qlora: a full fine-tuning scenario is stored without `finetune`."""
    return (row["scenario_json"].get("finetune") or {}).get("method", "full")


def _series(backend: str, method: str) -> tuple[str, str]:
    """The label and gid part of a backend's runs of one method: the backend alone for full
    fine-tuning, so the charts of full runs read as they did before the method axis."""
    if method == "full":
        return backend, _slug(backend)
    return f"{backend} {METHODS[method]}", f"{_slug(backend)}-{method}"


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
    backend and method, and `methods_<model>.png/.svg` where it ran with more than one method.
    `ok` runs only, and `unverified` ones (an old-contract plugin's missing claims) if asked."""
    shown = ("ok", "unverified") if include_unverified else ("ok",)
    import matplotlib
    from matplotlib.figure import Figure
    from matplotlib.transforms import blended_transform_factory

    scenarios = load_all() if published else []
    by_model: dict[str, list[dict]] = defaultdict(list)
    for r in _latest_per_point(Points(rows, reference=None).rows):  # the trials of a point as one, at their median
        by_model[r["model"]].append(r)
    backends = sorted({r["backend"] for r in rows})
    colours = {b: matplotlib.colormaps["tab10"](i % 10) for i, b in enumerate(backends)}
    paths: list[Path] = []
    for model, mrows in sorted(by_model.items()):
        refs = references(model, mrows, scenarios) if published else {}
        contexts = sorted({r["context_length"] for r in mrows}
                          | {p["context_length"] for pts in refs.values() for p in pts})
        series = sorted({(r["backend"], method_of(r)) for r in mrows},
                        key=lambda s: (s[0], list(METHODS).index(s[1])))
        with matplotlib.rc_context(_RC):
            fig = Figure(figsize=(13, 5.2), layout="constrained")
            axes = fig.subplots(1, 2)
            for ax, (metric, ylabel) in zip(axes, METRICS):
                bottom = blended_transform_factory(ax.transData, ax.transAxes)
                for i, (backend, method) in enumerate(series):
                    label, key = _series(backend, method)
                    linestyle, mark = _METHOD_STYLE[method]
                    brows = sorted((r for r in mrows if (r["backend"], method_of(r)) == (backend, method)),
                                   key=lambda r: r["context_length"])
                    ok = [r for r in brows if r["status"] in shown and r[metric] is not None]
                    verified = [r for r in ok if r["status"] == "ok"]
                    line, = ax.plot([r["context_length"] for r in verified], [r[metric] for r in verified],
                                    marker=mark, linestyle=linestyle, color=colours[backend], linewidth=2,
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
                    # Points without a figure stay visible: an x at the foot of the axis, with the status.
                    y = 0.04 + 0.07 * i
                    for r in (r for r in brows if r not in ok):
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
                _context_axis(ax, contexts)
                ax.set_ylim(bottom=0, top=ax.get_ylim()[1] * 1.12)  # headroom keeps the legend off the lines
                ax.set_ylabel(ylabel)
                if ax.get_legend_handles_labels()[0]:  # failures only: their x marks say it all
                    ax.legend(loc="best", fontsize=8, framealpha=0.9)
            modes = "/".join(sorted({r.get("settings_mode") or "matched" for r in mrows}))
            fig.suptitle(f"{model}: {gpus_label(mrows)} per run; measured on {hardware(mrows)}; "
                         f"{modes} settings", fontsize=12, gid=f"settings-{modes}")
            paths += _save(fig, Path(out_dir), f"tgs_tflops_{_slug(model)}")
        if len({method for _, method in series}) > 1:
            paths += _plot_methods(model, mrows, out_dir, shown)
    return paths + plot_loss_curves(rows, out_dir, include_unverified)


def _plot_methods(model: str, rows: list[dict], out_dir: Path, shown: tuple[str, ...]) -> list[Path]:
    """`methods_<model>.png/.svg`: full / LoRA / QLoRA side by side per backend and context, TGS
    (left) and peak memory (right), the two things adapters trade. A slot whose run has no figure
    (failed, unsupported, not shown) keeps an x with the run's status, one never run says so."""
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
    with matplotlib.rc_context(_RC):
        fig = Figure(figsize=(13, 5.2), layout="constrained")
        for ax, (metric, ylabel, value, fmt) in zip(fig.subplots(1, 2), panels):
            bottom = blended_transform_factory(ax.transData, ax.transAxes)
            labelled: dict[str, tuple[int, bool]] = {}  # legend label -> its place: full, LoRA, QLoRA
            for g, (backend, context) in enumerate(groups):
                for k, method in enumerate(methods):
                    x = g + (k - (len(methods) - 1) / 2) * width
                    gid = f"{metric}-{{}}-{_slug(backend)}-{method}-{ctx_label(context)}"
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
                    text.set_gid(gid.format("status") + f"-{_slug(status)}")  # SVG text is drawn as paths
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
        return _save(fig, Path(out_dir), f"methods_{_slug(model)}")


def plot_loss_curves(rows: list[dict], out_dir: Path = DEFAULT_OUT, include_unverified: bool = False) -> list[Path]:
    """Per scenario: `loss_<scenario>.png/.svg`, the canonical loss per optimizer step (the token
    mean, framework_bench/measure/losses.py) of each backend's latest run: from the same initial
    weights and rows, backends that computed the same steps draw one curve. `ok` runs only, and
    `unverified` ones, dotted and labelled so, if asked."""
    shown = ("ok", "unverified") if include_unverified else ("ok",)
    import matplotlib
    from matplotlib.figure import Figure

    latest: dict[tuple[str, str], dict] = {}  # the newest run per scenario and backend
    for r in sorted(rows, key=lambda r: r.get("id") or 0):
        if r.get("loss_curve") and r["status"] in shown:
            latest[(r["scenario"], r["backend"])] = r
    by_scenario: dict[str, list[dict]] = defaultdict(list)
    for (scenario, _), r in latest.items():
        by_scenario[scenario].append(r)
    backends = sorted({r["backend"] for r in rows})
    colours = {b: matplotlib.colormaps["tab10"](i % 10) for i, b in enumerate(backends)}
    paths: list[Path] = []
    for name, runs in sorted(by_scenario.items()):
        with matplotlib.rc_context(_RC):
            fig = Figure(figsize=(7, 4.5), layout="constrained")
            ax = fig.subplots()
            # Identical curves would hide each other: later backends are drawn thinner, on top.
            for i, r in enumerate(sorted(runs, key=lambda r: r["backend"])):
                curve = sorted((int(step), loss) for step, loss in r["loss_curve"].items())
                unverified = r["status"] == "unverified"
                line, = ax.plot([s for s, _ in curve], [loss for _, loss in curve], marker="o", markersize=4,
                                linewidth=max(4 - 1.2 * i, 1), color=colours[r["backend"]],
                                linestyle=":" if unverified else "-", markerfacecolor="none" if unverified else None,
                                label=f"{r['backend']} (seed {r.get('seed')}{', unverified' if unverified else ''})")
                line.set_gid(f"loss-line-{_slug(r['backend'])}" + ("-unverified" if unverified else ""))
            ax.set_xlabel("optimizer step")
            ax.set_ylabel("loss (token mean over the step)")
            ax.legend(loc="best", fontsize=8, framealpha=0.9)
            fig.suptitle(f"{name}: loss per step", fontsize=12)
            paths += _save(fig, Path(out_dir), f"loss_{_slug(name)}")
    return paths


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
        with matplotlib.rc_context(_RC):
            fig = Figure(figsize=(13, 5.2), layout="constrained")
            axes = fig.subplots(1, 2)
            ordered = sorted(by_model.items(), key=lambda kv: kv[1][0].arch.hidden_size)
            for ax, (metric, ylabel) in zip(axes, METRICS):
                for i, (model, ss) in enumerate(ordered):
                    ss = sorted(ss, key=lambda s: s.context_length)
                    colour = matplotlib.colormaps["tab10"](i)
                    line, = ax.plot([s.context_length for s in ss], [getattr(s.reference, metric) for s in ss],
                                    marker="o", linewidth=2, color=colour, label=f"{model} ({_gpus_by_context(ss)})")
                    line.set_gid(f"{metric}-line-{_slug(model)}")
                _label_values(ax, [[(s.context_length, getattr(s.reference, metric)) for s in ss]
                                   for _, ss in ordered], metric)
                _context_axis(ax, contexts)
                if metric == "tgs":
                    _log_y(ax)  # 7B and 70B differ by 10-100x: a linear axis flattens the big models
                else:
                    ax.set_ylim(0, max(s.reference.tflops for s in group) * 1.25)
                ax.set_ylabel(ylabel)
                ax.legend(loc="lower left", fontsize=8, framealpha=0.9)
            fig.suptitle(f"{name} published speed benchmark: full fine-tuning on packed Alpaca, {hw}", fontsize=12)
            gpu = _slug(hw.split("-")[0].lower())
            paths += _save(fig, Path(out_dir), f"published_{_slug(framework)}_{gpu}")
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
