"""report.html of ``mgprof sweep``: the answer (``sweep_view.answer_facts``), throughput, peak
memory and communication share against the batch size with the sweet spot (the hardware knee),
B_simple (the gradient noise scale, at its per-device batch) and the recommended batch marked,
the trials table (``sweep_view.rows``, as the terminal and Markdown show it) with links to each
trial's run report, how it was measured (``sweep_view.context_facts``), and the caveats.

The charts read the trials' own figures (``sweep.json``); the one conversion is B_simple, a
global batch, placed at the per-device batch whose global batch it is (global = per device x
devices x accumulation, read off a trial), as the run report's sweep chart places it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from mgprof.analyze.run.noise_scale import SweepNoiseScale
from mgprof.analyze.sweep.result import SweepResult, Trial
from mgprof.report.html.charts import layout
from mgprof.report.html.palette import color
from mgprof.report.html.study.shell import (
    chart_div,
    facts_html,
    lines_html,
    run_link,
    section,
    study_page,
    table,
    write_page,
)
from mgprof.report.html.text import esc, label
from mgprof.report.sweep_view import (
    answer_facts,
    caveats,
    columns,
    context_facts,
    noise_scale_of,
    rows,
    table_notes,
    trial_order,
)

__all__ = ["sweep_charts", "sweep_to_html", "write_sweep_html"]

Pick = Callable[[Trial], "float | None"]


def _fitted(result: SweepResult) -> list[Trial]:
    """Trials that ran to the end (``ok``), in batch order."""
    return sorted((t for t in result.trials if t.status == "ok"), key=lambda t: t.batch_size)


class _Noise(NamedTuple):
    """B_simple (a global batch) and where it sits on the per-device batch axis."""

    global_b: float
    per_device: float
    low: float | None
    high: float | None
    """The 95 % band's ends, per device; ``high`` None when the band is unbounded above."""


def _b_simple(result: SweepResult) -> _Noise | None:
    """B_simple and its band as per-device batches; None without an estimate."""
    ns = noise_scale_of(result)
    est = ns.estimate if ns is not None else None
    if est is None or est.b_simple is None or est.b_simple <= 0:
        return None
    factors = [t.global_batch / t.batch_size for t in result.trials if t.global_batch]
    if not factors or factors[0] <= 0:
        return None
    factor = factors[0]
    low = est.band_low / factor if est.band_low is not None else None
    high = est.band_high / factor if est.band_high is not None else None
    return _Noise(est.b_simple, est.b_simple / factor, low, high)


def _x_range(result: SweepResult) -> tuple[float, float]:
    """The batch axis' ends: the sizes tried and B_simple, with a little room either side (an
    unbounded band does not stretch it)."""
    xs = [float(t.batch_size) for t in result.trials]
    noise = _b_simple(result)
    if noise is not None:
        xs.append(noise.per_device)
    return min(xs) / 1.3, max(xs) * 1.3


def _vline(x: float, top: float, name: str, hue: str, dash: str, group: str) -> dict[str, Any]:
    return {
        "type": "scatter",
        "mode": "lines",
        "name": label(name),
        "legendgroup": group,
        "x": [x, x],
        "y": [0, top],
        "line": {"color": hue, "dash": dash, "width": 2},
        "hovertemplate": f"{label(name)}<extra></extra>",
    }


def _marker(x: float, y: float, name: str, symbol: str, hue: str, group: str) -> dict[str, Any]:
    return {
        "type": "scatter",
        "mode": "markers",
        "name": label(name),
        "legendgroup": group,
        "x": [x],
        "y": [y],
        "marker": {"size": 15, "symbol": symbol, "color": hue,
                   "line": {"width": 1, "color": "#fff"}},
    }  # fmt: skip


