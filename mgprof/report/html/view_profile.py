"""The Operators and Kernels views: the TensorBoard plugin's operator and kernel tables, per rank.

Operators come from each trace summary's ``operators`` (grouped by name and input shapes) and
``operators_by_name``; kernels from ``top_kernels``. A rank with several trace files gets one row
per group, summed over the files. "All ranks" charts sum over the ranks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mgprof.analyze.trace.kernels import KernelStat
from mgprof.analyze.trace.operators import OperatorNameStat, OperatorStat
from mgprof.analyze.trace.summary import RankTraceSummary
from mgprof.report.html.charts import layout
from mgprof.report.html.palette import color
from mgprof.report.html.sections import anchor
from mgprof.report.html.text import cell, label, short_label
from mgprof.report.html.view_model import Col, Context, View, figure_spec, ms, rounded

__all__ = ["kernels_view", "operators_view"]

TOP_KERNELS_TITLE = "Top kernels"
"""The shared section the Kernels view's table stands in for (``html_views.SHOWN_BY_VIEW``)."""

TOP_BARS = 15
"""Bars in a "top N" chart; the table below it has every row."""


@dataclass
class _Op:
    """One row of an operator table: the operators of a group summed (one rank's trace files,
    or every rank); a time no operator of the group has stays None (a CPU trace has no device
    time)."""

    name: str
    input_shapes: str = ""
    calls: float | None = None
    host_self_us: float | None = None
    host_total_us: float | None = None
    device_self_us: float | None = None
    device_total_us: float | None = None


def _add(acc: float | None, value: float | None) -> float | None:
    return acc if value is None else (acc or 0.0) + float(value)


def _merge(rows: Iterable[OperatorStat | OperatorNameStat | _Op], shapes: bool) -> list[_Op]:
    """Rows with the same name (and input shapes, with ``shapes``) summed."""
    merged: dict[tuple[str, str], _Op] = {}
    for row in rows:
        shape = row.input_shapes if shapes and not isinstance(row, OperatorNameStat) else ""
        key = (row.name or "", shape or "")
        acc = merged.get(key)
        if acc is None:
            acc = merged[key] = _Op(name=key[0], input_shapes=key[1])
        acc.calls = _add(acc.calls, row.calls)
        acc.host_self_us = _add(acc.host_self_us, row.host_self_us)
        acc.host_total_us = _add(acc.host_total_us, row.host_total_us)
        acc.device_self_us = _add(acc.device_self_us, row.device_self_us)
        acc.device_total_us = _add(acc.device_total_us, row.device_total_us)
    return list(merged.values())


def _unique_labels(names: Sequence[str]) -> list[str]:
    """Short chart labels, made distinct (two names cut to the same label stay two bars)."""
    out: list[str] = []
    seen: dict[str, int] = {}
    for name in names:
        text = short_label(name)
        seen[text] = seen.get(text, 0) + 1
        out.append(text if seen[text] == 1 else f"{text} #{seen[text]}")
    return out


def _hbar(
    title: str,
    names: Sequence[str],
    series: Sequence[tuple[str, list[float | None]]],
    x_title: str,
    colors: Sequence[str | None] = (),
) -> dict[str, Any]:
    """Horizontal bars, largest first at the top; hover shows the whole name."""
    ys = _unique_labels(names)
    full = [label(n) for n in names]
    data = []
    for i, (name, xs) in enumerate(series):
        trace: dict[str, Any] = {
            "type": "bar",
            "orientation": "h",
            "name": label(name),
            "x": xs,
            "y": ys,
            "hovertext": full,
            "hovertemplate": "%{hovertext}<br>%{x:,.3f} ms<extra>%{fullData.name}</extra>",
        }
        if i < len(colors) and colors[i]:
            trace["marker"] = {"color": colors[i]}
        data.append(trace)
    lay = layout(title, x_title, "")
    lay["yaxis"].update({"autorange": "reversed", "type": "category"})
    lay["height"] = max(300, 60 + 22 * len(ys))
    lay["barmode"] = "group" if len(series) > 1 else "relative"
    return {"data": data, "layout": lay}


