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

from framework_bench.worker.hparams import SEED

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="Benchmark fine-tuning frameworks on identical packed-Alpaca scenarios.")
env_app = typer.Typer(no_args_is_help=True, help="Each backend's own virtual environment.")
app.add_typer(env_app, name="env")
results_app = typer.Typer(no_args_is_help=True, help="The results store (SQLite).")
app.add_typer(results_app, name="results")
from framework_bench.cli.device import device_app  # noqa: E402  (its own module; registered here)
app.add_typer(device_app, name="device")
DbOption = Annotated[Optional[Path], typer.Option("--db", help="SQLite results file (default: .fbench/results)")]
OutOption = Annotated[Optional[Path], typer.Option("--out", help="folder for charts and the report (default: plots/ in FBENCH_HOME)")]
SettingsOption = Annotated[str, typer.Option(
    "--settings", help="matched: both frameworks configured alike where both allow (differences named); "
                       "native: each as its own docs and examples configure it")]
SeedOption = Annotated[int, typer.Option(
    "--seed", min=0, max=2**32 - 1, help="one per compare: every backend starts from the same initial weights "
                                          "drawn from it (checked by the host) and seeds its framework with it")]
TimeOption = Annotated[Optional[str], typer.Option(
    "--time", help="slurm: the job's time limit, [D-]HH:MM:SS (default: estimated from the scenario, shown in the plan)")]
CpusOption = Annotated[Optional[int], typer.Option(
    "--cpus-per-task", min=1, help="slurm: CPUs for each node's task (default: all of the node's, the job is exclusive)")]
SbatchArgOption = Annotated[Optional[list[str]], typer.Option(
    "--sbatch-arg", help="slurm: one more sbatch option, e.g. --sbatch-arg=--partition=gpu; repeatable")]
WaitOption = Annotated[bool, typer.Option(
    "--wait", help="slurm: wait for the jobs, storing each run when its job ends")]
PollOption = Annotated[float, typer.Option("--poll", min=0.1, help="slurm: seconds between queue checks")]

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
    from framework_bench.envs.venvs import EnvError
    from framework_bench.plugins.registry import UnknownBackend
    from framework_bench.store.results import ResultsError
    from framework_bench.spec.scenario import ScenarioError
    return (ScenarioError, UnknownBackend, DataError, EnvError, ResultsError)


# Exit codes (README, "Exit codes"): 0 every run ok or unsupported; 1 a user error, or any run
# failed / oom / timeout; 130 interrupted (Ctrl-C, SIGTERM, SIGHUP), finished runs stored.
EXIT_INTERRUPTED = 130


def _exit_code(results) -> int:
    if any(r.status == "interrupted" for r in results):
        return EXIT_INTERRUPTED
    return 1 if any(r.status not in ("ok", "unsupported", "unverified") for r in results) else 0


def _check_timeout(timeout: float | None) -> None:
    import math
    if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
        fail(f"--timeout {timeout}: give a number of seconds above 0")


def _check_local(launcher: str | None, chosen: list) -> None:
    for s in chosen:
        if launcher == "local" and s.cluster.gpus > 1:
            fail(f"{s.name} runs {s.cluster.gpus} processes; --launcher local runs one: use torchrun (the default)")


def _writable_folder(path: Path, what: str) -> None:
    """Fail now, before any training, if `path` cannot take files."""
    import tempfile
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".fbench-write-check-"):
            pass
    except OSError as e:
        fail(f"cannot write to the {what} folder {path}: {e.strerror or e}")


def _preflight(store, out: Path | None = None) -> None:
    """Everything a run writes, checked writable before launching anything."""
    from framework_bench.data.packing import cache_root
    from framework_bench.store.results import ResultsError
    from framework_bench.run.runner import runs_root
    try:
        store.check_writable()
    except ResultsError as e:
        fail(str(e))
    _writable_folder(runs_root(), "run")
    _writable_folder(cache_root(), "packed-data cache")
    if out is not None:
        _writable_folder(out, "--out")


def _load(name: str):
    from framework_bench.spec import scenario
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
    from framework_bench.spec import scenario
    t = Table(Column("name", no_wrap=True), "model", "device", "GPUs", "context", "SP", "ZeRO", "published TGS")
    for p in scenario.scenario_paths():
        try:
            s = scenario.load_file(p)
        except scenario.ScenarioError as e:
            t.add_row(escape(p.stem), f"[red]invalid: {escape(str(e).splitlines()[0])}[/red]", "", "", "", "", "", "")
            continue
        t.add_row(s.name, s.model.preset or "inline", s.cluster.device, str(s.cluster.gpus), _ctx(s.context_length),
                  str(s.sequence_parallel), str(s.zero_stage), _fmt(s.reference.tgs if s.reference else None))
    console.print(t)


