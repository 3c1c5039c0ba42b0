"""Self-contained HTML run report (``report.html``): the TensorBoard profiler plugin's views,
offline, around the report's shared sections.

One file that works with no network: plotly.js is inlined from the installed ``plotly`` package
(never a CDN), the data travels once as JSON in a ``<script type="application/json">`` block, and
a small inline script (``html_assets``) switches the views (Overview, Operators, Kernels, Memory,
Distributed, Steps, Regions; ``#view=kernels`` opens one), filters them to the rank the selector
names and draws a view's charts and tables only when it is shown. Escaping (every name from a
trace is text, never markup or script): ``html_text``. What each view holds: ``html_views``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mgprof.analyze.run.schema import RunAnalysis, decode_analysis
from mgprof.errors import UsageError
from mgprof.records import RunRecord
from mgprof.report.failure_summary import failure_summary, sections_after
from mgprof.report.html.assets import CSS, JS
from mgprof.report.html.charts import chart_figures
from mgprof.report.html.sections import failure_html
from mgprof.report.html.text import esc as _esc
from mgprof.report.html.text import intern_strings
from mgprof.report.html.text import json_for_script as _json_for_script
from mgprof.report.html.views import build_page
from mgprof.report.run.sections import build_sections, definitions

__all__ = ["HtmlDependencyMissing", "chart_figures", "run_to_html"]

PIP_HINT = "pip install 'mgprof[html]'  (or: pip install 'plotly>=5.18')"


class HtmlDependencyMissing(UsageError, ImportError):
    """plotly is not installed. An ImportError too, so callers that treat the HTML report as
    optional (``finish_run``) skip it, while the CLI prints the one-line fix."""


def _plotly_js() -> str:
    """plotly.min.js as bundled in the plotly wheel (``plotly.offline.get_plotlyjs``)."""
    try:
        from plotly.offline import get_plotlyjs
    except ImportError:
        raise HtmlDependencyMissing(
            f"the HTML report draws its charts with plotly, which is not installed: {PIP_HINT}"
        ) from None
    return str(get_plotlyjs())


_CSP = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "img-src data: blob:; font-src data:"
)
"""No network at all: the file is meant to work offline, and an injected element (had escaping
ever failed) could not load anything either."""

CSP = _CSP
"""The policy for other mgprof pages (``mgprof diff --format html``)."""


def plotly_js() -> str:
    """plotly.js for another offline mgprof page; HtmlDependencyMissing without plotly."""
    return _plotly_js()


def run_to_html(run: RunRecord, analysis: RunAnalysis | Mapping[str, Any]) -> str:
    """The run report as one offline HTML document with views, interactive charts and tables.

    Raises :class:`HtmlDependencyMissing` (a UsageError naming the pip command) without plotly.
    An analysis dict (``analyze_run``'s, run.json's) is decoded first (``decode_analysis``).
    """
    analysis = decode_analysis(analysis)
    plotly_js = _plotly_js()
    summary = failure_summary(run, analysis)
    brief = summary is not None and not summary.full_report
    charts = {} if brief else chart_figures(run, analysis)
    if summary is None:
        sections = build_sections(run, analysis)
    else:  # Setup, then the rest only when enough steps were measured
        sections = sections_after(summary, run, analysis)
    defs = [] if brief else definitions(analysis)
    page = build_page(run, analysis, sections, charts, defs, full=not brief)
    title = run.run_id or run.script or "run"
    return "".join(
        [
            '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">',
            f'<meta http-equiv="Content-Security-Policy" content="{_esc(_CSP)}">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>mgprof report: {_esc(title)}</title>",
            f"<style>{CSS}</style>",
            f"<script>{plotly_js}</script>",
            "</head><body>",
            f"<h1>mgprof report: {_esc(title)}</h1>",
            "" if summary is None else failure_html(summary),
            page.nav,
            '<div id="mgprof-errors" hidden></div>',
            page.views,
            '<script type="application/json" id="mgprof-charts">',
            _json_for_script(intern_strings(page.data)),
            "</script>",
            f"<script>{JS}</script>",
            "</body></html>\n",
        ]
    )
