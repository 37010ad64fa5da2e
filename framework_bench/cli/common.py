"""What every command group shares: the consoles, the option types, failing with one line, the
checks of the user's options, and the results store opened, written and read back."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperArgument, TyperCommand, TyperGroup

from framework_bench.measure import gpus
from framework_bench.present.run_lines import EXIT_INTERRUPTED


def within(low: float, high: float | None = None, words: str = ""):
    """A number option's callback: a value below `low` or above `high` (or NaN) is refused with a
    sentence, exit 2; click's min= and max= would print `x>=1` in --help."""
    kind, shown = ("a whole number", ",") if isinstance(low, int) else ("a number", "g")
    bound = f" from {low:{shown}} to {high:{shown}}" if high is not None else f", {low:{shown}} or more"
    sentence = f"must be {kind}{bound}" + (f" ({words})" if words else "")

    def check(value):
        if value is not None and not (low <= value and (high is None or value <= high)):
            raise typer.BadParameter(sentence)
        return value
    return check


def Flag(*names: str, help: str, **kwargs):
    """An on/off option: it takes no value, so the help's value column is left empty."""
    return typer.Option(*names, metavar="", help=help, **kwargs)


class _Argument(TyperArgument):
    def display_type_rich(self, ctx):
        return None  # its metavar, in the name column, says what it takes


class _InWords:
    """Help naming each value in words (its metavar) and never by typer's type (`<str>`, `<bool>`),
    which typer shows beside every argument and for --help."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for param in self.params:
            if type(param) is TyperArgument:  # typer builds them, taking no class of ours
                param.__class__ = _Argument

    def get_help_option(self, ctx):
        option = super().get_help_option(ctx)
        if option is not None:
            option.metavar = ""
        return option


class _Command(_InWords, TyperCommand):
    pass


class _Group(_InWords, TyperGroup):
    pass


class Typer(typer.Typer):
    """typer.Typer whose commands, and itself, show their help in words (`_InWords`)."""

    def __init__(self, **kwargs):
        super().__init__(cls=_Group, **kwargs)

    def command(self, *args, **kwargs):
        return super().command(*args, cls=_Command, **kwargs)


# The most rounds --repeat and --warmup-rounds each take: far beyond any useful verdict, and a
# bound on what the dry run multiplies (a 26-digit count made its estimate ~1e24 hours, then overflowed).
MAX_ROUNDS = 1000

DbOption = Annotated[Optional[Path], typer.Option("--db", metavar="FILE",
                                                  help="SQLite results file (default: .fbench/results)")]
OutOption = Annotated[Optional[Path], typer.Option(
    "--out", metavar="FOLDER", help="folder for charts and the report (default: plots/ in FBENCH_HOME)")]
SettingsOption = Annotated[str, typer.Option(
    "--settings", metavar="MODE",
    help="matched: both frameworks configured alike where both allow (differences named); "
         "native: each as its own docs and examples configure it")]
SeedOption = Annotated[Optional[int], typer.Option(
    "--seed", metavar="SEED", callback=within(0, 2**32 - 1, "a 32-bit seed"),
    help="pin the seed (a 32-bit number) every backend's initial weights are drawn from (checked by the host) "
         "and its framework is seeded with; default: a fresh one per compare, each round its own")]
TimeOption = Annotated[Optional[str], typer.Option(
    "--time", metavar="TIME",
    help="slurm: the job's time limit, [D-]HH:MM:SS (default: estimated from the scenario, shown in the plan)")]
CpusOption = Annotated[Optional[int], typer.Option(
    "--cpus-per-task", metavar="N", callback=within(1),
    help="slurm: CPUs for each node's task, 1 or more (default: all of the node's, the job is exclusive)")]
SbatchArgOption = Annotated[Optional[list[str]], typer.Option(
    "--sbatch-arg", metavar="OPTION",
    help="slurm: one more sbatch option, e.g. --sbatch-arg=--partition=gpu; repeatable")]
WaitOption = Annotated[bool, Flag("--wait", help="slurm: wait for the jobs, storing each run when its job ends")]
PollOption = Annotated[float, typer.Option("--poll", metavar="SECONDS", callback=within(0.1, words="seconds"),
                                           help="slurm: seconds between queue checks, 0.1 or more")]
WideOption = Annotated[bool, Flag(
    "--wide", help="every column, whatever the terminal's width (by default the ones that do not fit are named)")]
NoReferenceOption = Annotated[bool, Flag(
    "--no-reference", help="do not run the reference backend to judge the others: their runs are stored "
                           "unverified (parity: no reference), never ok")]
VerboseOption = Annotated[bool, Flag("--verbose", help="also each run's start-up breakdown")]
FailIfSlowerOption = Annotated[Optional[float], typer.Option(
    "--fail-if-slower", metavar="PCT", callback=within(0.0, words="percent"),
    help="exit 1 when a verdict says a backend is slower than the reference by more than PCT percent, 0 or more "
         "(a CI gate)")]
RepeatOption = Annotated[str, typer.Option("--repeat", metavar="N|auto", help=(
    "trials of each backend on each scenario, in rotated orders: from 2, TGS with 95% intervals and verdicts; "
    "5 for a verdict you can trust; auto: 5 to 10 rounds, until every interval is within --precision"))]
WarmupOption = Annotated[Optional[int], typer.Option("--warmup-rounds", metavar="N", callback=within(0), help=(
    f"rounds run first and not counted, 0 to {MAX_ROUNDS} (default: 1 on CPU scenarios with --repeat 2 or more, "
    "else 0)"))]
PrecisionOption = Annotated[Optional[float], typer.Option("--precision", metavar="PCT", help=(
    "with --repeat auto: the 95% interval half-width, in percent, every pair must reach (e.g. 2)"))]
BudgetOption = Annotated[Optional[str], typer.Option("--budget", metavar="TIME", help=(
    "with --repeat auto: the most time its rounds may take, e.g. 90s, 5m, 1h; each scenario an equal share of "
    "what is left, no round started that the longest so far says would end past it"))]
GpuOption = Annotated[Optional[str], typer.Option(
    "--gpu", metavar="NAME", help=f"judge memory and time on this GPU ({', '.join(gpus.MODELS)}; any case), "
                                  "e.g. --gpu H200")]

# Tables fit the terminal, or COLUMNS when set; piped output without COLUMNS is 160 wide, not
# rich's 80, so a log keeps most columns (framework_bench/present/fitted_table.py says which go first).
console = Console(width=None if (sys.stdout is not None and sys.stdout.isatty()) or os.environ.get("COLUMNS") else 160)
err = Console(stderr=True)


def fail(message: str, code: int = 1) -> None:
    for line in message.splitlines():
        err.print(f"[red]error:[/red] {escape(line)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def user_errors():
    """Exceptions that are the user's to fix: shown as one line each, never a traceback."""
    from framework_bench.data.alpaca import DataError
    from framework_bench.envs.errors import EnvError
    from framework_bench.plugins.registry import UnknownBackend
    from framework_bench.run.preflight import Refused
    from framework_bench.store.results import ResultsError
    from framework_bench.scenario.scenario import ScenarioError
    return (ScenarioError, UnknownBackend, DataError, EnvError, ResultsError, Refused)


