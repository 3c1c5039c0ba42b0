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


def t_quantile(q: float, df: float) -> float:
    """The ``q`` quantile of Student's t with ``df`` degrees of freedom: exact for df <= 2
    (closed forms; fractional df rounded down, which widens), else the Cornish-Fisher
    expansion around the normal quantile (within 1 % of the exact value from df = 3). The
    standard library has no t distribution."""
    from statistics import NormalDist

    z = NormalDist().inv_cdf(q)
    if not math.isfinite(df) or df > 1e6:
        return z
    if df < 2:
        return math.tan(math.pi * (q - 0.5))
    if df < 3:
        return (2 * q - 1) / math.sqrt(2 * q * (1 - q))
    d = df
    return (
        z
        + (z**3 + z) / (4 * d)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * d**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * d**3)
    )


def mean_difference_halfwidth(
    a: Sequence[float], b: Sequence[float], confidence: float = 0.95
) -> float | None:
    """Half-width of the ``confidence`` interval of mean(a) - mean(b) for independent samples
    (Welch: its standard error and its degrees of freedom, Student's t); None with fewer than
    two values on a side. A difference of means inside it is within the samples' own noise."""
    if len(a) < 2 or len(b) < 2:
        return None

    def var(x: Sequence[float]) -> float:
        m = sum(x) / len(x)
        return sum((v - m) ** 2 for v in x) / (len(x) - 1)

    va, vb = var(a) / len(a), var(b) / len(b)
    se2 = va + vb
    if se2 <= 0.0:
        return 0.0
    df = se2**2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    return t_quantile(1.0 - (1.0 - confidence) / 2.0, df) * math.sqrt(se2)


def binomial_upper_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p): how often chance alone gives ``k`` or more successes
    in ``n`` tries (summed in log space, so thousands of tries neither overflow nor underflow)."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    if p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    log_p, log_q = math.log(p), math.log1p(-p)
    terms = [
        math.lgamma(n + 1)
        - math.lgamma(i + 1)
        - math.lgamma(n - i + 1)
        + i * log_p
        + (n - i) * log_q
        for i in range(k, n + 1)
    ]
    top = max(terms)
    return min(1.0, math.exp(top) * sum(math.exp(t - top) for t in terms))
