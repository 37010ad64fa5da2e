"""The `fbench` command line. Heavy imports happen inside commands so `--help` stays fast."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Column, Table

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="Benchmark fine-tuning frameworks on identical packed-Alpaca scenarios.")
env_app = typer.Typer(no_args_is_help=True, help="Each backend's own virtual environment.")
app.add_typer(env_app, name="env")
results_app = typer.Typer(no_args_is_help=True, help="The results store (SQLite).")
app.add_typer(results_app, name="results")
DbOption = Annotated[Optional[Path], typer.Option("--db", help="SQLite results file (default: .fbench/results)")]
OutOption = Annotated[Path, typer.Option("--out", help="folder for charts and the report")]

# Piped output keeps whole table rows readable instead of wrapping at 80 columns.
console = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True)


def fail(message: str, code: int = 1) -> None:
    for line in message.splitlines():
        err.print(f"[red]error:[/red] {escape(line)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _user_errors():
    """Exceptions that are the user's to fix: shown as one line each, never a traceback."""
    from framework_bench.data.alpaca import DataError
    from framework_bench.envs import EnvError
    from framework_bench.plugins import UnknownBackend
    from framework_bench.scenario import ScenarioError
    return (ScenarioError, UnknownBackend, DataError, EnvError)


def _load(name: str):
    from framework_bench import scenario
    try:
        return scenario.load(name)
    except _user_errors() as e:
        fail(str(e))


def _fmt(x: float | None, spec: str = ",.1f") -> str:
    return "-" if x is None else format(x, spec)


def _ctx(n: int) -> str:
    for div, suffix in ((1024 * 1024, "M"), (1024, "k")):
        if n % div == 0:
            return f"{n // div}{suffix}"
    return str(n)


@app.command()
def scenarios() -> None:
    """List the scenarios in scenarios/."""
    from framework_bench import scenario
    t = Table(Column("name", no_wrap=True), "model", "device", "GPUs", "context", "SP", "ZeRO", "published TGS")
    for p in scenario.scenario_paths():
        try:
            s = scenario.load_file(p)
        except scenario.ScenarioError as e:
            t.add_row(p.stem, f"[red]invalid: {str(e).splitlines()[0]}[/red]", "", "", "", "", "", "")
            continue
        t.add_row(s.name, s.model.preset or "inline", s.cluster.device, str(s.cluster.gpus), _ctx(s.context_length),
                  str(s.sequence_parallel), str(s.zero_stage), _fmt(s.reference.tgs if s.reference else None))
    console.print(t)


def scenario_summary(s) -> dict:
    from framework_bench import flops
    from framework_bench.memory import estimate
    recompute = s.activation_checkpointing
    xt = flops.xtuner_flops_per_token(s.arch, s.context_length, recompute)
    model = flops.model_flops_per_token(s.arch, s.context_length, recompute)
    out = {
        "name": s.name, "gpus": s.cluster.gpus, "nodes": s.cluster.nodes, "gpus_per_node": s.cluster.gpus_per_node,
        "context_length": s.context_length, "sequence_parallel": s.sequence_parallel,
        "reference": s.reference.model_dump() if s.reference else None,
        "flops": {"xtuner_per_token": xt, "model_per_token": model},
        "scenario": s.model_dump(mode="json"),
        "model": s.arch.model_dump(),
        "memory": estimate(s, gpu=s.reference.hardware if s.reference else None),
    }
    if s.reference:
        out["flops"]["xtuner_tflops_at_reference_tgs"] = flops.tflops(s.reference.tgs, xt)
        out["flops"]["model_tflops_at_reference_tgs"] = flops.tflops(s.reference.tgs, model)
    return out


