"""Collectives: per-type time, exposure, bytes and nccl-tests bandwidth; cross-rank waiting.

Definitions (also returned by name in every result):

- A *collective call* on a GPU trace is one communication kernel (name matches nccl/rccl); on a
  CPU-only trace it is one ``gloo:*`` / ``nccl:*`` CPU event. Its type comes from the trace's
  ``Collective name`` arg when present, else from the kernel / op name (``AllReduce`` →
  ``all_reduce``, ``_allgather_base`` → ``all_gather``, ``SendRecv`` → ``send_recv`` …).
- ``exposed_us`` of a call = its duration minus the part of it covered by compute (compute
  kernels on a GPU trace, main-thread compute on a CPU-only trace).
- ``bytes`` of a call = max(In msg nelems, Out msg nelems) × dtype size, the buffer size
  nccl-tests uses (the full output of an all-gather, the full input of a reduce-scatter); when
  the kernel has no such args, the ``Input Dims`` × ``Input type`` of the ``nccl:*`` CPU op that
  launched it (× n for an all-gather); on a CPU trace, those of the gloo op. The launching op
  (same ``External id``, else the op around the kernel's CPU-side launch) also names the type.
- ``algbw_gbps`` = bytes / time (GB/s, 1e9), ``busbw_gbps`` = algbw × 2(n−1)/n for all-reduce,
  × (n−1)/n for all-gather, reduce-scatter and all-to-all, × 1 for broadcast, reduce, send/recv
  (nccl-tests PERFORMANCE.md); n = group size from the args or ``distributedInfo.pg_config``.
  Where bytes or n are unknown, the figure is None and ``not_applicable`` says why.
- Cross-rank: calls are matched across ranks by (process group, Seq) when every call has them,
  else by order within each type. For a matched call, ``transfer_us`` = the shortest duration
  over the ranks (the part all ranks spend together, when the last one has arrived) and
  ``wait_us`` on a rank = its duration − transfer_us (time spent waiting for the others). The rank
  with the least wait in a call arrived last; the *slowest rank* is the one that arrives last most
  often (ties: the least total wait). Durations are used, not start times, so host clocks that
  disagree across machines do not matter.

The type names, bus-bandwidth factors and the call/stats records live in
:mod:`mgprof.analyze.trace.comm_types`, the cross-rank matching in
:mod:`mgprof.analyze.trace.cross_rank`;
both are re-exported here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import numpy as np

from mgprof.analyze import intervals as iv
from mgprof.analyze.intervals import FloatArray
from mgprof.analyze.trace.comm_types import (
    CollectiveCall,
    CollectiveStats,
    busbw_factor,
    collective_type,
    has_busbw,
)
from mgprof.analyze.trace.cross_rank import (
    CrossRankCollective,
    CrossRankSummary,
    RankWait,
    cross_rank,
)
from mgprof.analyze.tracefile.load import KIND_COMM, KIND_COMPUTE, CommArgs, RankTrace, dtype_bytes
from mgprof.analyze.tracefile.rank_trace import CpuCommOp

_T = TypeVar("_T")

__all__ = [
    "CollectiveCall",
    "CollectiveStats",
    "CrossRankCollective",
    "CrossRankSummary",
    "RankWait",
    "busbw_factor",
    "collective_type",
    "cpu_collective_calls",
    "cross_rank",
    "gpu_collective_calls",
    "summarize_collectives",
]


def _group_size(rt: RankTrace, ca: CommArgs | None) -> int | None:
    if ca is not None and ca.group_size:
        return ca.group_size
    if ca is not None and ca.pg_name is not None and ca.pg_name in rt.pg_sizes:
        return rt.pg_sizes[ca.pg_name]
    sizes = set(rt.pg_sizes.values())
    if (ca is None or ca.pg_name is None) and len(sizes) == 1:
        return sizes.pop()  # every process group of the job has this size, so n is certain
    return None


def _nbytes(ca: CommArgs | None) -> int | None:
    if ca is None:
        return None
    size = dtype_bytes(ca.dtype)
    counts = [c for c in (ca.in_nelems, ca.out_nelems) if c is not None and c >= 0]
    if size is None or not counts:
        return None
    return max(counts) * size


def _enclosing(
    rt: RankTrace, rows: list[int], spans: Sequence[tuple[str, float, float, _T]]
) -> dict[int, _T]:
    """For each device row, the innermost ``(tid, start, end, value)`` span that encloses the
    CPU-side launch of that kernel (the runtime call with the same correlation)."""
    if not rows or not spans or rt.launch_corr.size == 0:
        return {}
    by_tid: dict[str, list[tuple[float, float, _T]]] = {}
    for tid, s, e, value in spans:
        by_tid.setdefault(tid, []).append((s, e, value))
    for found in by_tid.values():
        found.sort(key=lambda x: x[0])
    starts_by_tid = {tid: [s for s, _e, _v in found] for tid, found in by_tid.items()}
    out: dict[int, _T] = {}
    for r in rows:
        corr = int(rt.dev_corr[r])
        i = int(np.searchsorted(rt.launch_corr, corr))
        if corr < 0 or i >= rt.launch_corr.size or rt.launch_corr[i] != corr:
            continue
        ts, tid = float(rt.launch_ts[i]), rt.launch_tid[i]
        found = by_tid.get(tid, [])
        j = int(np.searchsorted(starts_by_tid.get(tid, []), ts, side="right")) - 1
        while j >= 0:  # innermost enclosing span: the latest start whose end covers ts
            s, e, value = found[j]
            if e >= ts:
                out[r] = value
                break
            j -= 1
            if ts - s > 1e7:  # spans are short; stop scanning far back
                break
    return out


def _enclosing_param_comms(rt: RankTrace) -> dict[int, CommArgs]:
    """Args for comm kernels that lack them: the ``record_param_comms`` span around the launch."""
    rows = [r for r in np.flatnonzero(rt.dev_kind == KIND_COMM).tolist() if r not in rt.comm_args]
    return _enclosing(rt, rows, rt.param_comms)


def _nccl_launches(rt: RankTrace) -> dict[int, CpuCommOp]:
    """Per communication-kernel row, the ``nccl:*`` CPU op that launched it: the op with the
    kernel's ``External id`` (Kineto links them so), else the op whose span encloses the
    kernel's CPU-side launch (traces whose kernel ``External id`` is its correlation)."""
    ops = [op for op in rt.cpu_comm_ops if op.name.startswith("nccl:")]
    if not ops:
        return {}
    by_ext = {op.ext: op for op in ops if op.ext is not None}
    rows = np.flatnonzero(rt.dev_kind == KIND_COMM).tolist()
    out: dict[int, CpuCommOp] = {}
    if rt.dev_ext.size:
        for r in rows:
            op = by_ext.get(int(rt.dev_ext[r]))
            if op is not None:
                out[r] = op
    rest = [r for r in rows if r not in out]
    out.update(_enclosing(rt, rest, [(op.tid, op.start, op.end, op) for op in ops]))
    return out


