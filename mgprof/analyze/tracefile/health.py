"""The health block of one rank's trace: what the trace gave the analysis to work with.

Part of :class:`mgprof.analyze.trace.summary.RankTraceSummary` (its ``health`` field).
"""

from __future__ import annotations

import msgspec
import numpy as np

from mgprof.analyze.tracefile.load import KIND_COMM, RankTrace

__all__ = ["TraceHealth", "trace_health"]


class TraceHealth(msgspec.Struct):
    """What the trace gave the analysis to work with: read this before trusting a figure.

    A figure whose inputs are missing here is null with its reason in ``not_applicable``.
    """

    steps_found: int
    rank_found: bool
    rank_source: str
    comm_kernels: int
    """Device events classified as communication (names matching nccl/rccl, any case)."""
    host_collectives: int
    """``gloo:*`` / ``nccl:*`` CPU ops."""
    device_events_without_launch: int
    """Device events whose correlation matches no runtime/driver call in the trace."""
    graph_launches: int
    unknown_categories: dict[str, int]
    events_dropped: int
    """Device events with a missing, negative or out-of-range ``ts``/``dur``, left out of every
    figure (out-of-range host events are named in ``notes``)."""
    notes: list[str]


def trace_health(rt: RankTrace) -> TraceHealth:
    """The health block of one rank's trace (see ``TraceHealth``)."""
    corr = rt.dev_corr
    if corr.size and rt.launch_corr.size:
        launched = np.isin(corr, rt.launch_corr)
        orphans = int(np.count_nonzero(~launched))
    else:
        orphans = int(corr.size)
    notes = list(rt.notes)
    if rt.has_device_events and not rt.steps:
        notes.append("no ProfilerStep#N spans: no per-step figures")
    if rt.has_device_events and rt.launch_corr.size == 0:
        notes.append("no runtime/driver launches: device events cannot be given to steps")
    if rt.graph_launches:
        notes.append(
            f"{rt.graph_launches} CUDA graph launches: their kernels share one launch, so "
            "per-step attribution counts each graph replay's kernels in the replay's step"
        )
    if rt.unknown_categories:
        cats = ", ".join(f"{c or '(none)'} ({n})" for c, n in sorted(rt.unknown_categories.items()))
        notes.append(f"event categories mgprof does not know, counted as host events: {cats}")
    return TraceHealth(
        steps_found=len(rt.steps),
        rank_found=rt.rank is not None,
        rank_source=rt.rank_source,
        comm_kernels=int(np.count_nonzero(rt.dev_kind == KIND_COMM)),
        host_collectives=len(rt.cpu_comm_ops),
        device_events_without_launch=orphans,
        graph_launches=rt.graph_launches,
        unknown_categories=dict(rt.unknown_categories),
        events_dropped=rt.skipped_device_events,
        notes=notes,
    )