# ---------------------------------------------------------------------------------- operators


def _has_device(per_rank: Mapping[int, list[_Op]]) -> bool:
    return any(r.device_self_us is not None for rows in per_rank.values() for r in rows)


def _op_chart(per_rank: Mapping[int, list[_Op]], device: bool, title: str) -> dict[str, Any]:
    def fig(rows: list[_Op], who: str) -> dict[str, Any]:
        top = sorted(
            rows, key=lambda r: -((r.device_self_us if device else r.host_self_us) or 0.0)
        )[:TOP_BARS]
        series = [("host self", [rounded(ms(r.host_self_us)) for r in top])]
        if device:
            series.append(("device self", [rounded(ms(r.device_self_us)) for r in top]))
        hues = (color("host time"), color("device time"))
        return _hbar(f"{title}, {who}", [r.name for r in top], series, "ms", hues)

    summed = _merge((r for rows in per_rank.values() for r in rows), shapes=False)
    all_fig = fig(summed, "all ranks summed" if len(per_rank) > 1 else _who(per_rank))
    by_rank = {rank: fig(rows, f"rank {rank}") for rank, rows in per_rank.items()}
    return figure_spec(all_fig, by_rank if len(per_rank) > 1 else None)


def _who(per_rank: Mapping[int, Any]) -> str:
    return ", ".join(f"rank {r}" for r in per_rank)


def _op_table(
    view: View,
    table_id: str,
    per_rank: Mapping[int, list[_Op]],
    device: bool,
    shapes: bool,
    *,
    hidden: bool = False,
) -> None:
    cols = [Col("rank", digits=0), Col("operator", num=False)]
    if shapes:
        cols.append(Col("input shapes", num=False))
    cols += [Col("calls", digits=0), Col("host self ms", digits=3), Col("host total ms", digits=3)]
    if device:
        cols += [Col("device self ms", digits=3), Col("device total ms", digits=3)]
    rows = []
    for rank, items in per_rank.items():
        for r in items:
            row: list[Any] = [rank, cell(r.name)]
            if shapes:
                row.append(cell(r.input_shapes))
            row += [r.calls, rounded(ms(r.host_self_us)), rounded(ms(r.host_total_us))]
            if device:
                row += [rounded(ms(r.device_self_us)), rounded(ms(r.device_total_us))]
            rows.append(row)
    first_time = 4 if shapes else 3
    sort_col = first_time + 2 if device else first_time
    view.table(table_id, cols, rows, sort=(sort_col, "desc"), group="operators", hidden=hidden)


Dropped = Callable[[RankTraceSummary], tuple[float, float, float] | None]
"""What a summary's bounded list left out: (groups or names, calls, µs), None when it says
nothing."""


def _ops_dropped(by_name: bool) -> Dropped:
    def pick(s: RankTraceSummary) -> tuple[float, float, float] | None:
        d = s.operators_by_name_dropped if by_name else s.operators_dropped
        return None if d is None else (d.groups, d.calls, d.host_self_us)

    return pick


def _kernels_dropped(s: RankTraceSummary) -> tuple[float, float, float] | None:
    d = s.kernels_dropped
    return None if d is None else (d.names, d.calls, d.total_us)


def _dropped_note(ctx: Context, dropped: Dropped, what: str, time_what: str = "") -> str:
    """What a bounded list left out, per rank."""
    parts = []
    for rank, summaries in ctx.summaries.items():
        n = calls = us = 0.0
        for s in summaries:
            d = dropped(s)
            if d is not None:
                n += d[0]
                calls += d[1]
                us += d[2]
        if n:
            parts.append(
                f"rank {rank}: {n:,.0f} more ({calls:,.0f} calls, {us / 1000.0:,.3f} ms{time_what})"
            )
    return f"Not listed, {what}: " + "; ".join(parts) + "." if parts else ""


