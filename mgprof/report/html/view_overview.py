"""The Overview's own charts, above the shared sections: key figures, the link to the run's
timeline (every rank on one clock, for Perfetto), step time breakdown per traced step (compute,
exposed communication, other device work, idle) and the tensor-core share of compute-kernel time
per rank.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mgprof.analyze.run.schema import given
from mgprof.analyze.timeline.build import DEFAULT_NAME, clock_line, read_timeline_facts
from mgprof.analyze.trace.summary import RankTraceSummary, StepSummary
from mgprof.report.html.charts import layout
from mgprof.report.html.palette import color
from mgprof.report.html.text import esc
from mgprof.report.html.view_model import Col, Context, View, figure_spec, rounded
from mgprof.report.html.view_steps import traced_steps

__all__ = ["cards_html", "overview_view"]

_PARTS = (
    ("compute", "compute (incl. overlapped comm)", color("compute")),
    ("exposed", "exposed communication", color("exposed communication")),
    ("other", "other device work (memcpy/memset)", color("other device work")),
    ("idle", "idle", color("idle")),
)


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _parts_ms(step: StepSummary) -> dict[str, float] | None:
    """A traced step's window split into the breakdown parts, in ms (they sum to the window)."""
    t = step.totals
    window = t.window_us
    compute, exposed, idle = t.compute_us, t.exposed_comm_us, t.idle_us
    if window is None or compute is None or idle is None:
        return None
    exposed = exposed or 0.0
    other = max(0.0, window - compute - exposed - idle)
    return {"compute": compute / 1e3, "exposed": exposed / 1e3, "other": other / 1e3,
            "idle": idle / 1e3}  # fmt: skip


def _breakdown_fig(points: Mapping[int, dict[str, float]], who: str) -> dict[str, Any]:
    steps = sorted(points)
    data = [
        {
            "type": "bar",
            "name": name,
            "x": steps,
            "y": [rounded(points[s][key]) for s in steps],
            "marker": {"color": hue},
        }
        for key, name, hue in _PARTS
        if any(rounded(points[s][key]) for s in steps)
    ]
    lay = layout(f"Step time breakdown per step, {who}", "step", "ms", barmode="stack")
    lay["xaxis"]["type"] = "category"
    lay["legend"]["traceorder"] = "normal"
    return {"data": data, "layout": lay}


def _breakdown_spec(ctx: Context) -> dict[str, Any]:
    per_rank: dict[int, dict[int, dict[str, float]]] = {}
    for rank, steps in traced_steps(ctx).items():
        points = {s.step: p for s in steps if (p := _parts_ms(s)) is not None}
        if points:
            per_rank[rank] = points
    if not per_rank:
        return {}
    if len(per_rank) == 1:
        ((rank, points),) = per_rank.items()
        return figure_spec(_breakdown_fig(points, f"rank {rank}"))
    numbers = sorted({n for points in per_rank.values() for n in points})
    means = {
        n: {
            key: _mean([p[n][key] for p in per_rank.values() if n in p]) or 0.0
            for key, _, _ in _PARTS
        }
        for n in numbers
    }
    return figure_spec(
        _breakdown_fig(means, "mean over ranks"),
        {rank: _breakdown_fig(points, f"rank {rank}") for rank, points in per_rank.items()},
    )


# ------------------------------------------------------------------------------ tensor cores


def _tc_shares(summaries: Sequence[RankTraceSummary]) -> tuple[float, float] | None:
    """(tensor-core %, FP32 GEMM %) of a rank's summed compute-kernel time."""
    tc_sum = fp32_sum = compute = 0.0
    for s in summaries:
        tc = s.tensor_cores
        tc_us, fp_us = tc.tensor_core_us, tc.fp32_gemm_us
        tc_pct, fp_pct = tc.tensor_core_pct, tc.fp32_gemm_pct
        if tc_pct is None:
            continue
        total: float | None
        if tc_pct > 0:
            total = tc_us * 100.0 / tc_pct
        elif fp_us and fp_pct:
            total = fp_us * 100.0 / fp_pct
        else:
            total = _file_compute_us(s)
        if total is None or total <= 0:
            continue
        tc_sum += tc_us
        fp32_sum += fp_us or 0.0
        compute += total
    if compute <= 0:
        return None
    return 100.0 * tc_sum / compute, 100.0 * fp32_sum / compute


