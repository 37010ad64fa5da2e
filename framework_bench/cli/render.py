"""How runs, plans, checks and verdicts are printed: tables and lines, no logic of their own."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from rich.console import Console, ConsoleOptions, RenderResult
from rich.markup import escape
from rich.measure import Measurement
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from framework_bench.cli import common

if TYPE_CHECKING:
    from framework_bench.present.verdict import Points


def fmt(x: float | None, spec: str = ",.1f") -> str:
    return "-" if x is None else format(x, spec)


def ctx(n: int) -> str:
    for div, suffix in ((1024 * 1024, "M"), (1024, "k")):
        if n % div == 0:
            return f"{n // div}{suffix}"
    return str(n)


def result_dict(r) -> dict:
    return r.model_dump(mode="json")


# Which columns each table leaves out when the terminal is narrower than all of them, the first
# named first: the one place this order is kept. The width left is then filled with
# the left-out columns that still fit, the last named first. A column not named here is never
# left out: the names, statuses and headline figures (TGS, % of the reference) each table is for.
# No cell is ever cut: a column is as wide as its widest cell (headers wrap), and a column that
# does not fit is left out whole and named under the table.
DROP_ORDER: dict[str, tuple[str, ...]] = {
    "compare": ("published TGS", "start-up", "MFU", "reserved", "TFLOPs/GPU", "peak mem", "TGS min–max", "trials"),
    "results list": ("data sha256", "created", "version", "settings", "steps", "TFLOPs/GPU", "round", "compare"),
    "scenarios": ("ZeRO", "SP", "published TGS", "device", "model"),
}
PROSE_MIN = 12  # the narrowest a sentence column gets: below it a sentence reads as a list of words


@dataclass(frozen=True)
class Col:
    """One column of a `FittedTable`. kind: `figure`, a number, name or status, printed whole on
    one line; `prose`, a sentence, wrapped to at most two lines in the width the table leaves, or
    else moved under the table as a numbered footnote; `notes`, a list of notes per row, each a
    numbered footnote under the table (the same note once), the cell holding their numbers."""
    header: str
    justify: Literal["left", "right"] = "left"
    kind: Literal["figure", "prose", "notes"] = "figure"


class FittedTable:
    """A table that fits the width it is printed at: rows of one or two lines, every figure whole,
    the columns of `DROP_ORDER[name]` left out as needed and named in one line under it ("more
    columns: ... (`more`)"), then the footnotes. `wide`: every column, at full width (print it
    with `show`, which leaves lines wider than the terminal uncropped)."""

    def __init__(self, name: str, columns: list[Col], *, title: str | None = None, more: str = "--wide or --json",
                 wide: bool = False):
        self.name, self.columns, self.title, self.more, self.wide = name, columns, title, more, wide
        self.rows: list[list] = []

    def add_row(self, *cells) -> None:
        """Cells: str (plain text, never markup) or rich Text; a `notes` column's cell is a list of str."""
        self.rows.append(list(cells))

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        notes: list[str] = []

        def mark(texts: list[str]) -> Text:
            for text in texts:
                if text not in notes:
                    notes.append(text)
            return Text(" ".join(f"[{notes.index(text) + 1}]" for text in texts))

        cells: dict[Col, list[Text]] = {}
        for i, c in enumerate(self.columns):
            column = [row[i] for row in self.rows]
            cells[c] = [mark(cell) if c.kind == "notes" else cell if isinstance(cell, Text) else Text(cell)
                        for cell in column]
        droppable = DROP_ORDER.get(self.name, ())
        # a column with no figure in any row, or no note, tells nothing: left out unnamed
        kept = [c for c in self.columns if not (self.rows and (c.header in droppable or c.kind == "notes")
                                                 and all(cell.plain in ("", "-") for cell in cells[c]))]
        dropped: list[str] = []
        if not self.wide:  # the kept columns, then each droppable one that still fits, the last dropped first
            fitted = [c for c in kept if c.header not in droppable]
            for h in reversed(droppable):
                trial = [c for c in kept if c in fitted or c.header == h]
                if len(trial) > len(fitted):
                    if self._needed(console, options, trial, cells) <= options.max_width:
                        fitted = trial
                    else:
                        dropped.insert(0, h)
            kept = fitted
        # headers on one line where the width allows it, else wrapped between words
        whole = self.wide or self._needed(console, options, kept, cells, whole_headers=True) <= options.max_width
        # figures that cannot all stand whole on one line (a median with its interval at 80
        # columns) wrap at their spaces, each part whole: "12,345.7" over "(11,975.3–12,716.0)"
        split = not self.wide and self._needed(console, options, kept, cells, whole_headers=whole) > options.max_width
        if split and self._needed(console, options, kept, cells, whole_headers=whole, split=True) > options.max_width:
            # narrower still: an interval may also break after its dash, "(11,975.3–" over "12,716.0)"
            cells = {c: [Text(cell.plain.replace("–", "– "), style=cell.style) if c.kind == "figure" else cell
                         for cell in column] for c, column in cells.items()}
        if not self.wide:
            spare = options.max_width - self._needed(console, options, kept, cells, whole_headers=whole, split=split)
            for c in kept:
                if c.kind == "prose":  # a sentence longer than two lines moves under the table
                    cells[c] = [cell if len(cell.wrap(console, PROSE_MIN + spare, overflow="fold")) <= 2
                                else mark([cell.plain]) for cell in cells[c]]
        table = self._table(kept, cells, whole_headers=whole, split=split)
        if self.wide:  # its full width, whatever the terminal's: the lines are left long
            table.width = Measurement.get(console, options.update_width(10**6), table).maximum
        yield table
        if dropped:
            yield Text(f"more columns: {', '.join(dropped)} ({self.more})", style="dim")
        if notes:  # a grid, so a long note wraps under its own text, not under its number
            grid = Table.grid(padding=(0, 1))
            grid.add_column(no_wrap=True)
            grid.add_column(overflow="fold")
            for n, text in enumerate(notes, 1):
                grid.add_row(Text(f"[{n}]"), Text(text))
            yield grid

    def _table(self, kept: list[Col], cells: dict, prose_width: int | None = None, whole_headers: bool = False,
               split: bool = False) -> Table:
        """`split`: a figure with spaces may wrap there (never within a word), at least its longest
        part wide."""
        table = Table(title=self.title)
        for c in kept:
            header = Text(c.header, no_wrap=False)  # headers wrap between words; figures only where `split`
            if c.kind == "prose" and prose_width is None:
                table.add_column(header, justify=c.justify, overflow="fold", min_width=PROSE_MIN)
                continue
            header_width = [len(c.header)] if whole_headers else [len(word) for word in c.header.split()]
            widest = max([cell.cell_len for cell in cells[c]] + header_width)
            if split and c.kind == "figure" and any(" " in cell.plain.strip() for cell in cells[c]):
                part = max([len(word) for cell in cells[c] for word in cell.plain.split()] + header_width)
                table.add_column(header, justify=c.justify, overflow="fold", min_width=part, max_width=widest)
                continue
            table.add_column(header, justify=c.justify, no_wrap=True, overflow="fold",
                             width=prose_width if c.kind == "prose" else widest)
        for row in zip(*(cells[c] for c in kept)):
            table.add_row(*row)
        return table

    def _needed(self, console: Console, options: ConsoleOptions, kept: list[Col], cells: dict,
                whole_headers: bool = False, split: bool = False) -> int:
        """The width the kept columns need, a sentence column at its narrowest (rich's measure)."""
        table = self._table(kept, cells, prose_width=PROSE_MIN, whole_headers=whole_headers, split=split)
        return Measurement.get(console, options.update_width(10**6), table).minimum


