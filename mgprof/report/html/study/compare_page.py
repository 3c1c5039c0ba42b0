"""report.html of ``mgprof compare``: the comparison's header, verdict and tables (the cells of
``compare_view``, so the page, the terminal and report.md never disagree), the speedup of every
row with its 95 % interval as an error-bar chart, peak memory per device per row, the model state
per rank when a row shards it (FSDP), the notes and links to each row's run report.

The charts read the rows' own figures (``comparison.json``); nothing is measured or derived here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mgprof.analyze.compare.scaling import Comparison, Row
from mgprof.report.compare_view import (
    COLUMNS,
    MEMORY_COLUMNS,
    PRECISION_COLUMNS,
    answer_lines,
    header_lines,
    memory_cells,
    note_lines,
    precision_cells,
    row_label,
    table_cells,
)
from mgprof.report.html.charts import layout
from mgprof.report.html.palette import color, rank_color
from mgprof.report.html.study.shell import (
    chart_div,
    lines_html,
    run_link,
    section,
    study_page,
    table,
    write_page,
)
from mgprof.report.html.text import label, prose

__all__ = ["comparison_charts", "comparison_to_html", "write_comparison_html"]


def _speedup_chart(rows: list[Row]) -> dict[str, Any] | None:
    """Each row's speedup over single as a point with its 95 % interval as the error bar, the
    ideal (speedup = devices: efficiency 100 %) beside it and a line at 1 (as fast as single)."""
    rows = [r for r in rows if r.speedup is not None]
    if not rows:
        return None
    xs = [label(row_label(r)) for r in rows]
    speedups = [float(r.speedup or 0.0) for r in rows]

    def bound(r: Row, value: float | None) -> float | None:
        return None if value is None or r.speedup is None else abs(value - r.speedup)

    interval = [
        "" if r.speedup_low is None or r.speedup_high is None
        else f"95 % interval {r.speedup_low:.2f}–{r.speedup_high:.2f}x"
        for r in rows
    ]  # fmt: skip
    data: list[dict[str, Any]] = [
        {
            "type": "scatter",
            "mode": "markers",
            "name": "speedup, with its 95 % interval",
            "x": xs,
            "y": speedups,
            "customdata": interval,
            "hovertemplate": "%{x}: %{y:.2f}x<br>%{customdata}<extra></extra>",
            "marker": {"size": 12, "color": color("throughput")},
            "error_y": {
                "type": "data",
                "symmetric": False,
                "array": [bound(r, r.speedup_high) for r in rows],
                "arrayminus": [bound(r, r.speedup_low) for r in rows],
                "color": color("throughput"),
                "thickness": 1.5,
                "width": 8,
            },
        },
        {
            "type": "scatter",
            "mode": "markers",
            "name": "ideal: speedup = devices (efficiency 100 %)",
            "x": xs,
            "y": [float(r.devices) for r in rows],
            "hovertemplate": "%{x}: ideal %{y:.0f}x<extra></extra>",
            "marker": {"size": 22, "symbol": "line-ew-open", "color": color("ideal"),
                       "line": {"width": 2, "color": color("ideal")}},
        },
    ]  # fmt: skip
    lay = layout("Speedup over single, with its 95 % interval", "", "× single's samples/s")
    lay["xaxis"]["type"] = "category"
    lay["yaxis"]["rangemode"] = "tozero"
    lay["shapes"] = [
        {
            "type": "line",
            "xref": "paper",
            "x0": 0,
            "x1": 1,
            "yref": "y",
            "y0": 1,
            "y1": 1,
            "line": {"color": color("ideal"), "width": 1, "dash": "dot"},
        }
    ]
    return {"data": data, "layout": lay}


_KIND_WORDS = {"cpu rss": "process RSS", "cuda allocated": "CUDA allocated"}


def _memory_chart(rows: list[Row]) -> dict[str, Any] | None:
    """Peak memory per device of every row, one bar per device (device N in rank N's colour)."""
    rows = [r for r in rows if any(v is not None for v in r.peak_mem_mib)]
    if not rows:
        return None
    devices = max(len(r.peak_mem_mib) for r in rows)
    xs = [label(row_label(r)) for r in rows]
    data = [
        {
            "type": "bar",
            "name": f"device {i}",
            "x": xs,
            "y": [r.peak_mem_mib[i] if i < len(r.peak_mem_mib) else None for r in rows],
            "marker": {"color": rank_color(i)},
            "hovertemplate": f"%{{x}}, device {i}: %{{y:,.0f}} MiB<extra></extra>",
        }
        for i in range(devices)
    ]
    kinds = sorted({_KIND_WORDS.get(k, k) for r in rows if (k := r.peak_mem_kind)})
    what = f" ({label(', '.join(kinds))})" if kinds else ""
    lay = layout(f"Peak memory per device{what}", "", "MiB", barmode="group")
    lay["xaxis"]["type"] = "category"
    return {"data": data, "layout": lay}


_STATE_PARTS = (
    ("parameters", "params_mib"),
    ("gradients", "grads_mib"),
    ("optimizer state", "optimizer_mib"),
)


def _state_chart(comp: Comparison) -> dict[str, Any] | None:
    """What one rank holds of the model after the first update, stacked (the memory table's
    columns), for the rows that recorded it; shown when a row shards the model."""
    if not memory_cells(comp):
        return None
    rows = [r for r in comp.rows if any(getattr(r, key) is not None for _, key in _STATE_PARTS)]
    if not rows:
        return None
    xs = [label(row_label(r) + (" (shard)" if r.state_sharded else "")) for r in rows]
    data = [
        {
            "type": "bar",
            "name": name,
            "x": xs,
            "y": [getattr(r, key) for r in rows],
            "marker": {"color": color(name)},
            "hovertemplate": f"%{{x}}: {name} %{{y:,.3g}} MiB<extra></extra>",
        }
        for name, key in _STATE_PARTS
    ]
    lay = layout("Model state per rank", "", "MiB per rank", barmode="stack")
    lay["xaxis"]["type"] = "category"
    lay["legend"]["traceorder"] = "normal"
    return {"data": data, "layout": lay}


def comparison_charts(comp: Comparison) -> dict[str, dict[str, Any]]:
    """Chart id -> Plotly figure, for the charts the comparison has figures for."""
    charts = {
        "chart-speedup": _speedup_chart(comp.rows),
        "chart-peak-memory": _memory_chart(comp.rows),
        "chart-model-state": _state_chart(comp),
    }
    return {k: v for k, v in charts.items() if v is not None}


def _run_links(comp: Comparison) -> list[str]:
    """Per table row (``table_cells``' order: measured rows, then the ones not applicable), links
    to its run's report.html, one per round when it ran several."""
    out = []
    for row in comp.rows:
        names = [n for n in (row.run, *row.rounds_run) if n]
        if len(names) == 1:
            out.append(run_link(names[0], "report"))
        else:
            out.append(" · ".join(run_link(n, f"round {i}") for i, n in enumerate(names, 1)))
    return out + [""] * len(comp.not_applicable)


def _answer_html(comp: Comparison) -> str:
    """The callout that opens the page: the answer's sentences, then its caveats as a list."""
    lines = answer_lines(comp)
    if not lines:
        return ""
    said = [
        f"<p><strong>{label(name.capitalize())}:</strong> {prose(text)}</p>"
        if name
        else f"<p>{prose(text)}</p>"
        for name, text in lines
        if name != "caveat"
    ]
    caveats = [f"<li>{prose(text)}</li>" for name, text in lines if name == "caveat"]
    if caveats:
        said.append(f'<ul class="caveats">{"".join(caveats)}</ul>')
    return f'<div class="callout verdict">{"".join(said)}</div>'


def comparison_to_html(comp: Comparison) -> str:
    """The comparison as one offline page (``HtmlDependencyMissing`` without plotly)."""
    charts = comparison_charts(comp)
    body = [
        _answer_html(comp),
        section(
            "Strategies",
            table(COLUMNS, table_cells(comp), links=("run", _run_links(comp))),
            chart_div("chart-speedup", charts),
            chart_div("chart-peak-memory", charts),
        ),
        lines_html(header_lines(comp)),
    ]
    memory = memory_cells(comp)
    if memory:
        body.append(
            section(
                "Memory and communication per rank",
                table(MEMORY_COLUMNS, memory),
                chart_div("chart-model-state", charts),
            )
        )
    precision = precision_cells(comp)
    if precision:
        body.append(section("Precision", table(PRECISION_COLUMNS, precision, text_columns=(6,))))
    body.append(section("Notes", lines_html(note_lines(comp), "notes", code=True)))
    title = f"mgprof compare: {comp.comparison_id or comp.script}"
    return study_page(title, body, charts)


def write_comparison_html(comp_dir: Path, comp: Comparison) -> Path | None:
    """``comp_dir/report.html`` beside comparison.json and report.md; None without plotly."""
    return write_page(comp_dir, comparison_to_html, comp)
