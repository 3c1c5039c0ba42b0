"""The Memory and Distributed views: what differs between ranks.

Memory: peak allocated vs reserved per rank (and per device for DataParallel) from the memory
records, the sampler's device-memory (or RSS) curve per rank (``chart-memory``, drawn by
``html_charts``), a per-rank table. Distributed: collectives per rank with sizes and bus
bandwidth from the trace summaries, and wait vs transfer per rank from the cross-rank matching
(``analysis.traces.job.cross_rank``), which also names the slowest rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mgprof.analyze.run.schema import given
from mgprof.analyze.trace.comm_types import CollectiveStats
from mgprof.analyze.trace.cross_rank import CrossRankSummary
from mgprof.report.html.charts import layout
from mgprof.report.html.palette import color
from mgprof.report.html.text import cell, esc, label
from mgprof.report.html.view_model import Col, Context, View, figure_spec, ms, rank_color, rounded

__all__ = ["distributed_view", "memory_view"]


# ------------------------------------------------------------------------------------ memory


def _float(value: float | None) -> float | None:
    """A record's figure (``MemoryRecord.per_device``: the record, not the analysis) as float."""
    return None if value is None else float(value)


def _memory_rows(ctx: Context) -> list[dict[str, Any]]:
    """One row per rank, or per device of a DataParallel rank."""
    analysed = {d.rank: d.memory for d in ctx.rank_figures()}
    rows: list[dict[str, Any]] = []
    for rec in sorted(ctx.run.ranks, key=lambda r: r.rank):
        mem = rec.memory
        sampled = {
            dev.device: max((v for v in dev.columns.get("mem_used_mib", []) if v is not None),
                            default=None)
            for dev in rec.sampler.devices
        }  # fmt: skip
        base = analysed.get(rec.rank)
        if mem is not None and len(mem.per_device) > 1:
            for device, figures in mem.per_device.items():
                total = _float(figures.get("total_mib"))
                reserved = _float(figures.get("peak_reserved_mib"))
                rows.append(
                    {
                        "rank": rec.rank,
                        "device": device,
                        "allocated": _float(figures.get("peak_allocated_mib")),
                        "reserved": reserved,
                        "total": total,
                        "headroom": None if total is None or reserved is None else total - reserved,
                        "rss": mem.peak_rss_mib,
                        "sampled": sampled.get(device),
                    }
                )
            continue
        device = rec.device.kind if rec.device.index is None else f"cuda:{rec.device.index}"
        rows.append(
            {
                "rank": rec.rank,
                "device": device,
                "allocated": mem.peak_allocated_mib if mem else None,
                "reserved": mem.peak_reserved_mib if mem else None,
                "total": mem.total_mib if mem else None,
                "headroom": base.headroom_mib if base is not None else None,
                "rss": mem.peak_rss_mib if mem else None,
                "sampled": next((v for v in sampled.values() if v is not None), None),
            }
        )
    return rows


