"""Small, pure summary statistics used by the run analysis.

Kept free of numpy so ``mgprof report`` runs anywhere; the percentile follows numpy's default
(``method="linear"``) exactly, so a figure can be checked with ``numpy.percentile``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Protocol


class _Ordered(Protocol):
    """A sorted list or 1-d numpy array: what :func:`percentile_of_sorted` indexes."""

    def __len__(self) -> int: ...

    def __getitem__(self, i: int, /) -> float: ...


def mean(values: Iterable[float]) -> float:
    """Arithmetic mean; ``ValueError`` on no values (a silent 0 would be a made-up number)."""
    total = 0.0
    count = 0
    for value in values:
        total += value
        count += 1
    if count == 0:
        raise ValueError("mean of no values")
    return total / count


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) by linear interpolation between closest ranks.

    Definition (numpy's default ``linear`` method, Hyndman & Fan type 7): sort the n values
    ``x[0] <= ... <= x[n-1]``, take the position ``h = (n - 1) * q / 100`` and return
    ``x[floor(h)] + (h - floor(h)) * (x[floor(h) + 1] - x[floor(h)])``.
    """
    if not values:
        raise ValueError("percentile of no values")
    return percentile_of_sorted(sorted(values), q)


def percentile_of_sorted(ordered: _Ordered, q: float) -> float:
    """:func:`percentile` of values already in ascending order (a list or a numpy array).

    Computed in numpy's own floating-point steps (``h = (n - 1) * (q / 100)`` and its
    two-sided interpolation), so on finite values the result equals ``numpy.percentile`` bit
    for bit (up to the sign of a zero result; numpy also propagates a NaN, this does not); a
    caller with a sorted array gets that without ``numpy.percentile``, whose first call
    imports numpy.ma (~10 ms of a command's start).
    """
    n = len(ordered)
    if n == 0:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 100.0 or math.isnan(q):
        raise ValueError(f"percentile q must be within 0..100, got {q}")
    frac = q / 100.0
    h = (n - 1) * frac
    lo = min(math.floor(h), n - 1)
    hi = min(lo + 1, n - 1)
    t = h - lo
    below, above = float(ordered[lo]), float(ordered[hi])
    diff = above - below
    return above - diff * (1.0 - t) if t >= 0.5 else below + diff * t


def ratio_pct(part: float, whole: float) -> float | None:
    """``100 * part / whole``, or None when ``whole`` is not positive (no meaningful share)."""
    if whole <= 0.0:
        return None
    return 100.0 * part / whole


def spread_pct(values: Sequence[float]) -> float | None:
    """How much larger the largest value is than the smallest, in percent of the smallest.

    Used for the step-time spread across ranks: 100 * (max - min) / min. None for fewer than two
    values or a non-positive minimum.
    """
    if len(values) < 2:
        return None
    low = min(values)
    if low <= 0.0:
        return None
    return 100.0 * (max(values) - low) / low
