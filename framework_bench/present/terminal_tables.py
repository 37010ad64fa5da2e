"""The tables fbench prints in a terminal: a compare's runs, a backend check's points, the stored
runs, the scenarios (each a `FittedTable`, fitted to the terminal's width), the installed backends
and their envs; and how their cells write figures."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table
from rich.text import Text

from framework_bench.present.fitted_table import Col, FittedTable

if TYPE_CHECKING:
    from framework_bench.present.verdict import Points


def fmt(x: float | None, spec: str = ",.1f") -> str:
    return "-" if x is None else format(x, spec)


def gib(n: int | None) -> str:
    return "-" if not n else f"{n / 2**30:.2f} GiB"


def status_text(status: str) -> Text:
    return Text(status, style="green" if status == "ok" else ("yellow" if status in ("unsupported", "unverified")
                                                               else "red"))


def is_startup_breakdown(note: str) -> bool:
    """The start-up breakdown a worker adds to its notes (worker/startup.py's `startup_note`):
    shown with --verbose, in the report and in `results show`, not in the tables."""
    return note.startswith("start-up ") and ": " in note


def results_table(points: Points, scenarios_by_name, wide: bool = False, verbose: bool = False) -> FittedTable:
    """The runs of a compare (and of the device check), one row per backend x scenario over its
    trials: the median TGS and % of the reference with their 95% intervals from two trials,
    headline figures first, notes as footnotes."""
    from framework_bench.present.verdict import noise_note, share_cell, tgs_cell
    t = FittedTable("compare", [
        Col("scenario"), Col("backend"), Col("status"), Col("trials", "right"), Col("TGS", "right"),
        Col(f"% of {points.reference or 'reference'}", "right"), Col("TGS min–max", "right"),
        Col("TFLOPs/GPU", "right"), Col("MFU", "right"), Col("peak mem", "right"), Col("reserved", "right"),
        Col("start-up", "right"), Col("published TGS", "right"), Col("notes", kind="notes")],
        title="fbench compare", wide=wide)
    for r in points.rows:
        s = scenarios_by_name.get(r["scenario"])
        summary = points.summaries[r["scenario"], r["backend"]]
        disturbed = (r["scenario"], r["backend"]) in points.disturbed
        t.add_row(r["scenario"], r["backend"], status_text(r["status"]) + (" · disturbed" if disturbed else ""),
                  "" if summary.trials <= 1 else str(summary.trials),  # one trial: the column is left out
                  tgs_cell(summary) if summary.trials else fmt(r["tgs"]),  # no trial counts: the run's own figure
                  share_cell(points.shares.get((r["scenario"], r["backend"]))),
                  f"{fmt(r['tgs_min'])}–{fmt(r['tgs_max'])}" if r["tgs_min"] is not None else "-",
                  fmt(r["tflops"], ".3g"), "-" if r["mfu"] is None else f"{r['mfu'] * 100:.1f}%",
                  gib(r["peak_mem_bytes"]), gib(r["peak_reserved_bytes"]),
                  "-" if r["startup_seconds"] is None else f"{r['startup_seconds']:.1f} s",
                  f"{s.reference.tgs:,.1f} ({s.reference.hardware})" if s and s.reference else "-",
                  r["flags"] + [n for n in r["notes"] if verbose or not is_startup_breakdown(n)] + noise_note(summary))
    return t


def points_table(name: str, report) -> FittedTable:
    """`fbench check-backend`: each point, its verdict and why."""
    t = FittedTable("check-backend", [Col("point"), Col("verdict"), Col("detail", kind="prose")],
                    title=f"fbench check-backend {name} ({report.scenario})")
    for p in report.points:
        t.add_row(p.name, Text(p.status, style={"pass": "green", "skipped": "yellow"}.get(p.status, "red")), p.detail)
    return t


def by_compare(rows: list[dict]) -> dict:
    """Stored rows by the compare they are trials of, in the order of each compare's first row
    (rows from before trials: each alone)."""
    compares: dict = {}
    for r in rows:
        compares.setdefault(r["compare_id"] or r["id"], []).append(r)
    return compares


def stored_runs_table(compares: dict, wide: bool = False) -> FittedTable:
    """`fbench results list`: one line per stored run (`by_compare`), the trials of one compare
    together, each backend's in round order."""
    t = FittedTable("results list", [
        Col("id", "right"), Col("created"), Col("compare"), Col("round", "right"), Col("scenario"), Col("backend"),
        Col("version"), Col("settings"), Col("status"), Col("TGS", "right"), Col("TFLOPs/GPU", "right"),
        Col("steps", "right"), Col("data sha256")],
        more="--wide, or `fbench results export --format json`", wide=wide)
    for trials in compares.values():
        for r in sorted(trials, key=lambda r: (r["scenario"], r["backend"], r["trial_round"] or 0)):
            t.add_row(str(r["id"]), r["created_at"], r["compare_id"] or "-",
                      "-" if r["trial_round"] is None else f"{r['trial_round']}·{r['trial_position']}",
                      r["scenario"], r["backend"], r["framework_version"] or "-",
                      r["settings_mode"], status_text(r["status"]), fmt(r["tgs"]), fmt(r["tflops"], ".3g"),
                      f"{r['steps_measured'] or 0}" + (" micro" if r.get("step_unit") == "micro" else ""),
                      (r["data_sha256"] or "-")[:12])
    return t


def scenarios_table(wide: bool = False) -> FittedTable:
    """`fbench scenarios`: every scenario file found, the bundled ones and the user's, a file that
    does not validate on a line of its own saying why."""
    from framework_bench.present.chart_style import ctx_label
    from framework_bench.scenario import scenario
    t = FittedTable("scenarios", [
        Col("name"), Col("model"), Col("device"), Col("GPUs", "right"), Col("context", "right"), Col("SP", "right"),
        Col("ZeRO", "right"), Col("published TGS", "right"), Col("notes", kind="notes")],
        more="--wide, or `fbench show NAME`", wide=wide)
    for p in scenario.scenario_paths():
        try:
            s = scenario.load_file(p)
        except scenario.ScenarioError as e:
            t.add_row(p.stem, Text("invalid", style="red"), "", "", "", "", "", "", [str(e).splitlines()[0]])
            continue
        notes = [f"yours ({p}), over the bundled one"] if scenario.shadowing(p) else []
        t.add_row(s.name, s.model.preset or "inline", s.cluster.device, str(s.cluster.gpus), ctx_label(s.context_length),
                  str(s.sequence_parallel), str(s.zero_stage), fmt(s.reference.tgs if s.reference else None), notes)
    return t


def backends_table() -> Table:
    """`fbench backends`: each installed backend, its env and capabilities; the broken ones with why."""
    from framework_bench.envs import venvs as envs
    from framework_bench.plugins import registry as plugins
    t = Table("backend", "framework", "version", "env", "capabilities")
    for name, b in plugins.backends().items():
        info = b.info
        env = envs.inspect(name, info.env)
        c = info.capabilities
        caps = ", ".join(k for k in ("cpu", "gpu", "sequence_parallel", "varlen") if getattr(c, k))
        caps += f", ZeRO {'/'.join(map(str, c.zero_stages))}"
        state = f"[green]ready ({env.flavour})[/green]" if env.ready else f"[yellow]{env.problem}[/yellow]"
        t.add_row(name, info.framework, env.version(info.env.framework_package) or "-", state, caps)
    for name, problem in plugins.load_errors.items():
        t.add_row(name, "-", "-", f"[red]failed to load: {problem}[/red]", "-")
    return t


def envs_table() -> Table:
    """`fbench env list`: each backend's env, its path, flavour, versions and state; then the envs
    made for a backend at a version (`plugins/pins.py`) whose plugin is installed."""
    from framework_bench.envs import venvs as envs
    from framework_bench.plugins import pins, registry as plugins
    t = Table("backend", "path", "flavour", "framework", "torch", "transformers", "state")
    made = sorted(p.name for p in (envs.fbench_home() / "envs").glob(f"*{pins.SEP}*") if p.is_dir())
    for name, b in plugins.backends(pinned=made).items():
        e = envs.inspect(name, b.info.env)
        t.add_row(name, str(e.path), e.flavour or "-", e.version(b.info.env.framework_package) or "-",
                  e.version("torch") or "-", e.version("transformers") or "-",
                  "[green]ok[/green]" if e.ready else f"[yellow]{e.problem}[/yellow]")
    return t
