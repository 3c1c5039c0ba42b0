"""The shared report sections (``run_sections``) as HTML: the same content as the terminal and
Markdown reports, with every text node escaped; findings in full (cause and saving too).

The page's views place these sections (``html_views``); the charts that follow a section are
passed in by id.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from mgprof.analyze.run.schema import ComparisonRow, RunAnalysis, SweepPoint, given
from mgprof.report.failure_summary import FailureSummary
from mgprof.report.html.charts import comparison_rows, sweep_series
from mgprof.report.html.text import esc as _esc
from mgprof.report.html.text import prose
from mgprof.report.run.sections import Section, Table

__all__ = [
    "anchor",
    "chart_div",
    "comparison_section",
    "definitions_html",
    "failure_html",
    "findings_html",
    "section_html",
    "sweep_section",
    "table_html",
]


def table_html(table: Table) -> str:
    head = "".join(
        f'<th class="{"" if table.is_text(i) else "num"}">{_esc(c)}</th>'
        for i, c in enumerate(table.columns)
    )
    rows = []
    for row in table.rows:
        cells = "".join(
            f'<td class="{"" if table.is_text(i) else "num"}'
            f'{" na" if c.startswith("n/a") else ""}">{_esc(c)}</td>'
            for i, c in enumerate(row)
        )
        rows.append(f"<tr>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def anchor(title: str) -> str:
    """The id of a section's element: ``sec-`` and its title in lower case."""
    return "sec-" + "".join(ch if ch.isalnum() else "-" for ch in title.lower()).strip("-")


def section_html(section: Section, after: str = "", extra: str = "") -> str:
    """A section: notice, facts, tables, then ``after`` (its charts' HTML) and ``extra``, then
    notes and footnotes; a section with a ``brief`` is that one line."""
    out = [f'<section id="{anchor(section.title)}"><h2>{_esc(section.title)}</h2>']
    if section.brief is not None:
        out.append(f'<p class="brief">{prose(section.brief)}</p>{after}</section>')
        return "".join(out)
    if section.notice:
        out.append(
            f'<div class="notice"><strong>CPU fallback:</strong> {prose(section.notice)}</div>'
        )
    if section.facts:
        out.append('<table class="facts"><tbody>')
        out.extend(f"<tr><th>{_esc(k)}</th><td>{_esc(v)}</td></tr>" for k, v in section.facts)
        out.append("</tbody></table>")
    out.extend(table_html(t) for t in section.tables)
    out.append(after)
    out.append(extra)
    out.extend(f'<p class="note">{prose(n)}</p>' for n in section.notes)
    if section.footnotes:
        out.append('<ul class="footnotes">')
        out.extend(f"<li>{prose(n)}</li>" for n in section.footnotes)
        out.append("</ul>")
    out.append("</section>")
    return "".join(out)


def failure_html(summary: FailureSummary) -> str:
    """The failure summary: facts, the end of the failing rank's traceback, steps per rank."""
    sec = summary.section
    out = [f'<section id="{anchor(sec.title)}" class="failure"><h2>{_esc(sec.title)}</h2>']
    out.append('<table class="facts"><tbody>')
    out.extend(f"<tr><th>{_esc(k)}</th><td>{_esc(v)}</td></tr>" for k, v in sec.facts)
    out.append("</tbody></table>")
    if summary.traceback:
        out.append(f'<p class="note">{_esc(summary.traceback_title)}:</p>')
        out.append(f"<pre>{_esc(chr(10).join(summary.traceback))}</pre>")
    out.extend(table_html(t) for t in sec.tables)
    out.extend(f'<p class="note">{prose(n)}</p>' for n in sec.notes)
    out.append("</section>")
    return "".join(out)


def findings_html(analysis: RunAnalysis) -> str:
    """Every finding with all its keys (the shared section keeps only the short form)."""
    items = []
    for f in given(analysis.findings) or []:
        severity = f.severity
        sev_class = severity if severity in ("high", "medium", "low", "info") else "info"
        fields: tuple[tuple[str, str, Any], ...] = (
            ("evidence", "evidence", f.evidence),
            ("cause", "cause", f.cause),
            ("change", "change", f.change),
            ("fix", "fix", f.fix),
            ("could save", "saving", f.saving),
        )
        rows = [
            (label, _finding_text(value))
            for label, key, value in fields
            if value and not (key == "fix" and value == f.change)
        ]
        body = "".join(f"<dt>{_esc(label)}</dt><dd>{prose(value)}</dd>" for label, value in rows)
        tag = f.rule or f.id
        rule = f' <span class="rule">{_esc(tag)}</span>' if tag else ""
        items.append(
            f'<li class="finding {sev_class}"><div class="head">'
            f'<span class="sev">{_esc(severity)}</span> {prose(f.title)}{rule}</div>'
            f"<dl>{body}</dl></li>"
        )
    return f'<ul class="findings">{"".join(items)}</ul>' if items else ""


