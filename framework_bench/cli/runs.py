"""`fbench run`, `compare` and `check-backend`: thin over `framework_bench/run/` (the pipeline,
its launchers, the SLURM collect); what they print is `framework_bench/cli/render.py`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from framework_bench.cli import common, render


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
    common.check_run_folders([name, *_reference(False)], [common.load_scenario(scenario)])
    try:
        with stop_signals_interrupt(), common.err.status(f"{name} on {scenario}: running"):
            report = testing.check_backend(name, scenario=scenario, settings_mode=settings, timeout=timeout)
    except common.user_errors() as e:
        common.fail(str(e))
    except KeyboardInterrupt:  # while packing or judging: no worker runs then
        common.stop_interrupted("nothing was checked")
    if report.result.status == "interrupted":  # the worker's whole process group is stopped
        common.stop_interrupted(f"the check of {name} stopped, its worker with it")
    render.show(render.points_table(name, report))
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
    no_reference: common.NoReferenceOption = False,
    gpu: common.GpuOption = None,
) -> None:
    """Run one backend on one scenario, then the reference to judge it; store both, and report TGS / TFLOPs.

    With --repeat: its trials (compare's trial loop, this backend and the reference) and the median's 95% interval.

    Example: fbench run --backend xtuner --scenario tiny_cpu --repeat 5"""
    s = common.load_scenario(scenario)
    common.check_launcher(launcher)
    common.check_timeout(timeout)
    common.check_settings(settings)
    common.check_local(launcher, [s])
    trials = common.check_repeat(repeat, precision, warmup_rounds, launcher)
    gpu = _dry_gpu(gpu, dry_run)
    reference = _reference(no_reference)
    common.check_run_folders([backend, *reference], [s])
    options = _run_options(launcher, timeout, force, settings, seed, time_limit, cpus_per_task, sbatch_arg)
    if dry_run:
        _plan_only([backend], [s], options, reference, as_json=as_json, repeat=trials, warmup_rounds=warmup_rounds,
                   gpu=gpu)
        return
    if launcher == "slurm":
        _submit_slurm([backend], [s], options.model_copy(update={"db": db}), wait=wait, poll=poll, out=None,
                      repeat=trials, no_reference=no_reference)
        return
    store = common.open_store(db)
    common.preflight(store)
    options = options.model_copy(update={"db": store.path})
    if trials != 1 or warmup_rounds:
        _run_trials(backend, s, options, store, trials, warmup_rounds, precision, no_reference,
                    as_json=as_json, verbose=verbose)
        return
    results, _, interrupted = _trial_loop([s], [backend], options, store, 1, 0, None, no_reference)
    if interrupted and not any(r.backend == backend for r in results):
        common.stop_interrupted()
    r = next(r for r in results if r.backend == backend)
    if as_json:
        print(json.dumps(render.result_dict(r), indent=2))
    else:
        render.print_run(r, store.path, verbose=verbose)
        for ref in results:
            if ref is not r:  # the reference that judged it, stored beside it
                common.console.print(f"judged against {ref.backend}'s run: {ref.status}"
                                     + (f", TGS {render.fmt(ref.tgs)}" if ref.tgs else "")
                                     + (f", stored as result {ref.result_id}" if ref.result_id is not None else ""),
                                     highlight=False, markup=False)
    _end(results, interrupted)


def _end(results: list, interrupted: bool, fail_if_slower: float | None = None, points=None,
         closing: bool = False, as_json: bool = False) -> None:
    """The exit of a command that ran trials: 130 when interrupted, else by the runs' statuses;
    with `--fail-if-slower PCT`, 1 when a verdict (of `points`) says a backend is slower than the
    reference by more. `closing`: its last line counts the runs by status and says what the exit
    code means (on stderr under `--json`)."""
    if interrupted:
        common.stop_interrupted()
    code, why = common.exit_code(results), None
    if not code and fail_if_slower is not None and (slower := points.slower_than(fail_if_slower)):
        common.err.print(f"slower than the reference by more than {fail_if_slower:g}%: "
                         + "; ".join(f"{r.scenario}: {r.backend} ({(1 - r.ratio) * 100:.1f}%)" for r in slower),
                         highlight=False, markup=False)
        code, why = 1, f"a backend slower than the reference by more than {fail_if_slower:g}%"
    if closing:
        (common.err if as_json else common.console).print(render.closing_line(results, code, why), highlight=False,
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
    no_reference: common.NoReferenceOption = False,
    fail_if_slower: common.FailIfSlowerOption = None,
    gpu: common.GpuOption = None,
) -> None:
    """Run backends over scenarios, the reference in each round to judge the others; store, tabulate, chart, report.

    Example: fbench compare --scenario 'tiny_cpu*' --backends xtuner,llamafactory"""
    from framework_bench.run import compare as compare_
    from framework_bench.plugins import registry as plugins

    common.check_launcher(launcher)
    common.check_timeout(timeout)
    common.check_settings(settings)
    trials = common.check_repeat(repeat, precision, warmup_rounds, launcher)
    gpu = _dry_gpu(gpu, dry_run)
    common.check_scenario_names(scenario)
    out = common.out_folder(out)
    try:
        chosen = compare_.expand(scenario)
        names = common.backend_names(backends_) if backends_ is not None else list(plugins.backends())
    except common.user_errors() as e:
        common.fail(str(e))
    if backends_ is None and plugins.load_errors:  # every installed backend, less the broken ones: said once
        common.err.print("[yellow]skipped, broken: " + escape("; ".join(f"{n} ({why})" for n, why in plugins.load_errors.items()))
                  + "[/yellow]", highlight=False, soft_wrap=True)
    common.check_local(launcher, chosen)
    reference = _reference(no_reference)
    common.check_run_folders([*names, *reference], chosen)
    options = _run_options(launcher, timeout, force, settings, seed, time_limit, cpus_per_task, sbatch_arg)
    if dry_run:
        _plan_only(names, chosen, options, reference, as_json=as_json, repeat=trials, warmup_rounds=warmup_rounds,
                   gpu=gpu)
        return
    if launcher == "slurm":
        _submit_slurm(names, chosen, options.model_copy(update={"db": db}), wait=wait, poll=poll, out=out,
                      repeat=trials, no_reference=no_reference)
        return
    store = common.open_store(db)
    common.preflight(store, out)
    by_name = {s.name: s for s in chosen}
    results, stops, interrupted = _trial_loop(chosen, names, options.model_copy(update={"db": store.path}), store,
                                              trials, warmup_rounds, precision, no_reference)
    points = render.points(results)
    if as_json:
        print(json.dumps(render.verdict_object(points), indent=2))
    else:
        render.show(render.results_table(points, by_name, wide=wide, verbose=verbose))
        render.print_verdicts(points)
        render.print_auto_stops(stops, results)
        render.print_reasons(results)
        render.print_differences([render.result_dict(r) for r in results], settings)
        common.console.print(f"results stored in {store.path}")
    if results:
        charts, md, page = common.charts_and_report(common.stored_rows(store, by_name, settings), out)
        (common.err if as_json else common.console).print(f"charts: {', '.join(str(c) for c in charts if c.suffix == '.png')}; "
                                            f"report: {md}, {page}", highlight=False, markup=False)
    if not as_json:
        render.print_answers(points)
    _end(results, interrupted, fail_if_slower, points, closing=True, as_json=as_json)


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


def _trial_loop(chosen: list, names: list[str], options, store, trials, warmup_rounds: int | None,
                precision: float | None, no_reference: bool) -> tuple[list, list, bool]:
    """`run/compare.py`'s trial loop with a progress bar (the loop stores each run as it ends):
    (every stored run, whatever ended the loop; the `--repeat auto` stops; whether Ctrl-C ended it)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from framework_bench.run import compare as compare_
    from framework_bench.run.interrupts import stop_signals_interrupt
    from framework_bench.store.unstored import Unstored
    done: list = []
    stops: list = []
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[note]}"), TimeElapsedColumn(), console=common.err, transient=False)
    tasks: dict = {}

    def on_start(backend: str, s) -> None:
        if "current" in tasks:  # runs go one at a time: the one before has ended, its clock stops
            progress.stop_task(tasks["current"])
        tasks["current"] = tasks[backend] = progress.add_task(f"{backend} · {s.name}", total=s.steps.total,
                                                              note="starting")

    def on_step(done: int, total: int, secs: float | None) -> None:
        progress.update(tasks["current"], completed=done, note=f"step {secs:.2f} s" if secs else "")

    def on_result(r, s) -> None:  # a run once judged and stored: the round's others after its reference
        done.append(r)
        progress.stop_task(tasks[r.backend])  # its time is its run's, not the compare's so far
        progress.update(tasks[r.backend], note=f"{r.status}" + (f" · TGS {r.tgs:,.1f}" if r.tgs else ""))

    interrupted = False
    with progress:
        try:
            with stop_signals_interrupt():
                compare_.compare(chosen, names, options, store=store, repeat=trials, warmup_rounds=warmup_rounds,
                                 precision=precision, no_reference=no_reference, on_start=on_start, on_step=on_step,
                                 on_result=on_result, on_auto=stops.append, on_kept=common.say_kept)
        except (compare_.Interrupted, KeyboardInterrupt):
            interrupted = True
        except Unstored as e:
            common.fail_unstored(e)
        except common.user_errors() as e:
            common.fail(str(e))
    return done, stops, interrupted


