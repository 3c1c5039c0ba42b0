"""Self-contained HTML run report (``report.html``): the report's sections plus Plotly charts.

One file that works offline: plotly.js is inlined from the installed ``plotly`` package (never a
CDN), and the chart data travels as JSON in a ``<script type="application/json">`` block with
``<``, ``>`` and ``&`` written as ``\\u003c``-style escapes, so no string from a trace can close the
script. Every text node goes through ``html.escape``; names from traces (kernel names hold ``<``,
``>`` and ``&``) therefore show as text, never as markup. Chart labels are escaped too, because
Plotly reads a small HTML subset in labels and turns entities back into plain characters.
Control and bidi characters are shown escaped first (``safe_text.printable``), as in every other
renderer, so a name reads the same in report.html as in the terminal.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from mgprof.analyze.readers import as_dict as _dict
from mgprof.analyze.readers import num as _num
from mgprof.analyze.readers import rank_dicts as _ranks
from mgprof.errors import UsageError
from mgprof.records import RunRecord
from mgprof.report.failure_summary import FailureSummary, failure_summary, sections_after
from mgprof.report.run_sections import Section, Table, build_sections, definitions
from mgprof.report.safe_text import printable

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


# --------------------------------------------------------------------------------------------
# Escaping


def _label(text: Any) -> str:
    """A chart label: Plotly renders a subset of HTML in labels, so escape like a text node
    (one line: a newline is shown as ``\\n``)."""
    return html.escape(printable(text), quote=True)


def _esc(text: Any) -> str:
    """A text node or attribute value: control characters shown escaped, newlines kept."""
    return html.escape(printable(text, multiline=True), quote=True)


def _json_for_script(data: Any) -> str:
    """JSON that is safe inside ``<script type="application/json">`` (no ``</script>``)."""
    text = json.dumps(_finite(data), allow_nan=False, separators=(",", ":"))
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def _finite(value: Any) -> Any:
    """NaN and infinities become None: JSON has no spelling for them and Plotly skips nulls."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


_LAYOUT: dict[str, Any] = {
    "margin": {"l": 60, "r": 30, "t": 40, "b": 50},
    "height": 360,
    "legend": {"orientation": "h", "y": -0.2},
    "font": {"family": "system-ui, sans-serif", "size": 12},
}


def _layout(title: str, x: str, y: str, **extra: Any) -> dict[str, Any]:
    return {
        **_LAYOUT,
        "title": {"text": _label(title)},
        "xaxis": {"title": {"text": _label(x)}},
        "yaxis": {"title": {"text": _label(y)}},
        **extra,
    }


# --------------------------------------------------------------------------------------------
# Charts (Plotly figure dicts: {"data": [...], "layout": {...}})

_BREAKDOWN_PARTS = (
    ("compute", "compute (incl. overlapped comm)", "compute_pct"),
    ("exposed", "exposed communication", "exposed_comm_pct"),
    ("other", "other device work (memcpy/memset)", None),
    ("idle", "idle", "idle_pct"),
)


def _window_shares(summaries: Sequence[Any]) -> dict[str, float] | None:
    """Time-weighted compute/exposed/idle shares (%) of a rank's trace windows."""
    sums = {"compute_pct": 0.0, "exposed_comm_pct": 0.0, "idle_pct": 0.0}
    window = 0.0
    for s in summaries:
        t = _dict(_dict(s).get("totals"))
        w = _num(t.get("window_us"))
        values = {k: _num(t.get(k)) for k in sums}
        if w is None or w <= 0 or any(v is None for v in values.values()):
            continue
        window += w
        for k, v in values.items():
            sums[k] += (v or 0.0) * w
    if window <= 0:
        return None
    return {k: v / window for k, v in sums.items()}


