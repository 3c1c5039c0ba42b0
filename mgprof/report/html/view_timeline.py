"""The Steps view's timeline: every traced rank on one clock, a row per rank and kind of work.

The TensorBoard profiler tab needs its front end from the network and the merged
``timeline.json.gz`` needs ui.perfetto.dev; this chart is the offline answer to "where did the
time go on which rank": per rank, its traced steps, its ``mgprof.region`` blocks, compute,
communication, other device work and idle time, as horizontal bars on the clock ``mgprof
timeline`` aligns (:mod:`mgprof.analyze.timeline.activity`), zoomable along time. The bars are
cut down to a fixed budget so that a large run's page stays small; a note under the chart says
how many intervals they stand for, and Perfetto stays the way into every event.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from mgprof.analyze.timeline.activity import JobActivity, job_activity, too_large
from mgprof.analyze.timeline.build import DEFAULT_NAME, clock_line
from mgprof.analyze.timeline.coarsen import Segments
from mgprof.errors import TraceError, UsageError
from mgprof.report.html.charts import layout
from mgprof.report.html.palette import color
from mgprof.report.html.text import label, short_label
from mgprof.report.html.view_model import Context, View, figure_spec, rounded

__all__ = ["COLORS", "timeline_figure", "timeline_note", "trace_files", "traced_timeline"]

COLORS = {
    "steps": color("step"),
    "regions": color("region"),
    "compute": color("compute"),
    "communication": color("communication"),
    "other device work": color("other device work"),
    "idle": color("idle"),
}
"""Compute, communication, other device work and idle in the palette's colours, as in the step
breakdown; steps and regions (rows of names, outlined) in the palette's two muted tones."""
_NAMED = ("steps", "regions")
_ROW_PX = 22
_MIN_OPACITY = 0.3
"""A merged bar is drawn as opaque as the share of it its intervals cover, never fainter than
this (a bar of sparse intervals must still be seen)."""
_RANKS_LISTED = 8


def trace_files(ctx: Context) -> list[Path]:
    """The trace files the analysis read (its summaries' sources)."""
    files = {
        Path(s.source) for items in ctx.summaries.values() for s in items if s.source
    }  # fmt: skip
    return sorted(files)


def _region_names(ctx: Context) -> set[str]:
    return {region.name for rank in ctx.run.ranks for region in rank.regions}


def activity(ctx: Context) -> JobActivity | str | None:
    """The ranks' rows, or why there are none (a sentence); None for a run without traces."""
    files = trace_files(ctx)
    if not files:
        return None
    gone = [f for f in files if not f.is_file()]
    if gone:
        more = f" and {len(gone) - 1} more" if len(gone) > 1 else ""
        return f"the analysis read {gone[0]}{more}, which is not there any more"
    reason = too_large(files)
    if reason is not None:
        return reason
    folder = files[0].parent
    beside = folder.parent / DEFAULT_NAME if folder.name == "traces" else None
    if any(f.parent != folder for f in files):
        beside = None
    try:
        return job_activity(files, _region_names(ctx), timeline=beside)
    except (TraceError, UsageError) as exc:
        return str(exc)
    except OSError as exc:
        return f"a trace could not be read ({exc.strerror or exc})"
    except MemoryError:
        return "ran out of memory reading the traces"
    except Exception as exc:  # a derived chart: the rest of the report must still be written
        return f"{type(exc).__name__}: {exc}"


def _hover(row_name: str, named: bool, merged: bool) -> str:
    """Plotly's hover template of a row (its name is mgprof's own words, no data: the names of
    steps and regions come through ``text``, escaped)."""
    what = "%{text}" if named else "%{fullData.name}"
    lines = [f"{what}: %{{x:,.3f}} ms from %{{base:,.3f}} ms"]
    if merged:
        lines.append("%{customdata[0]:,} intervals in this bar, %{customdata[1]:.0f} % covered")
    return "<br>".join(lines) + f"<extra>{label(row_name)}</extra>"


def _legend(kind: str) -> dict[str, Any]:
    """A legend entry of its own, with no rank (the rank selector keeps it, whichever rank it
    shows) and no bar; clicking it hides or shows the kind's rows of every rank."""
    return {"type": "bar", "orientation": "h", "name": kind, "legendgroup": kind,
            "x": [None], "y": [None], "marker": {"color": COLORS[kind]},
            "hoverinfo": "skip"}  # fmt: skip


def _trace(row_index: int, row_name: str, rank: int, kind: str, seg: Segments) -> dict[str, Any]:
    named = kind in _NAMED
    merged = any(c > 1 for c in seg.count)
    trace: dict[str, Any] = {
        "type": "bar",
        "orientation": "h",
        "name": kind,
        "legendgroup": kind,
        "showlegend": False,
        "y": [row_index] * len(seg.count),
        "base": [rounded(s / 1e3) for s in seg.start_us],
        "x": [rounded((e - s) / 1e3) for s, e in zip(seg.start_us, seg.end_us)],
        "marker": {"color": COLORS[kind], "line": {"width": 1 if named else 0, "color": "#fff"}},
        "hovertemplate": _hover(row_name, named, merged),
        "meta": {"rank": rank},
    }
    if named and seg.labels is not None:
        trace["text"] = [short_label(t, 40) for t in seg.labels]
        trace["textposition"] = "inside"
        trace["insidetextanchor"] = "middle"
    if merged:
        trace["customdata"] = [
            [c, round(100.0 * b / (e - s)) if e > s else 100]
            for c, b, s, e in zip(seg.count, seg.busy_us, seg.start_us, seg.end_us)
        ]
        trace["marker"]["opacity"] = [
            1.0 if c == 1 else round(max(_MIN_OPACITY, min(1.0, b / (e - s))), 2) if e > s else 1.0
            for c, b, s, e in zip(seg.count, seg.busy_us, seg.start_us, seg.end_us)
        ]
    return trace


