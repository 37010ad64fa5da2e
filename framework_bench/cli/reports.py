"""`fbench plot`, `report`, `diff` and `history`: charts, the report and comparisons over time from the stored runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from framework_bench.cli import common, render
from framework_bench.cli.results import reading_store, say_damaged


def plot(
    published: Annotated[bool, common.Flag(
        "--published", help="the published XTuner table alone (no runs needed)")] = False,
    scenario: Annotated[Optional[str], typer.Option("--scenario", metavar="GLOB", help="only these scenarios (name or glob)")] = None,
    db: common.DbOption = None,
    out: common.OutOption = None,
    settings: common.SettingsOption = "matched",
    include_unverified: Annotated[bool, common.Flag(
        "--include-unverified", help="also runs of old-contract plugins that did not make every claim")] = False,
) -> None:
    """Charts of TGS and TFLOPs/GPU against context length, one line per backend.

    Example: fbench plot --scenario 'llama2_7b_*' --out plots/"""
    from framework_bench.present.plotting import plot_results
    from framework_bench.present.published_chart import plot_published
    out = common.out_folder(out)
    common.writable_folder(out, "--out")
    if published:
        paths = plot_published(out)
    else:
        common.check_settings(settings)
        store = reading_store(db)
        rows = store.latest_by_point(scenario, settings_mode=settings)
        say_damaged(store)
        if not rows:
            common.fail(f"no stored runs with {settings} settings to plot: run `fbench compare` first, or use --published")
        paths = plot_results(rows, out, include_unverified=include_unverified)
    for p in paths:
        common.console.print(str(p), highlight=False)


def report(
    scenario: Annotated[Optional[str], typer.Option("--scenario", metavar="GLOB", help="only these scenarios (name or glob)")] = None,
    db: common.DbOption = None,
    out: common.OutOption = None,
    settings: common.SettingsOption = "matched",
) -> None:
    """Write report.md and a self-contained report.html from the stored runs.

    Example: fbench report --scenario 'tiny_cpu*' --out plots/"""
    common.check_settings(settings)
    out = common.out_folder(out)
    store = reading_store(db)
    rows = store.latest_by_point(scenario, settings_mode=settings)
    say_damaged(store)
    if not rows:
        common.fail(f"no stored runs with {settings} settings to report: run `fbench compare` first")
    common.writable_folder(out, "--out")
    _, md, page = common.charts_and_report(rows, out)
    common.console.print(f"{md}\n{page}", highlight=False)


def diff(
    before: Annotated[Optional[str], typer.Argument(
        metavar="BEFORE",
        help="the earlier compare's id, or a start of it only it has (default: the second newest)")] = None,
    after: Annotated[Optional[str], typer.Argument(
        metavar="AFTER", help="the later compare's id (default: the newest)")] = None,
    scenario: Annotated[Optional[str], typer.Option("--scenario",
        metavar="GLOB",
        help="only these scenarios (name or glob): by default the newest two compares that ran one")] = None,
    db: common.DbOption = None,
    as_json: Annotated[bool, common.Flag("--json", help="print one JSON object: pairs, changes and verdicts")] = False,
    fail_if_slower: Annotated[Optional[float], typer.Option(
        "--fail-if-slower", metavar="PCT", callback=common.within(0.0, words="percent"),
        help="exit 1 when a verdict says a backend is slower in the later compare by more than PCT percent, "
             "0 or more")] = None,
) -> None:
    """Two stored compares side by side: each backend's TGS in the later one over the earlier.

    Each ratio with its 95% interval and verdict; what changed between their runs; where the loss curves part.

    Example: fbench diff --scenario tiny_cpu --fail-if-slower 5"""
    import json

    from framework_bench.present.diff import Diff, chosen, compares
    from framework_bench.present.run_lines import slower_line
    if (before is None) != (after is None):
        common.fail("give both compares' ids, or neither (the newest two)")
    store = reading_store(db)
    found = compares(store.list(scenario))
    say_damaged(store)
    try:
        before, after = chosen(found, before, after, scenario)
    except ValueError as e:
        common.fail(str(e))
    d = Diff(before, found[before], after, found[after])
    if as_json:
        print(json.dumps(d.data(), indent=2))
    else:
        common.console.print(f"{after} against {before}", highlight=False, markup=False)
        for line in d.lines():
            common.console.print(line, highlight=False, markup=False, soft_wrap=True)
    if fail_if_slower is not None and (slower := d.slower_than(fail_if_slower)):
        common.err.print(slower_line(slower, fail_if_slower, f"in {after} than in {before}"), highlight=False, markup=False)
        raise typer.Exit(1)


def history(
    scenario: Annotated[Optional[str], typer.Option("--scenario", metavar="GLOB", help="only these scenarios (name or glob)")] = None,
    backend: Annotated[Optional[str], typer.Option("--backend", metavar="NAME", help="only this backend")] = None,
    by: Annotated[str, typer.Option("--by", metavar="ORDER", help="order each series by its compares' date or "
                                    "the backend's version: date or version")] = "date",
    db: common.DbOption = None,
    as_json: Annotated[bool, common.Flag("--json", help="print one JSON object: the series and their changes")] = False,
    out: Annotated[Optional[Path], typer.Option("--out", metavar="DIR", help="also a chart per scenario there")] = None,
    fail_on_change: Annotated[bool, common.Flag(
        "--fail-on-change", help="exit 1 when a series' speed changed (a nightly job's alarm)")] = False,
) -> None:
    """Every stored compare as a point of its series (scenario, backend, machine), and where each one's speed changed.

    Example: fbench history --scenario tiny_cpu --backend trl --fail-on-change"""
    import json

    from framework_bench.present import history as h
    if by not in h.ORDERS:
        common.fail(f"--by {by!r}: one of {', '.join(h.ORDERS)}")
    store = reading_store(db)
    found = h.series(store.list(scenario, backend), by=by)
    say_damaged(store)
    if not found:
        common.fail("no stored runs" + (f" of {scenario}" if scenario else "") + (f" by {backend}" if backend else "")
                    + ": run `fbench compare` first")
    if as_json:
        print(json.dumps(h.data(found), indent=2))
    else:
        render.say(h.lines(found))
    if out is not None:
        from framework_bench.present.history_chart import plot_history
        common.writable_folder(out, "--out")
        render.say([str(path) for path in plot_history(found, out)], common.err if as_json else None)
    if fail_on_change and (changed := h.changed(found)):
        common.err.print("speed changed: " + "; ".join(changed), highlight=False, markup=False)
        raise typer.Exit(1)