def _breakdown_chart(analysis: Mapping[str, Any]) -> dict[str, Any] | None:
    """Mean steady-state step time per rank, split by its trace window's shares."""
    traces = _dict(_dict(analysis.get("traces")).get("ranks"))
    labels: list[str] = []
    parts: dict[str, list[float | None]] = {key: [] for key, _, _ in _BREAKDOWN_PARTS}
    untraced: list[float | None] = []
    for rank in _ranks(analysis):
        step_ms = _num(_dict(rank.get("step_time_ms")).get("mean"))
        if step_ms is None:
            continue
        labels.append(_label(f"rank {rank.get('rank')}"))
        shares = _window_shares(_list(traces.get(str(rank.get("rank")))))
        if shares is None:
            for key in parts:
                parts[key].append(None)
            untraced.append(step_ms)
            continue
        untraced.append(None)
        known = shares["compute_pct"] + shares["exposed_comm_pct"] + shares["idle_pct"]
        pct = {
            "compute": shares["compute_pct"],
            "exposed": shares["exposed_comm_pct"],
            "other": max(0.0, 100.0 - known),
            "idle": shares["idle_pct"],
        }
        for key in parts:
            parts[key].append(step_ms * pct[key] / 100.0)
    if not labels:
        return None
    data: list[dict[str, Any]] = [
        {"type": "bar", "name": _label(name), "x": labels, "y": parts[key]}
        for key, name, _ in _BREAKDOWN_PARTS
        if any(v for v in parts[key])
    ]
    if any(v is not None for v in untraced):
        data.append({"type": "bar", "name": "step (no trace)", "x": labels, "y": untraced})
    return {
        "data": data,
        "layout": _layout("Step time breakdown per rank", "rank", "ms per step", barmode="stack"),
    }


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _series_chart(
    run: RunRecord, columns: Sequence[tuple[str, str]], title: str, y_title: str
) -> dict[str, Any] | None:
    """One line per sampled device for the first column each device has, on a shared clock."""
    starts = [_num(d.facts.get("started_unix_s")) for r in run.ranks for d in r.sampler.devices]
    known = [s for s in starts if s is not None]
    origin = min(known) if known else None
    data = []
    for rec in sorted(run.ranks, key=lambda r: r.rank):
        for dev in rec.sampler.devices:
            column, suffix = next(
                ((c, s) for c, s in columns if any(v is not None for v in dev.columns.get(c, []))),
                (None, ""),
            )
            if column is None:
                continue
            start = _num(dev.facts.get("started_unix_s"))
            offset = start - origin if start is not None and origin is not None else 0.0
            data.append(
                {
                    "type": "scatter",
                    "mode": "lines+markers",
                    "name": _label(f"rank {rec.rank} {dev.device}{suffix}"),
                    "x": [offset + t for t in dev.t_s],
                    "y": dev.columns[column],
                }
            )
    if not data:
        return None
    return {"data": data, "layout": _layout(title, "seconds since sampling started", y_title)}


def _comparison_rows(analysis: Mapping[str, Any]) -> list[dict[str, Any]]:
    raw = analysis.get("comparison")
    if isinstance(raw, dict):
        raw = raw.get("rows")
    return [r for r in _list(raw) if isinstance(r, dict)]


def _peak(value: Any) -> float | None:
    """A peak memory figure that may be one number, a per-device list or a per-device dict."""
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list):
        nums = [n for n in (_num(v) for v in value) if n is not None]
        return max(nums) if nums else None
    return _num(value)


def _comparison_chart(analysis: Mapping[str, Any]) -> dict[str, Any] | None:
    rows = _comparison_rows(analysis)
    points = [
        (f"{r.get('strategy', '?')} x{r.get('devices', '?')}", _num(r.get("samples_per_s")), r)
        for r in rows
    ]
    points = [p for p in points if p[1] is not None]
    if not points:
        return None
    text = []
    for _, _, r in points:
        speedup, eff = _num(r.get("speedup")), _num(r.get("efficiency"))
        bits = [f"{speedup:.2f}x" if speedup is not None else ""]
        if eff is not None:
            bits.append(f"efficiency {eff:.2f}")
        text.append(_label(" ".join(b for b in bits if b)))
    return {
        "data": [
            {
                "type": "bar",
                "name": "samples/s",
                "x": [_label(p[0]) for p in points],
                "y": [p[1] for p in points],
                "text": text,
                "textposition": "auto",
            }
        ],
        "layout": _layout("Strategy comparison: throughput", "strategy x devices", "samples/s"),
    }


_SWEEP_KEYS = ("batch_size", "samples_per_s", "peak_mem_mib", "comm_share_pct")


def _sweep_series(analysis: Mapping[str, Any]) -> list[tuple[str, list[dict[str, Any]]]]:
    """(name, points) per sweep series, whatever of the accepted shapes the sweep was stored in:
    a list of points, ``{"series": points}``, ``{"series": [{"name", "points"}]}``, or columns."""
    raw = analysis.get("sweep")
    if isinstance(raw, dict) and "series" in raw:
        raw = raw["series"]
    if isinstance(raw, dict):
        cols = {k: _list(raw.get(k)) for k in _SWEEP_KEYS}
        n = len(cols["batch_size"])
        raw = [
            {k: (cols[k][i] if i < len(cols[k]) else None) for k in _SWEEP_KEYS} for i in range(n)
        ]
    items = [p for p in _list(raw) if isinstance(p, dict)]
    if items and all(isinstance(p.get("points"), list) for p in items):
        return [
            (str(p.get("name", p.get("strategy", f"series {i + 1}"))), _points(p["points"]))
            for i, p in enumerate(items)
        ]
    return [("sweep", _points(items))] if items else []