def show(table: FittedTable, console: Console | None = None) -> None:
    """Print a fitted table; a --wide one keeps its lines whole (the terminal wraps them)."""
    (console or common.console).print(table, crop=False)


def status_text(status: str) -> Text:
    return Text(status, style="green" if status == "ok" else ("yellow" if status in ("unsupported", "unverified")
                                                               else "red"))


def is_startup_breakdown(note: str) -> bool:
    """The start-up breakdown a worker adds to its notes (worker/startup.py's `startup_note`):
    shown with --verbose, in the report and in `results show`, not in the tables."""
    return note.startswith("start-up ") and ": " in note


def points(results) -> Points:
    """A command's runs as the trials of their points, built once for its table, its verdicts,
    `--json` and `--fail-if-slower`."""
    from framework_bench.present.verdict import Points
    from framework_bench.run.reference import reference_backend
    return Points([result_dict(r) for r in results], reference_backend())


def results_table(points: Points, scenarios_by_name, wide: bool = False, verbose: bool = False) -> FittedTable:
    """The runs of a compare (and of the device check), one row per backend x scenario over its
    trials: the median TGS and % of the reference with their 95% intervals from two trials,
    headline figures first, notes as footnotes."""
    from framework_bench.present.verdict import noise_note, share_cell, tgs_cell
    t = FittedTable("compare", [
        Col("scenario"), Col("backend"), Col("status"), Col("trials", "right"), Col("TGS", "right"),
        Col(f"% of {points.reference or 'reference'}", "right"), Col("TGS min–max", "right"),
        Col("TFLOPs/GPU", "right"), Col("MFU", "right"), Col("peak mem", "right"), Col("reserved", "right"),
        Col("start-up", "right"), Col("published TGS", "right"), Col("notes", kind="notes")],
        title="fbench compare", wide=wide)
    for r in points.rows:
        s = scenarios_by_name.get(r["scenario"])
        summary = points.summaries[r["scenario"], r["backend"]]
        t.add_row(r["scenario"], r["backend"], status_text(r["status"]),
                  "" if summary.trials <= 1 else str(summary.trials),  # one trial: the column is left out
                  tgs_cell(summary) if summary.trials else fmt(r["tgs"]),  # no trial counts: the run's own figure
                  share_cell(points.shares.get((r["scenario"], r["backend"]))),
                  f"{fmt(r['tgs_min'])}–{fmt(r['tgs_max'])}" if r["tgs_min"] is not None else "-",
                  fmt(r["tflops"], ".3g"), "-" if r["mfu"] is None else f"{r['mfu'] * 100:.1f}%",
                  gib(r["peak_mem_bytes"]), gib(r["peak_reserved_bytes"]),
                  "-" if r["startup_seconds"] is None else f"{r['startup_seconds']:.1f} s",
                  f"{s.reference.tgs:,.1f} ({s.reference.hardware})" if s and s.reference else "-",
                  r["flags"] + [n for n in r["notes"] if verbose or not is_startup_breakdown(n)] + noise_note(summary))
    return t


