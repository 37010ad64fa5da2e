"""The settings that differ between a scenario's backends (`differences.setting_differences`) as
the terminal shows them under a compare: one setting per row, each backend's value in its own
column, fitted to the width (rich)."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from framework_bench.present.differences import setting_differences


def difference_grids(records: list[dict], mode: str, width: int) -> list[tuple[Text, Table | None]]:
    """Per scenario, a heading and its grid (None where no setting differs). Scenarios whose
    backends differ alike (a context sweep) share one. Each value wraps at spaces, never inside a
    word; where the backends' columns cannot all hold their longest words side by side in `width`
    (five frameworks at 100 columns), one line per backend under each setting instead."""
    alike: dict[str, list[str]] = {}
    found = setting_differences(records)
    for name, diffs in found.items():
        alike.setdefault(repr(diffs), []).append(name)
    out = []
    for names in alike.values():
        diffs, name = found[names[0]], ", ".join(names)
        said = (f": {len(diffs)} setting(s) differ between backends ({mode} settings)" if diffs
                else ": same settings on every backend")
        out.append((Text.assemble((name, "bold"), said), (_side_by_side(diffs, width) or _one_line_each(diffs))
                    if diffs else None))
    return out


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