@app.command()
def show(name: str, as_json: Annotated[bool, typer.Option("--json", help="one JSON object")] = False) -> None:
    """Show a validated scenario with its FLOPs per token by both formulas."""
    s = _load(name)
    info = scenario_summary(s)
    if as_json:
        print(json.dumps({**info, "memory": info["memory"].model_dump()}, indent=2))
        return
    console.print(f"[bold]{s.name}[/bold]  {s.description}")
    a = s.arch
    console.print(f"model      {s.model.preset or 'inline'}: hidden {a.hidden_size}, layers {a.num_hidden_layers}, "
                  f"heads {a.num_attention_heads}/{a.num_key_value_heads} KV, ffn {a.intermediate_size}, vocab {a.vocab_size}")
    console.print(f"cluster    {s.cluster.nodes} node(s) x {s.cluster.gpus_per_node} {s.cluster.device} = {s.cluster.gpus}")
    console.print(f"training   context {s.context_length:,} ({_ctx(s.context_length)}), SP {s.sequence_parallel}, "
                  f"micro batch {s.micro_batch}, grad accum {s.grad_accum}, ZeRO {s.zero_stage}, "
                  f"checkpointing {s.activation_checkpointing}, {s.precision}, attention {s.attention}")
    console.print(f"steps      {s.steps.warmup} warm-up + {s.steps.measured} measured; {s.rows_needed} rows needed")
    f = info["flops"]
    console.print(f"FLOPs/tok  XTuner formula {f['xtuner_per_token']:.4g}; model (GQA-exact) {f['model_per_token']:.4g}")
    console.print(f"memory     {info['memory'].summary()}",
                  highlight=False)
    if s.reference:
        r = s.reference
        console.print(f"published  {r.framework} on {r.hardware}: TGS {r.tgs}, TFLOPs {r.tflops} "
                      f"(formula gives {f['xtuner_tflops_at_reference_tgs']:.1f}; model FLOPs {f['model_tflops_at_reference_tgs']:.1f})")


@app.command()
def validate(files: list[Path]) -> None:
    """Validate scenario files; exit 1 listing each bad field."""
    from framework_bench import scenario
    bad = 0
    for f in files:
        try:
            scenario.load_file(f)
            console.print(f"[green]ok[/green] {f}")
        except scenario.ScenarioError as e:
            bad += 1
            for line in str(e).splitlines():
                err.print(f"[red]error:[/red] {line}", highlight=False, soft_wrap=True)
    if bad:
        raise typer.Exit(1)


@app.command()
def schema() -> None:
    """Print the JSON schema of a scenario file."""
    from framework_bench.scenario import Scenario
    print(json.dumps(Scenario.model_json_schema(), indent=2))


@app.command("pack")
def pack_cmd(name: str) -> None:
    """Build (or reuse) the packed data of a scenario; print rows, tokens, documents, sha256."""
    from framework_bench.data.packing import pack
    s = _load(name)
    try:
        data = pack(s, say=lambda msg: console.print(f"[yellow]{msg}[/yellow]"))
    except _user_errors() as e:
        fail(str(e))
    m = data.manifest
    console.print(f"{'reused' if data.cached else 'packed'} {data.dir}")
    console.print(f"rows {m['rows']:,} x {m['context_length']:,} = {m['tokens']:,} tokens, "
                  f"{m['documents']:,} documents (dataset repeated {m['repeat']}x), {m['seconds']:.2f} s to pack")
    console.print(f"sha256 {m['sha256']}")


@app.command()
def backends() -> None:
    """List the installed backends, their environments and capabilities."""
    from framework_bench import envs, plugins
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
    console.print(t)


