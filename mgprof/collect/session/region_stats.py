"""Per-region duration statistics kept while training runs: count, total, extremes, quantiles.

Quantiles need durations, and a region entered every step of a long run must not grow memory
without bound, so each region keeps its first ``KEPT`` durations and then a uniform reservoir
sample of that size (Vitter's algorithm R, seeded so two runs of one script keep the same
sample). Count, total, min and max stay exact.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from mgprof.records import RegionRecord

KEPT = 4096
"""Durations kept per region for its p50/p95."""


@dataclass
class _Stat:
    count: int = 0
    total_ms: float = 0.0
    min_ms: float = float("inf")
    max_ms: float = 0.0
    kept: list[float] = field(default_factory=list)


class RegionStats:
    """Durations of ``mgprof.region`` blocks keyed by their nesting path."""

    def __init__(self, kept: int = KEPT) -> None:
        self._kept = kept
        self._stats: dict[tuple[str, ...], _Stat] = {}
        self._rng = random.Random(0)

    def add(self, path: tuple[str, ...], ms: float) -> None:
        s = self._stats.get(path)
        if s is None:
            s = self._stats[path] = _Stat()
        s.count += 1
        s.total_ms += ms
        s.min_ms = min(s.min_ms, ms)
        s.max_ms = max(s.max_ms, ms)
        if len(s.kept) < self._kept:
            s.kept.append(ms)
        else:
            j = self._rng.randrange(s.count)
            if j < self._kept:
                s.kept[j] = ms

    def records(self) -> list[RegionRecord]:
        """One record per path, parents before their children (sorted by path)."""
        out = []
        for path, s in sorted(self._stats.items()):
            ordered = sorted(s.kept)
            out.append(
                RegionRecord(
                    name=path[-1],
                    count=s.count,
                    total_ms=round(s.total_ms, 6),
                    max_ms=round(s.max_ms, 6),
                    path=list(path),
                    min_ms=round(s.min_ms, 6),
                    p50_ms=round(_quantile(ordered, 0.50), 6),
                    p95_ms=round(_quantile(ordered, 0.95), 6),
                )
            )
        return out


def _quantile(ordered: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), on sorted values."""
    pos = (len(ordered) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)