def _file_compute_us(summary: RankTraceSummary) -> float | None:
    for k in summary.top_kernels:
        if k.pct_of_compute:
            return k.total_us * 100.0 / k.pct_of_compute
    return None


_TC_PARTS = tuple((name, color(name)) for name in ("tensor cores", "FP32 GEMM", "other kernels"))


def _tc_spec(ctx: Context) -> dict[str, Any]:
    shares = {r: sh for r, s in ctx.summaries.items() if (sh := _tc_shares(s)) is not None}
    if not shares:
        return {}
    ranks = sorted(shares)
    values = {r: (tc, fp, max(0.0, 100.0 - tc - fp)) for r, (tc, fp) in shares.items()}
    bars = [
        {
            "type": "bar",
            "name": name,
            "x": [f"rank {r}" for r in ranks],
            "y": [round(values[r][i], 2) for r in ranks],
            "marker": {"color": hue},
        }
        for i, (name, hue) in enumerate(_TC_PARTS)
    ]
    all_lay = layout(
        "Tensor-core share of compute-kernel time", "rank", "% of compute", barmode="stack"
    )
    all_lay["legend"]["traceorder"] = "normal"
    all_fig = {"data": bars, "layout": all_lay}

    def pie(rank: int) -> dict[str, Any]:
        lay = layout(f"Tensor-core share of compute-kernel time, rank {rank}", "", "")
        return {
            "data": [
                {
                    "type": "pie",
                    "labels": [n for n, _ in _TC_PARTS],
                    "values": [round(v, 2) for v in values[rank]],
                    "marker": {"colors": [c for _, c in _TC_PARTS]},
                    "sort": False,
                }
            ],
            "layout": lay,
        }

    return figure_spec(all_fig, {r: pie(r) for r in ranks})


# ---------------------------------------------------------------------------------- overview


def _fmt(value: float | None, unit: str, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}{unit}"


def cards_html(ctx: Context) -> str:
    """The run at a glance: a few job-level figures above the Overview's charts."""
    job = ctx.job()
    ranks = ctx.rank_figures()

    def avg(values: Sequence[float | None]) -> float | None:
        return _mean([v for v in values if v is not None])

    step = avg([r.step_time_ms.mean if r.step_time_ms else None for r in ranks])
    shares = [sh for s in ctx.summaries.values() if (sh := _tc_shares(s)) is not None]
    findings = given(ctx.analysis.findings) or []
    high = sum(1 for f in findings if f.severity == "high")
    device = next((r.device_name or r.device for r in ranks), "n/a")
    world = job.world_size if job is not None else ctx.run.world_size
    reported = job.ranks_reported if job is not None else len(ranks)
    strategy = (job.strategy_label or job.strategy) if job is not None else ""
    cards = [
        ("ranks", f"{reported} of {world}" if reported != world else str(world)),
        ("strategy", strategy or ctx.run.strategy),
        ("device", device),
        ("mean step time", _fmt(step, " ms", 2)),
        ("throughput", _fmt(job.samples_per_s if job is not None else None, " samples/s")),
        ("trace busy", _fmt(avg([r.trace_busy_pct for r in ranks]), " %")),
        ("tensor cores", _fmt(_mean([tc for tc, _ in shares]) if shares else None, " %")),
        ("MFU", _fmt(avg([r.mfu_pct for r in ranks]), " %")),
        ("findings", f"{len(findings)}" + (f" ({high} high)" if high else "")),
    ]
    items = "".join(f"<div><dt>{esc(k)}</dt><dd>{esc(v)}</dd></div>" for k, v in cards)
    return f'<dl class="cards">{items}</dl>'


_TIMELINE_RANKS_LISTED = 16
_OFFLINE = (
    'Offline, <a href="#view=steps">the Steps view</a> draws every rank\'s steps, regions, '
    "compute, communication and idle time on the same clock."
)
"""Where the page itself shows the timeline (``html_view_timeline``)."""


def _run_dir(ctx: Context) -> Path | None:
    """The run directory, from where its traces were read (``<run>/traces/<file>``)."""
    for summaries in ctx.summaries.values():
        for summary in summaries:
            source = summary.source
            if source and Path(source).parent.name == "traces":
                return Path(source).parent.parent
    return None