def verdict_object(points: Points) -> dict:
    """`--json`: the runs, and the verdicts as data (`Points.data`)."""
    return {"runs": points.runs, **points.data()}


def print_verdicts(points: Points) -> None:
    """Below a compare's table: each pair's verdict with an interval, each noisy backend, each trial
    not counted (the pairs with none are said once, in the answer: `print_answers`)."""
    for line in points.with_intervals:
        common.console.print(line, highlight=False, markup=False)


def print_auto_stops(stops, results) -> None:
    """Below a repeated run's verdicts: where `--repeat auto` stopped, whether the cap stopped it,
    and which backends of the scenario no trial of counted (`results`: the runs)."""
    from framework_bench.measure.statistics import Trial, summarise
    from framework_bench.present.verdict import auto_stop_sentence
    summaries = summarise(Trial.from_record(result_dict(r)) for r in results)
    for stop in stops:
        uncounted = sorted(b for (scenario, b), s in summaries.items() if scenario == stop.scenario and not s.trials)
        common.console.print(auto_stop_sentence(stop, uncounted), highlight=False, markup=False)


def gib(n: int | None) -> str:
    return "-" if not n else f"{n / 2**30:.2f} GiB"


def points_table(name: str, report) -> FittedTable:
    """`fbench check-backend`: each point, its verdict and why."""
    t = FittedTable("check-backend", [Col("point"), Col("verdict"), Col("detail", kind="prose")],
                    title=f"fbench check-backend {name} ({report.scenario})")
    for p in report.points:
        t.add_row(p.name, Text(p.status, style={"pass": "green", "skipped": "yellow"}.get(p.status, "red")), p.detail)
    return t


def print_checks(checks) -> None:
    colours = {"pass": "green", "fail": "red", "unverified": "yellow", "skipped": "dim"}
    for c in checks:
        common.console.print(f"  [{colours[c.status]}]{c.status:10}[/{colours[c.status]}] {c.name:10} {escape(c.detail)}",
                      highlight=False)


