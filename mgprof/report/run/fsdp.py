"""FSDP2 communication by unit and phase as one small table (unit | phase | count | comm ms |
exposed ms | bus GB/s) and the lines under it; shared by the run report's Communication section
and ``mgprof trace``."""

from __future__ import annotations

from collections.abc import Callable

from mgprof.analyze.run.schema import RunAnalysis
from mgprof.analyze.trace.fsdp import FsdpComm, FsdpRow
from mgprof.report.run.section_model import Footnotes, Table

COLUMNS = ["unit", "phase", "count", "comm ms", "exposed ms", "bus GB/s"]
GROUP_COLUMNS = ["unit", "phase", "group", "count", "comm ms", "exposed ms", "bus GB/s"]
PHASE_LABELS = {
    "forward_all_gather": "fwd all-gather",
    "backward_all_gather": "bwd all-gather",
    "post_backward_reduce_scatter": "post-bwd reduce-scatter",
}

NotApplicable = Callable[[str, str], str]
"""(figure, reason) -> the cell shown for a figure that is None."""


def phase_label(row: FsdpRow) -> str:
    return PHASE_LABELS.get(row.phase, f"other {row.type}")


def _ms(v: float | None) -> str | None:
    return None if v is None else f"{v / 1000.0:,.2f}"


def _gbps(v: float) -> str:
    """Two decimals, or two significant digits below 0.1 (a CPU run's 0.0016 is not 0.00)."""
    return f"{v:,.2f}" if v >= 0.1 or v == 0 else f"{v:.2g}"


def _group(row: FsdpRow) -> str:
    if row.group is None:
        return "?"
    return row.group + (f" (n={row.group_size})" if row.group_size is not None else "")


def several_groups(f: FsdpComm) -> bool:
    """The rows name more than one process group (HSDP, 2-D meshes): the table shows which."""
    return len({r.group for r in f.rows}) > 1


def rows(f: FsdpComm, na: NotApplicable) -> list[list[str]]:
    """The table's rows, formatted; ``na`` gives the cell of a figure that is None."""
    out = []
    for r in f.rows:
        why = r.not_applicable or "not computed"
        comm, exposed = _ms(r.comm_us), _ms(r.exposed_us)
        bw = _gbps(r.busbw_gbps) if r.busbw_gbps is not None else na("FSDP bus GB/s", why)
        cells = [
            r.unit,
            phase_label(r),
            *([_group(r)] if several_groups(f) else []),
            str(r.count),
            comm if comm is not None else na("FSDP comm ms", why),
            exposed if exposed is not None else na("FSDP exposed ms", why),
            bw,
        ]
        out.append(cells)
    return out


def lines(f: FsdpComm) -> list[str]:
    """What the table leaves out: the first all-gather, calls outside FSDP spans, the total."""
    out = []
    first = f.first_all_gather
    if first is not None:
        figures = f"{first.calls} call{'s' if first.calls != 1 else ''}"
        if first.comm_us is not None and first.exposed_us is not None:
            figures += (
                f", {first.exposed_us / 1000:,.2f} ms exposed of {first.comm_us / 1000:,.2f} ms"
            )
        out.append(
            f"First all-gather ({first.unit}, forward): nothing to overlap with, each step "
            f"starts by waiting for it ({figures})."
        )
    if f.outside_calls:
        ms = _ms(f.outside_comm_us)
        out.append(
            f"Outside FSDP spans: {f.outside_calls} collective call(s)"
            + (f", {ms} ms" if ms is not None else "")
            + "."
        )
    total, exposed = _ms(f.comm_us), _ms(f.exposed_us)
    if total is not None and exposed is not None:
        whole = (
            "with the calls outside FSDP spans, the rank's communication time"
            if f.outside_calls
            else "all of the rank's communication time"
        )
        out.append(
            f"FSDP collectives: {total} ms, {exposed} ms exposed: {whole} (an instant two calls "
            "share counts once, for the call that started first)."
        )
    for g in f.groups:
        if several_groups(f) and g.ranks is not None:
            desc = f" {g.description}" if g.description else ""
            out.append(f"Group {g.name}{desc}: ranks {', '.join(map(str, g.ranks))}.")
    return out


def _first_fsdp(analysis: RunAnalysis) -> tuple[int, FsdpComm] | None:
    """The lowest rank whose trace has FSDP figures (FSDP ranks run the same units)."""
    ranks = []
    for key, summaries in analysis.traces.ranks.items():
        try:
            rank = int(key)
        except ValueError:
            continue
        found = next((s.fsdp for s in summaries if s.fsdp is not None), None)
        if found is not None:
            ranks.append((rank, found))
    return min(ranks, key=lambda x: x[0]) if ranks else None


def fsdp_table(analysis: RunAnalysis, notes: Footnotes) -> tuple[Table, list[str]] | None:
    """The run report's FSDP table (the lowest rank with FSDP figures) and its notes; None for
    a run without FSDP2 traces."""
    found = _first_fsdp(analysis)
    if found is None:
        return None
    rank, f = found
    table = Table(
        list(GROUP_COLUMNS if several_groups(f) else COLUMNS),
        numeric_from=3 if several_groups(f) else 2,
    )
    table.rows = rows(f, lambda figure, why: notes.mark(figure, why, f"rank {rank}"))
    head = (
        f"FSDP2 by unit and phase (the last table; rank {rank}, mgprof trace shows each rank): "
        "each collective is counted where FSDP issued it; comm ms are shares of the rank's "
        "comm ms above, exposed ms the part no compute covered."
    )
    return table, [head, *lines(f)]
