"""The Steps view: step time per step for every rank, a timeline of the traced steps, and a
per-step table.

The timeline is every rank's rows on one clock (``html_view_timeline``) when the run's traces can
be read and aligned; otherwise each rank's traced steps as bars on its own trace clock.

Recorded steps come from ``run.ranks[i].steps`` (the step timer); traced steps from the trace
summaries' ``steps`` (``ProfilerStep#N``, the same N as the step index), whose totals split each
step into compute, exposed communication and idle time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mgprof.analyze.trace.summary import StepSummary, TraceTotals
from mgprof.records import StepRecord
from mgprof.report.html.charts import layout
from mgprof.report.html.view_model import Col, Context, View, figure_spec, ms, rank_color, rounded
from mgprof.report.html.view_timeline import traced_timeline

__all__ = ["STEPS_SHOWN", "steps_view", "traced_steps"]

STEPS_SHOWN = 1000
"""Recorded steps per rank the Steps view carries; beyond it a sample (``_sample``)."""


def traced_steps(ctx: Context) -> dict[int, list[StepSummary]]:
    """Rank -> its traced steps (trace summaries' ``steps``)."""
    return ctx.items(lambda s: s.steps)


# ------------------------------------------------------------------------------------- steps


def _sample(steps: Sequence[StepRecord], limit: int = STEPS_SHOWN) -> list[StepRecord]:
    """Every step up to ``limit``; beyond, an even sample with every traced step and the
    slowest ones kept (a sampled table would otherwise hide the outliers it is read for)."""
    if len(steps) <= limit:
        return list(steps)
    keep = {i for i, s in enumerate(steps) if s.traced}
    keep.update(sorted(range(len(steps)), key=lambda i: -steps[i].duration_ms)[: limit // 10])
    stride = -(-len(steps) // max(1, limit - len(keep)))  # ceiling: at most the room left
    keep.update(range(0, len(steps), stride))
    return [steps[i] for i in sorted(keep)]


def _duration_fig(ctx: Context, shown: Mapping[int, list[StepRecord]]) -> dict[str, Any]:
    data: list[dict[str, Any]] = []
    for rank, steps in shown.items():
        data.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": f"rank {rank}",
                "x": [s.index for s in steps],
                "y": [rounded(s.duration_ms) for s in steps],
                "marker": {
                    "symbol": ["diamond" if s.traced else "circle" for s in steps],
                    "size": [9 if s.traced else 5 for s in steps],
                    "color": rank_color(rank),
                },
                "meta": {"rank": rank},
            }
        )
        waits = [s.dataloader_ms for s in steps]
        if any(w is not None for w in waits):
            data.append(
                {
                    "type": "scatter",
                    "mode": "lines",
                    "line": {"dash": "dot", "color": rank_color(rank)},
                    "name": f"rank {rank} DataLoader wait",
                    "x": [s.index for s in steps],
                    "y": [rounded(w) for w in waits],
                    "meta": {"rank": rank},
                }
            )
    title = "Step time per step (◆ traced steps)"
    return {"data": data, "layout": layout(title, "step", "ms")}


def _timeline_fig(ctx: Context) -> dict[str, Any] | None:
    """Traced steps as bars on each rank's trace clock, from the earliest start."""
    spans: dict[int, list[tuple[int, float, float]]] = {}
    for rank, steps in traced_steps(ctx).items():
        for s in steps:
            # the trace clock, comparable across ranks on one host; start_us is from the
            # rank's own trace start
            start = s.cpu_start_us if s.cpu_start_us is not None else s.start_us
            if start is not None:
                spans.setdefault(rank, []).append((s.step, start, s.cpu_duration_us))
    if not spans:
        return None
    t0 = min(start for items in spans.values() for _, start, _ in items)
    data = [
        {
            "type": "bar",
            "orientation": "h",
            "name": f"rank {rank}",
            "y": [f"rank {rank}"] * len(items),
            "base": [rounded((start - t0) / 1e3) for _, start, _ in items],
            "x": [rounded(dur / 1e3) for _, _, dur in items],
            "text": [f"step {n}" for n, _, _ in items],
            "textposition": "inside",
            "hovertemplate": "%{text}: %{x:,.3f} ms from %{base:,.3f} ms<extra>%{y}</extra>",
            "marker": {"color": rank_color(rank), "line": {"color": "#fff", "width": 1}},
            "meta": {"rank": rank},
        }
        for rank, items in sorted(spans.items())
    ]
    lay = layout("Timeline of the traced steps", "ms since the first traced step began", "")
    lay["yaxis"].update({"type": "category", "autorange": "reversed"})
    lay["height"] = max(260, 120 + 34 * len(spans))
    lay["showlegend"] = False
    return {"data": data, "layout": lay}


def _step_table(ctx: Context, view: View, shown: Mapping[int, list[StepRecord]]) -> None:
    traced: dict[tuple[int, int], TraceTotals] = {
        (rank, s.step): s.totals for rank, steps in traced_steps(ctx).items() for s in steps
    }
    cols = [
        Col("rank", digits=0),
        Col("step", digits=0),
        Col("step ms", digits=3),
        Col("batch", digits=0),
        Col("DataLoader ms", digits=3),
        Col("traced", num=False),
    ]
    if traced:
        cols += [
            Col("trace window ms", digits=3),
            Col("compute %", digits=1),
            Col("exposed comm %", digits=1),
            Col("idle %", digits=1),
        ]
    rows = []
    for rank, steps in shown.items():
        for s in steps:
            row: list[Any] = [
                rank,
                s.index,
                rounded(s.duration_ms),
                s.batch_size,
                rounded(s.dataloader_ms),
                "yes" if s.traced else "no",
            ]
            if traced:
                t = traced.get((rank, s.index))
                if t is None:
                    row += [None, None, None, None]
                else:
                    row += [rounded(ms(t.window_us))] + [
                        rounded(v, 2) for v in (t.compute_pct, t.exposed_comm_pct, t.idle_pct)
                    ]
            rows.append(row)
    view.table("steps-table", cols, rows)


def steps_view(ctx: Context) -> View:
    """Every recorded step per rank (a sample beyond ``STEPS_SHOWN``), and the traced ones."""
    view = View("steps", "Steps")
    shown = {r.rank: _sample(r.steps) for r in sorted(ctx.run.ranks, key=lambda r: r.rank)}
    shown = {rank: steps for rank, steps in shown.items() if steps}
    if not shown:
        view.note("No steps recorded.")
        return view
    view.chart("steps-duration", figure_spec(_duration_fig(ctx, shown)))
    timeline = None if traced_timeline(ctx, view) else _timeline_fig(ctx)
    if timeline is not None:
        view.chart("steps-timeline", figure_spec(timeline))
        view.note(
            "Timeline: each rank's traced steps on its trace clock (ranks on different hosts "
            "may be offset by their clocks)."
        )
    _step_table(ctx, view, shown)
    total = {r.rank: len(r.steps) for r in ctx.run.ranks}
    cut = [f"rank {rank}: {len(shown[rank])} of {total[rank]}" for rank in shown
           if len(shown[rank]) < total[rank]]  # fmt: skip
    if cut:
        view.note(
            "Long run: a sample of the steps is shown (evenly spaced, plus every traced step and "
            "the slowest): " + "; ".join(cut)
        )
    return view