def _unattributed_note(ctx: Context) -> str:
    parts = []
    for rank, summaries in ctx.summaries.items():
        known = [
            s.operators_device_unattributed_us
            for s in summaries
            if s.operators_device_unattributed_us is not None
        ]
        if known and sum(known) > 0:
            parts.append(f"rank {rank}: {sum(known) / 1000.0:,.3f} ms")
    if not parts:
        return ""
    return (
        "Device time launched from no host operator (or with no launch in the trace), in no "
        "row: " + "; ".join(parts) + "."
    )


def _operators(s: RankTraceSummary) -> list[OperatorStat]:
    return s.operators


def _operators_by_name(s: RankTraceSummary) -> list[OperatorNameStat]:
    return s.operators_by_name


def operators_view(ctx: Context) -> View:
    """Host and device self/total time and calls per operator, by name or by input shape."""
    view = View("operators", "Operators")
    by_shape = {r: _merge(rows, shapes=True) for r, rows in ctx.items(_operators).items()}
    by_name = {r: _merge(rows, shapes=False) for r, rows in ctx.items(_operators_by_name).items()}
    if not by_name and by_shape:
        by_name = {rank: _merge(rows, shapes=False) for rank, rows in by_shape.items()}
    if not by_name:
        view.note(
            "No operator table in this analysis: the run has no trace, or its run.json was "
            "analysed by an older mgprof (re-render it: mgprof report RUN_DIR --format html)."
        )
        return view
    device = _has_device(by_name)
    what = "device self time" if device else "host self time"
    view.chart("ops-top", _op_chart(by_name, device, f"Top operators by {what}"))
    options = [("ops-by-name", "operator name")]
    if by_shape:
        options.append(("ops-by-shape", "operator name and input shapes"))
    view.switch("operators", "group by", options)
    _op_table(view, "ops-by-name", by_name, device, shapes=False)
    if by_shape:
        _op_table(view, "ops-by-shape", by_shape, device, shapes=True, hidden=True)
    if not device:
        view.note(
            "Device time: not applicable (CPU-only traces have no device events); host self = "
            "an operator's time minus the operators nested in it."
        )
    for note in (
        _dropped_note(ctx, _ops_dropped(by_name=True), "smaller operator names", " host self"),
        _dropped_note(ctx, _ops_dropped(by_name=False), "smaller (name, input shapes) groups",
                      " host self"),
        _unattributed_note(ctx),
    ):  # fmt: skip
        if note:
            view.note(note)
    return view


# ------------------------------------------------------------------------------------ kernels


def _compute_us(kernels: Sequence[KernelStat]) -> float | None:
    """A trace file's summed compute-kernel time, from any kernel's total and share of it."""
    for k in kernels:
        if k.pct_of_compute:
            return k.total_us * 100.0 / k.pct_of_compute
    return None


@dataclass
class _Kernel:
    """One kernel name of a rank, summed over its trace files (or over every rank)."""

    name: str
    calls: float = 0.0
    total_us: float = 0.0
    min_us: float | None = None
    max_us: float | None = None
    tensor_core: bool | None = None
    mean_us: float | None = None
    pct: float | None = None


def _kernel_rows(summaries: Sequence[RankTraceSummary]) -> list[_Kernel]:
    """One rank's kernels summed by name over its trace files."""
    merged: dict[str, _Kernel] = {}
    compute = 0.0
    for s in summaries:
        kernels = s.kernels or s.top_kernels  # top_kernels: older run.json
        compute += _compute_us(kernels) or 0.0
        for k in kernels:
            acc = merged.setdefault(k.name, _Kernel(name=k.name))
            acc.calls += float(k.calls or k.count)
            acc.total_us += float(k.total_us)
            lo, hi = k.min_us, k.max_us
            if lo is not None:
                acc.min_us = float(lo) if acc.min_us is None else min(acc.min_us, lo)
            if hi is not None:
                acc.max_us = float(hi) if acc.max_us is None else max(acc.max_us, hi)
            tc = k.tensor_core or k.kind == "tensor_core"
            acc.tensor_core = bool(acc.tensor_core) or tc
    for acc in merged.values():
        acc.mean_us = acc.total_us / acc.calls if acc.calls else None
        acc.pct = 100.0 * acc.total_us / compute if compute > 0 else None
    return sorted(merged.values(), key=lambda k: -k.total_us)