def _run_trials(backend: str, s, options, store, trials, warmup_rounds: int | None, precision: float | None,
                no_reference: bool, as_json: bool, verbose: bool) -> None:
    """`fbench run --repeat`: the backend's trials and the reference's as compare shows them, each row
    with the median's interval and % of the reference."""
    results, stops, interrupted = _trial_loop([s], [backend], options, store, trials, warmup_rounds, precision,
                                              no_reference)
    points = render.points(results)
    if as_json:
        print(json.dumps(render.verdict_object(points), indent=2))
    else:
        render.show(render.results_table(points, {s.name: s}, verbose=verbose))
        render.print_verdicts(points)
        render.print_auto_stops(stops, results)
        render.print_reasons(results)
        common.console.print(f"results stored in {store.path}", highlight=False)
        render.print_answers(points)
    _end(results, interrupted, closing=True, as_json=as_json)


def _run_options(launcher: str | None, timeout: float | None, force: bool, settings: str, seed: int | None,
                 time_limit: str | None, cpus_per_task: int | None, sbatch_arg: list[str] | None):
    """The command line's choices as one `RunOptions` (checked by the callers first)."""
    from framework_bench.run.options import RunOptions
    return RunOptions(launcher=launcher, timeout=timeout, force=force, settings_mode=settings, seed=seed,
                      pinned_seed=seed is not None, sbatch=common.sbatch_options(time_limit, cpus_per_task, sbatch_arg))