def _launch_bytes(op: CpuCommOp, kind: str, n: int | None) -> int | None:
    """nccl-tests' buffer size from the launching op's ``Input Dims`` × ``Input type``: the
    input, except for all-gather, whose buffer is the gathered output (n × the input)."""
    if op.nbytes is None:
        return None
    if kind == "all_gather":
        return op.nbytes * n if n else None
    return op.nbytes


def gpu_collective_calls(rt: RankTrace) -> list[CollectiveCall]:
    """Every communication kernel as a call, exposure measured against compute kernels."""
    rows = np.flatnonzero(rt.dev_kind == KIND_COMM)
    if rows.size == 0:
        return []
    compute = (
        rt.dev_start[rt.dev_kind == KIND_COMPUTE],
        rt.dev_end[rt.dev_kind == KIND_COMPUTE],
    )
    starts, ends = rt.dev_start[rows], rt.dev_end[rows]
    covered = iv.covered_within(starts, ends, compute)
    extra = _enclosing_param_comms(rt)
    launches = _nccl_launches(rt)
    calls = []
    for k, r in enumerate(rows.tolist()):
        op = launches.get(r)
        ca = rt.comm_args.get(r) or extra.get(r) or (op.comm if op is not None else None)
        name = rt.kernel_names[int(rt.dev_name[r])]
        kind = collective_type(ca.collective) if ca and ca.collective else "other"
        if kind == "other" and op is not None:
            # the CPU op names what was asked for: an all-to-all runs as SendRecv kernels
            kind = collective_type(op.name)
        if kind == "other":
            kind = collective_type(name)
        nbytes = _nbytes(ca)
        if nbytes is None and op is not None:
            nbytes = _launch_bytes(op, kind, _group_size(rt, ca))
        dur = float(ends[k] - starts[k])
        calls.append(
            CollectiveCall(
                type=kind,
                start_us=rt.time_base_us + float(starts[k]),
                dur_us=dur,
                exposed_us=max(0.0, dur - float(covered[k])),
                bytes=nbytes,
                group_size=_group_size(rt, ca),
                pg=ca.pg_name if ca else None,
                seq=ca.seq if ca else None,
            )
        )
    return calls


def cpu_collective_calls(
    rt: RankTrace,
    cover: tuple[FloatArray, FloatArray] | None = None,
    gloo_only: bool = False,
) -> list[CollectiveCall]:
    """Every ``gloo:*`` / ``nccl:*`` CPU event as a call, exposure against main-thread compute
    (or ``cover``: the compute kernels, for gloo collectives in a trace with device events)."""
    ops = [op for op in rt.cpu_comm_ops if not gloo_only or op.name.startswith("gloo:")]
    if not ops:
        return []
    launches_only = not rt.has_device_events
    starts = iv.as_array([op.start for op in ops])
    ends = iv.as_array([op.end for op in ops])
    covered = iv.covered_within(starts, ends, rt.main_thread if cover is None else cover)
    # A gloo op names no process group; n is known only when every group has the same size.
    n = _group_size(rt, None)
    return [
        CollectiveCall(
            type=collective_type(op.name),
            start_us=rt.time_base_us + op.start,
            dur_us=op.end - op.start,
            exposed_us=max(0.0, (op.end - op.start) - float(covered[k])),
            bytes=op.nbytes,
            group_size=n,
            pg=None,
            seq=None,
            launch_only=launches_only and op.name.startswith("nccl:"),
        )
        for k, op in enumerate(ops)
    ]