def _points(raw: Iterable[Any]) -> list[dict[str, Any]]:
    pts = [p for p in raw if isinstance(p, dict) and _num(p.get("batch_size")) is not None]
    return sorted(pts, key=lambda p: _num(p.get("batch_size")) or 0.0)


def _sweep_chart(analysis: Mapping[str, Any]) -> dict[str, Any] | None:
    data: list[dict[str, Any]] = []
    for name, pts in _sweep_series(analysis):
        xs = [_num(p.get("batch_size")) for p in pts]
        data.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": _label(f"{name}: samples/s"),
                "x": xs,
                "y": [_num(p.get("samples_per_s")) for p in pts],
            }
        )
        mem = [_peak(p.get("peak_mem_mib")) for p in pts]
        if any(m is not None for m in mem):
            data.append(
                {
                    "type": "scatter",
                    "mode": "lines+markers",
                    "line": {"dash": "dot"},
                    "name": _label(f"{name}: peak memory MiB"),
                    "x": xs,
                    "y": mem,
                    "yaxis": "y2",
                }
            )
    if not data:
        return None
    layout = _layout("Batch-size sweep", "batch size per device", "samples/s")
    layout["xaxis"] = {"title": {"text": "batch size per device"}, "type": "log"}
    layout["yaxis2"] = {
        "title": {"text": "peak memory MiB"},
        "overlaying": "y",
        "side": "right",
        "rangemode": "tozero",
    }
    return {"data": data, "layout": layout}


