"""Trace-window totals and per-step figures, exactly as DESIGN.md "Metric definitions" says.

GPU trace (at least one device event):
  window = first device event start … last device event end; busy = |all device events|;
  compute = |compute kernels|; comm = |communication kernels|; overlap = |compute ∩ comm|;
  host-side gloo collectives (DDP over gloo on a CUDA job) count as communication and as busy
  time, and extend the window;
  memcpy = |memcpy ∪ memset|; data loader = |enumerate(DataLoader) spans ∩ window|.
CPU-only trace (no device events):
  window W = ∪ ProfilerStep#N spans (first … last complete CPU event when there are none);
  compute = |main-thread operator events (cat cpu_op) other than comm ops, ∩ W| (annotation
  spans are containers, not compute; clipped to W as well, so that no figure can exceed the
  window); comm = |gloo:* events ∩ W| (nccl:* CPU ops are launches: counts and sizes only);
  busy = |(compute ∪ comm) ∩ W|; overlap = compute + comm − busy (= |compute ∩ comm|).
Per step, the same rules apply inside each ProfilerStep#N: on a GPU trace a device event belongs
to the step whose CPU-side launch (runtime call with the same ``correlation``) lies in the span.
"""

from __future__ import annotations

import msgspec
import numpy as np

from mgprof.analyze import intervals as iv
from mgprof.analyze.intervals import FloatArray
from mgprof.analyze.tracefile.load import (
    KIND_COMM,
    KIND_COMPUTE,
    KIND_MEMCPY,
    KIND_MEMSET,
    RankTrace,
)

__all__ = [
    "Breakdown",
    "CpuSpans",
    "cpu_breakdown",
    "cpu_spans",
    "cpu_window",
    "device_step_index",
    "gpu_breakdown",
    "host_collectives",
]


class Breakdown(msgspec.Struct, frozen=True):
    """Absolute figures in microseconds; ``memcpy_us`` is None on CPU-only traces."""

    window_us: float
    busy_us: float
    compute_us: float
    comm_us: float
    overlap_us: float
    memcpy_us: float | None
    dataloader_us: float | None
    window_start_us: float
    window_end_us: float

    @property
    def idle_us(self) -> float:
        return max(0.0, self.window_us - self.busy_us)

    @property
    def exposed_comm_us(self) -> float:
        return max(0.0, self.comm_us - self.overlap_us)


def _sel(rt: RankTrace, rows: np.ndarray) -> tuple[FloatArray, FloatArray]:
    return rt.dev_start[rows], rt.dev_end[rows]


def host_collectives(rt: RankTrace) -> tuple[FloatArray, FloatArray]:
    """The ``gloo:*`` CPU events of a trace that also has device events.

    DDP over gloo on a CUDA job (or ``cpu:gloo,cuda:nccl``) moves gradients on the host: these
    events are that job's communication, and a GPU trace that ignored them read comm 0. The
    ``nccl:*`` CPU ops are not included: they launch the NCCL kernels, which are counted.
    """
    ops = [op for op in rt.cpu_comm_ops if op.name.startswith("gloo:")]
    return iv.as_array([op.start for op in ops]), iv.as_array([op.end for op in ops])


def gpu_breakdown(
    rt: RankTrace,
    rows: np.ndarray | None = None,
    host_span: tuple[float, float] | None = None,
    not_before: float | None = None,
    gloo: tuple[FloatArray, FloatArray] | None = None,
) -> Breakdown | None:
    """DESIGN.md GPU rules over all device events, or over the selection ``rows`` (a boolean
    mask, or ascending row numbers: a step passes its own rows, so that a trace of many steps
    is not scanned whole once per step).

    Host-side gloo collectives (:func:`host_collectives`) count as communication and extend
    the window (the device events alone would start after, or end before, them). For a step:
    only the gloo part inside ``host_span`` (its CPU span) counts, its data loading is the
    DataLoader time inside that CPU span (a step's loading runs before its kernels), and
    ``not_before`` (where the previous step's window ended) clips every device interval, so
    step windows never overlap and no time is counted in two steps. ``gloo`` is
    :func:`host_collectives`, when the caller has it already.
    """
    if rows is None:
        sel = np.arange(rt.dev_start.size)
    elif rows.dtype == bool:
        sel = np.flatnonzero(rows)
    else:
        sel = rows
    if gloo is None:
        gloo = host_collectives(rt)
    if host_span is not None and gloo[0].size:
        gloo = iv.clip(*gloo, *host_span)
    floor = -np.inf if not_before is None else not_before

    def pick(rows: np.ndarray) -> tuple[FloatArray, FloatArray]:
        s, e = _sel(rt, rows)
        return iv.clip(s, e, floor, np.inf) if not_before is not None else (s, e)

    if not_before is not None and gloo[0].size:
        gloo = iv.clip(*gloo, floor, np.inf)
    kind = rt.dev_kind[sel]
    every = pick(sel)
    start = np.concatenate((every[0], gloo[0]))
    end = np.concatenate((every[1], gloo[1]))
    if start.size == 0:
        return None
    lo, hi = float(start.min()), float(end.max())
    compute = pick(sel[kind == KIND_COMPUTE])
    kernels = pick(sel[kind == KIND_COMM])
    comm = (np.concatenate((kernels[0], gloo[0])), np.concatenate((kernels[1], gloo[1])))
    memory = pick(sel[(kind == KIND_MEMCPY) | (kind == KIND_MEMSET)])
    dl: float | None = None
    if rt.dataloader[0].size:
        span = host_span if host_span is not None else (lo, hi)
        dl = iv.union_length(*iv.clip(*rt.dataloader, *span))
    return Breakdown(
        window_us=hi - lo,
        busy_us=iv.union_length(start, end),
        compute_us=iv.union_length(*compute),
        comm_us=iv.union_length(*comm),
        overlap_us=iv.intersection_length(compute, comm),
        memcpy_us=iv.union_length(*memory),
        dataloader_us=dl,
        window_start_us=lo,
        window_end_us=hi,
    )