def print_differences(records: list[dict], mode: str, show: Console | None = None) -> None:
    """Per scenario, the settings that differ between its backends: one setting per row, each
    backend's value in its own column, wrapped to the width at spaces, never inside a word; where
    the backends' columns cannot all hold their longest words side by side (five frameworks at
    100 columns), one line per backend under each setting instead. Scenarios whose backends
    differ alike (a context sweep) share one grid."""
    from framework_bench.present.differences import setting_differences
    show = show or common.console
    alike: dict[str, list[str]] = {}
    found = setting_differences(records)
    for name, diffs in found.items():
        alike.setdefault(repr(diffs), []).append(name)
    for names in alike.values():
        diffs, name = found[names[0]], ", ".join(names)
        show.print(f"[bold]{escape(name)}[/bold]: {len(diffs)} setting(s) differ between backends "
                   f"({mode} settings)" if diffs else f"[bold]{escape(name)}[/bold]: same settings on every backend",
                   highlight=False)
        if not diffs:
            continue
        grid = _side_by_side(diffs, show.width - 2) or _one_line_each(diffs)
        show.print(Padding(grid, (0, 0, 0, 2)))


def _side_by_side(diffs: list, room: int) -> Table | None:
    """A column per backend, each as wide as its longest word at least and its longest value at
    most, the room left shared out evenly; None where the longest words alone do not fit."""
    backends = list(diffs[0][1])
    texts = {b: [b, *(str(values[b]) for _, values, _ in diffs)] for b in backends}
    fewest = [max(len(word) for text in texts[b] for word in text.split()) for b in backends]
    most = [max(len(text) for text in texts[b]) for b in backends]
    # "speed", the setting's name, then the backends, a space either side of each inner edge
    room -= len("speed") + max(len(key) for key, _, _ in diffs) + 2 * (len(backends) + 1)
    if sum(fewest) > room:
        return None
    widths, room = list(fewest), room - sum(fewest)
    while room > 0 and (growing := [i for i, w in enumerate(widths) if w < most[i]]):
        for i in growing:
            grow = min(max(room // len(growing), 1), most[i] - widths[i], room)
            widths[i], room = widths[i] + grow, room - grow
    grid = Table(box=None, show_edge=False, pad_edge=False, header_style="bold")
    grid.add_column("", no_wrap=True)  # speed: the setting changes what a run's TGS measures
    grid.add_column("setting", no_wrap=True)
    for b, width in zip(backends, widths):
        grid.add_column(Text(b), width=width, overflow="fold")
    for key, values, speed in diffs:
        grid.add_row(Text("speed", style="yellow") if speed else "", Text(key), *(Text(str(values[b])) for b in backends))
    return grid


def _one_line_each(diffs: list) -> Table:
    """Under each setting, a line per backend: its name, then its value."""
    grid = Table(box=None, show_edge=False, pad_edge=False, header_style="bold")
    grid.add_column("", no_wrap=True)
    grid.add_column("setting", no_wrap=True)
    grid.add_column("backend", no_wrap=True)
    grid.add_column("value", overflow="fold")
    for key, values, speed in diffs:
        for i, (backend, value) in enumerate(values.items()):
            grid.add_row(Text("speed", style="yellow") if speed and not i else "", Text(key) if not i else "",
                         Text(backend), Text(str(value)))
    return grid


def print_reasons(results: list) -> None:
    """Below a results table: why each run that is not ok ended so (first line, then the log tail);
    the backends of a scenario that ended alike for one reason (three QLoRA refusals) on one line."""
    said: dict[tuple, list] = {}
    for r in results:
        if r.status != "ok":
            lines = (r.reason or "").splitlines()
            first = (lines[0] if lines else "").removeprefix(f"{r.backend}: ")
            said.setdefault((r.scenario, r.status, first) + (() if len(lines) <= 1 else (id(r),)), []).append(r)
    for (scenario, status, first, *_), runs in said.items():
        common.console.print(f"[yellow]{escape(scenario)} / {escape(', '.join(r.backend for r in runs))}: {status}[/yellow]: "
                             f"{escape(first)}", highlight=False)
        for line in (runs[0].reason or "").splitlines()[1:][-8:]:
            common.console.print(f"    {line}", highlight=False, markup=False)


def print_answers(points: Points) -> None:
    """A compare's last lines: per scenario, the fastest framework, by how much, how sure."""
    answers = points.answers()
    if answers:
        common.console.rule("the answer", style="bold")
        for line in answers:
            common.console.print(line, highlight=False, markup=False)


# The statuses in the order a closing line counts them.
_STATUS_ORDER = ("ok", "unverified", "invalid", "failed", "oom", "timeout", "interrupted", "unsupported")


def closing_line(results: list, code: int, why: str | None = None) -> str:
    """`15 runs: 12 ok, 3 unsupported · exit 0: ...`, as pytest's last line counts its tests."""
    counts = Counter(r.status for r in results)
    parts = ", ".join(f"{counts[s]} {s}" for s in sorted(counts, key=lambda s: (_STATUS_ORDER + (s,)).index(s)))
    meaning = why or {0: "no run failed or was judged invalid (unverified and unsupported runs say why above)",
                      1: "a run failed or was judged invalid (why above)", 130: "interrupted"}.get(code, "")
    return f"{len(results)} run(s): {parts or 'none'} · exit {code}: {meaning}"


def time_line(estimate, options) -> str:
    if options.time_limit:
        return f"  time: --time={options.time_limit} (given; the estimate was {estimate.summary()})"
    return f"  time: {estimate.summary()}"


def print_verdict(name: str, launcher: str, verdict, show=common.console) -> None:
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



def print_run(r, db: Path, verbose: bool = False) -> None:
    """One run as `fbench run` shows it: status, figures, notes (the start-up breakdown with
    --verbose), reason, the host's checks."""
    console = common.console
    colour = {"ok": "green", "unverified": "yellow"}.get(r.status, "red")
    console.print(f"[{colour}]{r.status}[/{colour}] {r.backend} on {r.scenario}"
                  + (f" ({r.framework_version})" if r.framework_version else ""))
    if r.status in ("ok", "unverified"):
        console.print(f"TGS {fmt(r.tgs)} (min {fmt(r.tgs_min)}, max {fmt(r.tgs_max)}) over {r.steps_measured} "
                      f"measured steps; TFLOPs/GPU {fmt(r.tflops, '.3g')} (XTuner formula), "
                      f"{fmt(r.model_tflops, '.3g')} (model FLOPs); step {fmt(r.step_seconds, '.3f')} s")
        mem = "-" if r.peak_mem_bytes is None else f"{r.peak_mem_bytes / 2**30:.2f} GiB"
        reserved = "" if r.peak_reserved_bytes is None else f", {r.peak_reserved_bytes / 2**30:.2f} GiB reserved"
        console.print(f"peak memory {mem}{reserved} (max over measured steps); "
                      f"start-up {fmt(r.startup_seconds, '.1f')} s (worker start to first step)")
        if r.flags:
            console.print(f"[yellow]flags: {'; '.join(r.flags)}[/yellow]")
    for note in r.notes:
        if verbose or not is_startup_breakdown(note):
            console.print(f"note: {note}", highlight=False, markup=False)
    if r.reason:
        console.print(r.reason, highlight=False, markup=False)
    print_checks(r.checks)
    console.print(f"data sha256 {r.data_sha256}; {r.settings_mode} settings")
    if r.run_dir:
        console.print(f"run folder {r.run_dir}")
    if r.result_id is not None:  # else kept beside the store, as said above
        console.print(f"stored as result {r.result_id} in {db}", highlight=False, markup=False)


def estimate_line(e, gpu: str | None) -> str:
    """A backend's memory estimate as a dry run heads its plans: with --gpu, the answer first
    ('fits on H200 ...'), then what it is made of."""
    return e.summary() if gpu is None else f"{e.fit_line(gpu)}\n  {e.breakdown()}"


def print_plan(d, s, options, show) -> None:
    """One dry-run plan: the verdicts, then the command, its environment and the files it wrote."""
    import shlex

    if d.verdict is not None:
        print_verdict(d.backend, d.launcher, d.verdict, show)
    else:
        show.print(f"[bold]{escape(d.backend)}[/bold] via {d.launcher}: [red]refused[/red] {escape(d.check or '')}",
                   highlight=False)
    if d.plan_error:
        show.print(f"  [red]no plan:[/red] {escape(d.plan_error)}", highlight=False)
        return
    if d.time is not None:
        show.print(time_line(d.time, options.sbatch), highlight=False, markup=False)
    if (e := d.verdict and d.verdict.estimate) is not None:  # per phase, as this backend declares its AdamW
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


def print_submission(name: str, p, options) -> None:
    """One backend x scenario given to SLURM: the verdicts, then the script and the job, or nothing."""
    print_verdict(name, "slurm", p.verdict)
    if p.result is not None:
        return
    common.console.print(time_line(p.time, options.sbatch), highlight=False, markup=False)
    common.console.print(f"  sbatch: {p.sbatch}", highlight=False, markup=False)
    if p.note:
        common.console.print(f"  [yellow]{escape(p.note)}[/yellow]", highlight=False)
    if p.submission:
        common.console.print(f"  submitted: SLURM job {p.submission.job_id}", highlight=False)