_TC_COLOR, _OTHER_COLOR = color("tensor cores"), color("other kernels")


def _kernel_fig(rows: list[_Kernel], who: str) -> dict[str, Any]:
    top = rows[:TOP_BARS]
    tc = [rounded(k.total_us / 1000.0) if k.tensor_core else None for k in top]
    other = [None if k.tensor_core else rounded(k.total_us / 1000.0) for k in top]
    series = [("tensor-core kernels", tc), ("other kernels", other)]
    fig = _hbar(
        f"Top kernels by total time, {who}",
        [k.name for k in top],
        series,
        "ms (summed over calls)",
        (_TC_COLOR, _OTHER_COLOR),
    )
    fig["layout"]["barmode"] = "relative"  # one bar per kernel, coloured by class
    return fig


def kernels_view(ctx: Context) -> View:
    """Calls, total/mean/min/max time, tensor-core flag and share of compute per kernel."""
    view = View("kernels", "Kernels")
    per_rank = {rank: rows for rank, s in ctx.summaries.items() if (rows := _kernel_rows(s))}
    if not per_rank:
        view.note(
            "No kernels: CPU-only traces have none (the Operators view has the CPU ops), or "
            "the run has no trace. On a GPU run this view lists every kernel the trace summary "
            "kept."
        )
        return view
    summed: dict[str, _Kernel] = {}
    for rows in per_rank.values():
        for k in rows:
            acc = summed.setdefault(k.name, dataclasses.replace(k, total_us=0.0))
            acc.total_us += k.total_us
    all_rows = sorted(summed.values(), key=lambda k: -k.total_us)
    multi = len(per_rank) > 1
    view.chart(
        "kernels-top",
        figure_spec(
            _kernel_fig(all_rows, "all ranks summed" if multi else _who(per_rank)),
            {rank: _kernel_fig(rows, f"rank {rank}") for rank, rows in per_rank.items()}
            if multi
            else None,
        ),
    )
    cols = [
        Col("rank", digits=0),
        Col("kernel", num=False),
        Col("calls", digits=0),
        Col("total ms", digits=3),
        Col("mean µs", digits=1),
        Col("min µs", digits=1),
        Col("max µs", digits=1),
        Col("tensor cores", num=False),
        Col("% of compute", digits=1),
    ]
    flag = {True: "yes", False: "no", None: "n/a"}
    table = [
        [
            rank,
            cell(k.name),
            k.calls,
            rounded(k.total_us / 1000.0),
            rounded(k.mean_us, 2),
            rounded(k.min_us, 2),
            rounded(k.max_us, 2),
            flag[k.tensor_core],
            rounded(k.pct, 2),
        ]
        for rank, items in per_rank.items()
        for k in items
    ]
    # the shared "Top kernels" section's place (its title and anchor), with this table in it:
    # every kernel the trace summary kept, sortable, so the page shows one kernel table
    view.html(f'<section id="{anchor(TOP_KERNELS_TITLE)}"><h2>{TOP_KERNELS_TITLE}</h2>')
    view.table("kernels-table", cols, table, sort=(3, "desc"))
    dropped = _dropped_note(ctx, _kernels_dropped, "smaller kernels")
    if dropped:
        view.note(dropped)
    view.note(
        "% of compute: the kernel's summed time / all compute kernels' summed time on that rank "
        "(communication kernels excluded). Tensor cores: classified from the kernel name or its "
        "GEMM's input dtype."
    )
    view.html("</section>")
    return view