def scenario_summary(s) -> dict:
    from framework_bench.measure import flops
    from framework_bench.measure.memory import estimate
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
    console.print(f"[bold]{s.name}[/bold]  {escape(s.description)}")
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
    from framework_bench.run.sbatch import estimate_time
    console.print(f"slurm      {estimate_time(s, s.reference.hardware if s.reference else None).summary()}",
                  highlight=False, markup=False)
    if s.reference:
        r = s.reference
        console.print(f"published  {r.framework} on {r.hardware}: TGS {r.tgs}, TFLOPs {r.tflops} "
                      f"(formula gives {f['xtuner_tflops_at_reference_tgs']:.1f}; model FLOPs {f['model_tflops_at_reference_tgs']:.1f})")


@app.command()
def validate(files: list[Path]) -> None:
    """Validate scenario files; exit 1 listing each bad field."""
    from framework_bench.spec import scenario
    bad = 0
    for f in files:
        try:
            scenario.load_file(f)
            console.print(f"[green]ok[/green] {escape(str(f))}", highlight=False)
        except scenario.ScenarioError as e:
            bad += 1
            for line in str(e).splitlines():
                err.print(f"[red]error:[/red] {escape(line)}", highlight=False, soft_wrap=True)
    if bad:
        raise typer.Exit(1)


@app.command()
def schema() -> None:
    """Print the JSON schema of a scenario file."""
    from framework_bench.spec.scenario import Scenario
    print(json.dumps(Scenario.model_json_schema(), indent=2))


@app.command("pack")
def pack_cmd(name: str) -> None:
    """Build (or reuse) the packed data of a scenario; print rows, tokens, documents, sha256."""
    from framework_bench.data.packing import pack
    from framework_bench.run.interrupts import stop_signals_interrupt
    s = _load(name)
    try:
        with stop_signals_interrupt():
            data = pack(s, say=lambda msg: console.print(f"[yellow]{escape(msg)}[/yellow]", highlight=False))
    except _user_errors() as e:
        fail(str(e))
    except KeyboardInterrupt:
        err.print("[yellow]interrupted: nothing was kept of the unfinished packing[/yellow]")
        raise typer.Exit(EXIT_INTERRUPTED)
    m = data.manifest
    console.print(f"{'reused' if data.cached else 'packed'} {data.dir}", highlight=False, markup=False)
    console.print(f"rows {m['rows']:,} x {m['context_length']:,} = {m['tokens']:,} tokens, "
                  f"{m['documents']:,} documents (dataset repeated {m['repeat']}x), {m['seconds']:.2f} s to pack")
    console.print(f"sha256 {m['sha256']}")


@app.command()
def backends() -> None:
    """List the installed backends, their environments and capabilities."""
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
    console.print(t)


@app.command("check-backend")
def check_backend(
    name: Annotated[str, typer.Argument(help="backend name (see `fbench backends`)")],
    scenario: Annotated[str, typer.Option(help="scenario to run it on")] = "tiny_cpu",
    timeout: Annotated[Optional[float], typer.Option(help="seconds before the run is stopped")] = 900,
    settings: SettingsOption = "matched",
) -> None:
    """Run a backend through a small scenario and every host verification; exit 1 on any failure."""
    from framework_bench import testing
    from framework_bench.run.interrupts import stop_signals_interrupt
    _check_settings(settings)
    _check_timeout(timeout)
    try:
        with stop_signals_interrupt(), err.status(f"{name} on {scenario}: running"):
            report = testing.check_backend(name, scenario=scenario, settings_mode=settings, timeout=timeout)
    except _user_errors() as e:
        fail(str(e))
    except KeyboardInterrupt:  # while packing or judging: no worker runs then
        err.print("[yellow]interrupted: nothing was checked[/yellow]")
        raise typer.Exit(EXIT_INTERRUPTED)
    if report.result.status == "interrupted":  # the worker's whole process group is stopped
        err.print(f"[yellow]interrupted: the check of {escape(name)} stopped, its worker with it[/yellow]")
        raise typer.Exit(EXIT_INTERRUPTED)
    t = Table("point", "verdict", "detail", title=f"fbench check-backend {name} ({report.scenario})")
    for p in report.points:
        colour = {"pass": "green", "skipped": "yellow"}.get(p.status, "red")
        t.add_row(p.name, f"[{colour}]{p.status}[/{colour}]", escape(p.detail))
    console.print(t)
    if report.result.run_dir:
        console.print(f"run folder {report.result.run_dir}", highlight=False)
    if not report.passed:
        raise typer.Exit(1)


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
    from framework_bench.envs import venvs as envs
    from framework_bench.plugins import registry as plugins
    options = envs.Options(find_links=[str(Path(f).resolve()) for f in find_links or []], no_index=no_index,
                           with_specs=list(with_specs or []), system_site_packages=system_site_packages,
                           no_deps=no_deps, torch_index=torch_index,
                           requirements=str(Path(requirements).resolve()) if requirements else None)
    found = plugins.backends()
    for name in names or []:
        if name not in found:
            fail(f"the backend {name!r} is installed but broken: {plugins.load_errors[name]}"
                 if name in plugins.load_errors else f"no backend named {name!r}; installed: {', '.join(found)}")
    from framework_bench.run.interrupts import stop_signals_interrupt
    try:
        envs.validate(flavour, options)
        with stop_signals_interrupt():  # SIGTERM too: the half-built env and pip go, not only on Ctrl-C
            for name in names or list(found):
                envs.create(name, found[name].info.env, flavour,
                            say=lambda m: console.print(m, highlight=False, markup=False),
                            packages=(found[name].package,), options=options)
    except envs.EnvError as e:
        fail(str(e))
    except KeyboardInterrupt:
        err.print("[yellow]interrupted: the half-built env was removed; an earlier env stays as it was[/yellow]")
        raise typer.Exit(EXIT_INTERRUPTED)


