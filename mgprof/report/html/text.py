"""Escaping for report.html: text nodes, chart labels, and the JSON that travels in a script.

Every string from a trace or run.json is untrusted (a kernel name holds ``<``, ``>`` and ``&``; a
region can be called ``</script>``). Text nodes and attributes go through :func:`esc`; Plotly
reads a small HTML subset in labels and turns entities back into plain characters, so chart
labels go through :func:`label`; the data block is JSON with ``<``, ``>`` and ``&`` written as
``\\u003c``-style escapes (:func:`json_for_script`), so nothing in it can close its script.
Table cells the page's script fills from that JSON are set with ``textContent``: they stay raw.
Control and bidi characters are shown escaped first (``safe_text.printable``), as in every other
renderer, so a name reads the same in report.html as in the terminal.
"""

from __future__ import annotations

import html
import json
import math
import re
from collections import Counter
from typing import Any

from mgprof.report.safe_text import printable

LABEL_CHARS = 60
"""Longest chart label (a C++ kernel name runs to hundreds of characters); the hover text and
the tables keep the whole name."""


def esc(text: Any) -> str:
    """A text node or attribute value: control characters shown escaped, newlines kept."""
    return html.escape(printable(text, multiline=True), quote=True)


_CODE = re.compile(r"``([^\n]+?)``|`([^`\n]+)`")
"""A Markdown code span (``x`` or ````x````) on one line."""


def prose(text: Any) -> str:
    """:func:`esc` of a sentence written for every renderer (a finding, a note), with its
    Markdown code spans (`mgprof.region(...)`) as ``<code>``: the terminal shows the backticks,
    Markdown renders them, and the page must not show them literally. The text is escaped
    first, so a span holds text only, never markup."""
    return _CODE.sub(lambda m: f"<code>{m.group(1) or m.group(2)}</code>", esc(text))


def label(text: Any) -> str:
    """A chart label: Plotly renders a subset of HTML in labels, so escape like a text node
    (one line: a newline is shown as ``\\n``)."""
    return html.escape(printable(text), quote=True)


def short_label(text: Any, chars: int = LABEL_CHARS) -> str:
    """:func:`label` of at most ``chars`` characters (cut before escaping, so never inside an
    entity), ending in ``…`` when cut."""
    plain = printable(text)
    if len(plain) > chars:
        plain = plain[: chars - 1] + "…"
    return html.escape(plain, quote=True)


def cell(text: Any) -> str:
    """A table cell the page's script sets with ``textContent``: control characters shown
    escaped, nothing else changed (the JSON escaping keeps it inside its script)."""
    return printable(text)


def finite(value: Any) -> Any:
    """NaN and infinities become None: JSON has no spelling for them and Plotly skips nulls."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def json_for_script(data: Any) -> str:
    """JSON that is safe inside ``<script type="application/json">`` (no ``</script>``)."""
    text = json.dumps(finite(data), allow_nan=False, separators=(",", ":"))
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


STRING_REF = "\x00"
"""Starts a reference into the data's ``strings`` table: no text from data can start with it
(``printable`` shows a NUL as the four characters ``\\x00``)."""
INTERN_MIN_CHARS = 12


def intern_strings(data: dict[str, Any], min_chars: int = INTERN_MIN_CHARS) -> dict[str, Any]:
    """``data`` with every string of ``min_chars`` or more that occurs twice or more replaced by
    ``STRING_REF`` + its index in a ``strings`` list added to it. Kernel and operator names
    repeat on every rank, in tables and chart labels: a 16-rank report stores each once."""
    counts: Counter[str] = Counter()

    def count(value: Any) -> None:
        if isinstance(value, str):
            if len(value) >= min_chars:
                counts[value] += 1
        elif isinstance(value, dict):
            for v in value.values():
                count(v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                count(v)

    count(data)
    table = [text for text, n in counts.items() if n > 1]
    index = {text: i for i, text in enumerate(table)}

    def swap(value: Any) -> Any:
        if isinstance(value, str):
            i = index.get(value)
            return value if i is None else f"{STRING_REF}{i}"
        if isinstance(value, dict):
            return {k: swap(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [swap(v) for v in value]
        return value

    return {**swap(data), "strings": table}


def unintern_strings(data: dict[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`intern_strings` (what the page's script does after parsing)."""
    table = data.get("strings") or []

    def swap(value: Any) -> Any:
        if isinstance(value, str) and value.startswith(STRING_REF):
            return table[int(value[1:])]
        if isinstance(value, dict):
            return {k: swap(v) for k, v in value.items()}
        if isinstance(value, list):
            return [swap(v) for v in value]
        return value

    return {k: swap(v) for k, v in data.items() if k != "strings"}
