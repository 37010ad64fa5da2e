"""A page as a list of blocks (heading, paragraph, table, list, image, preformatted text),
written as Markdown or as one self-contained HTML page: the report and the index of reports are
both rendered from blocks, so their two formats always say the same thing. The HTML embeds its
images as base64 data URIs and its CSS inline: it can be mailed or attached as one file."""

from __future__ import annotations

import base64
import html
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

SPEED_MARK, OTHER_MARK = "⚠ ", "≠ "  # settings rows that differ between backends (speed-relevant / not)
LONG_CELL = 32  # characters from which a table cell is free text, wrapped anywhere so its column stays narrow


@dataclass
class Block:
    kind: str  # h1 | h2 | p | table | list | image | pre
    text: str = ""
    header: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)
    items: list[str] = field(default_factory=list)
    path: Path | None = None


class Link(str):
    """A table cell naming a page by its stem: the Markdown index links its `.md`, the HTML one its `.html`."""


def _md_cell(text: str) -> str:
    if isinstance(text, Link):
        return f"[{text}]({text}.md)"
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(items: list[Block], base: Path) -> str:
    lines: list[str] = []
    for b in items:
        if b.kind == "h1":
            lines += [f"# {b.text}", ""]
        elif b.kind == "h2":
            lines += [f"## {b.text}", ""]
        elif b.kind == "p":
            lines += [b.text, ""]
        elif b.kind == "table":
            lines.append("| " + " | ".join(map(_md_cell, b.header)) + " |")
            lines.append("|" + "---|" * len(b.header))
            lines += ["| " + " | ".join(map(_md_cell, row)) + " |" for row in b.rows]
            lines.append("")
        elif b.kind == "list":
            lines += [f"- {item}" for item in b.items] + [""]
        elif b.kind == "image":
            lines += [f"![{b.text}]({Path(os.path.relpath(b.path, base)).as_posix()})", ""]
        elif b.kind == "pre":
            lines += ["```", b.text, "```", ""]
    return "\n".join(lines)


# The page fits 1280 px: the body is at most that wide, and no table is wider than the body.
# Free-text cells (LONG_CELL) wrap anywhere, so their columns give way; a table still wider
# (many columns of whole words) scrolls inside its own box instead of widening the page.
_CSS = """*{box-sizing:border-box}
body{font-family:system-ui,sans-serif;margin:0 auto;padding:1.5em 2em;color:#222;max-width:1280px;
overflow-wrap:break-word}
div.table{max-width:100%;overflow-x:auto;margin:1em 0}
table{border-collapse:collapse;font-size:0.85em}
th,td{border:1px solid #ccc;padding:0.3em 0.5em;text-align:left;vertical-align:top}
td.long{overflow-wrap:anywhere;min-width:10em}
th{background:#f3f3f3}img{max-width:100%;height:auto;border:1px solid #ddd;margin:0.5em 0}
figure{margin:1em 0}
pre{background:#f6f6f6;padding:0.6em;overflow-x:auto;white-space:pre-wrap;overflow-wrap:anywhere;font-size:0.85em}
tr.speed td{background:#fff3cd;font-weight:600}"""


def _th(name: str) -> str:
    """A column name that may break after `_` or `/`: the host checks' names (`initial_weights`,
    `projection_delay`) set the width of twenty columns."""
    return "<th>" + re.sub(r"([_/])", r"\1<wbr>", html.escape(name)) + "</th>"


def _td(cell: str) -> str:
    if isinstance(cell, Link):
        return f'<td><a href="{html.escape(cell)}.html">{html.escape(cell)}</a></td>'
    return f'<td class="long">{html.escape(cell)}</td>' if len(cell) >= LONG_CELL else f"<td>{html.escape(cell)}</td>"


def to_html(items: list[Block], title: str = "fbench report") -> str:
    e = html.escape
    parts = ["<!DOCTYPE html>", f'<html lang="en"><head><meta charset="utf-8"><title>{e(title)}</title>',
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             f"<style>{_CSS}</style></head><body>"]
    for b in items:
        if b.kind in ("h1", "h2", "p"):
            parts.append(f"<{b.kind}>{e(b.text)}</{b.kind}>")
        elif b.kind == "table":
            parts.append('<div class="table"><table><thead><tr>' + "".join(map(_th, b.header)) + "</tr></thead><tbody>")
            parts += [("<tr class=\"speed\">" if row and row[0].startswith(SPEED_MARK) else "<tr>")
                      + "".join(map(_td, row)) + "</tr>" for row in b.rows]
            parts.append("</tbody></table></div>")
        elif b.kind == "list":
            parts.append("<ul>" + "".join(f"<li>{e(i)}</li>" for i in b.items) + "</ul>")
        elif b.kind == "image":
            data = base64.b64encode(b.path.read_bytes()).decode()
            parts.append(f'<figure><img alt="{e(b.text)}" src="data:image/png;base64,{data}">'
                         f"<figcaption>{e(b.text)}</figcaption></figure>")
        elif b.kind == "pre":
            parts.append(f"<pre>{e(b.text)}</pre>")
    parts.append("</body></html>")
    return "\n".join(parts)