@env_app.command("list")
def env_list() -> None:
    """Show each backend env: path, flavour, framework/torch/transformers versions, state."""
    from framework_bench.envs import venvs as envs
    from framework_bench.plugins import registry as plugins
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
    settings: SettingsOption = "matched",
    time_limit: TimeOption = None,
    cpus_per_task: CpusOption = None,
    sbatch_arg: SbatchArgOption = None,
    wait: WaitOption = False,
    poll: PollOption = 30.0,
    seed: SeedOption = SEED,
) -> None:
    """Run one backend on one scenario, store the result, and report TGS / TFLOPs."""
    from framework_bench.run import runner
    from framework_bench.run.interrupts import stop_signals_interrupt
    s = _load(scenario)
    _check_launcher(launcher)
    _check_timeout(timeout)
    _check_settings(settings)
    _check_local(launcher, [s])
    options = _sbatch_options(time_limit, cpus_per_task, sbatch_arg)
    if dry_run:
        _plan_only([backend], [s], launcher, options, as_json=as_json, settings=settings)
        return
    if launcher == "slurm":
        _submit_slurm([backend], [s], options, wait=wait, poll=poll, db=db, out=None, force=force, settings=settings)
        return
    store = _store(db)
    _preflight(store)
    try:
        with stop_signals_interrupt(), err.status(f"{backend} on {escape(s.name)}: starting") as status:
            def on_step(done, total, secs):
                status.update(f"{backend} on {s.name}: step {done}/{total}" + (f" ({secs:.2f} s)" if secs else ""))
            r = runner.run_one(backend, s, timeout=timeout, on_step=on_step, launcher=launcher, force=force,
                              settings_mode=settings, db=store.path, seed=seed)
            _keep(store, r, s)
    except _user_errors() as e:
        fail(str(e))
    except KeyboardInterrupt:  # after the run was stored: the signal came while storing
        raise typer.Exit(EXIT_INTERRUPTED)
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
        for note in r.notes:
            console.print(f"note: {note}", highlight=False, markup=False)
        if r.reason:
            console.print(r.reason, highlight=False, markup=False)
        _print_checks(r.checks)
        console.print(f"data sha256 {r.data_sha256}; {r.settings_mode} settings")
        if r.run_dir:
            console.print(f"run folder {r.run_dir}")
        if r.result_id is not None:  # else kept beside the store, as said above
            console.print(f"stored as result {r.result_id} in {store.path}", highlight=False, markup=False)
    if code := _exit_code([r]):
        raise typer.Exit(code)


def _results_table(results, scenarios_by_name) -> Table:
    from framework_bench.run.compare import REFERENCE_BACKEND, percent_of_reference
    # one compare: every run of a scenario ran its one definition
    share = percent_of_reference([(r.scenario, r.backend, r.status, r.tgs, "") for r in results])
    t = Table("scenario", "backend", "status", "TGS (min–max)", f"% of {REFERENCE_BACKEND}", "TFLOPs/GPU", "MFU",
              "peak mem", "start-up", "published TGS", "notes", title="fbench compare")
    for r in results:
        s = scenarios_by_name[r.scenario]
        spread = f" ({_fmt(r.tgs_min)}–{_fmt(r.tgs_max)})" if r.tgs is not None else ""
        colour = "green" if r.status == "ok" else ("yellow" if r.status == "unsupported" else "red")
        mem = f"{r.peak_mem_bytes / 2**30:.2f} GiB" if r.peak_mem_bytes else "-"
        if r.peak_reserved_bytes:
            mem += f" ({r.peak_reserved_bytes / 2**30:.2f} reserved)"
        ref = f"{s.reference.tgs:,.1f} ({s.reference.hardware})" if s.reference else "-"
        notes = escape("; ".join(r.flags + r.notes)) if r.status == "ok" else "see below"
        pct = share.get((r.scenario, r.backend))
        t.add_row(r.scenario, r.backend, f"[{colour}]{r.status}[/{colour}]", _fmt(r.tgs) + spread,
                  "-" if pct is None else f"{pct:.0f}%", _fmt(r.tflops, ".3g"), _fmt(r.mfu * 100 if r.mfu is not None else None, ".1f") + ("%" if r.mfu else ""),
                  mem, _fmt(r.startup_seconds, ".1f") + (" s" if r.startup_seconds is not None else ""), ref, notes)
    return t


