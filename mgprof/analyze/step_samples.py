"""Which steps measure a run, and how sure a throughput ratio between two runs is.

Shared by ``mgprof compare`` (its rows) and ``mgprof sweep`` (its trials). A run is measured on
untraced steady-state steps only. The first step of a run warms up (lazy
init, allocator growth); the profiler's warm-up and active steps carry its overhead, and the step
after the last traced one pays for writing the trace (47.6 ms against 5.7 ms in the DDP
tutorial), so all of them are reported apart and never enter a speedup. A DDP step ends when its
slowest rank is done, so a row's step time at index i is the largest of the ranks' times there.

Each row runs in interleaved rounds (single, ddp, single, ddp, ...) so machine drift touches
every row alike. The interval of a ratio between two rows is a cluster bootstrap: rounds are
drawn with replacement, then steps within each drawn round, so run-to-run variation widens the
interval as much as step-to-step noise does. The draws are seeded: the same measurements give
the same interval, hence the same verdict.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec
import numpy as np

from mgprof.records import RunRecord

BOOTSTRAP_DRAWS = 2000
BOOTSTRAP_SEED = 20261201
CONFIDENCE = 0.95


@dataclass
class RunSteps:
    """The steps of one run (one round of a row) sorted into what measures it and what not."""

    clean_ms: list[float] = field(default_factory=list)
    """Untraced steady-state steps: the slowest rank's time at each step index."""
    traced_ms: list[float] = field(default_factory=list)
    """Steps under the profiler (its warm-up and active steps)."""
    post_trace_ms: list[float] = field(default_factory=list)
    """The step after the last traced one (the trace is written then)."""
    samples_per_step: int | None = None
    """Samples the job trains per step (summed over ranks), as the steps recorded them; None
    when no step recorded a batch."""
    per_rank_batch: list[int] = field(default_factory=list)
    """Each rank's usual batch per step, by rank."""


def _usual(values: Sequence[int]) -> int | None:
    if not values:
        return None
    return Counter(values).most_common(1)[0][0]


def run_steps(run: RunRecord) -> RunSteps:
    """Sort ``run``'s steps (module docstring). Step indices every rank recorded count; the
    first step of the run and the profiler's steps (its warm-up step before the first traced
    one, the traced ones, and the one after) are set apart."""
    out = RunSteps()
    ranks = [r for r in run.ranks if r.steps]
    if not ranks:
        return out
    by_rank = [{s.index: s for s in r.steps} for r in ranks]
    common = sorted(set.intersection(*(set(d) for d in by_rank)))
    traced = sorted({i for d in by_rank for i, s in d.items() if s.traced})
    profiler: set[int] = set(traced)
    post: set[int] = set()
    if traced:
        profiler.add(traced[0] - 1)  # the profiler's warm-up step traces, unrecorded
        post.add(traced[-1] + 1)
    first = common[0] if common else None
    for i in common:
        ms = max(d[i].duration_ms for d in by_rank)
        if i in post:
            out.post_trace_ms.append(ms)
        elif i in profiler:
            if i in traced:
                out.traced_ms.append(ms)
        elif i != first:
            out.clean_ms.append(ms)
    batches = []
    for d in by_rank:
        # the batch is the run's, traced or not: every step after the first says it
        sizes = [s.batch_size for i, s in d.items() if i != first and s.batch_size is not None]
        usual = _usual(sizes or [s.batch_size for s in d.values() if s.batch_size is not None])
        if usual is not None:
            batches.append(usual)
    if len(batches) == len(by_rank):
        out.per_rank_batch = batches
        out.samples_per_step = sum(batches)
    return out


@dataclass
class RowSamples:
    """A row's clean steps per round and what one step trains, for its throughput."""

    rounds: list[list[float]]
    samples_per_step: int | None

    @property
    def pooled(self) -> list[float]:
        return [t for r in self.rounds for t in r]

    def mean_ms(self) -> float | None:
        pooled = self.pooled
        return sum(pooled) / len(pooled) if pooled else None

    def rate(self) -> float | None:
        """Samples per second (steps per second when the batch is unknown)."""
        mean = self.mean_ms()
        if mean is None or mean <= 0:
            return None
        return (self.samples_per_step or 1) * 1000.0 / mean


def _draw_means(row: RowSamples, rng: np.random.Generator, draws: int) -> np.ndarray:
    """``draws`` bootstrap means of the row's step time: rounds, then steps within them."""
    rounds = [np.asarray(r, dtype=float) for r in row.rounds if r]
    if not rounds:
        return np.full(draws, np.nan)
    picks = rng.integers(0, len(rounds), size=(draws, len(rounds)))
    totals = np.zeros(draws)
    counts = np.zeros(draws)
    for slot in range(len(rounds)):
        for k, steps in enumerate(rounds):
            drawn = picks[:, slot] == k
            n = int(drawn.sum())
            if n:
                idx = rng.integers(0, len(steps), size=(n, len(steps)))
                totals[drawn] += steps[idx].sum(axis=1)
                counts[drawn] += len(steps)
    return totals / counts


class Interval(msgspec.Struct, kw_only=True):
    """Throughput of row ``a`` over row ``b`` and its 95 % interval (what a verdict reads)."""

    a: str
    b: str
    ratio: float
    low: float
    high: float

    @property
    def above(self) -> bool:
        """``a`` is measurably faster than ``b``: the whole interval lies above 1."""
        return self.low > 1.0


def rate_intervals(
    rows: dict[str, RowSamples],
    pairs: Sequence[tuple[str, str]],
    draws: int = BOOTSTRAP_DRAWS,
    seed: int = BOOTSTRAP_SEED,
) -> list[Interval]:
    """The interval of rate(a) / rate(b) for each pair whose rows both have a rate."""
    rng = np.random.default_rng(seed)
    means: dict[str, np.ndarray] = {}
    for name in sorted(rows):  # a fixed draw order: the same data gives the same interval
        if rows[name].rate() is not None:
            means[name] = _draw_means(rows[name], rng, draws)
    out = []
    tail = (1.0 - CONFIDENCE) / 2.0
    for a, b in pairs:
        ra, rb = rows[a].rate() if a in rows else None, rows[b].rate() if b in rows else None
        if ra is None or rb is None or a not in means or b not in means:
            continue
        sa = rows[a].samples_per_step or 1
        sb = rows[b].samples_per_step or 1
        ratios = (sa / means[a]) / (sb / means[b])
        ratios = ratios[np.isfinite(ratios)]
        if not len(ratios):
            continue
        low, high = np.quantile(ratios, [tail, 1.0 - tail])
        out.append(Interval(a=a, b=b, ratio=ra / rb, low=float(low), high=float(high)))
    return out
