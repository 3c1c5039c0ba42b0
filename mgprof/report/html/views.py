"""report.html's views (the TensorBoard profiler plugin's, offline): which content goes in which
tab, the tab bar and the rank selector.

Each shared report section (``run_sections``, the terminal and Markdown content) is shown once, in
the view it belongs to; a section this module does not know goes to the Overview. The views'
figures and tables travel in the page's one JSON block and are drawn by the page's script when
their view is shown, for the rank the selector names (``html_assets``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mgprof.analyze.run.schema import RunAnalysis, given
from mgprof.records import RunRecord
from mgprof.report.html.sections import (
    chart_div,
    comparison_section,
    definitions_html,
    findings_html,
    section_html,
    sweep_section,
    table_html,
)
from mgprof.report.html.text import esc
from mgprof.report.html.view_model import Context, View
from mgprof.report.html.view_overview import overview_view
from mgprof.report.html.view_profile import kernels_view, operators_view
from mgprof.report.html.view_ranks import distributed_view, memory_view
from mgprof.report.html.view_regions import regions_view
from mgprof.report.html.view_steps import steps_view
from mgprof.report.run.sections import Section

__all__ = ["VIEWS", "Page", "build_page"]

VIEWS = ("overview", "operators", "kernels", "memory", "distributed", "steps", "regions")
"""The tabs in order; ``#view=<name>`` opens one."""

SECTION_VIEW = {
    "Regions": "regions",
    "Communication": "distributed",
    "Slowest rank": "distributed",
    "Memory & headroom": "memory",
    "Memory profile": "memory",
    "Data loading": "steps",
    "Top kernels": "kernels",
}
"""Shared sections shown outside the Overview (by title); every other one is in the Overview."""

SHOWN_BY_VIEW = {"Regions": "regions-table", "Top kernels": "kernels-table"}
"""Shared sections left out where their view holds this table: it shows the same rows (and more),
sortable and filterable; one table, not two. The section's own table is the view table's first
content, which the page's script replaces when it draws it (a page read without scripts, or
whose script failed, still shows the rows)."""

CHARTS_AFTER = {"Utilisation": ("chart-utilisation",)}
"""Summary charts (``chart_figures``) drawn right after a shared section."""

VIEW_CHARTS = {"memory": ("chart-memory",), "distributed": ("chart-step-breakdown",)}
"""Summary charts that open a view."""


@dataclass
class Page:
    """The views' markup and the data their script draws from."""

    nav: str
    views: str
    data: dict[str, Any] = field(default_factory=dict)


def _views(ctx: Context, full: bool) -> list[View]:
    if not full:
        return [View("overview", "Overview")]
    builders = (
        overview_view,
        operators_view,
        kernels_view,
        memory_view,
        distributed_view,
        steps_view,
        regions_view,
    )
    return [build(ctx) for build in builders]


def _overview_extra(
    section: Section, analysis: RunAnalysis, charts: Mapping[str, Any]
) -> list[str]:
    """The Findings section with every finding in full, after the comparison and the sweep."""
    full = findings_html(analysis)
    section.findings = []  # rendered in full above; the short list would repeat it
    return [
        comparison_section(analysis, charts),
        sweep_section(analysis, charts),
        section_html(section, extra=full),
    ]


def _fallback(views: Sequence[View], table_id: str, markup: str) -> None:
    """``markup`` inside the element the view's table ``table_id`` is drawn into."""
    empty = f'<div class="vtable" data-table="{table_id}"></div>'
    for view in views:
        view.blocks = [
            f"{empty[: -len('</div>')]}{markup}</div>" if block == empty else block
            for block in view.blocks
        ]


def _view_html(view: View, sections: Sequence[str], charts: Mapping[str, Any]) -> str:
    top = "".join(chart_div(c, charts) for c in VIEW_CHARTS.get(view.key, ()))
    return (
        f'<section class="view" id="view-{view.key}" data-view="{view.key}">'
        f'<h2 class="view-title">{esc(view.title)}</h2>'
        f"{top}{''.join(view.blocks)}{''.join(sections)}</section>"
    )


def _nav(views: Sequence[View], ranks: Sequence[int], findings: int) -> str:
    tabs = "".join(
        f'<a href="#view={v.key}" data-view="{v.key}" role="tab">{esc(v.title)}</a>' for v in views
    )
    badge = f'<a class="findings-link" href="#sec-findings">Findings ({findings})</a>'
    picker = ""
    if len(ranks) > 1:
        options = "".join(f'<option value="{r}">rank {r}</option>' for r in ranks)
        picker = (
            '<label class="rank-picker" title="filters the charts and tables of every view; the '
            'summary sections list every rank">rank '
            f'<select id="rank-select"><option value="all">all ranks</option>{options}</select>'
            "</label>"
        )
    return f'<nav class="tabs" role="tablist">{tabs}{badge}{picker}</nav>'


def build_page(
    run: RunRecord,
    analysis: RunAnalysis,
    sections: Sequence[Section],
    charts: Mapping[str, Any],
    defs: Sequence[tuple[str, str]],
    *,
    full: bool = True,
) -> Page:
    """Every view with its blocks and shared sections; ``full=False`` (a failed run with too
    few steps) keeps the Overview alone."""
    ctx = Context.of(run, analysis)
    views = _views(ctx, full)
    keys = [v.key for v in views]
    placed: dict[str, list[str]] = {k: [] for k in keys}
    held = {table for view in views for table in view.tables}
    for section in sections:
        key = SECTION_VIEW.get(section.title, "overview")
        table_id = SHOWN_BY_VIEW.get(section.title)
        if table_id in held and key in placed:
            # the view's own table holds the same rows, sortable: the section's is its fallback
            _fallback(views, table_id, "".join(table_html(t) for t in section.tables))
            continue
        key = key if key in placed else "overview"
        if section.title == "Findings":
            placed[key].extend(_overview_extra(section, analysis, charts))
            continue
        after = "".join(chart_div(c, charts) for c in CHARTS_AFTER.get(section.title, ()))
        placed[key].append(section_html(section, after))
    placed["overview"].append(definitions_html(defs))
    figures: dict[str, Any] = {}
    tables: dict[str, Any] = {}
    for view in views:
        figures.update(view.figures)
        tables.update(view.tables)
    markup = {v.key: _view_html(v, placed[v.key], charts) for v in views}
    # a summary chart whose section was renamed or dropped still shows, in the Overview
    lost = [c for c in charts if not any(f'id="{c}"' in m for m in markup.values())]
    if lost:
        placed["overview"].extend(chart_div(c, charts) for c in lost)
        markup["overview"] = _view_html(views[0], placed["overview"], charts)
    n_findings = len(given(analysis.findings) or [])
    return Page(
        nav=_nav(views, ctx.ranks, n_findings),
        views="".join(markup[v.key] for v in views),
        data={
            "ranks": ctx.ranks,
            "views": keys,
            "charts": dict(charts),
            "figures": figures,
            "tables": tables,
        },
    )
