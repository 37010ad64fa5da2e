"""`fbench results ...`: the results store, and the SLURM runs collected into it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from framework_bench.cli import common, render

results_app = common.Typer(no_args_is_help=True, help="The results store (SQLite).\n\n"
                                                      "Example: fbench results list --limit 10")


def reading_store(db: Path | None):
    """The store for a command that only reads (list, show, export, plot, report): a current one
    as `common.open_store` opens it (the rows earlier commands kept aside are stored first); an
    older schema is read as it is, never migrated: the next command that stores a run does that."""
    from framework_bench.store import results, schema
    try:
        store = results.ResultStore(db, must_exist=db is not None, read_only=True)
    except results.ResultsError as e:
        common.fail(str(e))
    if store.version == schema.SCHEMA_VERSION:
        store.close()
        return common.open_store(db, read_only=True)
    common.err.print(f"[yellow]{escape(str(store.path))} has schema version {store.version}: read as it is; the next "
                     f"command that stores a run (fbench run, compare, results collect) migrates it to "
                     f"{schema.SCHEMA_VERSION}, after a backup copy beside it[/yellow]", highlight=False, soft_wrap=True)
    return store


def say_damaged(store) -> None:
    """One line for each stored row that could not be read and was left out."""
    for line in store.damaged.values():
        common.err.print(f"[yellow]{escape(line)}[/yellow]", highlight=False, soft_wrap=True)


@results_app.command("list")
def results_list(
    scenario: Annotated[Optional[str], typer.Option("--scenario", metavar="GLOB", help="scenario name or glob")] = None,
    backend: Annotated[Optional[str], typer.Option("--backend", metavar="NAME", help="backend name")] = None,
    db: common.DbOption = None,
    limit: Annotated[int, typer.Option(
        "--limit", metavar="N", callback=common.within(1), help="show the latest N runs, 1 or more")] = 50,
    all_: Annotated[bool, common.Flag("--all", help="show every stored run")] = False,
    wide: common.WideOption = False,
) -> None:
    """One line per stored run: the latest 50 unless --limit N or --all.

    The trials of one compare together, each backend's in round order; then the verdicts of each
    compare of several rounds.

    Example: fbench results list --scenario 'tiny_cpu*' --limit 10"""
    from framework_bench.present.run_lines import compare_verdict_lines
    from framework_bench.present.terminal_tables import by_compare, stored_runs_table
    store = reading_store(db)
    rows = store.list(scenario, backend)
    say_damaged(store)
    shown = rows if all_ else rows[-limit:]
    compares = by_compare(shown)
    render.show(stored_runs_table(compares, wide))
    if len(shown) < len(rows):
        common.console.print(f"the latest {len(shown)} of {len(rows)} runs; --all or --limit N for more", highlight=False)
    render.say(compare_verdict_lines(compares))


@results_app.command("show")
def results_show(
    run_id: Annotated[int, typer.Argument(metavar="ID", help="the run's id (see `fbench results list`)")],
    db: common.DbOption = None,
) -> None:
    """One run as JSON: figures, per-step metrics, scenario and environment manifest.

    Example: fbench results show 12"""
    from framework_bench.store.results import ResultsError
    try:
        from framework_bench.store.export import standard_json
        print(json.dumps(standard_json(reading_store(db).get(run_id)), indent=2, default=str, allow_nan=False))
    except ResultsError as e:
        common.fail(str(e))


@results_app.command("export")
def results_export(
    format: Annotated[str, typer.Option("--format", metavar="FORMAT", help="csv or json")] = "csv",
    scenario: Annotated[Optional[str], typer.Option("--scenario", metavar="GLOB", help="scenario name or glob")] = None,
    backend: Annotated[Optional[str], typer.Option("--backend", metavar="NAME", help="backend name")] = None,
    db: common.DbOption = None,
) -> None:
    """Print every stored run as CSV or JSON.

    One row per trial, each with the aggregates of its compare: trials, median TGS and its 95%
    interval, CV, % of the reference and its interval.

    Example: fbench results export --format json > runs.json"""
    from framework_bench.run.reference import reference_backend
    if format not in ("csv", "json"):
        common.fail(f"--format {format!r}: use csv or json")
    from framework_bench.store.export import export
    store = reading_store(db)
    print(export(store, format, scenario, backend, reference_backend()), end="")
    say_damaged(store)


@results_app.command("collect")
def results_collect(
    db: common.DbOption = None,
    wait: common.WaitOption = False,
    poll: common.PollOption = 30.0,
) -> None:
    """Store every submitted SLURM run whose job has ended; list the ones still queued or running.

    Example: fbench results collect --wait --poll 60"""
    from framework_bench.cli.progress import Progress
    from framework_bench.present.run_lines import collected_lines
    from framework_bench.run import collect
    from framework_bench.run.campaign import collect_jobs
    problems: list[str] = []
    subs = collect.pending(problems=problems)
    for line in problems:
        common.err.print(f"[red]skipped[/red] {escape(line)}", highlight=False, soft_wrap=True)
    if not subs:
        common.console.print("no submitted runs waiting to be collected")
        raise typer.Exit(1 if problems else 0)
    # Each run goes to the store it was submitted for, unless --db names one for all of them.
    stores: dict = {}

    def store_for(sub):
        path = db if db is not None else (Path(sub.db) if sub.db else None)
        if path not in stores:
            stores[path] = common.open_store(path)
        return stores[path]

    with Progress() as events:
        results, still = collect_jobs(subs, store_for, events, wait=wait, poll=poll)
    problems += events.problems
    if wait and still:
        common.err.print(f"[yellow]stopped waiting: {len(still)} job(s) still queued or running; "
                         "`fbench results collect` stores them when they end[/yellow]")
    render.say(collected_lines(results, [] if wait else still))
    if wait and still:
        raise typer.Exit(common.EXIT_INTERRUPTED)
    if problems:
        raise typer.Exit(1)

