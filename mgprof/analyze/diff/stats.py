"""How sure a change between two runs is: a bootstrap interval and a rank test on step samples.

Both work on the steady-state step times of each run, the only figures of a run that come with
their own scatter. Pure Python (no numpy), seeded, so the same two runs always give the same
interval and a CI job never flips on its own.

- ``bootstrap_ratio``: the 95 % percentile interval of mean(new) / mean(base), resampling each
  run's steps with replacement (Efron's percentile bootstrap). The statistic is a ratio so a
  change in step time, in time per sample and in throughput all come from the same draws. Its
  p-value comes from the same draws (twice the share of ratios on the far side of 1), so "p ≤
  0.05" and "the interval excludes 1" are one statement and can never disagree.
- ``mann_whitney``: the two-sided p-value of the Mann-Whitney U test (Wilcoxon rank sum): exact
  from the distribution of U when there are no ties and the samples are small, else the normal
  approximation with the tie correction. It needs no normality, which step times lack (a long
  right tail from the GC, the data loader or a slow collective).

Neither knows about drift between runs on a shared machine: two runs of the same code can differ
by a few percent for reasons no step inside either shows. ``--fail-on`` limits guard that.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

BOOTSTRAP_SEED = 20261201
CONFIDENCE = 0.95


@dataclass(frozen=True)
class RatioInterval:
    """mean(new) / mean(base), and its percentile bootstrap interval at ``CONFIDENCE``."""

    ratio: float
    low: float
    high: float
    resamples: int
    p_value: float = 1.0
    """Two-sided bootstrap p-value of no change: 2 x the share of resampled ratios on the far
    side of 1 (capped at 1)."""

    @property
    def significant(self) -> bool:
        """No change is outside the interval: p ≤ 1 - CONFIDENCE, by construction."""
        return self.p_value <= 1.0 - CONFIDENCE


def _resamples(n_total: int) -> int:
    """Fewer draws for long runs: the interval's own Monte-Carlo error is ~0.2 pp either way,
    far below what step scatter gives, and a diff of two 10,000-step runs stays under a second."""
    if n_total <= 200:
        return 4000
    if n_total <= 2000:
        return 2000
    return 1000


def bootstrap_ratio(
    base: Sequence[float], new: Sequence[float], seed: int = BOOTSTRAP_SEED
) -> RatioInterval:
    """The ratio of means and its percentile interval; both samples need ≥ 2 values, > 0 mean."""
    if len(base) < 2 or len(new) < 2:
        raise ValueError("a bootstrap interval needs at least two steps on each side")
    mean_base = sum(base) / len(base)
    mean_new = sum(new) / len(new)
    if mean_base <= 0.0:
        raise ValueError("the base run's mean is not positive")
    rng = random.Random(seed)
    draws = _resamples(len(base) + len(new))
    ratios = []
    nb, nn = len(base), len(new)
    for _ in range(draws):
        b = sum(rng.choices(base, k=nb)) / nb
        n = sum(rng.choices(new, k=nn)) / nn
        if b > 0.0:
            ratios.append(n / b)
    ratios.sort()
    tail = (1.0 - CONFIDENCE) / 2.0
    low = ratios[max(0, math.floor(tail * len(ratios)))]
    high = ratios[min(len(ratios) - 1, math.ceil((1.0 - tail) * len(ratios)) - 1)]
    below = sum(1 for r in ratios if r <= 1.0)
    above = sum(1 for r in ratios if r >= 1.0)
    p = min(1.0, 2.0 * min(below, above) / len(ratios)) if ratios else 1.0
    return RatioInterval(
        ratio=mean_new / mean_base, low=low, high=high, resamples=len(ratios), p_value=p
    )


_EXACT_MAX_PRODUCT = 400
"""Exact U distribution up to n1*n2 = 400 (e.g. 20 x 20 steps); past it the normal approximation
is within a few thousandths of the exact p and the table would cost seconds."""


def _ranks(values: Sequence[float]) -> tuple[list[float], float]:
    """Mid-ranks (1-based; tied values share the mean of their ranks) and Σ(t³ - t) over ties."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    ties = 0.0
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        mid = (i + j) / 2.0 + 1.0
        for k in range(i, j + 1):
            ranks[order[k]] = mid
        t = j - i + 1
        ties += t**3 - t
        i = j + 1
    return ranks, ties


def _exact_cdf_counts(n1: int, n2: int) -> list[int]:
    """Number of arrangements giving each U = 0..n1*n2 (no ties), by the usual recursion
    f(u; m, n) = f(u - n; m - 1, n) + f(u; m, n - 1), built one column at a time."""
    # table[n][u] for the current m
    prev = [[1] + [0] * (n1 * n2) for _ in range(n2 + 1)]  # m = 0: only U = 0
    for m in range(1, n1 + 1):
        cur = [[0] * (n1 * n2 + 1) for _ in range(n2 + 1)]
        cur[0][0] = 1
        for n in range(1, n2 + 1):
            for u in range(m * n + 1):
                cur[n][u] = (prev[n][u - n] if u >= n else 0) + cur[n - 1][u]
        prev = cur
    return prev[n2]


def mann_whitney(base: Sequence[float], new: Sequence[float]) -> float | None:
    """Two-sided p-value that the two samples come from one distribution; None with < 2 each."""
    n1, n2 = len(base), len(new)
    if n1 < 2 or n2 < 2:
        return None
    ranks, ties = _ranks([*base, *new])
    r1 = sum(ranks[:n1])
    u1 = r1 - n1 * (n1 + 1) / 2.0
    if ties == 0.0 and n1 * n2 <= _EXACT_MAX_PRODUCT:
        counts = _exact_cdf_counts(n1, n2)
        total = sum(counts)
        u = round(min(u1, n1 * n2 - u1))
        tail = sum(counts[: u + 1]) / total
        return min(1.0, 2.0 * tail)
    n = n1 + n2
    mu = n1 * n2 / 2.0
    var = n1 * n2 / 12.0 * ((n + 1) - ties / (n * (n - 1)))
    if var <= 0.0:
        return 1.0  # every value equal: nothing tells the samples apart
    z = (abs(u1 - mu) - 0.5) / math.sqrt(var)  # continuity correction
    return min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2.0)))