@app.command()
def compare(
    scenario: Annotated[list[str], typer.Option(help="scenario name, glob (e.g. 'tiny_cpu*') or file; repeatable")],
    backends_: Annotated[Optional[str], typer.Option("--backends", help="comma-separated (default: every installed)")] = None,
    timeout: Annotated[Optional[float], typer.Option(help="seconds per run before it is stopped")] = None,
    db: DbOption = None,
    out: OutOption = None,
    launcher: Annotated[Optional[str], typer.Option(help="local, torchrun or slurm (default: by process count)")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print each backend's plan; run nothing")] = False,
    force: Annotated[bool, typer.Option("--force", help="run even if the memory estimate says it won't fit")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON list of run records")] = False,
    settings: SettingsOption = "matched",
    time_limit: TimeOption = None,
    cpus_per_task: CpusOption = None,
    sbatch_arg: SbatchArgOption = None,
    wait: WaitOption = False,
    poll: PollOption = 30.0,
    seed: SeedOption = SEED,
) -> None:
    """Run backends over scenarios on one packed stream each; store, tabulate, chart, report."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from framework_bench.run import compare as compare_
    from framework_bench.plugins import registry as plugins
    from framework_bench.run.interrupts import stop_signals_interrupt

    _check_launcher(launcher)
    _check_timeout(timeout)
    _check_settings(settings)
    out = _out(out)
    try:
        chosen = compare_.expand(scenario)
        names = _backend_names(backends_) if backends_ is not None else list(plugins.backends())
    except _user_errors() as e:
        fail(str(e))
    if backends_ is None and plugins.load_errors:  # every installed backend, less the broken ones: said once
        err.print("[yellow]skipped, broken: " + escape("; ".join(f"{n} ({why})" for n, why in plugins.load_errors.items()))
                  + "[/yellow]", highlight=False, soft_wrap=True)
    _check_local(launcher, chosen)
    options = _sbatch_options(time_limit, cpus_per_task, sbatch_arg)
    if dry_run:
        _plan_only(names, chosen, launcher, options, as_json=as_json, settings=settings)
        return
    if launcher == "slurm":
        _submit_slurm(names, chosen, options, wait=wait, poll=poll, db=db, out=out, force=force, settings=settings)
        return
    store = _store(db)
    _preflight(store, out)
    by_name = {s.name: s for s in chosen}
    done: list = []  # every stored run, whatever ends the compare
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[note]}"), TimeElapsedColumn(), console=err, transient=False)
    tasks: dict = {}

    def on_start(backend: str, s) -> None:
        tasks["current"] = progress.add_task(f"{backend} · {s.name}", total=s.steps.total, note="starting")

    def on_step(done: int, total: int, secs: float | None) -> None:
        progress.update(tasks["current"], completed=done, note=f"step {secs:.2f} s" if secs else "")

    def on_result(r, s) -> None:
        _keep(store, r, s)
        done.append(r)
        progress.update(tasks["current"], note=f"{r.status}" + (f" · TGS {r.tgs:,.1f}" if r.tgs else ""))

    interrupted = False
    with progress:
        try:
            with stop_signals_interrupt():
                compare_.compare(chosen, names, timeout=timeout, on_start=on_start, on_step=on_step,
                                 on_result=on_result, launcher=launcher, force=force, settings_mode=settings,
                                 db=store.path, seed=seed)
        except (compare_.Interrupted, KeyboardInterrupt):
            interrupted = True
        except _user_errors() as e:
            fail(str(e))
    results = done
    if as_json:
        print(json.dumps([_result_dict(r) for r in results], indent=2))
    else:
        console.print(_results_table(results, by_name))
        _print_reasons(results)
        _print_differences([_result_dict(r) for r in results], settings)
        console.print(f"results stored in {store.path}")
    if results:
        charts, md, page = _charts_and_report(_stored_rows(store, by_name, settings), out)
        (err if as_json else console).print(f"charts: {', '.join(str(c) for c in charts if c.suffix == '.png')}; "
                                            f"report: {md}, {page}", highlight=False, markup=False)
    if interrupted:
        err.print("[yellow]interrupted: finished runs are stored[/yellow]")
        raise typer.Exit(EXIT_INTERRUPTED)
    if code := _exit_code(results):
        raise typer.Exit(code)


def _backend_names(option: str) -> list[str]:
    """`--backends a, b`: stripped, each once, in order; an empty name is a mistake."""
    names = [n.strip() for n in option.split(",")]
    if not all(names):
        fail(f"--backends {option!r}: give backend names separated by commas (see `fbench backends`)")
    return list(dict.fromkeys(names))


def _check_settings(mode: str) -> None:
    from framework_bench.run.compare import SETTINGS_MODES
    if mode not in SETTINGS_MODES:
        fail(f"--settings {mode!r}: use {' or '.join(SETTINGS_MODES)}")


def _print_checks(checks) -> None:
    colours = {"pass": "green", "fail": "red", "unverified": "yellow"}
    for c in checks:
        console.print(f"  [{colours[c.status]}]{c.status:10}[/{colours[c.status]}] {c.name:10} {escape(c.detail)}",
                      highlight=False)


def _print_differences(records: list[dict], mode: str) -> None:
    """One line per setting that differs between the backends of a scenario."""
    from framework_bench.run.compare import setting_differences
    for name, diffs in setting_differences(records).items():
        console.print(f"[bold]{escape(name)}[/bold]: {len(diffs)} setting(s) differ between backends "
                      f"({mode} settings)" if diffs else f"[bold]{escape(name)}[/bold]: same settings on every backend",
                      highlight=False)
        for key, values, speed in diffs:
            shown = ", ".join(f"{b} {v}" for b, v in values.items())
            console.print(("  [yellow]speed[/yellow] " if speed else "        ") + escape(f"{key}: {shown}"),
                          highlight=False)


def _check_launcher(launcher: str | None) -> None:
    if launcher not in (None, "local", "torchrun", "slurm"):
        fail(f"--launcher {launcher!r}: use local, torchrun or slurm")


def _sbatch_options(time_limit: str | None, cpus_per_task: int | None, sbatch_arg: list[str] | None):
    from framework_bench.run.sbatch import SbatchOptions, check_options
    options = SbatchOptions(time_limit=time_limit, cpus_per_task=cpus_per_task, extra=sbatch_arg or [])
    if problem := check_options(options):
        fail(problem)
    return options


def _print_reasons(results: list) -> None:
    """Below a results table: why each run that is not ok ended so (first line, then the log tail)."""
    for r in results:
        if r.status != "ok":
            lines = (r.reason or "").splitlines()
            console.print(f"[yellow]{r.scenario} / {r.backend}: {r.status}[/yellow]: {escape(lines[0] if lines else '')}",
                          highlight=False)
            for line in lines[1:][-8:]:
                console.print(f"    {line}", highlight=False, markup=False)


def _time_line(estimate, options) -> str:
    if options.time_limit:
        return f"  time: --time={options.time_limit} (given; the estimate was {estimate.summary()})"
    return f"  time: {estimate.summary()}"


def _print_verdict(name: str, launcher: str, verdict, show=console) -> None:
    """Every refusal on its own line: this machine, the env, the backend's check, memory."""
    if verdict.reason is None:
        head = "[green]checks pass on this machine[/green]"
    elif verdict.refused_by_backend:
        head = "[red]refused[/red]"
    else:
        head = "[yellow]not runnable on this machine[/yellow]; the backend's checks pass for the scenario's nodes"
    show.print(f"[bold]{escape(name)}[/bold] via {launcher}: {head}", highlight=False)
    for label, text in (("this machine", verdict.machine), (f"{name} env", verdict.env), (name, verdict.check),
                        ("memory", verdict.memory)):
        if text:
            show.print(f"  {label}: {text}", highlight=False, markup=False)


def _plan_only(backend_names: list[str], chosen: list, launcher: str | None, options, as_json: bool = False,
               settings: str = "matched") -> None:
    """--dry-run: print every plan, with every verdict side by side; nothing is launched or
    submitted. With --json, one JSON list of the plans on stdout and nothing else there."""
    import shlex

    from framework_bench.plugins import registry as plugins
    from framework_bench.run import runner
    from framework_bench.measure.memory import estimate
    from framework_bench.measure.machine import detect

    machine = detect()
    show = err if as_json else console  # with --json, stdout holds the JSON alone
    plans = []
    for s in chosen:
        show.rule(f"{s.name}: {s.cluster.nodes} node(s) x {s.cluster.gpus_per_node} {s.cluster.device}")
        target = s.reference.hardware if s.reference else None
        show.print(estimate(s, gpu_memory_gib=machine.gpu_memory_gib, gpu=target).summary(), highlight=False)
        for name in backend_names:
            try:
                d = runner.dry_run(name, s, launcher, machine, settings_mode=settings, sbatch_options=options)
            except _user_errors() as e:
                fail(str(e))
            plans.append(d.model_dump(mode="json"))
            if d.verdict is not None:
                _print_verdict(name, d.launcher, d.verdict, show)
            else:
                show.print(f"[bold]{escape(name)}[/bold] via {d.launcher}: [red]refused[/red] {escape(d.check or '')}",
                           highlight=False)
            if d.plan_error:
                show.print(f"  [red]no plan:[/red] {escape(d.plan_error)}", highlight=False)
                continue
            if d.time is not None:
                show.print(_time_line(d.time, options), highlight=False, markup=False)
            if s.cluster.device == "cuda":  # per phase, as this backend declares its AdamW in this mode
                e = estimate(s, declared=plugins.get(name).info.memory, settings_mode=settings,
                             gpu_memory_gib=machine.gpu_memory_gib, gpu=target)
                show.print(f"  memory: ~{e.total_gib:.1f} GiB at the {e.peak_phase} ({e.phases_line()}; "
                           f"{e.optimizer_impl} AdamW, {'DDP-wrapped' if e.ddp_wrapped else 'not DDP-wrapped'})",
                           highlight=False, markup=False)
            show.print(f"  argv: {shlex.join(d.argv)}", highlight=False, markup=False)
            for k, v in sorted(d.env.items()):
                show.print(f"  env:  {k}={v}", highlight=False, markup=False)
            for role, path in d.files.items():
                show.print(f"  file ({role}): {path}", highlight=False, markup=False)
                if path.is_dir():
                    lines = [f"{p.name}" for p in sorted(path.iterdir())]
                else:
                    lines = path.read_text().splitlines() if path.exists() else []
                for line in lines[:40]:
                    show.print(f"    | {line}", highlight=False, markup=False)
                if len(lines) > 40:
                    show.print(f"    | ... ({len(lines) - 40} more lines)", highlight=False, markup=False)
    if as_json:
        print(json.dumps(plans, indent=2))


def _submit_slurm(backend_names: list[str], chosen: list, options, *, wait: bool, poll: float, db: Path | None,
                  out: Path | None, force: bool, settings: str = "matched") -> None:
    """--launcher slurm: judge, write and submit each run (never for a backend that refused);
    refusals are stored at once, submitted runs when their jobs end (--wait, or `results collect`)."""
    from framework_bench.run import slurm
    store = _store(db)
    by_name = {s.name: s for s in chosen}
    results, submitted = [], []
    for s in chosen:
        console.rule(f"{s.name}: {s.cluster.nodes} node(s) x {s.cluster.gpus_per_node} {s.cluster.device}")
        for name in backend_names:
            try:
                p = slurm.plan_and_submit(name, s, options, force=force, settings_mode=settings, db=store.path)
            except _user_errors() as e:
                fail(str(e))
            _print_verdict(name, "slurm", p.verdict)
            if p.result is not None:
                _keep(store, p.result, s)
                results.append(p.result)
                console.print(f"  nothing submitted; stored as result {p.result.result_id}", highlight=False)
                continue
            console.print(_time_line(p.time, options), highlight=False, markup=False)
            console.print(f"  sbatch: {p.sbatch}", highlight=False, markup=False)
            if p.note:
                console.print(f"  [yellow]{escape(p.note)}[/yellow]", highlight=False)
            if p.submission:
                console.print(f"  submitted: SLURM job {p.submission.job_id}", highlight=False)
                submitted.append(p.submission)
    if not wait:
        if submitted:
            console.print("`fbench results collect` stores each run once its job has ended (or use --wait)")
        return
    waited, interrupted = _wait_for_jobs(submitted, lambda sub: store, poll)
    results += waited
    console.print(_results_table(results, by_name))
    _print_reasons(results)
    console.print(f"results stored in {store.path}")
    if out is not None and results:
        charts, md, page = _charts_and_report(_stored_rows(store, by_name), out)
        console.print(f"charts: {', '.join(str(c) for c in charts if c.suffix == '.png')}; report: {md}, {page}",
                      highlight=False)
    if interrupted:
        raise typer.Exit(EXIT_INTERRUPTED)


def _wait_for_jobs(subs: list, store_for, poll: float) -> tuple[list, bool]:
    """Poll the queue until every job has ended, storing each run as its job ends; (the
    results, whether Ctrl-C stopped the waiting)."""
    import time

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from framework_bench.run import slurm
    results = []
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[note]}"), TimeElapsedColumn(), console=err, transient=False)
    tasks = {sub.job_id: progress.add_task(f"job {sub.job_id} · {sub.backend} · {sub.scenario}",
                                           total=slurm.scenario_of(sub).steps.total, note="submitted") for sub in subs}

    def on_result(r, sub) -> None:
        results.append(r)
        progress.update(tasks[sub.job_id], completed=slurm.steps_done(sub),
                        note=f"{r.status}" + (f" · TGS {r.tgs:,.1f}" if r.tgs else "") + f" · stored as {r.result_id}")

    def on_problem(sub, why: str) -> None:
        progress.update(tasks[sub.job_id], note=f"not stored: {why}")

    waiting = subs
    with progress:
        try:
            while waiting:
                still = slurm.collect(waiting, store_for, slurm.scenario_of, on_result, on_problem)
                for sub, state in still:
                    progress.update(tasks[sub.job_id], completed=slurm.steps_done(sub), note=state.state.lower())
                waiting = [sub for sub, _ in still]
                if waiting:
                    time.sleep(poll)
        except KeyboardInterrupt:
            err.print(f"[yellow]stopped waiting: {len(waiting)} job(s) still queued or running; "
                      "`fbench results collect` stores them when they end[/yellow]")
            return results, True
    return results, False


def _store(db: Path | None, read_only: bool = False):
    """The results store; first, the runs earlier commands could not store are stored (and said)."""
    from framework_bench.run import orphans
    from framework_bench.store import results
    from framework_bench.run.runner import runs_root
    try:
        store = results.ResultStore(db, must_exist=read_only and db is not None)
    except results.ResultsError as e:
        fail(str(e))
    for line in orphans.recover(runs_root()) + results.recover(store):
        err.print(f"[yellow]{escape(line)}[/yellow]", highlight=False, soft_wrap=True)
    return store


def _keep(store, result, scenario) -> None:
    """Store one run's row, whatever happens: kept beside the store for the next command when
    the store cannot take it; printed as JSON on stderr, exit 1, when that fails too."""
    from framework_bench.store import results
    from framework_bench.run.interrupts import held
    with held():  # a second Ctrl-C now must not lose this run's row
        try:
            kept = results.save(store, result, scenario)
        except results.Unstored as e:
            print(e.record, file=sys.stderr)
            fail(f"{e}: the run is printed above as JSON")
    if kept:
        err.print(f"[yellow]the results file could not take the run now: kept in {escape(str(kept))}; "
                  "the next fbench command stores it[/yellow]", highlight=False, soft_wrap=True)


def _stored_rows(store, by_name: dict, settings: str | None = None) -> list[dict]:
    """The stored runs of these scenarios, read back for the charts: a store locked by another
    process now is one line and exit 1; the runs are stored already."""
    import sqlite3
    try:
        return [r for r in store.latest_by_point(settings_mode=settings) if r["scenario"] in by_name]
    except sqlite3.Error as e:
        fail(f"the runs are stored, but could not be read back for the charts and report: {e}; "
             "`fbench report` makes them later")


def _out(out: Path | None) -> Path:
    """--out, or the state folder's plots/: never files dropped wherever the command was typed."""
    from framework_bench.envs import venvs as envs
    return out if out is not None else envs.fbench_home() / "plots"


def _charts_and_report(rows: list[dict], out: Path):
    """The charts and the report; the runs are stored already, so a failure here (a full disk)
    is one line and exit 1, never a traceback."""
    from framework_bench.present.plotting import plot_results
    from framework_bench.present.report import write_report
    try:
        charts = plot_results(rows, out)
        md, page = write_report(rows, out, [c for c in charts if c.suffix == ".png"])
    except Exception as e:  # noqa: BLE001 - the rows are safe; say what failed and stop
        fail(f"the runs are stored, but the charts and report could not be written to {out}: {type(e).__name__}: {e}")
    return charts, md, page


@results_app.command("list")
def results_list(
    scenario: Annotated[Optional[str], typer.Option(help="scenario name or glob")] = None,
    backend: Annotated[Optional[str], typer.Option(help="backend name")] = None,
    db: DbOption = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="show the latest N runs")] = 50,
    all_: Annotated[bool, typer.Option("--all", help="show every stored run")] = False,
) -> None:
    """One line per stored run: the latest 50 unless --limit N or --all."""
    store = _store(db, read_only=True)
    t = Table("id", "created", "scenario", "backend", "version", "settings", "status", "TGS", "TFLOPs/GPU", "steps",
              "data sha256")
    rows = store.list(scenario, backend)
    shown = rows if all_ else rows[-limit:]
    for r in shown:
        t.add_row(str(r["id"]), r["created_at"], r["scenario"], r["backend"], r["framework_version"] or "-",
                  r["settings_mode"], r["status"], _fmt(r["tgs"]), _fmt(r["tflops"], ".3g"),
                  f"{r['steps_measured'] or 0}" + (" micro" if r.get("step_unit") == "micro" else ""),
                  (r["data_sha256"] or "-")[:12])
    console.print(t)
    if len(shown) < len(rows):
        console.print(f"the latest {len(shown)} of {len(rows)} runs; --all or --limit N for more", highlight=False)