def chart_figures(run: RunRecord, analysis: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Chart id -> Plotly figure, only for charts the run has data for."""
    charts = {
        "chart-step-breakdown": _breakdown_chart(analysis),
        "chart-utilisation": _series_chart(
            run,
            (("gpu_util_pct", " GPU util"), ("cpu_pct", " process CPU")),
            "Utilisation over time",
            "% (NVML GPU util; CPU sampler: % of one core)",
        ),
        "chart-memory": _series_chart(
            run,
            (("mem_used_mib", " device memory used"), ("rss_mib", " process RSS")),
            "Memory over time",
            "MiB",
        ),
        "chart-comparison": _comparison_chart(analysis),
        "chart-sweep": _sweep_chart(analysis),
    }
    return {k: v for k, v in charts.items() if v is not None}


# Which chart follows which section of the shared report.
_CHARTS_AFTER = {
    "Step time per rank": ("chart-step-breakdown",),
    "Utilisation": ("chart-utilisation",),
    "Memory & headroom": ("chart-memory",),
}


# --------------------------------------------------------------------------------------------
# HTML


def _table_html(table: Table) -> str:
    head = "".join(
        f'<th class="{"num" if i >= table.numeric_from else ""}">{_esc(c)}</th>'
        for i, c in enumerate(table.columns)
    )
    rows = []
    for row in table.rows:
        cells = "".join(
            f'<td class="{"num" if i >= table.numeric_from else ""}'
            f'{" na" if c.startswith("n/a") else ""}">{_esc(c)}</td>'
            for i, c in enumerate(row)
        )
        rows.append(f"<tr>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _anchor(title: str) -> str:
    return "sec-" + "".join(ch if ch.isalnum() else "-" for ch in title.lower()).strip("-")


def _section_html(section: Section, charts: Mapping[str, Any], extra: str = "") -> str:
    out = [f'<section id="{_anchor(section.title)}"><h2>{_esc(section.title)}</h2>']
    if section.notice:
        out.append(
            f'<div class="notice"><strong>CPU fallback:</strong> {_esc(section.notice)}</div>'
        )
    if section.facts:
        out.append('<table class="facts"><tbody>')
        out.extend(f"<tr><th>{_esc(k)}</th><td>{_esc(v)}</td></tr>" for k, v in section.facts)
        out.append("</tbody></table>")
    out.extend(_table_html(t) for t in section.tables)
    out.extend(_chart_div(c, charts) for c in _CHARTS_AFTER.get(section.title, ()))
    out.append(extra)
    out.extend(f'<p class="note">{_esc(n)}</p>' for n in section.notes)
    if section.footnotes:
        out.append('<ul class="footnotes">')
        out.extend(f"<li>{_esc(n)}</li>" for n in section.footnotes)
        out.append("</ul>")
    out.append("</section>")
    return "".join(out)


def _failure_html(summary: FailureSummary) -> str:
    """The failure summary: facts, the end of the failing rank's traceback, steps per rank."""
    sec = summary.section
    out = [f'<section id="{_anchor(sec.title)}" class="failure"><h2>{_esc(sec.title)}</h2>']
    out.append('<table class="facts"><tbody>')
    out.extend(f"<tr><th>{_esc(k)}</th><td>{_esc(v)}</td></tr>" for k, v in sec.facts)
    out.append("</tbody></table>")
    if summary.traceback:
        out.append(f'<p class="note">{_esc(summary.traceback_title)}:</p>')
        out.append(f"<pre>{_esc(chr(10).join(summary.traceback))}</pre>")
    out.extend(_table_html(t) for t in sec.tables)
    out.extend(f'<p class="note">{_esc(n)}</p>' for n in sec.notes)
    out.append("</section>")
    return "".join(out)


def _findings_html(analysis: Mapping[str, Any]) -> str:
    """Every finding with all its keys (the shared section keeps only the short form)."""
    items = []
    for f in _list(analysis.get("findings")):
        if not isinstance(f, dict):
            continue
        severity = str(f.get("severity", "info"))
        sev_class = severity if severity in ("high", "medium", "low", "info") else "info"
        rows = [
            (label, f.get(key))
            for label, key in (
                ("evidence", "evidence"),
                ("cause", "cause"),
                ("change", "change"),
                ("could save", "saving"),
            )
            if f.get(key)
        ]
        body = "".join(f"<dt>{_esc(label)}</dt><dd>{_esc(value)}</dd>" for label, value in rows)
        rule = f' <span class="rule">{_esc(f["rule"])}</span>' if f.get("rule") else ""
        items.append(
            f'<li class="finding {sev_class}"><div class="head">'
            f'<span class="sev">{_esc(severity)}</span> {_esc(f.get("title", ""))}{rule}</div>'
            f"<dl>{body}</dl></li>"
        )
    return f'<ul class="findings">{"".join(items)}</ul>' if items else ""


def _fmt(value: Any) -> str:
    num = _num(value)
    if num is not None:
        return f"{num:,.2f}"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {_fmt(v)}" for k, v in value.items())
    if isinstance(value, list):
        return ", ".join(_fmt(v) for v in value)
    return "-" if value is None else str(value)


def _rows_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> Table:
    table = Table(list(columns), numeric_from=1)
    table.rows = [[_fmt(r.get(c)) for c in columns] for r in rows]
    return table


def _chart_div(chart_id: str, charts: Mapping[str, Any]) -> str:
    return f'<div class="chart" id="{chart_id}"></div>' if chart_id in charts else ""


def _comparison_section(analysis: Mapping[str, Any], charts: Mapping[str, Any]) -> str:
    rows = _comparison_rows(analysis)
    if not rows:
        return ""
    cols = (
        "strategy",
        "devices",
        "step_time_ms",
        "samples_per_s",
        "speedup",
        "efficiency",
        "comm_share_pct",
        "peak_mem_mib",
    )
    chart = (
        '<div class="chart" id="chart-comparison"></div>' if "chart-comparison" in charts else ""
    )
    return _section_html(
        Section("Strategy comparison", tables=[_rows_table(rows, cols)]), {}, chart
    )


def _sweep_section(analysis: Mapping[str, Any], charts: Mapping[str, Any]) -> str:
    series = _sweep_series(analysis)
    if not series:
        return ""
    rows = [{"series": name, **p} for name, pts in series for p in pts]
    table = _rows_table(rows, ("series", *_SWEEP_KEYS))
    chart = _chart_div("chart-sweep", charts)
    return _section_html(Section("Batch-size sweep", tables=[table]), {}, chart)


_CSS = """
body{font-family:system-ui,sans-serif;margin:0 auto;max-width:1200px;padding:0 1rem 3rem;
color:#1d1d1f}
h1{font-size:1.5rem}h2{font-size:1.2rem;border-bottom:1px solid #ddd;padding-bottom:.2rem;
margin-top:2rem}
nav a{margin-right:.8rem}
table{border-collapse:collapse;margin:.6rem 0;font-size:.9rem}
th,td{padding:.2rem .6rem;border-bottom:1px solid #eee;text-align:left;vertical-align:top}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
td.na{color:#888}
.facts th{font-weight:600}
.notice{border:1px solid #e0a800;background:#fff8e1;padding:.6rem;margin:.6rem 0}
.note{font-style:italic;color:#555}.footnotes{color:#666;font-size:.85rem}
.chart{min-height:360px;margin:.8rem 0}
.findings{list-style:none;padding:0}
.finding{border-left:4px solid #999;padding:.4rem .8rem;margin:.6rem 0;background:#fafafa}
.finding.high{border-color:#c62828}.finding.medium{border-color:#ef8f00}
.finding.low{border-color:#0277bd}.finding.info{border-color:#9e9e9e}
.finding .head{font-weight:600}.finding .sev{text-transform:uppercase;font-size:.8rem}
.finding .rule{color:#888;font-weight:400;font-size:.8rem}
.finding dt{font-weight:600;float:left;clear:left;width:6.5rem}
.finding dd{margin-left:7rem;white-space:pre-wrap}
#mgprof-errors{color:#c62828;white-space:pre-wrap}
.failure h2{color:#c62828}
.failure pre{background:#f6f6f6;padding:.6rem;overflow-x:auto;font-size:.85rem}
"""

# Renders every chart from the JSON block; a failure is shown on the page (not only in the
# console) so a reader knows a chart is missing rather than assuming there was no data.
_JS = """
(function () {
  var box = document.getElementById("mgprof-errors");
  function report(msg) { box.hidden = false; box.textContent += msg + "\\n"; }
  window.addEventListener("error", function (e) { report("chart error: " + e.message); });
  if (typeof Plotly === "undefined") {
    report("plotly.js did not load: charts are missing");
    return;
  }
  var figs = JSON.parse(document.getElementById("mgprof-charts").textContent);
  Object.keys(figs).forEach(function (id) {
    var el = document.getElementById(id);
    if (!el) { return; }
    Plotly.newPlot(el, figs[id].data, figs[id].layout, {displaylogo: false, responsive: true})
      .then(function () { el.setAttribute("data-rendered", "1"); })
      .catch(function (err) { report(id + ": " + err); });
  });
})();
"""

_CSP = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "img-src data: blob:; font-src data:"
)
"""No network at all: the file is meant to work offline, and an injected element (had escaping
ever failed) could not load anything either."""


