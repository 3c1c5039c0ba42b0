"""Strings from data (traces, run.json, paths, exception text) printed as text, never as commands.

A kernel name, hostname, error message or path is written by whoever made the trace or ran the
script. Printed as it is, it can act on the reader's terminal or viewer:

- ANSI/OSC escape sequences (``\\x1b[2J`` clears the screen, ``\\x1b]8;;URL\\x1b\\\\`` plants a
  hyperlink), BEL, carriage return (overwrites the line), other C0/C1 controls;
- bidi overrides (U+202E) that make the text read differently from what it is;
- rich markup (``[/x]`` raises ``MarkupError``, ``[link=URL]`` plants a hyperlink);
- Markdown or HTML (``|`` splits a table cell, ``<script>`` reaches a Markdown viewer).

The renderers pass every such string through one function here at the point it enters rich or
Markdown (HTML escapes with :func:`printable` then ``html.escape``, in ``report/html.py``).
Only :func:`rich_text` needs rich, and imports it when called: the CLI's plain ``print`` lines
use :func:`printable` without loading it.

Escaping rules (:func:`printable`): C0 controls except tab (and newline where a message may span
lines), DEL, C1 controls, bidi formatting characters, line/paragraph separators and lone
surrogates (from undecodable path bytes) are written as Python writes them in a ``repr``:
``\\x1b``, ``\\r``, ``\\u202e``, ``\\udcff``. Everything else, ordinary Unicode text such as
"µs", "×", "—" or non-Latin names included, is kept as it is. A backslash is kept too, so a
name that already holds the four characters ``\\x1b`` reads the same as one holding ESC: the
output is for reading, and neither can act on the terminal.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING
from urllib.parse import quote

if TYPE_CHECKING:
    from rich.text import Text

__all__ = ["json_text", "md_code", "md_link", "md_text", "printable", "rich_text"]

_BIDI = r"\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_OTHER = r"\x7f-\x9f\u2028\u2029\ud800-\udfff"  # DEL, C1, line/paragraph separators, surrogates
_UNSAFE = re.compile(rf"[\x00-\x08\x0a-\x1f{_OTHER}{_BIDI}]")
_UNSAFE_KEEP_NEWLINE = re.compile(rf"[\x00-\x08\x0b-\x1f{_OTHER}{_BIDI}]")
_UNSAFE_IN_JSON = re.compile(rf"[\x7f-\x9f\u2028\u2029{_BIDI}]")

_SHORT = {"\n": "\\n", "\r": "\\r"}


def _escape_char(match: re.Match[str]) -> str:
    char = match.group()
    if char in _SHORT:
        return _SHORT[char]
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}"


def printable(text: object, multiline: bool = False) -> str:
    """``text`` (``str()`` of it) with every character that could act on a terminal shown
    escaped: ``"\\x1b[2J"`` becomes the six characters ``\\x1b[2J``.

    ``multiline=True`` keeps newlines (tracebacks, messages that span lines); otherwise a
    newline is shown as ``\\n`` too, so a name cannot start a line of its own. Tabs are kept.
    """
    pattern = _UNSAFE_KEEP_NEWLINE if multiline else _UNSAFE
    return pattern.sub(_escape_char, str(text))


def json_text(text: str) -> str:
    """JSON text (``msgspec``'s, which escapes C0 controls but writes the rest as UTF-8) with
    DEL, C1 controls (U+009B is a CSI to many terminals), bidi and line separators written as
    ``\\u`` escapes too: the same JSON value, printable on a terminal. Those characters can only
    occur inside JSON strings, where ``\\uXXXX`` means the character itself."""
    return _UNSAFE_IN_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


DISPLAY_CHARS = 8192
"""Characters of one text the terminal lays out: far more than any sentence or cell mgprof
prints, and bounded, so a name of hundreds of MB in a trace costs its reading, not a layout
that grows faster than the name (rich measures and wraps every character)."""


def rich_text(
    text: object, style: str = "", multiline: bool = False, highlight: bool = False
) -> Text:
    """A ``rich.text.Text`` of :func:`printable` text: never read as markup (``[/x]``,
    ``[link=...]``) nor emoji codes, no control characters.

    ``highlight=True`` colours numbers and the like as rich does for a plain ``str`` (styles
    only: it adds no links), for cells that were plain strings before.
    """
    from rich.highlighter import ReprHighlighter
    from rich.text import Text

    if isinstance(text, str) and len(text) > DISPLAY_CHARS:
        text = text[: DISPLAY_CHARS - 1] + "…"
    out = Text(printable(text, multiline=multiline), style=style)
    return ReprHighlighter()(out) if highlight else out


_MD_ESCAPES = {
    "<": "&lt;",
    ">": "&gt;",
    "|": "\\|",
    "\\": "\\\\",
    "`": "\\`",
    "*": "\\*",
    "_": "\\_",
    "[": "\\[",
    "]": "\\]",
}


_ENTITY_START = re.compile(r"&(?=#?[0-9A-Za-z]+;)")
"""An ``&`` that a Markdown renderer would read as a character reference (``&lt;``, ``&#60;``)."""


def md_text(text: object) -> str:
    """Text that renders literally in a GitHub-flavoured Markdown table cell, list item or
    paragraph: one line, no HTML (``<``/``>`` as entities, ``&`` too where it would start one:
    a plain "A & B" stays readable in the raw file), ``|`` cannot split a cell, and emphasis,
    code and link characters are backslash-escaped."""
    raw = _ENTITY_START.sub("&amp;", printable(text, multiline=True))
    out = "".join(_MD_ESCAPES.get(ch, ch) for ch in raw)
    return " ".join(out.splitlines())


def md_code(text: object) -> str:
    """An inline code span showing ``text`` verbatim: its fence is longer than any backtick run
    inside, and ``|`` is escaped (GFM splits table cells on it even inside code)."""
    body = printable(text).replace("|", "\\|")
    longest = max((len(run) for run in re.findall(r"`+", body)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if body.startswith("`") or body.endswith("`") or not body.strip() else ""
    return f"{fence}{pad}{body}{pad}{fence}"


def md_link(text: object, target: str) -> str:
    """``[text](target)`` with the text escaped (:func:`md_text`) and the target percent-encoded,
    so neither can close the link, add a title or carry markup."""
    return f"[{md_text(text)}]({quote(printable(target), safe='/._-~#')})"