def check_timeout(timeout: float | None) -> None:
    import math
    if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
        fail(f"--timeout {timeout}: give a number of seconds above 0")


def check_repeat(repeat: str, precision: float | None, warmup_rounds: int | None, launcher: str | None):
    """--repeat as the trial loop takes it: a count from 1 to MAX_ROUNDS in the digits 0-9 (not
    "²", which `str.isdigit` accepts and `int` refuses), or "auto" (which needs --precision)."""
    import math
    if warmup_rounds is not None and warmup_rounds > MAX_ROUNDS:
        fail(f"--warmup-rounds {_digits(str(warmup_rounds))}: at most {MAX_ROUNDS}")
    if repeat == "auto":
        if precision is None or not (math.isfinite(precision) and precision > 0):
            fail("--repeat auto needs --precision P: the 95% interval half-width to reach, in percent above 0")
        trials = "auto"
    else:
        if not (repeat.isascii() and repeat.isdigit()) or not repeat.strip("0"):
            fail(f"--repeat {repeat!r}: give a number of trials from 1, or auto")
        count = repeat.lstrip("0")  # int() refuses more than 4300 digits: the length first
        if len(count) > len(str(MAX_ROUNDS)) or int(count) > MAX_ROUNDS:
            fail(f"--repeat {_digits(count)}: at most {MAX_ROUNDS} trials")
        if precision is not None:
            fail("--precision goes with --repeat auto")
        trials = int(count)
    if launcher == "slurm" and (trials == "auto" or warmup_rounds):
        # each round is a job of its own, on nodes of its own: a warm-up round would warm other
        # nodes, and `auto` would need each round's figures before submitting the next
        fail("with --launcher slurm, --repeat takes a number of rounds (one job each); --repeat auto and "
             "--warmup-rounds run here only")
    return trials


def check_budget(budget: str | None, trials) -> float | None:
    """--budget in seconds (90s, 5m, 1h; a bare number is seconds), only with --repeat auto."""
    import re
    if budget is None:
        return None
    if trials != "auto":
        fail("--budget goes with --repeat auto (a fixed --repeat runs every round it names)")
    found = re.fullmatch(r"(\d{1,7}(?:\.\d+)?)\s*([smh]?)", budget.strip())
    if not found or float(found[1]) <= 0:
        fail(f"--budget {budget!r}: a time above 0, such as 90s, 5m or 1h")
    return float(found[1]) * {"": 1, "s": 1, "m": 60, "h": 3600}[found[2]]


