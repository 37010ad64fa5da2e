"""A table that fits the terminal it is printed in (rich): every figure whole, rows of one or two
lines, the columns that do not fit left out in a set order and named under it, notes and long
sentences as numbered footnotes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

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