@results_app.command("show")
def results_show(run_id: int, db: DbOption = None) -> None:
    """One run as JSON: figures, per-step metrics, scenario and environment manifest."""
    from framework_bench.store.results import ResultsError
    try:
        from framework_bench.store.results import standard_json
        print(json.dumps(standard_json(_store(db, read_only=True).get(run_id)), indent=2, default=str, allow_nan=False))
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
    print(_store(db, read_only=True).export(format, scenario, backend), end="")


@results_app.command("collect")
def results_collect(
    db: DbOption = None,
    wait: WaitOption = False,
    poll: PollOption = 30.0,
) -> None:
    """Store every submitted SLURM run whose job has ended; list the ones still queued or running."""
    from framework_bench.run import slurm
    problems: list[str] = []
    subs = slurm.pending(problems=problems)
    for line in problems:
        err.print(f"[red]skipped[/red] {escape(line)}", highlight=False, soft_wrap=True)
    if not subs:
        console.print("no submitted runs waiting to be collected")
        raise typer.Exit(1 if problems else 0)
    # Each run goes to the store it was submitted for, unless --db names one for all of them.
    stores: dict = {}

    def store_for(sub):
        path = db if db is not None else (Path(sub.db) if sub.db else None)
        if path not in stores:
            stores[path] = _store(path)
        return stores[path]

    def on_problem(sub, why: str) -> None:
        problems.append(why)
        err.print(f"[red]not stored[/red] SLURM job {sub.job_id} ({escape(sub.backend)} on {escape(sub.scenario)}, "
                  f"{escape(str(sub.run_dir))}): {escape(why)}; the others are collected", highlight=False, soft_wrap=True)

    interrupted = False
    if wait:
        results, interrupted = _wait_for_jobs(subs, store_for, poll)
        still = []
    else:
        results = []
        still = slurm.collect(subs, store_for, slurm.scenario_of, lambda r, sub: results.append(r), on_problem)
    for r in results:
        colour = "green" if r.status == "ok" else "red"
        console.print(f"[{colour}]{r.status}[/{colour}] {escape(r.backend)} on {escape(r.scenario)}: stored as result "
                      f"{r.result_id}" + (f", TGS {r.tgs:,.1f} over {r.steps_measured} measured steps" if r.tgs else ""),
                      highlight=False)
        if r.status != "ok" and r.reason:
            for line in r.reason.splitlines()[-8:]:
                console.print(f"    {line}", highlight=False, markup=False)
    for sub, state in still:
        console.print(f"[yellow]{state.state.lower()}[/yellow] SLURM job {sub.job_id}: {escape(sub.backend)} on "
                      f"{escape(sub.scenario)}, {slurm.steps_done(sub)} steps so far ({sub.run_dir})", highlight=False)
    if interrupted:
        raise typer.Exit(EXIT_INTERRUPTED)
    if problems:
        raise typer.Exit(1)


