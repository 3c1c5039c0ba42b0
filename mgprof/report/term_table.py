"""Terminal tables that fit the console width without cutting a number.

Rich shrinks a too-wide table by squeezing every column, which turns ``660.4`` into ``660…`` and
can collapse a column to nothing. A report read in an 80-column CI log must show each figure
whole, so the width is planned here instead: numbers never wrap; headers wrap at spaces; label
columns (names, reasons) wrap; and when the figures still do not fit, the columns that do not fit
move to a continuation table below, which repeats the label columns so every row stays
readable. Columns are placed in the order given, so callers list the important ones first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich import box
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

GAP = 3
"""Cells between two columns of a ``SIMPLE_HEAD`` table with default padding and no edge: a
right pad, the (blank) column divider, a left pad."""

LABEL_MIN = 12
"""Narrowest a wrapping label column is planned at (its longest word if shorter)."""

LABEL_MAX = 40
"""Widest a wrapping column is planned at: longer words (C++ kernel names) fold."""


@dataclass
class Col:
    header: str
    numeric: bool = True
    """Numbers: right-aligned, never wrapped. Labels: left-aligned, wrap at spaces."""
    wrap: bool | None = None
    """Whether cells may wrap; default: labels wrap, numbers do not."""

    @property
    def wraps(self) -> bool:
        return (not self.numeric) if self.wrap is None else self.wrap


def _text(cell: str | Text) -> Text:
    return cell if isinstance(cell, Text) else Text(cell)


def _longest_word(text: str) -> int:
    return max((cell_len(w) for w in text.split()), default=0)


def _width(col: Col, cells: Sequence[Text]) -> int:
    """Planned width: the widest cell for columns that do not wrap (their header wraps at
    spaces); for wrapping ones, their longest word (at least ``LABEL_MIN`` when a cell is longer,
    at most the longest cell)."""
    header = _longest_word(col.header)
    lines = [line for c in cells for line in c.plain.splitlines() or [""]]
    longest = max((cell_len(line) for line in lines), default=0)
    if not col.wraps:
        return max(header, longest)
    words = min(max((_longest_word(line) for line in lines), default=0), LABEL_MAX)
    return max(header, words, min(longest, LABEL_MIN))


def _chunks(labels: list[int], values: list[int], widths: list[int], width: int) -> list[list[int]]:
    """Value columns split into runs that fit beside the label columns (at least one each)."""
    base = sum(widths[i] for i in labels) + GAP * max(0, len(labels) - 1)
    chunks: list[list[int]] = []
    current: list[int] = []
    used = base
    for i in values:
        need = widths[i] + (GAP if labels or current else 0)
        if current and used + need > width:
            chunks.append(current)
            current, used = [], base
            need = widths[i] + (GAP if labels else 0)
        current.append(i)
        used += need
    if current or not chunks:
        chunks.append(current)
    return chunks


def _spread(
    widths: list[int], columns: list[Col], keep: list[int], cells: list[list[Text]], width: int
) -> list[int]:
    """Room left in the line goes to wrapping columns whose text is longer than planned, in
    column order, so a long name wraps less."""
    out = list(widths)
    room = width - sum(out) - GAP * max(0, len(out) - 1)
    for n, (i, col) in enumerate(zip(keep, columns)):
        if room <= 0:
            break
        if not col.wraps:
            continue
        longest = max(
            (cell_len(line) for r in cells if i < len(r) for line in r[i].plain.splitlines()),
            default=0,
        )
        extra = min(room, max(0, longest - out[n]))
        out[n] += extra
        room -= extra
    return out


def fitted_tables(
    columns: Sequence[Col],
    rows: Sequence[Sequence[str | Text]],
    width: int,
    *,
    labels: int = 1,
    header_style: str = "bold",
) -> list[Table]:
    """One table when it fits ``width``, else a table per run of columns that fits, each
    repeating the first ``labels`` columns. Every figure appears whole in one of them."""
    cells = [[_text(c) for c in row] for row in rows]
    widths = [_width(col, [r[i] for r in cells if i < len(r)]) for i, col in enumerate(columns)]
    label_idx = list(range(min(labels, len(columns))))
    value_idx = list(range(len(label_idx), len(columns)))
    tables = []
    for chunk in _chunks(label_idx, value_idx, widths, width):
        keep = label_idx + chunk
        planned = _spread([widths[i] for i in keep], [columns[i] for i in keep], keep, cells, width)
        table = Table(
            box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, header_style=header_style
        )
        for i, w in zip(keep, planned):
            col = columns[i]
            # exactly the planned width: rich's own shrinking squeezes every column, numbers
            # included; for a column that must not wrap this is its widest cell, so only the
            # header wraps (rich's no_wrap would keep the header on one line too)
            table.add_column(
                Text(col.header),
                justify="right" if col.numeric else "left",
                overflow="fold",
                min_width=w,
                max_width=w,
            )
        for row in cells:
            table.add_row(*(row[i] if i < len(row) else Text("") for i in keep))
        tables.append(table)
    return tables


def print_fitted(
    console: Console,
    columns: Sequence[Col],
    rows: Sequence[Sequence[str | Text]],
    *,
    labels: int = 1,
    title: str | Text | None = None,
) -> None:
    """``fitted_tables`` at the console's width, printed; the title is a line of its own (a
    table's title would wrap at the table's width), continuations say so."""
    for n, table in enumerate(fitted_tables(columns, rows, console.width, labels=labels)):
        if title is not None:
            head = _text(title).copy()
            head.stylize("bold")
            if n:
                head.append(" (continued)", style="dim")
            console.print(head)
        elif n:
            console.print(Text("(continued)", style="dim"))
        console.print(table)
