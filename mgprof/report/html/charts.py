"""The report's summary charts as Plotly figure dicts (``{"data": [...], "layout": {...}}``).

Built in Python from the analysis and the sampler series: step-time breakdown per rank,
utilisation and memory over time, the strategy comparison and the batch-size sweep. Every label
from data is escaped (:func:`~mgprof.report.html.text.label`). Series that belong to one rank
carry ``meta: {"rank": N}`` so the page's rank selector can show that rank's lines alone.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from mgprof.analyze.readers import num as _num
from mgprof.analyze.run.schema import (
    ComparisonRow,
    RunAnalysis,
    Sweep,
    SweepPoint,
    decode_analysis,
    given,
)
from mgprof.analyze.trace.summary import RankTraceSummary
from mgprof.records import RunRecord
from mgprof.report.html.palette import color, rank_color
from mgprof.report.html.text import label as _label

__all__ = ["SWEEP_KEYS", "chart_figures", "comparison_rows", "layout", "sweep_series"]

_LAYOUT: dict[str, Any] = {
    "margin": {"l": 60, "r": 30, "t": 50, "b": 50},
    "height": 380,
    "legend": {"orientation": "h", "y": -0.25, "yanchor": "top"},
    "font": {"family": "system-ui, sans-serif", "size": 12},
}


def layout(title: str, x: str, y: str, **extra: Any) -> dict[str, Any]:
    """A figure layout with escaped titles. ``automargin`` grows the margins to fit tick labels
    and axis titles, so neither is clipped however long the labels are."""
    return {
        **copy.deepcopy(_LAYOUT),
        "title": {"text": _label(title)},
        "xaxis": {"title": {"text": _label(x)}, "automargin": True},
        "yaxis": {"title": {"text": _label(y)}, "automargin": True},
        **extra,
    }


_layout = layout


# --------------------------------------------------------------------------------------------
# Charts (Plotly figure dicts: {"data": [...], "layout": {...}})

_BREAKDOWN_PARTS = (
    ("compute", "compute (incl. overlapped comm)", "compute_pct"),
    ("exposed", "exposed communication", "exposed_comm_pct"),
    ("other", "other device work (memcpy/memset)", None),
    ("idle", "idle", "idle_pct"),
)
_BREAKDOWN_COLORS = {
    "compute": color("compute"),
    "exposed": color("exposed communication"),
    "other": color("other device work"),
    "idle": color("idle"),
}
"""The Overview's per-step breakdown has the same colours (``palette``)."""


def _window_shares(summaries: Sequence[RankTraceSummary]) -> dict[str, float] | None:
    """Time-weighted compute/exposed/idle shares (%) of a rank's trace windows."""
    sums = {"compute_pct": 0.0, "exposed_comm_pct": 0.0, "idle_pct": 0.0}
    window = 0.0
    for s in summaries:
        t = s.totals
        w = t.window_us
        values = {
            "compute_pct": t.compute_pct,
            "exposed_comm_pct": t.exposed_comm_pct,
            "idle_pct": t.idle_pct,
        }
        if w is None or w <= 0 or any(v is None for v in values.values()):
            continue
        window += w
        for k, v in values.items():
            sums[k] += (v or 0.0) * w
    if window <= 0:
        return None
    return {k: v / window for k, v in sums.items()}


def _breakdown_chart(analysis: RunAnalysis) -> dict[str, Any] | None:
    """Mean steady-state step time per rank, split by its trace window's shares."""
    traces = analysis.traces.ranks
    labels: list[str] = []
    parts: dict[str, list[float | None]] = {key: [] for key, _, _ in _BREAKDOWN_PARTS}
    untraced: list[float | None] = []
    for rank in analysis.ranks:
        if rank.step_time_ms is None:
            continue
        step_ms = float(rank.step_time_ms.mean)
        labels.append(_label(f"rank {rank.rank}"))
        shares = _window_shares(traces.get(str(rank.rank), []))
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
        {
            "type": "bar",
            "name": _label(name),
            "x": labels,
            "y": parts[key],
            "marker": {"color": _BREAKDOWN_COLORS[key]},
        }
        for key, name, _ in _BREAKDOWN_PARTS
        if any(v for v in parts[key])
    ]
    if any(v is not None for v in untraced):
        data.append(
            {
                "type": "bar",
                "name": "step (no trace)",
                "x": labels,
                "y": untraced,
                "marker": {"color": color("untraced step")},
            }
        )
    lay = _layout("Step time breakdown per rank", "rank", "ms per step", barmode="stack")
    lay["legend"]["traceorder"] = "normal"
    return {"data": data, "layout": lay}