def _number(value: Any) -> float | None:
    """A real number as float; None for anything else (None, bool, text)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def _finding_text(value: Any) -> str:
    """A finding's field as text: evidence may be a sentence, or numbers keyed by name."""
    if isinstance(value, dict):
        return "; ".join(f"{k}: {_finding_text(v)}" for k, v in value.items())
    if isinstance(value, list):
        return "; ".join(_finding_text(v) for v in value)
    num = _number(value)
    if num is not None and not isinstance(value, int):
        return f"{num:,.4g}"
    return str(value)


def _fmt(value: Any) -> str:
    num = _number(value)
    if num is not None:
        return f"{num:,.2f}"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {_fmt(v)}" for k, v in value.items())
    if isinstance(value, list):
        return ", ".join(_fmt(v) for v in value)
    return "-" if value is None else str(value)


Column = tuple[str, Callable[[Any], Any]]
"""A table column: its header and what it shows of a row."""


def _rows_table(rows: Sequence[Any], columns: Sequence[Column]) -> Table:
    table = Table([name for name, _ in columns], numeric_from=1)
    table.rows = [[_fmt(pick(r)) for _, pick in columns] for r in rows]
    return table


def chart_div(chart_id: str, charts: Mapping[str, Any]) -> str:
    """The element a chart is drawn into, when the chart exists."""
    return f'<div class="chart" id="{chart_id}"></div>' if chart_id in charts else ""


_COMPARISON: tuple[tuple[str, Callable[[ComparisonRow], Any]], ...] = (
    ("strategy", lambda r: r.strategy),
    ("devices", lambda r: r.devices),
    ("step_time_ms", lambda r: r.step_time_ms),
    ("samples_per_s", lambda r: r.samples_per_s),
    ("speedup", lambda r: r.speedup),
    ("efficiency", lambda r: r.efficiency),
    ("comm_share_pct", lambda r: r.comm_share_pct),
    ("peak_mem_mib", lambda r: r.peak_mem_mib),
)
_PRECISION: tuple[tuple[str, Callable[[ComparisonRow], Any]], ...] = (
    ("strategy", lambda r: r.strategy),
    ("precision", lambda r: r.precision),
    ("precision_setting", lambda r: r.precision_setting),
    ("precision_speedup", lambda r: r.precision_speedup),
    ("peak_mem_change_pct", lambda r: r.peak_mem_change_pct),
    ("reduced_gemm_pct", lambda r: r.reduced_gemm_pct),
    ("tensor_core_pct", lambda r: r.tensor_core_pct),
    ("mfu_pct", lambda r: r.mfu_pct),
    ("loss_status", lambda r: _loss_status(r)),
)


def comparison_section(analysis: RunAnalysis, charts: Mapping[str, Any]) -> str:
    rows = comparison_rows(analysis)
    if not rows:
        return ""
    tables = [_rows_table(rows, _COMPARISON)]
    if any(r.precision for r in rows):
        tables.append(_rows_table(rows, _PRECISION))
    return section_html(
        Section("Strategy comparison", tables=tables), chart_div("chart-comparison", charts)
    )


def _loss_status(row: ComparisonRow) -> str | None:
    """``ok: within 0.5 % of the baseline's loss ...`` (the precision row's loss check)."""
    check = row.loss_check
    if check is None:
        return "baseline" if row.precision == row.precision_baseline else None
    return f"{check.status}: {check.detail}"


_SWEEP: tuple[tuple[str, Callable[[tuple[str, SweepPoint]], Any]], ...] = (
    ("series", lambda r: r[0]),
    ("batch_size", lambda r: r[1].batch_size),
    ("samples_per_s", lambda r: r[1].samples_per_s),
    ("peak_mem_mib", lambda r: r[1].peak_mem_mib),
    ("comm_share_pct", lambda r: r[1].comm_share_pct),
)


def sweep_section(analysis: RunAnalysis, charts: Mapping[str, Any]) -> str:
    series = sweep_series(analysis)
    if not series:
        return ""
    rows = [(name, p) for name, pts in series for p in pts]
    table = _rows_table(rows, _SWEEP)
    return section_html(
        Section("Batch-size sweep", tables=[table]), chart_div("chart-sweep", charts)
    )


def definitions_html(defs: Sequence[tuple[str, str]]) -> str:
    """The glossary, folded: it is long and read on demand."""
    if not defs:
        return ""
    items = "".join(f"<dt>{_esc(k)}</dt><dd>{prose(v)}</dd>" for k, v in defs)
    return (
        '<section id="sec-definitions"><details><summary><h2>Definitions</h2></summary>'
        f'<dl class="defs">{items}</dl></details></section>'
    )
