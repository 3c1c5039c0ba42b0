"""The GPU idle section: why the device waited (HTA's idle breakdown) and launch delay.

"Busy 40 %" invites the question of what the other 60 % was. The trace summaries answer it per
rank: idle gaps where the GPU waited for the host to enqueue work (host wait), the fixed cost
between back-to-back kernels (kernel wait), and the rest (synchronisation, other streams); and
how long launched work sat in the queue (launch delay). A short queue with much host wait means
the host is the bottleneck (Python overhead, ``.item()`` syncs, data loading).
"""

from __future__ import annotations

from mgprof.analyze.run.schema import RunAnalysis
from mgprof.report.run.section_model import Section, Table, cpu_only, fixed, ms_from_us

COLUMNS = [
    "rank",
    "idle %",
    "host wait ms",
    "kernel wait ms",
    "other ms",
    "launch delay p50 ms",
    "launch delay p95 ms",
]


def _ms(value: float | None) -> str:
    return ms_from_us(value) if value is not None else "n/a"


def _rank_rows(analysis: RunAnalysis) -> list[list[str]]:
    rows = []
    traces = analysis.traces.ranks
    for key in sorted(traces, key=lambda k: (len(k), k)):
        for s in traces[key]:
            idle, delay = s.idle, s.launch_delay
            if idle is None and delay is None:
                continue
            idle_pct = s.totals.idle_pct
            rows.append(
                [
                    key,
                    fixed(1)(idle_pct) if idle_pct is not None else "n/a",
                    _ms(idle.host_wait_us if idle else None),
                    _ms(idle.kernel_wait_us if idle else None),
                    _ms(idle.other_us if idle else None),
                    _ms(delay.p50_us if delay else None),
                    _ms(delay.p95_us if delay else None),
                ]
            )
    return rows


def idle_section(analysis: RunAnalysis) -> Section | None:
    """None when no trace has the breakdown (no trace, or one from an older mgprof)."""
    sec = Section("GPU idle & launch delay")
    if cpu_only(analysis):
        sec.brief = "GPU traces only (idle gaps between kernels and their launch delay)"
        return sec
    rows = _rank_rows(analysis)
    if not rows:
        return None
    sec.tables.append(Table(list(COLUMNS), rows=rows))
    sec.notes.append(
        "Idle gaps per stream by cause (HTA's definitions): host wait = the GPU waited for the "
        "host to launch; kernel wait = the fixed gap between back-to-back kernels; other = "
        "synchronisation and the rest. Launch delay = how long launched work queued. Much host "
        "wait with a short launch delay: the host is the bottleneck."
    )
    return sec