def run_to_html(run: RunRecord, analysis: Mapping[str, Any]) -> str:
    """The run report as one offline HTML document with interactive charts.

    Raises :class:`HtmlDependencyMissing` (a UsageError naming the pip command) without plotly.
    """
    plotly_js = _plotly_js()
    summary = failure_summary(run, analysis)
    brief = summary is not None and not summary.full_report
    charts = {} if brief else chart_figures(run, analysis)
    if summary is None:
        sections = build_sections(run, analysis)
    else:  # Setup, then the rest only when enough steps were measured
        sections = sections_after(summary, run, analysis)
    title = run.run_id or run.script or "run"
    body: list[str] = [] if summary is None else [_failure_html(summary)]
    for section in sections:
        if section.title == "Findings":
            body.append(_comparison_section(analysis, charts))
            body.append(_sweep_section(analysis, charts))
            # Findings rendered here with cause and saving; the section's short list is dropped.
            full = _findings_html(analysis)
            section.findings = []
            body.append(_section_html(section, charts, full))
        else:
            body.append(_section_html(section, charts))
    defs = [] if brief else definitions(analysis)
    if defs:
        items = "".join(f"<dt>{_esc(k)}</dt><dd>{_esc(v)}</dd>" for k, v in defs)
        body.append(f'<section id="sec-definitions"><h2>Definitions</h2><dl>{items}</dl></section>')
    n_findings = len([f for f in _list(analysis.get("findings")) if isinstance(f, dict)])
    nav_titles = ([summary.section.title] if summary is not None else []) + [
        s.title for s in sections
    ]
    nav = "".join(
        f'<a href="#{_anchor(t)}">{_esc(t)}'
        + (f" ({n_findings})" if t == "Findings" else "")
        + "</a>"
        for t in nav_titles
    )
    return "".join(
        [
            '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">',
            f'<meta http-equiv="Content-Security-Policy" content="{_esc(_CSP)}">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>mgprof report: {_esc(title)}</title>",
            f"<style>{_CSS}</style>",
            f"<script>{plotly_js}</script>",
            "</head><body>",
            f"<h1>mgprof report: {_esc(title)}</h1>",
            f"<nav>{nav}</nav>",
            '<div id="mgprof-errors" hidden></div>',
            *body,
            '<script type="application/json" id="mgprof-charts">',
            _json_for_script(charts),
            "</script>",
            f"<script>{_JS}</script>",
            "</body></html>\n",
        ]
    )