def type_unions(
    calls: Sequence[CollectiveCall],
    base_us: float,
    window: tuple[FloatArray, FloatArray],
    cover: tuple[FloatArray, FloatArray],
) -> dict[str, tuple[float, float]]:
    """Per collective type: ``(total_us, exposed_us)`` as interval unions inside ``window``.

    Calls of one type can overlap (gloo runs collectives on several threads; NCCL on several
    streams), so summing durations counted shared time twice and could exceed the window (the
    TensorBoard plugin also takes the union per type). ``exposed`` = the union minus its part
    covered by ``cover`` (compute). Times of ``window``/``cover`` are relative to ``base_us``.
    """
    by_type: dict[str, list[CollectiveCall]] = {}
    for c in calls:
        by_type.setdefault(c.type, []).append(c)
    out: dict[str, tuple[float, float]] = {}
    for kind, group in by_type.items():
        group = [c for c in group if not c.launch_only]
        if not group:
            continue
        starts = iv.as_array([c.start_us - base_us for c in group])
        ends = starts + iv.as_array([c.dur_us for c in group])
        inside = iv.intersect((starts, ends), window)
        total = iv.union_length(*inside)
        out[kind] = (total, max(0.0, total - iv.intersection_length(inside, cover)))
    return out


def _sizes(group: Sequence[CollectiveCall]) -> list[tuple[int, int]]:
    counts: dict[int, int] = {}
    for c in group:
        if c.bytes is not None:
            counts[c.bytes] = counts.get(c.bytes, 0) + 1
    return sorted(counts.items(), key=lambda kv: -kv[0])


def summarize_collectives(
    calls: Sequence[CollectiveCall], unions: dict[str, tuple[float, float]] | None = None
) -> list[CollectiveStats]:
    """Per-type totals and bandwidths, largest total time first.

    With ``unions`` (from :func:`type_unions`) a type's total and exposed time are interval
    unions inside the window; without, sums over its calls.
    """
    by_type: dict[str, list[CollectiveCall]] = {}
    for c in calls:
        by_type.setdefault(c.type, []).append(c)
    out = []
    for kind, group in by_type.items():
        if all(c.launch_only for c in group):
            out.append(_launch_only_stats(kind, group))
            continue
        group = [c for c in group if not c.launch_only]
        if unions is not None and kind in unions:
            total, exposed = unions[kind]
        else:
            total = sum(c.dur_us for c in group)
            exposed = sum(c.exposed_us for c in group)
        sizes = {c.group_size for c in group}
        n = sizes.pop() if len(sizes) == 1 else None
        nbytes: int | None = None
        reason: str | None = None
        algbw = busbw = None
        if any(c.bytes is None for c in group):
            reason = "the trace does not record the message size of every call"
        else:
            nbytes = sum(c.bytes or 0 for c in group)
        if reason is None and total <= 0:
            reason = "calls have zero duration"
        if reason is None and nbytes is not None:
            algbw = nbytes / (total * 1e-6) / 1e9
            factor = busbw_factor(kind, n)
            if factor is None:
                if not has_busbw(kind):
                    reason = f"nccl-tests defines no bus bandwidth for {kind}"
                else:
                    reason = "group size unknown (not in the args or distributedInfo.pg_config)"
            else:
                busbw = algbw * factor
        out.append(
            CollectiveStats(
                type=kind,
                count=len(group),
                total_us=total,
                exposed_us=exposed,
                bytes=nbytes,
                group_size=n,
                algbw_gbps=algbw,
                busbw_gbps=busbw,
                not_applicable=reason,
                sizes=_sizes(group),
            )
        )
    out.sort(key=lambda s: -(s.total_us or 0.0))
    return out


LAUNCH_ONLY_REASON = (
    "nccl:* CPU ops in a trace without device events are host-side launches of asynchronous "
    "GPU collectives, not transfers: counts and sizes only, no time or bandwidth (profile with "
    "CUDA activities to see the NCCL kernels)"
)


def _launch_only_stats(kind: str, group: Sequence[CollectiveCall]) -> CollectiveStats:
    sizes = {c.group_size for c in group}
    known = all(c.bytes is not None for c in group)
    return CollectiveStats(
        type=kind,
        count=len(group),
        total_us=None,
        exposed_us=None,
        bytes=sum(c.bytes or 0 for c in group) if known else None,
        group_size=sizes.pop() if len(sizes) == 1 else None,
        algbw_gbps=None,
        busbw_gbps=None,
        not_applicable=LAUNCH_ONLY_REASON,
        sizes=_sizes(group),
    )