def _mapping(value: Any) -> dict[str, Any]:
    """A dict of the timeline's facts (a file of its own, not the analysis), else empty."""
    return value if isinstance(value, dict) else {}


def timeline_html(ctx: Context) -> str:
    """A link to RUN/timeline.json.gz with each rank's clock offset, or, when the run has
    traces but no timeline, the command that makes it (nothing for a run without traces)."""
    run_dir = _run_dir(ctx)
    if run_dir is None:
        return ""
    facts = read_timeline_facts(run_dir / DEFAULT_NAME)
    if facts is None:
        return (
            '<p class="note">Timeline (every rank on one clock, for Perfetto): not made for this '
            f"run; make it with <code>mgprof timeline {esc(str(run_dir))}</code>. "
            f"{_OFFLINE}</p>"
        )
    ranks = [r for r in facts.get("ranks") or [] if isinstance(r, dict)]
    items = [
        f"<li>rank {esc(r.get('rank'))}: {esc(clock_line(_mapping(r.get('clock'))))}</li>"
        for r in ranks[:_TIMELINE_RANKS_LISTED]
    ]
    if len(ranks) > _TIMELINE_RANKS_LISTED:
        items.append(f"<li>and {len(ranks) - _TIMELINE_RANKS_LISTED} more (in its otherData)</li>")
    offsets = (
        f"Clock offsets onto rank {esc(facts.get('reference_rank'))} (added to each rank's "
        f"timestamps):</p><ul>{''.join(items)}</ul>"
        if items
        else "</p>"
    )
    return (
        f'<div class="timeline"><p><a href="{DEFAULT_NAME}">{DEFAULT_NAME}</a>: every rank on '
        "one clock, as one Chrome/Perfetto trace; open it in ui.perfetto.dev (Open trace file) "
        f"or chrome://tracing (Load). {_OFFLINE} {offsets}</div>"
    )


def overview_view(ctx: Context) -> View:
    """Key figures, the timeline link, step breakdown per traced step, tensor-core share (the
    shared sections, with utilisation and findings, follow them: ``html_views``)."""
    view = View("overview", "Overview")
    view.html(cards_html(ctx))
    timeline = timeline_html(ctx)
    if timeline:
        view.html(timeline)
    breakdown = _breakdown_spec(ctx)
    view.chart("ov-step-breakdown", breakdown)
    if not breakdown:
        view.note("Step breakdown per step: no traced steps (the run has no trace).")
    tc = _tc_spec(ctx)
    view.chart("ov-tensor-cores", tc)
    if not tc:
        view.note("Tensor-core share: not applicable (no compute kernels in the traces).")
    _compiled_table(ctx, view)
    return view


def _compiled_table(ctx: Context, view: View) -> None:
    """torch.compile in the traced steps, per rank: the run report's torch.compile table (the
    same figures, as numbers), with dynamo's counters above it; nothing without compiled code."""
    from mgprof.report.run.compiled import COLUMNS, NOTE
    from mgprof.report.run.setup import compile_text

    counters = next((r.training.compile for r in ctx.run.ranks if r.training.compile), None)
    found = [
        (rank, s.compiled)
        for rank in sorted(ctx.summaries)
        for s in ctx.summaries[rank]
        if s.compiled is not None
    ]
    if counters is None and not found:
        return
    view.html("<h3>torch.compile</h3>")
    if counters is not None:
        view.note(f"dynamo: {compile_text(counters)}")
    if not found:
        view.note("No compiled region in the traced steps.")
        return
    cols = [Col(COLUMNS[0], digits=0), Col(COLUMNS[1], digits=0), Col(COLUMNS[2], digits=1)]
    cols += [Col(COLUMNS[3], digits=1)] + [Col(c, digits=0) for c in COLUMNS[4:]]
    rows = [
        [
            rank,
            c.steps,
            rounded(c.compiled_pct, 1),
            rounded(c.regions_per_step, 1),
            c.nested,
            len({f.split("/")[0] for f in c.frames}),
            c.recompiled_frames,
        ]
        for rank, c in found
    ]
    view.table("ov-compiled", cols, rows, note=NOTE)
