"""Interval arithmetic on ``[start, end)`` spans in microseconds, by sort-and-sweep in numpy.

Every trace figure in mgprof is a length of a union (``|X|`` in DESIGN.md), so overlapping kernels
on several streams are counted once. Lengths of intersections use inclusion-exclusion
(``|A ∩ B| = |A| + |B| − |A ∪ B|``), which is exact and needs only the union routine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import numpy.typing as npt

    FloatArray = npt.NDArray[np.float64]
else:
    FloatArray = np.ndarray  # numpy.typing costs an import on every run; the alias is for mypy

__all__ = [
    "FloatArray",
    "as_array",
    "clip",
    "covered_within",
    "intersect",
    "intersection_length",
    "merge",
    "merged_length",
    "union_length",
    "within",
]


def as_array(values: Sequence[float] | FloatArray) -> FloatArray:
    """Return ``values`` as a float64 array (no copy when it already is one)."""
    return np.asarray(values, dtype=np.float64)


def merge(starts: FloatArray, ends: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Merge intervals into sorted, disjoint ones; empty and reversed intervals are dropped.

    Touching intervals (one ends where the next starts) are merged too: the gap between them is
    zero long, so the union length is the same either way.
    """
    starts = as_array(starts)
    ends = as_array(ends)
    keep = ends > starts
    if not keep.all():
        starts, ends = starts[keep], ends[keep]
    if starts.size == 0:
        return starts, ends
    order = np.argsort(starts, kind="stable")
    s = starts[order]
    e = np.maximum.accumulate(ends[order])
    gap = s[1:] > e[:-1]
    first = np.concatenate(([True], gap))
    last = np.concatenate((gap, [True]))
    return s[first], e[last]


def union_length(starts: FloatArray, ends: FloatArray) -> float:
    """Length of the union of the intervals (``|X|``)."""
    ms, me = merge(starts, ends)
    return float(np.sum(me - ms)) if ms.size else 0.0


def merged_length(merged: tuple[FloatArray, FloatArray]) -> float:
    """:func:`union_length` of intervals that :func:`merge` (or :func:`intersect`,
    :func:`within`) already returned: their summed lengths, without sorting them again."""
    starts, ends = merged
    return float(np.sum(ends - starts)) if starts.size else 0.0


def intersection_length(
    a: tuple[FloatArray, FloatArray], b: tuple[FloatArray, FloatArray]
) -> float:
    """``|∪a ∩ ∪b|`` by inclusion-exclusion; clamped at zero against float rounding."""
    la = union_length(*a)
    lb = union_length(*b)
    lab = union_length(np.concatenate((a[0], b[0])), np.concatenate((a[1], b[1])))
    return max(0.0, la + lb - lab)


def clip(
    starts: FloatArray, ends: FloatArray, lo: float, hi: float
) -> tuple[FloatArray, FloatArray]:
    """Clip intervals to ``[lo, hi]``, dropping those left empty."""
    s = np.clip(as_array(starts), lo, hi)
    e = np.clip(as_array(ends), lo, hi)
    keep = e > s
    return s[keep], e[keep]


def intersect(
    a: tuple[FloatArray, FloatArray], b: tuple[FloatArray, FloatArray]
) -> tuple[FloatArray, FloatArray]:
    """The intervals of ``∪a ∩ ∪b`` (merged, sorted); used to clip to a multi-span window."""
    a_s, a_e = merge(*a)
    b_s, b_e = merge(*b)
    if a_s.size == 0 or b_s.size == 0:
        empty = np.empty(0, dtype=np.float64)
        return empty, empty
    # Each piece of the intersection starts at the later of two starts; pair every interval of
    # ``a`` with the window intervals it can overlap, found by binary search.
    lo = np.searchsorted(b_e, a_s, side="right")
    hi = np.searchsorted(b_s, a_e, side="left")
    counts = np.maximum(hi - lo, 0)
    if counts.sum() == 0:
        empty = np.empty(0, dtype=np.float64)
        return empty, empty
    ai = np.repeat(np.arange(a_s.size), counts)
    offsets = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    bi = np.repeat(lo, counts) + offsets
    s = np.maximum(a_s[ai], b_s[bi])
    e = np.minimum(a_e[ai], b_e[bi])
    keep = e > s
    return merge(s[keep], e[keep])


def within(
    merged: tuple[FloatArray, FloatArray], lo: float, hi: float
) -> tuple[FloatArray, FloatArray]:
    """``intersect(merged, ([lo], [hi]))`` for intervals that :func:`merge` already returned.

    Per-step figures clip the same trace-wide intervals to each step in turn; re-sorting them
    per step made a trace with many steps quadratic. On merged (sorted, disjoint) intervals the
    pieces inside ``[lo, hi]`` are one slice, found by binary search, with its two ends clipped:
    the same values :func:`intersect` returns, in the same order.
    """
    starts, ends = merged
    if not hi > lo:
        empty = np.empty(0, dtype=np.float64)
        return empty, empty
    a = int(np.searchsorted(ends, lo, side="right"))  # first interval ending after lo
    b = int(np.searchsorted(starts, hi, side="left"))  # first interval starting at or after hi
    if b <= a:
        empty = np.empty(0, dtype=np.float64)
        return empty, empty
    return np.maximum(starts[a:b], lo), np.minimum(ends[a:b], hi)


def subtract(
    a: tuple[FloatArray, FloatArray], b: tuple[FloatArray, FloatArray]
) -> tuple[FloatArray, FloatArray]:
    """The intervals of ``∪a \\ ∪b`` (merged, sorted)."""
    a_s, a_e = merge(*a)
    b_s, b_e = merge(*b)
    if a_s.size == 0 or b_s.size == 0:
        return a_s, a_e
    lo = min(float(a_s[0]), float(b_s[0]))
    hi = max(float(a_e[-1]), float(b_e[-1]))
    gaps = (np.concatenate(([lo], b_e)), np.concatenate((b_s, [hi])))
    return intersect((a_s, a_e), gaps)


def covered_within(
    starts: FloatArray, ends: FloatArray, cover: tuple[FloatArray, FloatArray]
) -> FloatArray:
    """For each interval, the length of it that the union ``cover`` covers.

    Uses the cumulative coverage function ``F(t) = |cover ∩ (−∞, t]|``, so the answer per
    interval is ``F(end) − F(start)``; this is how per-collective overlap is measured.
    """
    starts = as_array(starts)
    ends = as_array(ends)
    cs, ce = merge(*cover)
    if cs.size == 0 or starts.size == 0:
        return np.zeros(starts.size, dtype=np.float64)
    cum = np.concatenate(([0.0], np.cumsum(ce - cs)))

    def coverage(t: FloatArray) -> FloatArray:
        i = np.searchsorted(cs, t, side="right")  # intervals starting at or before t
        prev = np.maximum(i - 1, 0)
        partial = np.clip(t - cs[prev], 0.0, ce[prev] - cs[prev])
        return np.where(i > 0, cum[prev] + partial, 0.0)

    return np.maximum(coverage(ends) - coverage(starts), 0.0)