def _plan_only(backend_names: list[str], chosen: list, options, reference: list[str], as_json: bool = False, repeat=1,
               warmup_rounds: int | None = None, gpu: str | None = None) -> None:
    """--dry-run: print every plan, with every verdict side by side; nothing is launched or
    submitted. With --json, one JSON list of the plans on stdout and nothing else there. On GPU
    scenarios, what --repeat and the warm-up rounds multiply: runs and training time, the
    `reference`'s (none or one: `_reference`) counted too. `gpu` (--gpu): memory and time are
    judged on it, each estimate answering whether it fits."""
    from framework_bench.measure.machine import detect
    from framework_bench.run import dry_run

    machine = detect()
    show = common.err if as_json else common.console  # with --json, stdout holds the JSON alone
    try:
        plans = dry_run.plans(chosen, backend_names, options, machine, gpu)
    except common.user_errors() as e:
        common.fail(str(e))
    for s in chosen:
        mine = [d for d in plans if d.scenario == s.name]
        show.rule(f"{s.name}: {s.cluster.nodes} node(s) x {s.cluster.gpus_per_node} {s.cluster.device}"
                  + (f", judged on {gpu}" if gpu else ""))
        # Each backend's own estimate in this settings mode (its declared AdamW and sequence-parallel
        # engine), the figure of its verdict and plan lines below; one line per distinct estimate.
        by_estimate: dict[str, list[str]] = {}
        for d in mine:
            if d.verdict is not None and d.verdict.estimate is not None:
                by_estimate.setdefault(render.estimate_line(d.verdict.estimate, gpu), []).append(d.backend)
        for summary, names in by_estimate.items():
            show.print(f"{', '.join(names)} ({options.settings_mode} settings): {summary}", highlight=False,
                       markup=False)
        for d in mine:
            render.print_plan(d, s, options, show)
    for s in chosen:
        try:
            cost = dry_run.trial_cost(s, [d for d in plans if d.scenario == s.name], machine, repeat, warmup_rounds,
                                      reference=next(iter(reference), None), gpu=gpu)
        except common.user_errors() as e:
            common.fail(str(e))
        if cost is not None:
            show.print(f"{s.name}: {cost.summary()}", highlight=False, markup=False)
    if as_json:
        print(json.dumps([d.model_dump(mode="json") for d in plans], indent=2))


