"""How a command prints what `framework_bench/present/` makes of its runs, plans and checks:
tables (`present/terminal_tables.py`), lines (`present/run_lines.py`), settings grids
(`present/settings_grid.py`), on the command's console."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.padding import Padding

from framework_bench.cli import common
from framework_bench.present import run_lines
from framework_bench.present.fitted_table import FittedTable
from framework_bench.present.run_lines import closing_line  # noqa: F401 - cli/runs.py reads it here

if TYPE_CHECKING:
    from framework_bench.present.verdict import Points


def say(lines: list, show: Console | None = None) -> None:
    """Lines as present/ wrote them (rich Text or plain sentences), never read as markup."""
    for line in lines:
        (show or common.console).print(line, highlight=False, markup=False)


def show(table: FittedTable, console: Console | None = None) -> None:
    """Print a fitted table; a --wide one keeps its lines whole (the terminal wraps them)."""
    (console or common.console).print(table, crop=False)


def result_dict(r) -> dict:
    return r.model_dump(mode="json")


def points(results) -> Points:
    """A command's runs as the trials of their points, built once for its table, its verdicts,
    `--json` and `--fail-if-slower`."""
    from framework_bench.present.verdict import Points
    from framework_bench.run.reference import reference_backend
    return Points([result_dict(r) for r in results], reference_backend())


def verdict_object(points: Points) -> dict:
    """`--json`: the runs, and the verdicts as data (`Points.data`)."""
    return {"runs": points.runs, **points.data()}


def print_verdicts(points: Points) -> None:
    """Below a compare's table: each pair's verdict with an interval, each noisy backend, each trial
    not counted (the pairs with none are said once, in the answer: `print_answers`)."""
    say(points.with_intervals)


def print_auto_stops(stops, results) -> None:
    """Below a repeated run's verdicts: where `--repeat auto` stopped (`run_lines.auto_stop_lines`)."""
    say(run_lines.auto_stop_lines(stops, results))


def print_differences(records: list[dict], mode: str, show: Console | None = None) -> None:
    """Per scenario, the settings that differ between its backends (`settings_grid`), indented."""
    from framework_bench.present.settings_grid import difference_grids
    show = show or common.console
    for heading, grid in difference_grids(records, mode, show.width - 2):
        show.print(heading, highlight=False)
        if grid is not None:
            show.print(Padding(grid, (0, 0, 0, 2)))


def print_reasons(results: list) -> None:
    """Below a results table: why each run that is not ok ended so (`run_lines.reason_lines`)."""
    say(run_lines.reason_lines(results))


def print_answers(points: Points) -> None:
    """A compare's last lines: per scenario, the fastest framework, by how much, how sure."""
    answers = points.answers()
    if answers:
        common.console.rule("the answer", style="bold")
        say(answers)


def print_run(r, db: Path, verbose: bool = False) -> None:
    say(run_lines.run_lines(r, db, verbose))


def print_plan(d, s, options, show) -> None:
    say(run_lines.plan_lines(d, options), show)


def print_submission(name: str, p, options) -> None:
    say(run_lines.submission_lines(name, p, options))