@app.command()
def plot(
    published: Annotated[bool, typer.Option("--published", help="the published XTuner table alone (no runs needed)")] = False,
    scenario: Annotated[Optional[str], typer.Option(help="only these scenarios (name or glob)")] = None,
    db: DbOption = None,
    out: OutOption = None,
    settings: SettingsOption = "matched",
    include_unverified: Annotated[bool, typer.Option(
        "--include-unverified", help="also runs of old-contract plugins that did not make every claim")] = False,
) -> None:
    """Charts of TGS and TFLOPs/GPU against context length, one line per backend."""
    from framework_bench.present.plotting import plot_published, plot_results
    out = _out(out)
    _writable_folder(out, "--out")
    if published:
        paths = plot_published(out)
    else:
        _check_settings(settings)
        rows = _store(db, read_only=True).latest_by_point(scenario, settings_mode=settings)
        if not rows:
            fail(f"no stored runs with {settings} settings to plot: run `fbench compare` first, or use --published")
        paths = plot_results(rows, out, include_unverified=include_unverified)
    for p in paths:
        console.print(str(p), highlight=False)


@app.command()
def report(
    scenario: Annotated[Optional[str], typer.Option(help="only these scenarios (name or glob)")] = None,
    db: DbOption = None,
    out: OutOption = None,
    settings: SettingsOption = "matched",
) -> None:
    """Write report.md and a self-contained report.html from the stored runs."""
    _check_settings(settings)
    out = _out(out)
    rows = _store(db, read_only=True).latest_by_point(scenario, settings_mode=settings)
    if not rows:
        fail(f"no stored runs with {settings} settings to report: run `fbench compare` first")
    _writable_folder(out, "--out")
    _, md, page = _charts_and_report(rows, out)
    console.print(f"{md}\n{page}", highlight=False)
