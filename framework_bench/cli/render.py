"""How a command prints what `framework_bench/present/` makes of its runs, plans and checks:
tables (`present/terminal_tables.py`), lines (`present/run_lines.py`), settings grids
(`present/settings_grid.py`), on the command's console."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.padding import Padding

from framework_bench.cli import common
from framework_bench.present.fitted_table import FittedTable

if TYPE_CHECKING:
    from framework_bench.present.verdict import Points


def say(lines: list, show: Console | None = None) -> None:
    """Lines as present/ wrote them (rich Text or plain sentences), never read as markup."""
    for line in lines:
        (show or common.console).print(line, highlight=False, markup=False)


def show(table: FittedTable, console: Console | None = None) -> None:
    """Print a fitted table; a --wide one keeps its lines whole (the terminal wraps them)."""
    (console or common.console).print(table, crop=False)


def points(results) -> Points:
    """A command's runs as the trials of their points, built once for its table, its verdicts,
    `--json` and `--fail-if-slower`."""
    from framework_bench.present.verdict import Points
    from framework_bench.run.reference import reference_backend
    return Points([r.model_dump(mode="json") for r in results], reference_backend())


def print_differences(records: list[dict], mode: str, show: Console | None = None) -> None:
    """Per scenario, the settings that differ between its backends (`settings_grid`), indented."""
    from framework_bench.present.settings_grid import difference_grids
    show = show or common.console
    for heading, grid in difference_grids(records, mode, show.width - 2):
        show.print(heading, highlight=False)
        if grid is not None:
            show.print(Padding(grid, (0, 0, 0, 2)))


def print_answers(points: Points) -> None:
    """A compare's last lines: per scenario, the fastest framework, by how much, how sure."""
    answers = points.answers()
    if answers:
        common.console.rule("the answer", style="bold")
        say(answers)