def _marks(result: SweepResult, top: float, points: dict[int, float]) -> list[dict[str, Any]]:
    """B_simple and its band, the sweet spot (the knee), the recommended batch and the first
    OOM, on a chart whose values reach ``top``; ``points`` (batch -> value) carry the markers."""
    out: list[dict[str, Any]] = []
    left, right = _x_range(result)
    noise = _b_simple(result)
    if noise is not None:
        lo = max(noise.low if noise.low is not None else noise.per_device, left)
        hi = min(noise.high if noise.high is not None else right, right)
        if hi > lo:
            out.append(
                {
                    "type": "scatter",
                    "mode": "lines",
                    "fill": "toself",
                    "fillcolor": color("B_simple"),
                    "opacity": 0.12,
                    "line": {"width": 0},
                    "hoverinfo": "skip",
                    "name": "B_simple 95 % band" + ("" if noise.high is not None else " (to ∞)"),
                    "legendgroup": "b_simple",
                    "x": [lo, hi, hi, lo, lo],
                    "y": [0, 0, top, top, 0],
                }
            )
        per = noise.per_device
        per_text = f"{per:,.0f}" if per >= 10 else f"{per:.3g}"
        name = f"B_simple ≈ {noise.global_b:,.0f} global = {per_text} per device"
        out.append(_vline(noise.per_device, top, name, color("B_simple"), "dash", "b_simple"))
    spot = result.sweet_spot
    if spot is not None:
        hue = color("sweet spot")
        out.append(_vline(spot, top, f"sweet spot (knee): {spot}", hue, "dot", "spot"))
        if spot in points:
            mark = _marker(spot, points[spot], "sweet spot", "diamond", hue, "spot")
            out.append({**mark, "showlegend": False})
    ns: SweepNoiseScale | None = noise_scale_of(result)
    rec = ns.recommended_batch if ns is not None else None
    if rec is not None and rec in points:
        name = f"recommended (knee and B_simple): {rec}"
        out.append(_marker(rec, points[rec], name, "star", color("recommended"), "rec"))
    if result.first_oom is not None:
        name = f"first OOM: {result.first_oom}"
        out.append(_vline(result.first_oom, top, name, color("out of memory"), "dashdot", "oom"))
    return out


def _axis(result: SweepResult, lay: dict[str, Any]) -> dict[str, Any]:
    """A log batch axis ticked at the sizes tried and the powers of two between its ends."""
    left, right = _x_range(result)
    ticks = {t.batch_size for t in result.trials}
    power = 1
    while power <= right:
        if power >= left:
            ticks.add(power)
        power *= 2
    sizes = sorted(ticks)
    lay["xaxis"].update(
        {
            "type": "log",
            "range": [math.log10(left), math.log10(right)],
            "tickvals": sizes,
            "ticktext": [str(s) for s in sizes],
        }
    )
    lay["yaxis"]["rangemode"] = "tozero"
    return lay


def _top(values: Sequence[float | None], floor: float = 1.0) -> float:
    known = [v for v in values if v is not None]
    return max(known) * 1.08 if known and max(known) > 0 else floor


def _series(trials: Sequence[Trial], pick: Pick) -> tuple[list[int], list[float | None]]:
    return [t.batch_size for t in trials], [pick(t) for t in trials]


def _throughput_chart(result: SweepResult) -> dict[str, Any] | None:
    trials = _fitted(result)
    xs, ys = _series(trials, lambda t: t.samples_per_s)
    if not any(y is not None for y in ys):
        return None
    data: list[dict[str, Any]] = [
        {
            "type": "scatter",
            "mode": "lines+markers",
            "name": "samples/s (job)",
            "x": xs,
            "y": ys,
            "customdata": [t.global_batch for t in trials],
            "hovertemplate": "batch %{x} (global %{customdata}): %{y:,.1f} samples/s"
            "<extra></extra>",
            "line": {"color": color("throughput")},
        }
    ]
    points = {x: y for x, y in zip(xs, ys, strict=True) if y is not None}
    data.extend(_marks(result, _top(ys), points))
    lay = layout("Throughput against batch size", "batch size per device", "samples/s")
    return {"data": data, "layout": _axis(result, lay)}