@env_app.command("create")
def env_create(
    names: Annotated[Optional[list[str]], typer.Argument(help="backends (default: all)")] = None,
    flavour: Annotated[Optional[str], typer.Option(help="cpu or cuda (default: cuda if nvidia-smi works)")] = None,
    find_links: Annotated[Optional[list[str]], typer.Option("--find-links", help="a wheelhouse folder (repeatable)")] = None,
    no_index: Annotated[bool, typer.Option("--no-index", help="install only from --find-links folders (offline)")] = False,
    with_specs: Annotated[Optional[list[str]], typer.Option("--with", help="an extra package: spec or wheel path (repeatable)")] = None,
    system_site_packages: Annotated[bool, typer.Option("--system-site-packages", help="reuse the machine's installed packages (its torch, flash-attn)")] = False,
    no_deps: Annotated[bool, typer.Option("--no-deps", help="install exactly what is listed, without dependency resolution")] = False,
    torch_index: Annotated[Optional[str], typer.Option("--torch-index", help="torch wheel index URL (default: chosen from the driver's CUDA version)")] = None,
    requirements: Annotated[Optional[str], typer.Option("--requirements", help="a requirements file replacing the backend's own")] = None,
) -> None:
    """Create (or reuse) backend environments; idempotent. Built aside and swapped in only when complete."""
    from framework_bench import envs, plugins
    options = envs.Options(find_links=[str(Path(f).resolve()) for f in find_links or []], no_index=no_index,
                           with_specs=list(with_specs or []), system_site_packages=system_site_packages,
                           no_deps=no_deps, torch_index=torch_index,
                           requirements=str(Path(requirements).resolve()) if requirements else None)
    found = plugins.backends()
    unknown = [n for n in names or [] if n not in found]
    if unknown:
        fail(f"no backend named {unknown[0]!r}; installed: {', '.join(found)}")
    try:
        envs.validate(flavour, options)
        for name in names or list(found):
            envs.create(name, found[name].info.env, flavour, say=lambda m: console.print(m, highlight=False, markup=False),
                        packages=(found[name].package,), options=options)
    except envs.EnvError as e:
        fail(str(e))


@env_app.command("list")
def env_list() -> None:
    """Show each backend env: path, flavour, framework/torch/transformers versions, state."""
    from framework_bench import envs, plugins
    t = Table("backend", "path", "flavour", "framework", "torch", "transformers", "state")
    for name, b in plugins.backends().items():
        e = envs.inspect(name, b.info.env)
        t.add_row(name, str(e.path), e.flavour or "-", e.version(b.info.env.framework_package) or "-",
                  e.version("torch") or "-", e.version("transformers") or "-",
                  "[green]ok[/green]" if e.ready else f"[yellow]{e.problem}[/yellow]")
    console.print(t)


def _result_dict(r) -> dict:
    return r.model_dump(mode="json")


