"""`fbench plot` and `fbench report`: charts and the report from the stored runs."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from framework_bench.cli import common
from framework_bench.cli.results import reading_store, say_damaged


def plot(
    published: Annotated[bool, typer.Option("--published", help="the published XTuner table alone (no runs needed)")] = False,
    scenario: Annotated[Optional[str], typer.Option(help="only these scenarios (name or glob)")] = None,
    db: common.DbOption = None,
    out: common.OutOption = None,
    settings: common.SettingsOption = "matched",
    include_unverified: Annotated[bool, typer.Option(
        "--include-unverified", help="also runs of old-contract plugins that did not make every claim")] = False,
) -> None:
    """Charts of TGS and TFLOPs/GPU against context length, one line per backend."""
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
    scenario: Annotated[Optional[str], typer.Option(help="only these scenarios (name or glob)")] = None,
    db: common.DbOption = None,
    out: common.OutOption = None,
    settings: common.SettingsOption = "matched",
) -> None:
    """Write report.md and a self-contained report.html from the stored runs."""
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