def timeline_figure(act: JobActivity) -> dict[str, Any]:
    """One horizontal bar trace per rank and row (``meta.rank``: the rank selector keeps that
    rank's rows), rows top to bottom in rank order, time in ms on the job's clock."""
    data: list[dict[str, Any]] = []
    names: list[str] = []
    for rank in act.ranks:
        for row in rank.rows:
            row_name = f"rank {rank.rank} · {row.kind}"
            data.append(_trace(len(names), row_name, rank.rank, row.kind, row.segments))
            names.append(row_name)
    kinds = {row.kind for rank in act.ranks for row in rank.rows}
    data.extend(_legend(kind) for kind in COLORS if kind in kinds)
    lay = layout(
        "Timeline of the traced steps, every rank on one clock",
        f"ms from the job's first traced event, on rank {act.reference_rank}'s clock",
        "",
        barmode="overlay",
        dragmode="zoom",
        hovermode="closest",
        bargap=0.15,
    )
    lay["yaxis"].update(
        {
            "tickmode": "array",
            "tickvals": list(range(len(names))),
            "ticktext": [label(n) for n in names],
            "autorange": "reversed",
            "fixedrange": True,
            "zeroline": False,
            "showgrid": False,
        }
    )
    lay["xaxis"]["zeroline"] = False
    lay["legend"] = {
        "orientation": "h",
        "x": 0,
        "y": 1.0,
        "yanchor": "bottom",
        "traceorder": "normal",
    }
    lay["margin"] = {**lay["margin"], "t": 80}
    lay["uniformtext"] = {"minsize": 9, "mode": "hide"}
    lay["height"] = max(260, 140 + _ROW_PX * len(names))
    return {"data": data, "layout": lay}


def _count(n: int, what: str) -> str:
    return f"{n:,} {what}" + ("" if n == 1 else "s")


def timeline_note(act: JobActivity) -> str:
    """What the chart shows, how it was bounded and where the rest is (prose, under it)."""
    clocks = [
        f"rank {r.rank} {clock_line(msgspec.to_builtins(r.clock))}"
        for r in act.ranks[1 : _RANKS_LISTED + 1]
    ]
    more = len(act.ranks) - 1 - _RANKS_LISTED
    if more > 0:
        clocks.append(f"and {more} more")
    aligned = (
        "Clock offsets onto the lowest rank, as `mgprof timeline` finds them: "
        + "; ".join(clocks)
        + "."
        if clocks
        else "One rank: its own clock."
    )
    bars = act.segments
    text = [
        "Each rank's traced steps, `mgprof.region` blocks and where its time went (compute, "
        "communication, other device work, idle: the sets the breakdown figures measure, inside "
        "the trace window), on one clock; drag to zoom into a span of time, double-click to "
        "zoom out. " + aligned,
        f"Drawn: {_count(bars, 'bar')} for {_count(act.intervals, 'interval')} "
        f"(at most {act.max_segments:,} bars, so that the page stays small)."
        if act.merged == 0
        else f"Drawn: {_count(bars, 'bar')} for {_count(act.intervals, 'interval')}: at most "
        f"{act.max_segments:,} bars, so {act.merged:,} intervals that sat close to others of "
        "their row are merged into wider bars (the smallest gaps closed first), each as opaque "
        "as the share of it they cover; hover a bar for its count.",
    ]
    if act.ranks_left_out:
        shown = ", ".join(str(r) for r in act.ranks_left_out[:_RANKS_LISTED])
        extra = "…" if len(act.ranks_left_out) > _RANKS_LISTED else ""
        text.append(
            f"{_count(len(act.ranks_left_out), 'rank')} not drawn (ranks {shown}{extra}): "
            f"the chart holds the lowest {len(act.ranks)}."
        )
    text.extend(act.notes)
    text.append(
        f"Every event, on the same clock (a time here is its ts in ms): `{DEFAULT_NAME}` in "
        "Perfetto (the Overview links it, or says how to make it)."
    )
    return " ".join(text)


def traced_timeline(ctx: Context, view: View) -> bool:
    """The chart and its note in ``view``; False when there is none to draw (no traces, or they
    could not be aligned: the reason is noted), for the caller's fallback."""
    act = activity(ctx)
    if act is None:
        return False
    if isinstance(act, str):
        view.note(f"Timeline of every rank on one clock: not drawn here ({act}).")
        return False
    if not act.segments:
        view.note("Timeline of every rank on one clock: the traces hold no traced work.")
        return False
    view.chart("steps-activity", figure_spec(timeline_figure(act)))
    view.note(timeline_note(act))
    return True
