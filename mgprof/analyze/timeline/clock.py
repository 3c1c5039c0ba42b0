"""Clock alignment across ranks for ``mgprof timeline``: one offset per rank, with its error.

Each rank's trace has its own clock: ranks on different hosts disagree by whatever their clock
sync leaves (NTP: up to milliseconds), and Kineto writes ``ts`` relative to a per-file
``baseTimeNanoseconds``. An offset ``offset_us`` maps a rank's ``ts`` onto the reference rank's
(the lowest rank): ``ts_on_reference = ts + offset_us``.

**Which edge of a collective.** A blocking, symmetric collective (all-reduce, all-gather,
reduce-scatter, all-to-all, barrier) cannot complete on any rank before every rank has
contributed, and it completes on all ranks within about one message latency of each other: the
*end* is the moment the ranks share. The *start* is not: a rank starts when it arrives, and the
spread of arrivals (load imbalance, a slow data loader) is exactly what a timeline is meant to
show, so aligning starts would erase it.

- NCCL (device events): the kernel's end is when the last chunk has arrived and been reduced on
  that GPU; kernels start when their stream reaches them, often long before the peers do (the
  kernel spins). The end is the edge: ends agree to a few µs on NVLink, tens of µs across nodes.
- gloo (host events, CPU-only traces): the ``gloo:*`` op spans the algorithm on the rank's gloo
  thread; it ends when that rank's part of the ring is done. Ends agree less tightly (thread
  wake-ups, a busy CPU can delay one rank's end by milliseconds) but are still the best edge.
  ``nccl:*`` host ops are asynchronous launches, not synchronisation points: never used.
  Point-to-point calls (send/recv) and rooted ones (broadcast, reduce) are not symmetric (a
  sender may finish before its peer starts) and are not used either.

**Estimate.** Calls are matched across ranks by (process group, Seq) when every call has them,
else by order within (step, process group, type). Each matched call gives an end difference
``d = end_ref − end_rank`` and a causal interval: since neither rank can leave the call before
the other entered it, the offset lies in ``[start_ref − end_rank, end_ref − start_rank]``.
Calls matched wrongly (a process group one of the ranks is not in, a sampled trace that lost a
call) have intervals scattered across milliseconds, the true ones share one point; so the
offset is taken from the largest set of calls whose intervals overlap, as the median of their
``d`` with outliers beyond 4 robust standard deviations (1.4826 × MAD) left out, and kept
inside the overlap. ``error_us`` is the largest |d − offset| over the calls used: after
alignment, each of them ends on both ranks within ``error_us``. With fewer than three calls a
spread says nothing, and ``error_us`` is the distance to the far end of the causal interval.
Without any usable call the offset comes from the recorded clock bases (``baseTimeNanoseconds``
differences; 0 where the traces have none), with no error figure: exact on one host, as good as
clock sync across hosts.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import msgspec

__all__ = [
    "METHOD_BASE",
    "METHOD_COLLECTIVES",
    "METHOD_REFERENCE",
    "SYNC_TYPES",
    "Anchor",
    "ClockOffset",
    "align_clocks",
    "estimate_offset",
    "match_anchors",
]

SYNC_TYPES = frozenset({"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "barrier"})
"""Collective types whose end every rank shares (module docstring)."""
METHOD_REFERENCE = "reference"
METHOD_COLLECTIVES = "collectives"
METHOD_BASE = "clock base"
_REJECT_SIGMAS = 4.0
_MAD_TO_SIGMA = 1.4826
_REJECT_FLOOR_US = 1.0
"""Residuals under a microsecond are never outliers (MAD can be 0 on identical ends)."""


class Anchor(NamedTuple):
    """One collective call on one rank: a candidate synchronisation point."""

    kind: str
    """``device`` (a communication kernel) or ``host`` (a ``gloo:*`` op)."""
    type: str
    pg: str | None
    seq: str | None
    step: int | None
    start_us: float
    end_us: float


class ClockOffset(msgspec.Struct):
    """How one rank's timestamps were moved onto the reference rank's clock."""

    rank: int
    offset_us: float
    method: str
    error_us: float | None = None
    calls_matched: int = 0
    calls_used: int = 0
    bounds_us: tuple[float, float] | None = None
    """The causal interval the offset must lie in (module docstring), when calls were used."""
    clock_base_offset_us: float | None = None
    """What the recorded clock bases alone would give, for comparison."""
    note: str | None = None


def _sync(anchors: Sequence[Anchor]) -> list[Anchor]:
    return sorted((a for a in anchors if a.type in SYNC_TYPES), key=lambda a: a.start_us)


def _keyed(anchors: Sequence[Anchor], by_seq: bool) -> dict[tuple[object, ...], Anchor]:
    out: dict[tuple[object, ...], Anchor] = {}
    counters: dict[tuple[object, ...], int] = {}
    for a in anchors:
        if by_seq:
            out.setdefault((a.kind, a.pg or "", a.type, a.seq), a)
            continue
        group = (a.kind, a.step, a.pg or "", a.type)
        k = counters.get(group, 0)
        counters[group] = k + 1
        key = (*group, k)
        out[key] = a
    return out


def match_anchors(
    ref: Sequence[Anchor], other: Sequence[Anchor]
) -> tuple[list[tuple[Anchor, Anchor]], str]:
    """Pairs of the same call on two ranks, and the key they were matched by."""
    a, b = _sync(ref), _sync(other)
    if not a or not b:
        return [], "none"
    by_seq = all(x.seq is not None for x in (*a, *b))
    ka, kb = _keyed(a, by_seq), _keyed(b, by_seq)
    pairs = [(ka[k], kb[k]) for k in ka if k in kb]
    pairs.sort(key=lambda p: p[0].start_us)
    return pairs, "process group + Seq" if by_seq else "order within step and type"


class _Estimate(NamedTuple):
    offset_us: float
    error_us: float
    used: int
    bounds: tuple[float, float]


def _deepest(intervals: Sequence[tuple[float, float]]) -> list[list[int]]:
    """For each region where the most intervals overlap, the indices of those intervals."""
    points = sorted(
        [(lo, 0, i) for i, (lo, _hi) in enumerate(intervals)]
        + [(hi, 1, i) for i, (_lo, hi) in enumerate(intervals)]
    )
    open_now: set[int] = set()
    best = 0
    regions: list[list[int]] = []
    for _x, closing, i in points:
        if closing:
            open_now.discard(i)
            continue
        open_now.add(i)
        if len(open_now) > best:
            best, regions = len(open_now), [sorted(open_now)]
        elif len(open_now) == best:
            regions.append(sorted(open_now))
    return regions


def _mad(values: Sequence[float], center: float) -> float:
    return statistics.median(abs(v - center) for v in values)


def estimate_offset(pairs: Sequence[tuple[Anchor, Anchor]]) -> _Estimate | None:
    """The offset of the second rank of each pair onto the first (module docstring), or None
    when the calls do not agree on one (no two calls' causal intervals overlap)."""
    # a pair whose interval is empty (one rank left before the other entered, whatever the
    # offset) cannot be one call: matched wrongly
    pairs = [(r, o) for r, o in pairs if r.start_us - o.end_us <= r.end_us - o.start_us]
    if not pairs:
        return None
    d = [r.end_us - o.end_us for r, o in pairs]
    intervals = [(r.start_us - o.end_us, r.end_us - o.start_us) for r, o in pairs]
    regions = _deepest(intervals)
    if len(pairs) > 1 and len(regions[0]) < 2:
        return None
    # ties between equally deep regions: the one whose calls' end differences agree best
    chosen = min(
        regions, key=lambda idx: _mad([d[i] for i in idx], statistics.median(d[i] for i in idx))
    )
    lo = max(intervals[i][0] for i in chosen)
    hi = min(intervals[i][1] for i in chosen)
    values = [d[i] for i in chosen]
    center = statistics.median(values)
    limit = max(_REJECT_SIGMAS * _MAD_TO_SIGMA * _mad(values, center), _REJECT_FLOOR_US)
    kept = [v for v in values if abs(v - center) <= limit] or values
    offset = min(max(statistics.median(kept), lo), hi)
    # a spread needs three calls; with fewer, the far end of the causal interval
    spread = len(kept) >= 3
    error = max(abs(v - offset) for v in kept) if spread else max(offset - lo, hi - offset)
    return _Estimate(offset, error, len(kept), (lo, hi))


class RankClock(NamedTuple):
    """What alignment needs of one rank."""

    anchors: Sequence[Anchor]
    base_us: float | None


def align_clocks(ranks: Mapping[int, RankClock]) -> dict[int, ClockOffset]:
    """One offset per rank onto the lowest rank's clock (module docstring)."""
    if not ranks:
        return {}
    ref = min(ranks)
    ref_clock = ranks[ref]
    out = {ref: ClockOffset(rank=ref, offset_us=0.0, method=METHOD_REFERENCE, error_us=0.0)}
    for rank in sorted(ranks):
        if rank == ref:
            continue
        clock = ranks[rank]
        base = (clock.base_us or 0.0) - (ref_clock.base_us or 0.0)
        by_base = ClockOffset(rank=rank, offset_us=base, method=METHOD_BASE)
        if (clock.base_us is None) != (ref_clock.base_us is None):
            by_base.note = "only one of the two traces records baseTimeNanoseconds"
        by_base.clock_base_offset_us = base
        pairs, key = match_anchors(ref_clock.anchors, clock.anchors)
        est = estimate_offset(pairs)
        if est is None:
            by_base.calls_matched = len(pairs)
            if pairs:
                by_base.note = f"{len(pairs)} matched collectives disagree on one offset"
            elif by_base.note is None:
                by_base.note = "no collective matched the reference rank's"
            out[rank] = by_base
            continue
        out[rank] = ClockOffset(
            rank=rank,
            offset_us=est.offset_us,
            method=METHOD_COLLECTIVES,
            error_us=est.error_us,
            calls_matched=len(pairs),
            calls_used=est.used,
            bounds_us=est.bounds,
            clock_base_offset_us=base,
            note=f"matched by {key}",
        )
    return out
