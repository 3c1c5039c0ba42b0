"""The page every study renders into: head (policy, style, plotly.js), body, the charts' JSON and
the script that draws them.

The script draws every ``<div class="chart" id=...>`` from the page's JSON block as soon as the
page loads (a study page is short: no views to defer), marks a drawn chart ``data-rendered`` and
``<html>`` ``data-ready-ms`` once all are, and shows any failure on the page, as the run report
does. Tables are plain HTML, escaped here; nothing from a record is ever parsed as markup.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from mgprof.atomic import write_text_atomic
from mgprof.report.html.assets import CSS
from mgprof.report.html.page import CSP, plotly_js
from mgprof.report.html.sections import anchor
from mgprof.report.html.text import esc, json_for_script, prose

__all__ = [
    "REPORT_HTML",
    "chart_div",
    "facts_html",
    "lines_html",
    "run_link",
    "section",
    "study_page",
    "table",
    "write_page",
]

REPORT_HTML = "report.html"

JS = """
(function () {
  "use strict";
  var started = performance.now();
  var box = document.getElementById("mgprof-errors");
  function report(msg) { box.hidden = false; box.textContent += msg + "\\n"; }
  window.addEventListener("error", function (e) { report("script error: " + e.message); });
  var charts = JSON.parse(document.getElementById("mgprof-charts").textContent).charts || {};
  if (typeof Plotly === "undefined") {
    report("plotly.js did not load: charts are missing");
    return;
  }
  var pending = [];
  Array.prototype.forEach.call(document.querySelectorAll(".chart"), function (el) {
    var fig = charts[el.id];
    if (!fig) { report(el.id + ": no figure for this chart"); return; }
    try {
      pending.push(Plotly.newPlot(el, fig.data, fig.layout, {displaylogo: false, responsive: true})
        .then(function () { el.setAttribute("data-rendered", "1"); })
        .catch(function (err) { report(el.id + ": " + err); }));
    } catch (err) { report(el.id + ": " + err); }
  });
  Promise.all(pending).then(function () {
    var root = document.documentElement;
    root.setAttribute("data-ready-ms", performance.now().toFixed(0));
    root.setAttribute("data-script-ms", started.toFixed(0));
  });
})();
"""


def chart_div(chart_id: str, charts: Mapping[str, Any]) -> str:
    """The element a chart is drawn into, when the chart exists."""
    return f'<div class="chart" id="{chart_id}"></div>' if chart_id in charts else ""


def table(
    columns: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    text_columns: Sequence[int] = (),
    links: tuple[str, Sequence[str]] | None = None,
) -> str:
    """A table of formatted cells (the first column and ``text_columns`` labels, the others
    figures, right-aligned; ``n/a`` cells dimmed), horizontally scrollable on a narrow window.
    ``links`` is (header, one piece of markup per row): a last column of links."""
    text = {0, *text_columns}
    head = "".join(
        f'<th class="{"" if i in text else "num"}">{esc(c)}</th>' for i, c in enumerate(columns)
    )
    if links is not None:
        head += f"<th>{esc(links[0])}</th>"
    body = []
    for r, row in enumerate(rows):
        cells = "".join(
            f'<td class="{"" if i in text else "num"}{" na" if c.startswith("n/a") else ""}">'
            f"{esc(c)}</td>"
            for i, c in enumerate(row)
        )
        if links is not None:
            cells += f'<td class="links">{links[1][r] if r < len(links[1]) else ""}</td>'
        body.append(f"<tr>{cells}</tr>")
    return (
        f'<div class="scroll"><table class="cells"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


def facts_html(facts: Sequence[tuple[str, str]]) -> str:
    """Key/value facts (the sweep's answer), as the run report's Setup shows them."""
    rows = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in facts)
    return f'<table class="facts"><tbody>{rows}</tbody></table>'


def lines_html(lines: Sequence[str], css: str = "lines", *, code: bool = False) -> str:
    """Lines as a list; with ``code`` (sentences mgprof wrote: notes, caveats) their Markdown
    code spans become ``<code>``, while a record's facts (a script path) stay as written."""
    if not lines:
        return ""
    text = prose if code else esc
    return f'<ul class="{css}">' + "".join(f"<li>{text(line)}</li>" for line in lines) + "</ul>"


def section(title: str, *parts: str) -> str:
    """A titled section (its id: ``sec-`` and the title, as in the run report)."""
    return f'<section id="{anchor(title)}"><h2>{esc(title)}</h2>{"".join(parts)}</section>'


def run_link(run_dir: str, text: str, file: str = REPORT_HTML) -> str:
    """A link to ``<run_dir>/<file>`` beside the study's own page. The directory name comes from
    the record: it is percent-encoded (a ``:`` too), so it can only ever be a relative path,
    never a ``javascript:`` or other scheme."""
    href = quote(f"{run_dir.rstrip('/')}/{file}", safe="/")
    return f'<a href="{esc(href)}">{esc(text)}</a>'


def study_page(title: str, body: Sequence[str], charts: Mapping[str, Any]) -> str:
    """One offline document: ``body`` (markup whose data strings are already escaped) and the
    ``charts`` (chart id -> Plotly figure) its chart elements name.

    Raises ``HtmlDependencyMissing`` (a UsageError and an ImportError) without plotly."""
    script = plotly_js()
    return "".join(
        [
            '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">',
            f'<meta http-equiv="Content-Security-Policy" content="{esc(CSP)}">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{esc(title)}</title>",
            f"<style>{CSS}</style>",
            f"<script>{script}</script>",
            '</head><body class="study">',
            f"<h1>{esc(title)}</h1>",
            '<div id="mgprof-errors" hidden></div>',
            *body,
            '<script type="application/json" id="mgprof-charts">',
            json_for_script({"charts": dict(charts)}),
            "</script>",
            f"<script>{JS}</script>",
            "</body></html>\n",
        ]
    )


def write_page(folder: Path, render: Any, record: Any) -> Path | None:
    """``folder/report.html`` from ``render(record)``; skipped (None) without plotly, since the
    page is optional and the study must not fail for it (as a run's report.html)."""
    try:
        text = render(record)
    except ImportError:  # HtmlDependencyMissing is an ImportError too
        return None
    return write_text_atomic(folder / REPORT_HTML, text)