def _memory_chart(result: SweepResult) -> dict[str, Any] | None:
    trials = _fitted(result)
    xs, ys = _series(trials, lambda t: t.peak_memory_mib)
    skipped = sorted(
        (t for t in result.trials if t.status == "skipped" and t.predicted_memory_mib is not None),
        key=lambda t: t.batch_size,
    )
    if not any(y is not None for y in ys) and not skipped:
        return None
    data: list[dict[str, Any]] = [
        {
            "type": "scatter",
            "mode": "lines+markers",
            "name": "peak memory",
            "x": xs,
            "y": ys,
            "hovertemplate": "batch %{x}: %{y:,.0f} MiB<extra></extra>",
            "line": {"color": color("peak memory")},
        }
    ]
    if skipped:
        data.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": "predicted (not run)",
                "x": [t.batch_size for t in skipped],
                "y": [t.predicted_memory_mib for t in skipped],
                "marker": {"symbol": "circle-open", "size": 10, "color": color("peak memory")},
            }
        )
    values = [*ys, *(t.predicted_memory_mib for t in skipped)]
    cap = result.capacity_mib
    if cap is not None:
        values.append(cap)
    top = _top(values)
    if cap is not None:
        ends = list(_x_range(result))
        data.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": label(f"capacity {cap:,.0f} MiB"),
                "x": ends,
                "y": [cap, cap],
                "line": {"color": color("capacity"), "dash": "dash", "width": 1},
            }
        )
        if result.margin > 0:
            limit = (1.0 - result.margin) * cap
            data.append(
                {
                    "type": "scatter",
                    "mode": "lines",
                    "name": label(f"limit with {100 * result.margin:.0f} % headroom"),
                    "x": ends,
                    "y": [limit, limit],
                    "line": {"color": color("capacity"), "dash": "dot", "width": 1},
                }
            )
    points = {x: y for x, y in zip(xs, ys, strict=True) if y is not None}
    data.extend(_marks(result, top, points))
    lay = layout("Peak memory against batch size", "batch size per device", "MiB")
    return {"data": data, "layout": _axis(result, lay)}


def _comm_chart(result: SweepResult) -> dict[str, Any] | None:
    trials = _fitted(result)
    xs, total = _series(trials, lambda t: t.comm_pct)
    _, exposed = _series(trials, lambda t: t.exposed_comm_pct)
    if not any(v is not None for v in (*total, *exposed)):
        return None
    data: list[dict[str, Any]] = []
    for name, ys, dash in (
        ("communication share", total, "solid"),
        ("exposed communication share", exposed, "dash"),
    ):
        if any(v is not None for v in ys):
            data.append(
                {
                    "type": "scatter",
                    "mode": "lines+markers",
                    "name": name,
                    "x": xs,
                    "y": ys,
                    "hovertemplate": "batch %{x}: %{y:.1f} %<extra></extra>",
                    "line": {"color": color("communication"), "dash": dash},
                }
            )
    points = {x: y for x, y in zip(xs, total, strict=True) if y is not None}
    data.extend(_marks(result, _top([*total, *exposed]), points))
    lay = layout("Communication share against batch size", "batch size per device", "% of step")
    return {"data": data, "layout": _axis(result, lay)}


def sweep_charts(result: SweepResult) -> dict[str, dict[str, Any]]:
    """Chart id -> Plotly figure, for the charts the sweep has figures for."""
    charts = {
        "chart-sweep-throughput": _throughput_chart(result),
        "chart-sweep-memory": _memory_chart(result),
        "chart-sweep-comm": _comm_chart(result),
    }
    return {k: v for k, v in charts.items() if v is not None}


def _run_links(result: SweepResult) -> list[str]:
    """Per table row (``rows``' order), a link to the trial's run report."""
    return [run_link(t.run_dir, "report") if t.run_dir else "" for t in trial_order(result)]


def sweep_to_html(result: SweepResult) -> str:
    """The sweep as one offline page (``HtmlDependencyMissing`` without plotly)."""
    charts = sweep_charts(result)
    names = columns(result)
    body = [
        section("Answer", facts_html(answer_facts(result))),
        section(
            "Against batch size",
            chart_div("chart-sweep-throughput", charts),
            chart_div("chart-sweep-memory", charts),
            f'<p class="note">memory: {esc(result.memory_definition)}</p>'
            if result.memory_definition and "chart-sweep-memory" in charts
            else "",
            chart_div("chart-sweep-comm", charts),
        )
        if charts
        else "",
        section(
            "Trials",
            table(
                names,
                rows(result),
                text_columns=(2, len(names) - 1),
                links=("run", _run_links(result)),
            ),
            lines_html(table_notes(result), "notes"),
        ),
        section("How it was measured", facts_html(context_facts(result))),
    ]
    notes = caveats(result)
    if notes:
        body.append(section("Caveats", lines_html(notes, "notes", code=True)))
    return study_page(f"mgprof sweep: {result.script or ''}", body, charts)


def write_sweep_html(sweep_dir: Path, result: SweepResult) -> Path | None:
    """``sweep_dir/report.html`` beside sweep.json; None without plotly."""
    return write_page(sweep_dir, sweep_to_html, result)