@app.command()
def run(
    backend: Annotated[str, typer.Option(help="backend name (see `fbench backends`)")],
    scenario: Annotated[str, typer.Option(help="scenario name or file")],
    timeout: Annotated[Optional[float], typer.Option(help="seconds before the run is stopped")] = None,
    launcher: Annotated[Optional[str], typer.Option(help="local, torchrun or slurm (default: by process count)")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print the plan; run nothing")] = False,
    force: Annotated[bool, typer.Option("--force", help="run even if the memory estimate says it won't fit")] = False,
    db: DbOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object")] = False,
) -> None:
    """Run one backend on one scenario, store the result, and report TGS / TFLOPs."""
    from framework_bench import runner
    s = _load(scenario)
    _check_launcher(launcher)
    if dry_run or launcher == "slurm":
        _plan_only([backend], [s], launcher, submit=not dry_run)
        return
    store = _store(db)
    try:
        with err.status(f"{backend} on {s.name}: starting") as status:
            def on_step(done, total, secs):
                status.update(f"{backend} on {s.name}: step {done}/{total}" + (f" ({secs:.2f} s)" if secs else ""))
            r = runner.run_one(backend, s, timeout=timeout, on_step=on_step, launcher=launcher, force=force)
    except _user_errors() as e:
        fail(str(e))
    store.add(r, s)
    if as_json:
        print(json.dumps(_result_dict(r), indent=2))
    else:
        colour = "green" if r.status == "ok" else "red"
        console.print(f"[{colour}]{r.status}[/{colour}] {r.backend} on {r.scenario}"
                      + (f" ({r.framework_version})" if r.framework_version else ""))
        if r.status == "ok":
            console.print(f"TGS {_fmt(r.tgs)} (min {_fmt(r.tgs_min)}, max {_fmt(r.tgs_max)}) over {r.steps_measured} "
                          f"measured steps; TFLOPs/GPU {_fmt(r.tflops, '.3g')} (XTuner formula), "
                          f"{_fmt(r.model_tflops, '.3g')} (model FLOPs); step {_fmt(r.step_seconds, '.3f')} s")
            mem = "-" if r.peak_mem_bytes is None else f"{r.peak_mem_bytes / 2**30:.2f} GiB"
            reserved = "" if r.peak_reserved_bytes is None else f", {r.peak_reserved_bytes / 2**30:.2f} GiB reserved"
            console.print(f"peak memory {mem}{reserved} (max over measured steps); "
                          f"start-up {_fmt(r.startup_seconds, '.1f')} s (worker start to first step)")
            if r.flags:
                console.print(f"[yellow]flags: {'; '.join(r.flags)}[/yellow]")
        if r.reason:
            console.print(r.reason, highlight=False, markup=False)
        console.print(f"data sha256 {r.data_sha256}")
        if r.run_dir:
            console.print(f"run folder {r.run_dir}")
        console.print(f"stored as result {r.result_id} in {store.path}")
    if r.status not in ("ok", "unsupported"):
        raise typer.Exit(1)


def _results_table(results, scenarios_by_name) -> Table:
    t = Table("scenario", "backend", "status", "TGS (min–max)", "TFLOPs/GPU", "MFU", "peak mem", "start-up",
              "published TGS", "notes", title="fbench compare")
    for r in results:
        s = scenarios_by_name[r.scenario]
        spread = f" ({_fmt(r.tgs_min)}–{_fmt(r.tgs_max)})" if r.tgs is not None else ""
        colour = "green" if r.status == "ok" else ("yellow" if r.status == "unsupported" else "red")
        mem = f"{r.peak_mem_bytes / 2**30:.2f} GiB" if r.peak_mem_bytes else "-"
        if r.peak_reserved_bytes:
            mem += f" ({r.peak_reserved_bytes / 2**30:.2f} reserved)"
        ref = f"{s.reference.tgs:,.1f} ({s.reference.hardware})" if s.reference else "-"
        notes = "; ".join(r.flags) if r.status == "ok" else "see below"
        t.add_row(r.scenario, r.backend, f"[{colour}]{r.status}[/{colour}]", _fmt(r.tgs) + spread,
                  _fmt(r.tflops, ".3g"), _fmt(r.mfu * 100 if r.mfu is not None else None, ".1f") + ("%" if r.mfu else ""),
                  mem, _fmt(r.startup_seconds, ".1f") + (" s" if r.startup_seconds is not None else ""), ref, notes)
    return t


@app.command()
def compare(
    scenario: Annotated[list[str], typer.Option(help="scenario name, glob (e.g. 'tiny_cpu*') or file; repeatable")],
    backends_: Annotated[Optional[str], typer.Option("--backends", help="comma-separated (default: every installed)")] = None,
    timeout: Annotated[Optional[float], typer.Option(help="seconds per run before it is stopped")] = None,
    db: DbOption = None,
    out: OutOption = Path("plots"),
    launcher: Annotated[Optional[str], typer.Option(help="local, torchrun or slurm (default: by process count)")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print each backend's plan; run nothing")] = False,
    force: Annotated[bool, typer.Option("--force", help="run even if the memory estimate says it won't fit")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON list of run records")] = False,
) -> None:
    """Run backends over scenarios on one packed stream each; store, tabulate, chart, report."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from framework_bench import compare as compare_, plugins
    from framework_bench.results import ResultStore, default_db

    _check_launcher(launcher)
    try:
        chosen = compare_.expand(scenario)
        names = backends_.split(",") if backends_ else list(plugins.backends())
    except _user_errors() as e:
        fail(str(e))
    if dry_run or launcher == "slurm":
        _plan_only(names, chosen, launcher, submit=not dry_run)
        return
    store = ResultStore(db or default_db())
    by_name = {s.name: s for s in chosen}
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[note]}"), TimeElapsedColumn(), console=err, transient=False)
    tasks: dict = {}

    def on_start(backend: str, s) -> None:
        tasks["current"] = progress.add_task(f"{backend} · {s.name}", total=s.steps.total, note="starting")

    def on_step(done: int, total: int, secs: float | None) -> None:
        progress.update(tasks["current"], completed=done, note=f"step {secs:.2f} s" if secs else "")

    def on_result(r, s) -> None:
        r.result_id = store.add(r, s)
        progress.update(tasks["current"], note=f"{r.status}" + (f" · TGS {r.tgs:,.1f}" if r.tgs else ""))

    interrupted = False
    with progress:
        try:
            results = compare_.compare(chosen, names, timeout=timeout, on_start=on_start, on_step=on_step,
                                       on_result=on_result, launcher=launcher, force=force)
        except compare_.Interrupted as stop:
            results, interrupted = stop.args[0], True
        except KeyboardInterrupt:
            results, interrupted = [], True
        except _user_errors() as e:
            fail(str(e))
    if as_json:
        print(json.dumps([_result_dict(r) for r in results], indent=2))
    else:
        console.print(_results_table(results, by_name))
        for r in results:
            if r.status != "ok":
                lines = (r.reason or "").splitlines()
                console.print(f"[yellow]{r.scenario} / {r.backend}: {r.status}[/yellow]: {escape(lines[0] if lines else '')}",
                              highlight=False)
                for line in lines[1:][-8:]:
                    console.print(f"    {line}", highlight=False, markup=False)
        console.print(f"results stored in {store.path}")
    if results:
        rows = [r for r in store.latest_by_point() if r["scenario"] in by_name]
        charts, md, page = _charts_and_report(rows, out)
        (err if as_json else console).print(f"charts: {', '.join(str(c) for c in charts if c.suffix == '.png')}; "
                                            f"report: {md}, {page}", highlight=False)
    if interrupted:
        err.print("[yellow]interrupted: finished runs are stored[/yellow]")
        raise typer.Exit(130)


def _check_launcher(launcher: str | None) -> None:
    if launcher not in (None, "local", "torchrun", "slurm"):
        fail(f"--launcher {launcher!r}: use local, torchrun or slurm")


def _plan_only(backend_names: list[str], chosen: list, launcher: str | None, submit: bool) -> None:
    """--dry-run (print every plan) and --launcher slurm (write, and submit where sbatch exists)."""
    import shlex
    import subprocess

    from framework_bench import launch, runner
    from framework_bench.memory import estimate
    from framework_bench.machine import detect

    machine = detect()
    for s in chosen:
        console.rule(f"{s.name}: {s.cluster.nodes} node(s) x {s.cluster.gpus_per_node} {s.cluster.device}")
        target = s.reference.hardware if s.reference else None
        console.print(estimate(s, gpu_memory_gib=machine.gpu_memory_gib, gpu=target).summary(), highlight=False)
        for name in backend_names:
            try:
                d = runner.dry_run(name, s, launcher, machine, pack_data=submit)
            except _user_errors() as e:
                fail(str(e))
            console.print(f"[bold]{name}[/bold] via {d.launcher}: "
                          + ("[green]checks pass on this machine[/green]" if d.check is None
                             else f"[yellow]not runnable here: {d.check}[/yellow]"), highlight=False)
            console.print(f"  argv: {shlex.join(d.argv)}", highlight=False, markup=False)
            for k, v in sorted(d.env.items()):
                console.print(f"  env:  {k}={v}", highlight=False, markup=False)
            for role, path in d.files.items():
                console.print(f"  file ({role}): {path}", highlight=False, markup=False)
                if path.is_dir():
                    lines = [f"{p.name}" for p in sorted(path.iterdir())]
                else:
                    lines = path.read_text().splitlines() if path.exists() else []
                for line in lines[:40]:
                    console.print(f"    | {line}", highlight=False, markup=False)
                if len(lines) > 40:
                    console.print(f"    | ... ({len(lines) - 40} more lines)", highlight=False, markup=False)
            if d.launcher == "slurm" and submit:
                if launch.sbatch_available():
                    out = subprocess.run(d.argv, capture_output=True, text=True)
                    console.print(f"  sbatch: {out.stdout.strip() or out.stderr.strip()}", highlight=False)
                else:
                    console.print(f"  sbatch not found here: submit {d.files['sbatch']} on the cluster", highlight=False)


def _store(db: Path | None):
    from framework_bench.results import ResultsError, ResultStore
    try:
        return ResultStore(db)
    except ResultsError as e:
        fail(str(e))


def _charts_and_report(rows: list[dict], out: Path):
    from framework_bench.plotting import plot_results
    from framework_bench.report import write_report
    charts = plot_results(rows, out)
    md, page = write_report(rows, out, [c for c in charts if c.suffix == ".png"])
    return charts, md, page


@results_app.command("list")
def results_list(
    scenario: Annotated[Optional[str], typer.Option(help="scenario name or glob")] = None,
    backend: Annotated[Optional[str], typer.Option(help="backend name")] = None,
    db: DbOption = None,
) -> None:
    """One line per stored run."""
    store = _store(db)
    t = Table("id", "created", "scenario", "backend", "version", "status", "TGS", "TFLOPs/GPU", "steps", "data sha256")
    for r in store.list(scenario, backend):
        t.add_row(str(r["id"]), r["created_at"], r["scenario"], r["backend"], r["framework_version"] or "-",
                  r["status"], _fmt(r["tgs"]), _fmt(r["tflops"], ".3g"), str(r["steps_measured"] or 0),
                  (r["data_sha256"] or "-")[:12])
    console.print(t)


@results_app.command("show")
def results_show(run_id: int, db: DbOption = None) -> None:
    """One run as JSON: figures, per-step metrics, scenario and environment manifest."""
    from framework_bench.results import ResultsError
    try:
        print(json.dumps(_store(db).get(run_id), indent=2, default=str))
    except ResultsError as e:
        fail(str(e))


@results_app.command("export")
def results_export(
    format: Annotated[str, typer.Option("--format", help="csv or json")] = "csv",
    scenario: Annotated[Optional[str], typer.Option(help="scenario name or glob")] = None,
    backend: Annotated[Optional[str], typer.Option(help="backend name")] = None,
    db: DbOption = None,
) -> None:
    """Print every stored run as CSV or JSON."""
    if format not in ("csv", "json"):
        fail(f"--format {format!r}: use csv or json")
    print(_store(db).export(format, scenario, backend), end="")


@app.command()
def plot(
    published: Annotated[bool, typer.Option("--published", help="the published XTuner table alone (no runs needed)")] = False,
    scenario: Annotated[Optional[str], typer.Option(help="only these scenarios (name or glob)")] = None,
    db: DbOption = None,
    out: OutOption = Path("plots"),
) -> None:
    """Charts of TGS and TFLOPs/GPU against context length, one line per backend."""
    from framework_bench.plotting import plot_published, plot_results
    if published:
        paths = plot_published(out)
    else:
        rows = _store(db).latest_by_point(scenario)
        if not rows:
            fail("no stored runs to plot: run `fbench compare` first, or use --published")
        paths = plot_results(rows, out)
    for p in paths:
        console.print(str(p), highlight=False)


@app.command()
def report(
    scenario: Annotated[Optional[str], typer.Option(help="only these scenarios (name or glob)")] = None,
    db: DbOption = None,
    out: OutOption = Path("plots"),
) -> None:
    """Write report.md and a self-contained report.html from the stored runs."""
    rows = _store(db).latest_by_point(scenario)
    if not rows:
        fail("no stored runs to report: run `fbench compare` first")
    _, md, page = _charts_and_report(rows, out)
    console.print(f"{md}\n{page}", highlight=False)
