"""`fbench run`, `compare` and `check-backend`: each checks its options, asks one library entry
(`run/campaign.py`, `framework_bench/testing.py`) and renders what it says (`cli/progress.py`) and
returns; what they print is `framework_bench/cli/render.py`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from framework_bench.cli import common, render
from framework_bench.present import run_lines
from framework_bench.present.run_lines import closing_line
from framework_bench.present.terminal_tables import points_table, results_table


def check_backend(
    name: Annotated[str, typer.Argument(metavar="BACKEND", help="backend name (see `fbench backends`)")],
    scenario: Annotated[str, typer.Option("--scenario", metavar="NAME", help="scenario to run it on")] = "tiny_cpu",
    timeout: Annotated[Optional[float], typer.Option("--timeout",
        metavar="SECONDS", help="seconds before the run is stopped")] = 900,
    settings: common.SettingsOption = "matched",
) -> None:
    """Run a backend through a small scenario and every host verification; exit 1 on any failure.

    Example: fbench check-backend xtuner --scenario tiny_cpu"""
    from framework_bench import testing
    from framework_bench.run.interrupts import stop_signals_interrupt
    common.check_settings(settings)
    common.check_timeout(timeout)
    _reference(False)  # one line, before any run, where the reference cannot be used
    try:
        with stop_signals_interrupt(), common.err.status(f"{name} on {scenario}: running"):
            report = testing.check_backend(name, scenario=scenario, settings_mode=settings, timeout=timeout)
    except common.user_errors() as e:
        common.fail(str(e))
    except KeyboardInterrupt:  # while packing or judging: no worker runs then
        common.stop_interrupted("nothing was checked")
    if report.result.status == "interrupted":  # the worker's whole process group is stopped
        common.stop_interrupted(f"the check of {name} stopped, its worker with it")
    render.show(points_table(name, report))
    if report.result.run_dir:
        common.console.print(f"run folder {report.result.run_dir}", highlight=False)
    if not report.passed:
        raise typer.Exit(1)


def run(
    backend: Annotated[str, typer.Option("--backend", metavar="NAME", help="backend name (see `fbench backends`)")],
    scenario: Annotated[str, typer.Option("--scenario", metavar="NAME", help="scenario name or file")],
    timeout: Annotated[Optional[float], typer.Option("--timeout",
        metavar="SECONDS", help="seconds before the run is stopped")] = None,
    launcher: Annotated[Optional[str], typer.Option("--launcher",
        metavar="NAME", help="local, torchrun or slurm (default: by process count)")] = None,
    dry_run: Annotated[bool, common.Flag("--dry-run", help="print the plan; run nothing")] = False,
    force: Annotated[bool, common.Flag("--force", help="run even if the memory estimate says it won't fit")] = False,
    db: common.DbOption = None,
    as_json: Annotated[bool, common.Flag("--json", help="one JSON object")] = False,
    settings: common.SettingsOption = "matched",
    time_limit: common.TimeOption = None,
    cpus_per_task: common.CpusOption = None,
    sbatch_arg: common.SbatchArgOption = None,
    wait: common.WaitOption = False,
    poll: common.PollOption = 30.0,
    seed: common.SeedOption = None,
    verbose: common.VerboseOption = False,
    repeat: common.RepeatOption = "1",
    warmup_rounds: common.WarmupOption = None,
    precision: common.PrecisionOption = None,
    budget: common.BudgetOption = None,
    no_reference: common.NoReferenceOption = False,
    gpu: common.GpuOption = None,
) -> None:
    """Run one backend on one scenario, then the reference to judge it; store both, and report TGS / TFLOPs.

    With --repeat: its trials (compare's trial loop, this backend and the reference) and the median's 95% interval.

    Example: fbench run --backend xtuner --scenario tiny_cpu --repeat 5"""
    request, reference = _checked_request(
        [common.load_scenario(scenario)], [backend], launcher=launcher, timeout=timeout, force=force, settings=settings,
        seed=seed, time_limit=time_limit, cpus_per_task=cpus_per_task, sbatch_arg=sbatch_arg, repeat=repeat,
        warmup_rounds=warmup_rounds, precision=precision, budget=budget, no_reference=no_reference, dry_run=dry_run,
        gpu=gpu, wait=wait, poll=poll, out=None, db=db)
    outcome = _campaign(request, reference)
    store = outcome.store
    if dry_run or launcher == "slurm":
        _show(request, outcome, store, None, as_json, wide=False, verbose=verbose, settings=settings)
        return
    results = outcome.results
    if request.repeat != 1 or warmup_rounds:  # its trials and the reference's, as compare shows them
        _show(request, outcome, store, None, as_json, wide=False, verbose=verbose, settings=None)
        _end(results, outcome.interrupted, closing=True, as_json=as_json)
        return
    if outcome.interrupted and not any(r.backend == backend for r in results):
        common.stop_interrupted()
    r = next(r for r in results if r.backend == backend)
    if as_json:
        print(json.dumps(r.model_dump(mode="json"), indent=2))
    else:
        render.say(run_lines.run_lines(r, store.path, verbose, judges=[ref for ref in results if ref is not r]))
    _end(results, outcome.interrupted)


def _end(results: list, interrupted: bool, fail_if_slower: float | None = None, points=None,
         closing: bool = False, as_json: bool = False) -> None:
    """The exit of a command that ran trials: 130 when interrupted, else by the runs' statuses;
    with `--fail-if-slower PCT`, 1 when a verdict (of `points`) says a backend is slower than the
    reference by more. `closing`: its last line counts the runs by status and says what the exit
    code means (on stderr under `--json`)."""
    if interrupted:
        common.stop_interrupted()
    code, why = run_lines.exit_code(results), None
    if not code and fail_if_slower is not None and (slower := points.slower_than(fail_if_slower)):
        common.err.print(run_lines.slower_line(slower, fail_if_slower, "than the reference"), highlight=False, markup=False)
        code, why = 1, f"a backend slower than the reference by more than {fail_if_slower:g}%"
    if closing:
        (common.err if as_json else common.console).print(closing_line(results, code, why), highlight=False,
                                                          markup=False)
    if code:
        raise typer.Exit(code)


def compare(
    scenario: Annotated[list[str], typer.Option("--scenario",
        metavar="NAME", help="scenario name, glob (e.g. 'tiny_cpu*') or file; repeatable")],
    backends_: Annotated[Optional[str], typer.Option(
        "--backends", metavar="NAMES", help="comma-separated (default: every installed)")] = None,
    timeout: Annotated[Optional[float], typer.Option("--timeout",
        metavar="SECONDS", help="seconds per run before it is stopped")] = None,
    db: common.DbOption = None,
    out: common.OutOption = None,
    launcher: Annotated[Optional[str], typer.Option("--launcher",
        metavar="NAME", help="local, torchrun or slurm (default: by process count)")] = None,
    dry_run: Annotated[bool, common.Flag("--dry-run", help="print each backend's plan; run nothing")] = False,
    force: Annotated[bool, common.Flag("--force", help="run even if the memory estimate says it won't fit")] = False,
    as_json: Annotated[bool, common.Flag(
        "--json", help="print one JSON object: the runs, summaries, pairs and verdicts")] = False,
    settings: common.SettingsOption = "matched",
    time_limit: common.TimeOption = None,
    cpus_per_task: common.CpusOption = None,
    sbatch_arg: common.SbatchArgOption = None,
    wait: common.WaitOption = False,
    poll: common.PollOption = 30.0,
    seed: common.SeedOption = None,
    wide: common.WideOption = False,
    verbose: common.VerboseOption = False,
    repeat: common.RepeatOption = "1",
    warmup_rounds: common.WarmupOption = None,
    precision: common.PrecisionOption = None,
    budget: common.BudgetOption = None,
    no_reference: common.NoReferenceOption = False,
    fail_if_slower: common.FailIfSlowerOption = None,
    gpu: common.GpuOption = None,
) -> None:
    """Run backends over scenarios, the reference in each round to judge the others; store, tabulate, chart, report.

    Example: fbench compare --scenario 'tiny_cpu*' --backends xtuner,llamafactory"""
    from framework_bench.plugins import registry as plugins
    from framework_bench.run import compare as compare_

    try:
        chosen = compare_.expand(scenario)
        names = common.backend_names(backends_) if backends_ is not None else list(plugins.backends())
    except common.user_errors() as e:
        common.fail(str(e))
    if backends_ is None and plugins.load_errors:  # every installed backend, less the broken ones: said once
        common.err.print("[yellow]skipped, broken: " + escape("; ".join(f"{n} ({why})" for n, why in plugins.load_errors.items()))
                  + "[/yellow]", highlight=False, soft_wrap=True)
    request, reference = _checked_request(
        chosen, names, launcher=launcher, timeout=timeout, force=force, settings=settings, seed=seed,
        time_limit=time_limit, cpus_per_task=cpus_per_task, sbatch_arg=sbatch_arg, repeat=repeat,
        warmup_rounds=warmup_rounds, precision=precision, budget=budget, no_reference=no_reference, dry_run=dry_run,
        gpu=gpu, wait=wait, poll=poll, out=common.out_folder(out), db=db)
    outcome = _campaign(request, reference)
    store = outcome.store
    points = _show(request, outcome, store, request.out, as_json, wide=wide, verbose=verbose, settings=settings)
    if points is not None:
        _end(outcome.results, outcome.interrupted, fail_if_slower, points, closing=True, as_json=as_json)


def bisect(
    backend: Annotated[str, typer.Option("--backend", metavar="NAME", help="backend name (see `fbench backends`)")],
    good: Annotated[str, typer.Option("--good", metavar="VERSION", help="a release known not to be slow")],
    bad: Annotated[str, typer.Option("--bad", metavar="VERSION", help="a later release known to be slow")],
    scenario: Annotated[str, typer.Option("--scenario", metavar="NAME", help="scenario name or file")],
    package: Annotated[Optional[str], typer.Option("--package", metavar="DIST", help=(
        "the distribution whose releases are bisected (default: the framework's own)"))] = None,
    threshold: Annotated[float, typer.Option("--threshold", metavar="PCT", callback=common.within(0.0, words="percent"),
                                             help="slower by more than PCT percent, with 95% confidence")] = 5.0,
    repeat: common.RepeatOption = "3",
    db: common.DbOption = None,
) -> None:
    """The first release past a slowdown: the releases from --good to --bad halved, each probed beside --good in one compare.

    Example: fbench bisect --backend trl --package transformers --good 5.6.0 --bad 5.23.0 --scenario tiny_cpu"""
    from framework_bench.present.bisection import lines, probe_line
    from framework_bench.run.bisect import bisect as halve
    request, _ = _checked_request([common.load_scenario(scenario)], [], repeat=repeat, db=db)
    found = _campaign(request, [], lambda events: halve(backend, package, good, bad, request, threshold, events,
                                                         lambda p: common.console.print(probe_line(p))))
    render.say(lines(found, threshold))


def _checked_request(scenarios: list, names: list[str], *, launcher: str | None = None, timeout: float | None = None,
                     force: bool = False, settings: str = "matched", seed: int | None = None, time_limit: str | None = None,
                     cpus_per_task: int | None = None, sbatch_arg: list[str] | None = None, repeat: str = "1",
                     warmup_rounds: int | None = None, precision: float | None = None, budget: str | None = None,
                     no_reference: bool = False, dry_run: bool = False, gpu: str | None = None, wait: bool = False,
                     poll: float = 30.0, out: Path | None = None, db: Path | None = None):
    """`run`'s and `compare`'s choices, each checked (one error line where one cannot be), as the
    campaign's `Request`, with the reference the command adds (a list of none or one)."""
    from framework_bench.run.campaign import Request
    from framework_bench.run.options import RunOptions
    common.check_launcher(launcher)
    common.check_timeout(timeout)
    common.check_settings(settings)
    trials = common.check_repeat(repeat, precision, warmup_rounds, launcher)
    options = RunOptions(launcher=launcher, timeout=timeout, force=force, settings_mode=settings, seed=seed,
                         pinned_seed=seed is not None, sbatch=common.sbatch_options(time_limit, cpus_per_task, sbatch_arg),
                         db=db)
    request = Request(scenarios=scenarios, backends=[common.backend_spec(n) for n in names], options=options,
                      repeat=trials, warmup_rounds=warmup_rounds, precision=precision,
                      budget_s=common.check_budget(budget, trials), no_reference=no_reference, dry_run=dry_run,
                      gpu=_dry_gpu(gpu, dry_run), wait=wait, poll=poll, out=out)
    return request, _reference(no_reference)


def _campaign(request, reference: list[str], drive=None):
    """The campaign (or what `drive(events)` makes of it), its events rendered: its outcome (one
    error line where it cannot start)."""
    from framework_bench.cli.progress import Progress
    from framework_bench.run.campaign import campaign
    from framework_bench.run.interrupts import stop_signals_interrupt
    from framework_bench.store.unstored import Unstored
    try:
        with Progress(request) as events, stop_signals_interrupt():
            return drive(events) if drive else campaign(request, events, reference=next(iter(reference), None))
    except Unstored as e:
        common.fail_unstored(e)
    except common.user_errors() as e:
        common.fail(str(e))


def _show(request, outcome, store, out: Path | None, as_json: bool, wide: bool, verbose: bool, settings: str | None):
    """What a campaign ran, as the command prints it: the plans of a dry run; the submissions, or
    the table of the runs collected, of a SLURM one; the table, verdicts, settings, charts and the
    answer of local rounds. Returns the points a local campaign's exit is decided on (None else)."""
    if request.dry_run:
        _print_plans(request, outcome, as_json)
        return None
    by_name = {s.name: s for s in request.scenarios}
    if request.options.launcher == "slurm":
        if outcome.interrupted and not outcome.waited:
            common.err.print(f"[yellow]interrupted: {len(outcome.submitted)} job(s) submitted; `fbench results "
                             "collect` stores them when they end[/yellow]")
            raise typer.Exit(common.EXIT_INTERRUPTED)
        if not request.wait:
            if outcome.submitted:
                common.console.print("`fbench results collect` stores each run once its job has ended (or use --wait)")
            return None
        if outcome.submitted:
            common.err.print(f"[yellow]stopped waiting: {len(outcome.submitted)} job(s) still queued or running; "
                             "`fbench results collect` stores them when they end[/yellow]")
        common.console.print(results_table(render.points(outcome.results), by_name))
        render.say(run_lines.reason_lines(outcome.results))
        common.console.print(f"results stored in {store.path}")
        if out is not None and outcome.results:
            _charts(store, by_name, None, out, as_json)
        _end(outcome.results, outcome.interrupted)
        return None
    results = outcome.results
    points = render.points(results)
    if as_json:
        print(json.dumps({"runs": points.runs, **points.data()}, indent=2))  # the verdicts as data too
    else:
        render.show(results_table(points, by_name, wide=wide, verbose=verbose))
        render.say(points.with_intervals)  # the pairs with none are said once, in the answer
        from framework_bench.present.diff import version_losses  # numpy: not at `fbench --help`
        render.say(version_losses(points.runs, by_name))  # a backend at two versions: where their losses part
        render.say(run_lines.auto_stop_lines(outcome.stops, results))
        render.say(run_lines.reason_lines(results))
        if settings is not None:
            render.print_differences([r.model_dump(mode="json") for r in results], settings)
        common.console.print(f"results stored in {store.path}", highlight=False)
    if out is not None and results:
        _charts(store, by_name, settings, out, as_json)
    if not as_json:
        render.print_answers(points)
    return points


def _charts(store, by_name: dict, settings: str | None, out: Path, as_json: bool) -> None:
    charts, md, page = common.charts_and_report(common.stored_rows(store, by_name, settings), out)
    (common.err if as_json else common.console).print(
        f"charts: {', '.join(str(c) for c in charts if c.suffix == '.png')}; report: {md}, {page}",
        highlight=False, markup=False)


def _print_plans(request, outcome, as_json: bool) -> None:
    """--dry-run: every plan, with every refusal side by side; nothing is launched or submitted.
    With --json, one JSON list of the plans on stdout and nothing else there. On GPU scenarios,
    what --repeat and the warm-up rounds multiply (`Outcome.costs`). --gpu: memory and time are
    judged on it, each estimate answering whether it fits."""
    show = common.err if as_json else common.console  # with --json, stdout holds the JSON alone
    gpu = request.gpu
    for s in request.scenarios:
        mine = [d for d in outcome.plans if d.scenario == s.name]
        show.rule(f"{s.name}: {s.cluster.nodes} node(s) x {s.cluster.gpus_per_node} {s.cluster.device}"
                  + (f", judged on {gpu}" if gpu else ""))
        render.say(run_lines.estimate_lines(mine, request.options.settings_mode, gpu), show)
        for d in mine:
            render.say(run_lines.plan_lines(d, request.options), show)
    for name, cost in outcome.costs.items():
        show.print(f"{name}: {cost.summary()}", highlight=False, markup=False)
    if as_json:
        print(json.dumps([d.model_dump(mode="json") for d in outcome.plans], indent=2))


def _dry_gpu(gpu: str | None, dry_run: bool) -> str | None:
    """--gpu as the GPU table names it; it asks what a plan would meet on that GPU, so it goes
    with --dry-run (a run meets the GPU it gets)."""
    if gpu is not None and not dry_run:
        common.fail("--gpu goes with --dry-run: a run is judged on the GPUs it gets")
    return common.gpu_named(gpu)


def _reference(no_reference: bool) -> list[str]:
    """The reference a command adds to the backends chosen, as a list of none or one (none with
    --no-reference); one error line before anything runs where FBENCH_REFERENCE names no working
    backend, or two plugins each declare themselves the reference (`reference.refusal`)."""
    from framework_bench.run import reference
    if no_reference:
        return []
    if problem := reference.refusal():
        common.fail(problem)
    name = reference.reference_backend()
    return [name] if name else []