def _peaks_fig(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    multi_device = len({r["rank"] for r in rows}) < len(rows)
    xs = [f"rank {r['rank']}" + (f" {r['device']}" if multi_device else "") for r in rows]
    data = [
        {"type": "bar", "name": name, "x": [label(x) for x in xs],
         "y": [rounded(r[key]) for r in rows], "marker": {"color": hue}}
        for key, name, hue in (
            ("allocated", "peak allocated (tensors)", color("peak memory")),
            ("reserved", "peak reserved (caching allocator)", color("reserved")),
            ("rss", "peak RSS (host process)", color("process RSS")),
        )
        if any(r[key] is not None for r in rows)
        # host RSS beside device memory would dwarf it: it is in the table; charted on CPU runs
        and not (key == "rss" and any(r["allocated"] is not None for r in rows))
    ]  # fmt: skip
    if not data:
        return None
    return {
        "data": data,
        "layout": layout(
            "Peak memory per rank: allocated vs reserved"
            if any(r["allocated"] is not None for r in rows) else "Peak process RSS per rank",
            "", "MiB", barmode="group"),
    }  # fmt: skip


def _allocation_fig(ctx: Context) -> tuple[dict[str, Any] | None, dict[int, dict[str, Any]]]:
    """``--memory``: each rank's allocation curve (one line per rank, its peak marked), for all
    ranks and per rank."""
    traces: list[tuple[int, dict[str, Any]]] = []
    memory = given(ctx.analysis.memory)
    for p in memory.ranks if memory is not None else []:
        curve = given(p.curve)
        if curve is None or not curve.time_ms:
            continue
        trace = {
            "type": "scatter",  # not scattergl: WebGL may be missing (headless, remote desktops)
            "mode": "lines",
            "name": f"rank {p.rank}",
            "x": [rounded(t) for t in curve.time_ms],
            "y": [rounded(v) for v in curve.allocated_mib],
            "line": {"color": rank_color(p.rank)},
            "meta": {"rank": p.rank},
        }
        traces.append((p.rank, trace))
    if not traces:
        return None, {}
    title = "Allocated memory over the traced steps (--memory)"

    def fig(data: list[dict[str, Any]]) -> dict[str, Any]:
        return {"data": data, "layout": layout(title, "ms since the trace started", "MiB")}

    return fig([t for _, t in traces]), {r: fig([t]) for r, t in traces}


def memory_view(ctx: Context) -> View:
    """Peak allocated vs reserved per rank, the memory table (the curve is ``chart-memory``);
    with ``--memory`` the allocation curve per rank (the Memory profile section follows)."""
    view = View("memory", "Memory")
    rows = _memory_rows(ctx)
    fig = _peaks_fig(rows)
    if fig is not None:
        view.chart("mem-peaks", figure_spec(fig))
    curve_all, curve_by_rank = _allocation_fig(ctx)
    if curve_all is not None:
        view.chart("mem-allocation", figure_spec(curve_all, curve_by_rank))
    if not rows:
        view.note("No memory records.")
        return view
    cols = [
        Col("rank", digits=0),
        Col("device", num=False),
        Col("peak allocated MiB", digits=1),
        Col("peak reserved MiB", digits=1),
        Col("reserved − allocated MiB", digits=1),
        Col("device total MiB", digits=0),
        Col("headroom MiB", digits=0),
        Col("peak RSS MiB", digits=1),
        Col("sampled peak used MiB", digits=0),
    ]
    table = [
        [
            r["rank"],
            cell(r["device"]),
            rounded(r["allocated"]),
            rounded(r["reserved"]),
            rounded(r["reserved"] - r["allocated"])
            if r["reserved"] is not None and r["allocated"] is not None
            else None,
            rounded(r["total"]),
            rounded(r["headroom"]),
            rounded(r["rss"]),
            rounded(r["sampled"]),
        ]
        for r in rows
    ]
    view.table("mem-table", cols, table)
    view.note(
        "Allocated: memory held by tensors (PyTorch's max_memory_allocated); reserved: what the "
        "caching allocator took from the device (what other processes cannot use); sampled peak "
        "used: NVML's reading, which also counts the CUDA context. n/a on CPU runs."
    )
    return view


# ------------------------------------------------------------------------------- distributed


@dataclass
class _Collective:
    """One collective type of a rank, over its trace files (figures as the page shows them)."""

    type: str
    count: float | None
    total_us: float | None
    exposed_us: float | None
    bytes: float | None
    group_size: float | None
    algbw_gbps: float | None
    busbw_gbps: float | None
    sizes: list[tuple[float, float]] = field(default_factory=list)

    @classmethod
    def of(cls, c: CollectiveStats) -> _Collective:
        return cls(
            type=c.type,
            count=_float(c.count),
            total_us=_float(c.total_us),
            exposed_us=_float(c.exposed_us),
            bytes=_float(c.bytes),
            group_size=_float(c.group_size),
            algbw_gbps=_float(c.algbw_gbps),
            busbw_gbps=_float(c.busbw_gbps),
            sizes=[(float(size), float(calls)) for size, calls in c.sizes],
        )


def _sizes_text(sizes: list[tuple[float, float]]) -> str:
    """``[(bytes, calls), ...]`` as ``1.07 MB ×3, 526 kB ×3``."""
    return ", ".join(f"{_bytes(size)} ×{calls:.0f}" for size, calls in sizes)


def _bytes(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def _add(x: float | None, y: float | None) -> float | None:
    return None if x is None and y is None else (x or 0.0) + (y or 0.0)


def merge_collectives(rows: list[CollectiveStats]) -> list[_Collective]:
    """One row per collective type over a rank's trace files: counts, times, bytes and sizes
    summed, bandwidths recomputed from the sums (busbw keeps the type's bus factor)."""
    merged: dict[str, _Collective] = {}
    for c in rows:
        if c.type not in merged:
            merged[c.type] = _Collective.of(c)
            continue
        acc = merged[c.type]
        other = _Collective.of(c)
        acc.count = _add(acc.count, other.count)
        acc.total_us = _add(acc.total_us, other.total_us)
        acc.exposed_us = _add(acc.exposed_us, other.exposed_us)
        acc.bytes = _add(acc.bytes, other.bytes)
        sizes: dict[float, float] = {}
        for message, calls in [*acc.sizes, *other.sizes]:
            sizes[message] = sizes.get(message, 0.0) + calls
        acc.sizes = sorted(sizes.items(), key=lambda kv: -kv[0])
        algbw, busbw = acc.algbw_gbps, acc.busbw_gbps
        total, size = acc.total_us, acc.bytes
        if algbw and busbw is not None and total and size is not None:
            acc.algbw_gbps = algbw_gbps = size / (total * 1e3)  # bytes / µs / 1e3 = GB/s
            acc.busbw_gbps = algbw_gbps * busbw / algbw
    return list(merged.values())


def _collective_table(ctx: Context, view: View) -> list[tuple[int, _Collective]]:
    colls = [
        (rank, c)
        for rank, rows in ctx.items(lambda s: s.collectives).items()
        for c in merge_collectives(rows)
    ]
    if not colls:
        return []
    cols = [
        Col("rank", digits=0),
        Col("type", num=False),
        Col("calls", digits=0),
        Col("total ms", digits=3),
        Col("exposed ms", digits=3),
        Col("MB", digits=2),
        Col("group size", digits=0),
        Col("algbw GB/s", digits=2),
        Col("busbw GB/s", digits=2),
        Col("message sizes", num=False),
    ]
    rows = [
        [
            rank,
            cell(c.type),
            c.count,
            rounded(ms(c.total_us)),
            rounded(ms(c.exposed_us)),
            rounded(c.bytes / 1e6) if c.bytes is not None else None,
            c.group_size,
            rounded(c.algbw_gbps),
            rounded(c.busbw_gbps),
            cell(_sizes_text(c.sizes)),
        ]
        for rank, c in colls
    ]
    view.table("dist-collectives", cols, rows, sort=(3, "desc"))
    return colls


def _busbw_fig(colls: list[tuple[int, _Collective]]) -> dict[str, Any] | None:
    by_rank: dict[int, list[_Collective]] = {}
    for rank, c in colls:
        if c.busbw_gbps is not None:
            by_rank.setdefault(rank, []).append(c)
    if not by_rank:
        return None
    data = [
        {
            "type": "bar",
            "name": f"rank {rank}",
            "x": [label(c.type) for c in items],
            "y": [rounded(c.busbw_gbps) for c in items],
            "marker": {"color": rank_color(rank)},
            "meta": {"rank": rank},
        }
        for rank, items in sorted(by_rank.items())
    ]
    lay = layout("Bus bandwidth per collective type", "collective", "busbw GB/s", barmode="group")
    return {"data": data, "layout": lay}


def _wait_fig(cross: CrossRankSummary | None) -> dict[str, Any] | None:
    per_rank = cross.per_rank if cross is not None else []
    if cross is None or not per_rank:
        return None
    transfer = sum(float(t.transfer_us) for t in cross.per_type)
    slowest = cross.slowest_rank
    xs = [f"rank {p.rank}" + (" (last to arrive)" if p.rank == slowest else "") for p in per_rank]
    data = [
        {"type": "bar", "name": "transfer", "x": xs, "y": [rounded(transfer / 1e3)] * len(xs),
         "marker": {"color": color("transfer")}},
        {"type": "bar", "name": "wait for other ranks", "x": xs,
         "y": [rounded(ms(p.wait_us)) for p in per_rank], "marker": {"color": color("wait")}},
    ]  # fmt: skip
    lay = layout(
        "Time in matched collectives per rank: wait vs transfer", "", "ms", barmode="stack"
    )
    lay["legend"]["traceorder"] = "normal"
    return {"data": data, "layout": lay}


def _slowest_html(ctx: Context) -> str:
    """The run's slowest rank as its analysis decided it (beyond the run's noise, or none,
    with why); a folder of traces without a run: the traces' last-arriving rank."""
    cross = ctx.cross_rank()
    job = ctx.job()
    if job is not None and (job.slowest_rank is not None or cross is None):
        slowest = job.slowest_rank
    elif job is not None:
        why = job.not_applicable.get("slowest_rank")
        return f'<p class="callout">{esc(f"No slowest rank: {why}")}.</p>' if why else ""
    else:
        slowest = cross.slowest_rank if cross is not None else None
    if slowest is None:
        return ""
    per_rank = cross.per_rank if cross is not None else []
    matched = float(cross.matched_calls) if cross is not None else None
    last = next((float(p.last_arrivals) for p in per_rank if p.rank == slowest), None)
    if last is not None and matched:
        why = f"it arrived last at {last:.0f} of {matched:.0f} matched collectives"
    else:
        basis = job.slowest_rank_basis if job is not None else None
        why = basis or "highest mean step time"
    waited = sum(float(p.wait_us) for p in per_rank if p.rank != slowest)
    text = f"Slowest rank: {slowest} — {why}"
    if per_rank:
        text += f"; the other ranks waited {waited / 1e3:,.3f} ms for it in total"
    return f'<p class="callout">{esc(text)}.</p>'


def distributed_view(ctx: Context) -> View:
    """Collectives with sizes and busbw, wait vs transfer per rank, the slowest rank (the
    per-rank stacked breakdown is ``chart-step-breakdown``)."""
    view = View("distributed", "Distributed")
    view.html(_slowest_html(ctx))
    cross = ctx.cross_rank()
    wait = _wait_fig(cross)
    if wait is not None and cross is not None:
        view.chart("dist-wait", figure_spec(wait))
        view.note(
            "Transfer: per matched call, the shortest duration over the ranks; wait: a rank's "
            f"duration minus that (matched by {cross.match_key})."
        )
    colls = _collective_table(ctx, view)
    busbw = _busbw_fig(colls)
    if busbw is not None:
        view.chart("dist-busbw", figure_spec(busbw))
    if not colls:
        view.note("No collectives in the traces (one process, or no trace).")
    per_rank = cross.per_rank if cross is not None else []
    if cross is not None and per_rank:
        cols = [Col("rank", digits=0), Col("wait ms", digits=3), Col("arrived last", digits=0),
                Col("slowest", num=False)]  # fmt: skip
        rows = [
            [p.rank, rounded(ms(p.wait_us)), float(p.last_arrivals),
             "yes" if p.rank == cross.slowest_rank else ""]
            for p in per_rank
        ]  # fmt: skip
        view.table("dist-waits", cols, rows)
    return view