def _series_chart(
    run: RunRecord, columns: Sequence[tuple[str, str, str]], title: str
) -> dict[str, Any] | None:
    """One line per sampled device for the first column each device has, on a shared clock.

    ``columns`` are (column, series suffix, axis title); the y axis is titled after the columns
    drawn (one short title each: a long one would not fit the axis)."""
    starts = [_num(d.facts.get("started_unix_s")) for r in run.ranks for d in r.sampler.devices]
    known = [s for s in starts if s is not None]
    origin = min(known) if known else None
    data = []
    titles: list[str] = []
    for rec in sorted(run.ranks, key=lambda r: r.rank):
        for dev in rec.sampler.devices:
            column, suffix, y_title = next(
                (
                    (c, s, t)
                    for c, s, t in columns
                    if any(v is not None for v in dev.columns.get(c, []))
                ),
                (None, "", ""),
            )
            if column is None:
                continue
            if y_title not in titles:
                titles.append(y_title)
            start = _num(dev.facts.get("started_unix_s"))
            offset = start - origin if start is not None and origin is not None else 0.0
            trace: dict[str, Any] = {
                "type": "scatter",
                "mode": "lines+markers",
                "name": _label(f"rank {rec.rank} {dev.device}{suffix}"),
                "x": [offset + t for t in dev.t_s],
                "y": dev.columns[column],
                "meta": {"rank": rec.rank},
            }
            if len(rec.sampler.devices) == 1:  # one line per rank: the rank's colour
                trace["line"] = {"color": rank_color(rec.rank)}
            data.append(trace)
    if not data:
        return None
    return {
        "data": data,
        "layout": _layout(title, "seconds since sampling started", "; ".join(titles)),
    }


def comparison_rows(analysis: RunAnalysis) -> list[ComparisonRow]:
    table = given(analysis.comparison)
    return table.rows if table is not None else []


def _peak(value: float | list[float | None] | dict[str, float | None] | None) -> float | None:
    """A peak memory figure that may be one number, a per-device list or a per-device dict."""
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list):
        nums = [float(v) for v in value if v is not None]
        return max(nums) if nums else None
    return None if value is None else float(value)


def _comparison_chart(analysis: RunAnalysis) -> dict[str, Any] | None:
    rows = comparison_rows(analysis)
    points = [
        (
            f"{r.strategy}{' ' + str(r.precision) if r.precision else ''} x{r.devices}",
            r.samples_per_s,
            r,
        )
        for r in rows
    ]
    points = [p for p in points if p[1] is not None]
    if not points:
        return None
    text = []
    for _, _, r in points:
        speedup, eff = r.speedup, r.efficiency
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
                "marker": {"color": color("throughput")},
            }
        ],
        "layout": _layout("Strategy comparison: throughput", "strategy x devices", "samples/s"),
    }


SWEEP_KEYS = ("batch_size", "samples_per_s", "peak_mem_mib", "comm_share_pct")


def _sweep(analysis: RunAnalysis) -> Sweep:
    return given(analysis.sweep) or Sweep()


def sweep_series(analysis: RunAnalysis) -> list[tuple[str, list[SweepPoint]]]:
    """(name, points) per sweep series (``Sweep`` holds every shape a sweep was stored in), the
    points with a batch size, in batch order."""
    return [
        (
            series.name,
            sorted(
                (p for p in series.points if p.batch_size is not None),
                key=lambda p: p.batch_size or 0.0,
            ),
        )
        for series in _sweep(analysis).series
    ]