def _submit_slurm(backend_names: list[str], chosen: list, options, *, wait: bool, poll: float,
                  out: Path | None, repeat: int = 1, no_reference: bool = False) -> None:
    """--launcher slurm: judge, write and submit each round as one job (never a backend that
    refused, or whose hooks raised); those are stored at once, submitted runs when their job
    ends (--wait, or `results collect`)."""
    from framework_bench.run import pipeline, submit
    from framework_bench.run.interrupts import stop_signals_interrupt
    from framework_bench.store.unstored import Unstored
    store = common.open_store(options.db)
    options = options.model_copy(update={"db": store.path})
    by_name = {s.name: s for s in chosen}
    results, submitted = [], []

    def on_scenario(s) -> None:
        common.console.rule(f"{s.name}: {s.cluster.nodes} node(s) x {s.cluster.gpus_per_node} {s.cluster.device}")

    def on_round(s, i, order) -> None:
        if repeat > 1 or len(order) > 1:
            common.console.print(f"round {i}/{repeat}: one job runs {', '.join(order)}, in that order", highlight=False)

    def on_planned(name, s, p) -> None:
        render.print_submission(name, p, options)
        if p.result is not None:
            try:
                if kept := pipeline.keep(store, p.result, s):
                    common.say_kept(kept)
            except Unstored as e:
                common.fail_unstored(e)
            results.append(p.result)
            common.console.print(f"  nothing submitted; stored as result {p.result.result_id}", highlight=False)
        elif p.submission:
            submitted.append(p.submission)

    try:
        with stop_signals_interrupt():
            submit.submit_all(chosen, backend_names, options, repeat=repeat, no_reference=no_reference,
                              on_scenario=on_scenario, on_round=on_round, on_planned=on_planned)
    except common.user_errors() as e:
        common.fail(str(e))
    except KeyboardInterrupt:  # while judging, packing or submitting: what was submitted stays recorded
        common.err.print(f"[yellow]interrupted: {len(submitted)} job(s) submitted; `fbench results collect` "
                         "stores them when they end[/yellow]")
        raise typer.Exit(common.EXIT_INTERRUPTED)
    if not wait:
        if submitted:
            common.console.print("`fbench results collect` stores each run once its job has ended (or use --wait)")
        return
    waited, interrupted = wait_for_jobs(submitted, lambda sub: store, poll)
    results += waited
    common.console.print(render.results_table(render.points(results), by_name))
    render.print_reasons(results)
    common.console.print(f"results stored in {store.path}")
    if out is not None and results:
        charts, md, page = common.charts_and_report(common.stored_rows(store, by_name), out)
        common.console.print(f"charts: {', '.join(str(c) for c in charts if c.suffix == '.png')}; report: {md}, {page}",
                      highlight=False)
    if interrupted:
        raise typer.Exit(common.EXIT_INTERRUPTED)


def wait_for_jobs(subs: list, store_for, poll: float) -> tuple[list, bool]:
    """`framework_bench/run/collect.py`'s wait, with a progress bar; (the results, whether Ctrl-C
    stopped the waiting)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from framework_bench.run import collect
    results = []
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[note]}"), TimeElapsedColumn(), console=common.err, transient=False)
    tasks = {sub.run_dir: progress.add_task(f"job {sub.job_id} · {sub.backend} · {sub.scenario}",
                                            total=collect.scenario_of(sub).steps.total, note="submitted") for sub in subs}

    def on_result(r, sub) -> None:
        results.append(r)
        progress.update(tasks[sub.run_dir], completed=collect.steps_done(sub),
                        note=f"{r.status}" + (f" · TGS {r.tgs:,.1f}" if r.tgs else "") + f" · stored as {r.result_id}")

    def on_problem(sub, why: str) -> None:
        progress.update(tasks[sub.run_dir], note=f"not stored: {why}")

    def on_waiting(sub, state) -> None:
        progress.update(tasks[sub.run_dir], completed=collect.steps_done(sub), note=state.state.lower())

    with progress:
        left = collect.wait(subs, store_for, poll, on_result, on_problem, on_waiting)
    if left:
        common.err.print(f"[yellow]stopped waiting: {len(left)} job(s) still queued or running; "
                         "`fbench results collect` stores them when they end[/yellow]")
    return results, bool(left)