def cpu_window(rt: RankTrace) -> tuple[FloatArray, FloatArray]:
    """W: the union of the ProfilerStep spans, else the span of all complete CPU events."""
    if rt.steps:
        return iv.merge(
            iv.as_array([s.start for s in rt.steps]), iv.as_array([s.end for s in rt.steps])
        )
    if rt.cpu_window_all is None:
        empty = np.empty(0, dtype=np.float64)
        return empty, empty
    lo, hi = rt.cpu_window_all
    return iv.as_array([lo]), iv.as_array([hi])


def cpu_comm_intervals(rt: RankTrace) -> tuple[FloatArray, FloatArray]:
    """The ``gloo:*`` CPU events of any thread: the transfers of a CPU-only trace.

    ``nccl:*`` CPU ops are host-side launches of asynchronous GPU collectives; without the
    device events their spans say nothing about the transfer (DESIGN.md), so they give counts
    and sizes (see ``comm.cpu_collective_calls``), never communication time.
    """
    ops = [op for op in rt.cpu_comm_ops if op.name.startswith("gloo:")]
    return iv.as_array([op.start for op in ops]), iv.as_array([op.end for op in ops])


class CpuSpans(msgspec.Struct, frozen=True):
    """A CPU-only trace's compute, comm and DataLoader intervals, each merged once.

    The trace and every one of its steps are measured on the same three unions; merging them
    per step (a sort of every main-thread event per step) made long traces quadratic.
    """

    compute: tuple[FloatArray, FloatArray]
    comm: tuple[FloatArray, FloatArray]
    dataloader: tuple[FloatArray, FloatArray] | None


def cpu_spans(rt: RankTrace) -> CpuSpans:
    """The merged intervals :func:`cpu_breakdown` measures (see :class:`CpuSpans`)."""
    return CpuSpans(
        compute=iv.merge(*rt.main_thread),
        comm=iv.merge(*cpu_comm_intervals(rt)),
        dataloader=iv.merge(*rt.dataloader) if rt.dataloader[0].size else None,
    )


def cpu_breakdown(
    rt: RankTrace, window: tuple[FloatArray, FloatArray], spans: CpuSpans | None = None
) -> Breakdown | None:
    """DESIGN.md CPU-only rules inside the window ``window`` (merged intervals).

    ``spans`` (from :func:`cpu_spans`) is built once and passed for every step of a trace.
    """
    ws, we = iv.merge(*window)
    if ws.size == 0:
        return None
    if spans is None:
        spans = cpu_spans(rt)
    if ws.size == 1:
        lo, hi = float(ws[0]), float(we[0])

        def inside(merged: tuple[FloatArray, FloatArray]) -> tuple[FloatArray, FloatArray]:
            return iv.within(merged, lo, hi)
    else:

        def inside(merged: tuple[FloatArray, FloatArray]) -> tuple[FloatArray, FloatArray]:
            return iv.intersect(merged, (ws, we))

    compute = inside(spans.compute)
    comm = inside(spans.comm)
    # Both helpers return merged intervals: their lengths need no second merge.
    compute_us = iv.merged_length(compute)
    comm_us = iv.merged_length(comm)
    if not comm[0].size:
        busy_us = compute_us
    elif not compute[0].size:
        busy_us = comm_us
    else:
        busy_us = iv.union_length(
            np.concatenate((compute[0], comm[0])), np.concatenate((compute[1], comm[1]))
        )
    dl: float | None = None
    if spans.dataloader is not None:
        dl = iv.merged_length(inside(spans.dataloader))
    return Breakdown(
        window_us=float(np.sum(we - ws)),
        busy_us=busy_us,
        compute_us=compute_us,
        comm_us=comm_us,
        overlap_us=max(0.0, compute_us + comm_us - busy_us),
        memcpy_us=None,
        dataloader_us=dl,
        window_start_us=float(ws[0]),
        window_end_us=float(we[-1]),
    )


def device_step_index(rt: RankTrace) -> np.ndarray:
    """For each device event, the index into ``rt.steps`` of its step, or −1.

    The link is the CUDA/HIP correlation id: the kernel's ``args.correlation`` equals that of the
    runtime call (``cudaLaunchKernel`` …) that launched it, and the step is the ProfilerStep span
    that contains the launch's timestamp. Events with no launch in the trace stay −1.
    """
    out = np.full(rt.dev_start.size, -1, dtype=np.int64)
    if not rt.steps or rt.launch_corr.size == 0 or rt.dev_start.size == 0:
        return out
    pos = np.searchsorted(rt.launch_corr, rt.dev_corr)
    pos_c = np.minimum(pos, rt.launch_corr.size - 1)
    found = (rt.dev_corr >= 0) & (rt.launch_corr[pos_c] == rt.dev_corr)
    launch_ts = rt.launch_ts[pos_c]
    starts = iv.as_array([s.start for s in rt.steps])
    ends = iv.as_array([s.end for s in rt.steps])
    k = np.searchsorted(starts, launch_ts, side="right") - 1
    k_c = np.maximum(k, 0)
    inside = found & (k >= 0) & (launch_ts <= ends[k_c])
    out[inside] = k_c[inside]
    return out
