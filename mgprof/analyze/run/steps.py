"""Step-timer figures of a rank: steady-state steps, step time, throughput, DataLoader wait."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from mgprof.analyze.run.results import StepTimeStats
from mgprof.analyze.stats import mean, percentile, t_quantile
from mgprof.records import RankRecord, RunRecord, StepRecord

_STEADY_STATE_MIN_STEPS = 3


def steady_state_steps(steps: Sequence[StepRecord]) -> list[StepRecord]:
    """All steps but the first (warm-up) when there are at least three; all of them otherwise."""
    ordered = sorted(steps, key=lambda s: s.index)
    if len(ordered) >= _STEADY_STATE_MIN_STEPS:
        return ordered[1:]
    return ordered


def mean_interval(values: Sequence[float]) -> tuple[float, float] | None:
    """The 95 % interval of the mean of ``values`` (Student's t), None with fewer than two."""
    n = len(values)
    if n < 2:
        return None
    m = mean(values)
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1))
    half = t_quantile(0.975, n - 1) * sd / math.sqrt(n)
    return m - half, m + half


def step_time_stats(durations_ms: Sequence[float]) -> StepTimeStats:
    """mean (with its 95 % interval)/p50/p95/min/max of step durations (ms); ``durations_ms``
    must not be empty."""
    interval = mean_interval(durations_ms)
    return StepTimeStats(
        count=len(durations_ms),
        mean=mean(durations_ms),
        p50=percentile(durations_ms, 50.0),
        p95=percentile(durations_ms, 95.0),
        min=min(durations_ms),
        max=max(durations_ms),
        ci95_low=interval[0] if interval else None,
        ci95_high=interval[1] if interval else None,
    )


NO_BATCH_AUTO = (
    "no batch size seen: the trained module's calls had no tensor argument with a leading batch "
    "dimension and no DataLoader yielded the batches"
)
"""Under ``mgprof analyze`` nobody can pass a batch size: say what was looked at instead."""
NO_BATCH_OWN = "no batch sizes recorded (pass batch_size= to prof.step())"


def throughput(
    steps: Sequence[StepRecord], step_form: str | None = None
) -> tuple[float | None, str]:
    """Samples per second over steps with a known batch size, or None and the reason (advice
    the script can follow: an automatic session's steps have no ``prof.step`` to change)."""
    sized = [s for s in steps if s.batch_size is not None]
    if not sized:
        return None, NO_BATCH_AUTO if step_form == "auto" else NO_BATCH_OWN
    seconds = sum(s.duration_ms for s in sized) / 1000.0
    if seconds <= 0.0:
        return None, "the steps with a batch size took no measurable time"
    return sum(s.batch_size or 0 for s in sized) / seconds, ""


def dataloader_totals(rank: RankRecord, steps: Sequence[StepRecord]) -> tuple[float, float]:
    """(sum of DataLoader wait, sum of iteration time) in ms over the steps whose wait was timed.

    A ``with prof.step():`` block starts after the next batch was fetched, so its wait lies
    outside the step and is added to it; in the other forms the wait is part of the step.
    """
    timed = [s for s in steps if s.dataloader_ms is not None]
    wait = sum(s.dataloader_ms or 0.0 for s in timed)
    busy = sum(s.duration_ms for s in timed)
    return wait, busy + wait if rank.step_form == "with" else busy


def usual_batch_sizes(run: RunRecord) -> list[int]:
    """Per rank (that recorded any), its most common batch size over its steady-state steps:
    the batch the rank really trained on, which compare and sweep check against the request."""
    sizes: list[int] = []
    for rank in run.ranks:
        seen = [s.batch_size for s in steady_state_steps(rank.steps) if s.batch_size is not None]
        if seen:
            sizes.append(Counter(seen).most_common(1)[0][0])
    return sizes
