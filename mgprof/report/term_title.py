"""A section rule whose title holds a path, at any terminal width, with nothing cut.

``Console.rule`` cuts a title longer than the line with ``…``; a trace folder or a script path is
often longer than 80 columns. The path then goes under a short rule, folded at its ``/``
separators so every folder and file name stays whole (a name longer than the line is folded
inside itself, the only way to show all of it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mgprof.report.safe_text import printable, rich_text

if TYPE_CHECKING:
    from rich.align import AlignMethod
    from rich.console import Console

# what Console.rule keeps around a title: a rule character and a space on each side
_RULE_MARGIN = 4


def path_lines(path: str, width: int) -> list[str]:
    """``path`` in lines of at most ``width`` characters, broken after a ``/``."""
    width = max(width, 1)
    parts = printable(path).split("/")
    pieces = [p + "/" for p in parts[:-1]] + [parts[-1]]
    lines: list[str] = []
    line = ""
    for piece in pieces:
        if line and len(line) + len(piece) > width:
            lines.append(line)
            line = ""
        while len(piece) > width:  # one name longer than the line: fold inside it
            lines.append(piece[:width])
            piece = piece[width:]
        line += piece
    if line or not lines:
        lines.append(line)
    return lines


def rule_with_path(console: Console, head: str, path: str, align: AlignMethod = "center") -> None:
    """``── head path ──`` when it fits the console, else ``── head ──`` and the folded path."""
    from rich.text import Text

    width = console.width
    if len(head) + 1 + len(printable(path)) + _RULE_MARGIN <= width:
        console.rule(
            Text.assemble((head, "bold"), " ", rich_text(path, highlight=True)),
            align=align,
        )
        return
    console.rule(Text(head, style="bold"), align=align)
    for line in path_lines(path, width):
        console.print(rich_text(line))