def _sweep_chart(analysis: RunAnalysis) -> dict[str, Any] | None:
    """Samples/s (and memory) per batch; with a noise scale in the sweep, B_simple (its band
    shaded) as a vertical line at its per-device equivalent, the hardware knee and the batch
    recommended with both marked, so the two limits are read on one chart."""
    data: list[dict[str, Any]] = []
    all_pts: list[SweepPoint] = []
    series = sweep_series(analysis)
    for i, (name, pts) in enumerate(series):
        all_pts.extend(pts)
        xs = [p.batch_size for p in pts]
        # one series: the categories' colours; several: one colour per series, memory dotted
        one = len(series) == 1
        data.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": _label(f"{name}: samples/s"),
                "x": xs,
                "y": [p.samples_per_s for p in pts],
                "line": {"color": color("throughput") if one else rank_color(i)},
            }
        )
        mem = [_peak(p.peak_mem_mib) for p in pts]
        if any(m is not None for m in mem):
            data.append(
                {
                    "type": "scatter",
                    "mode": "lines+markers",
                    "line": {
                        "dash": "dot",
                        "color": color("peak memory") if one else rank_color(i),
                    },
                    "name": _label(f"{name}: peak memory MiB"),
                    "x": xs,
                    "y": mem,
                    "yaxis": "y2",
                }
            )
    if not data:
        return None
    data.extend(_noise_traces(_sweep(analysis), all_pts))
    layout = _layout("Batch-size sweep", "batch size per device", "samples/s")
    layout["xaxis"] = {"title": {"text": "batch size per device"}, "type": "log"}
    layout["yaxis2"] = {
        "title": {"text": "peak memory MiB"},
        "overlaying": "y",
        "side": "right",
        "rangemode": "tozero",
    }
    return {"data": data, "layout": layout}


def _noise_traces(sweep: Sweep, pts: Sequence[SweepPoint]) -> list[dict[str, Any]]:
    """B_simple and its band at the per-device batch whose global batch equals them (global =
    per-device x devices x accumulation, read off the points), the knee and the recommendation."""
    ns = sweep.noise_scale
    est = ns.estimate if ns is not None else None
    b_simple = est.b_simple if est is not None else None
    rates = [(b, r) for p in pts if (b := p.batch_size) and (r := p.samples_per_s) is not None]
    factors = [g / b for p in pts if (g := p.global_batch) and (b := p.batch_size)]
    if ns is None or est is None or b_simple is None or not rates or not factors:
        return []
    factor = factors[0]
    top = max(r for _, r in rates) * 1.05
    out: list[dict[str, Any]] = []
    low, high = est.band_low, est.band_high
    if low is not None and high is not None and high > low:
        # a band reaching 0 would stretch the log axis to nothing: start it below the points
        lo = max(low / factor, min(b for b, _ in rates) / 4)
        hi = max(high / factor, lo)
        out.append(
            {
                "type": "scatter",
                "mode": "lines",
                "fill": "toself",
                "opacity": 0.15,
                "line": {"width": 0},
                "fillcolor": color("B_simple"),
                "hoverinfo": "skip",
                "name": "B_simple 95 % band",
                "x": [lo, hi, hi, lo, lo],
                "y": [0, 0, top, top, 0],
            }
        )
    x = b_simple / factor
    out.append(
        {
            "type": "scatter",
            "mode": "lines",
            "line": {"dash": "dash", "color": color("B_simple")},
            "name": _label(f"B_simple ≈ {b_simple:,.0f} (global), per device"),
            "x": [x, x],
            "y": [0, top],
        }
    )
    by_batch = dict(rates)
    for batch, label, symbol, hue in (
        (ns.knee_batch, "hardware knee (sweet spot)", "diamond", color("sweet spot")),
        (ns.recommended_batch, "recommended (knee and B_simple)", "star", color("recommended")),
    ):
        if batch is not None and batch in by_batch:
            out.append(
                {
                    "type": "scatter",
                    "mode": "markers",
                    "marker": {"size": 14, "symbol": symbol, "color": hue},
                    "name": label,
                    "x": [float(batch)],
                    "y": [by_batch[batch]],
                }
            )
    return out


def chart_figures(
    run: RunRecord, analysis: RunAnalysis | Mapping[str, Any]
) -> dict[str, dict[str, Any]]:
    """Chart id -> Plotly figure, only for charts the run has data for (an analysis dict is
    decoded first, ``decode_analysis``)."""
    analysis = decode_analysis(analysis)
    charts = {
        "chart-step-breakdown": _breakdown_chart(analysis),
        "chart-utilisation": _series_chart(
            run,
            (
                ("gpu_util_pct", " GPU util", "GPU util %"),
                ("cpu_pct", " process CPU", "CPU % of one core"),
            ),
            "Utilisation over time",
        ),
        "chart-memory": _series_chart(
            run,
            (
                ("mem_used_mib", " device memory used", "device MiB"),
                ("rss_mib", " process RSS", "RSS MiB"),
            ),
            "Memory over time",
        ),
        "chart-comparison": _comparison_chart(analysis),
        "chart-sweep": _sweep_chart(analysis),
    }
    return {k: v for k, v in charts.items() if v is not None}