def _digits(number: str) -> str:
    """A number as an error line shows it: a long one cut, its length said."""
    return number if len(number) <= 12 else f"{number[:12]}… ({len(number)} digits)"


def writable_folder(path: Path, what: str) -> None:
    """Fail now, before any training, if `path` cannot take files."""
    from framework_bench.run.preflight import unwritable
    if problem := unwritable(path, what):
        fail(problem)


def load_scenario(name: str):
    from framework_bench.scenario import scenario
    try:
        return scenario.load(name)
    except user_errors() as e:
        fail(str(e))


def gpu_named(name: str | None) -> str | None:
    """--gpu as the GPU table names it (h200 -> H200, A100-80GB -> A100-80G); one error line
    naming the known ones when it names none."""
    if name is None:
        return None
    if (model := gpus.named(name)) is None:
        fail(f"--gpu {name!r}: no GPU of that name; known: {', '.join(gpus.MODELS)}")
    return model


def check_settings(mode: str) -> None:
    from framework_bench.worker.job import SETTINGS_MODES
    if mode not in SETTINGS_MODES:
        fail(f"--settings {mode!r}: use {' or '.join(SETTINGS_MODES)}")


def check_launcher(launcher: str | None) -> None:
    from framework_bench.run.launchers.base import LAUNCHERS
    if launcher is not None and launcher not in LAUNCHERS:
        fail(f"--launcher {launcher!r}: use local, torchrun or slurm")


def sbatch_options(time_limit: str | None, cpus_per_task: int | None, sbatch_arg: list[str] | None):
    from framework_bench.run.launchers.slurm import SbatchOptions, check_options
    options = SbatchOptions(time_limit=time_limit, cpus_per_task=cpus_per_task, extra=sbatch_arg or [])
    if problem := check_options(options):
        fail(problem)
    return options


def backend_names(option: str) -> list[str]:
    """`--backends a, b`: stripped, each once, in order; an empty name is a mistake."""
    names = [n.strip() for n in option.split(",")]
    if not all(names):
        fail(f"--backends {option!r}: give backend names separated by commas (see `fbench backends`)")
    return list(dict.fromkeys(names))


def backend_spec(name: str) -> str:
    """A backend name, a backend at a version (`trl@transformers==5.23.0`) spelled as it is stored."""
    from framework_bench.plugins import pins, registry
    try:
        return registry.canonical(name)
    except pins.BadSpec as e:
        fail(str(e))


def open_store(db: Path | None, read_only: bool = False):
    """The results store; first, the runs earlier commands could not store are stored (and said)."""
    from framework_bench.run import pipeline
    from framework_bench.store import results
    try:
        store = results.ResultStore(db, must_exist=read_only and db is not None)
    except results.ResultsError as e:
        fail(str(e))
    for line in pipeline.recover(store):
        err.print(f"[yellow]{escape(line)}[/yellow]", highlight=False, soft_wrap=True)
    return store


def say_kept(path: Path) -> None:
    """A run's row the store could not take now, kept beside it for the next command."""
    err.print(f"[yellow]the results file could not take the run now: kept in {escape(str(path))}; "
              "the next fbench command stores it[/yellow]", highlight=False, soft_wrap=True)


def fail_unstored(e) -> None:
    """Neither the store nor the folder beside it took a run (`unstored.Unstored`): its row as JSON, exit 1."""
    print(e.record, file=sys.stderr)
    fail(f"{e}: the run is printed above as JSON")


def stop_interrupted(what: str = "finished runs are stored") -> None:
    """Ctrl-C (or SIGTERM/SIGHUP) ended the command: said once, exit 130."""
    err.print(f"[yellow]interrupted: {escape(what)}[/yellow]")
    raise typer.Exit(EXIT_INTERRUPTED)


def stored_rows(store, by_name: dict, settings: str | None = None) -> list[dict]:
    """The stored runs of these scenarios, read back for the charts: a store locked by another
    process now is one line and exit 1; the runs are stored already."""
    import sqlite3
    try:
        return [r for r in store.latest_by_point(settings_mode=settings) if r["scenario"] in by_name]
    except sqlite3.Error as e:
        fail(f"the runs are stored, but could not be read back for the charts and report: {e}; "
             "`fbench report` makes them later")


def out_folder(out: Path | None) -> Path:
    """--out, or the state folder's plots/: never files dropped wherever the command was typed."""
    from framework_bench.envs import venvs as envs
    return out if out is not None else envs.fbench_home() / "plots"


def charts_and_report(rows: list[dict], out: Path):
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

