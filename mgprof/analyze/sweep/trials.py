"""Batch-size sweep records: one trial and each rank's figures, OOM detection, memory model.

Split out of :mod:`mgprof.analyze.sweep.result`, which re-exports every public name here. Once two
trials fit, ``fit_memory`` predicts memory as ``a + b * batch`` (least squares), which the
planner uses to skip sizes predicted not to fit.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Literal

import msgspec

__all__ = [
    "DEFAULT_MARGIN",
    "MemoryModel",
    "RankTrial",
    "Trial",
    "TrialStatus",
    "fit_memory",
    "is_oom_error",
]

DEFAULT_MARGIN = 0.1

TrialStatus = Literal["ok", "oom", "failed", "skipped"]

_OOM_PATTERNS = re.compile(
    r"OutOfMemoryError|out of memory|MemoryError|can't allocate memory|Cannot allocate memory",
    re.IGNORECASE,
)


def is_oom_error(text: str | None) -> bool:
    """True when an error text is an out-of-memory failure (CUDA, CPU allocator or Python).

    Matches ``torch.OutOfMemoryError`` / "CUDA out of memory", Python's ``MemoryError`` and the
    CPU allocator's "can't allocate memory" / errno 12 "Cannot allocate memory".
    """
    return bool(text) and _OOM_PATTERNS.search(text or "") is not None


class _Struct(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    """Keyword-only, tolerant of fields added later (sweep.json is read back by reports)."""


class RankTrial(_Struct):
    """One rank's figures in one trial; None where not measured (reason in ``note``)."""

    rank: int
    step_time_ms: float | None = None
    samples_per_s: float | None = None
    peak_memory_mib: float | None = None
    comm_pct: float | None = None
    exposed_comm_pct: float | None = None
    error: str | None = None


class Trial(_Struct):
    """One batch size tried (or skipped): job figures plus each rank's own.

    ``step_time_ms`` is the mean over the untraced steady-state steps of the slowest rank's time
    at each step (DDP steps in lock-step, so the slowest rank sets the pace); ``samples_per_s``
    the job's samples per step (``global_batch``) over it, ``samples_per_s_per_device`` that per
    device; ``peak_memory_mib`` the highest rank's peak; ``comm_pct`` / ``exposed_comm_pct`` the
    mean over ranks.
    """

    batch_size: int
    """Per-device micro-batch."""
    status: TrialStatus
    world_size: int = 1
    accumulation_steps: int = 1
    global_batch: int = 0
    """Samples per optimizer update across the job: batch_size * world_size * accumulation."""
    step_time_ms: float | None = None
    samples_per_s: float | None = None
    samples_per_s_per_device: float | None = None
    peak_memory_mib: float | None = None
    predicted_memory_mib: float | None = None
    comm_pct: float | None = None
    comm_pct_least_waiting: float | None = None
    """Lowest rank's comm share: the collective's own cost, without waiting for a slower rank
    (on CPU traces a gloo op's time includes the wait for the last rank to arrive)."""
    exposed_comm_pct: float | None = None
    ranks: list[RankTrial] = msgspec.field(default_factory=list)
    error: str | None = None
    run_dir: str | None = None
    note: str | None = None
    observed_batch_size: int | None = None
    """The per-process batch the ranks' records show (most common over steady-state steps);
    None when no step recorded one."""
    batch_applied_by: str | None = None
    """How the trial's size reached the script: ``mgprof.batch_size()``, a DataLoader mgprof
    resized, or None when it could not be applied."""
    step_times_ms: list[float] = msgspec.field(default_factory=list)
    """The untraced steady-state steps behind ``step_time_ms`` (the slowest rank's time at each
    step); the first step, the profiler's steps and the one writing the trace are left out."""
    traced_step_ms: float | None = None
    """Mean of the traced steps, never in the trial's figures."""
    post_trace_step_ms: float | None = None
    """The step after the traced ones (it writes the trace), never in the trial's figures."""


class MemoryModel(_Struct):
    """``memory_mib ~ intercept_mib + slope_mib_per_sample * batch`` by least squares."""

    intercept_mib: float
    slope_mib_per_sample: float
    points: int

    def predict(self, batch: int) -> float:
        return self.intercept_mib + self.slope_mib_per_sample * batch

    def max_batch(self, limit_mib: float) -> int | None:
        """Largest batch predicted to stay at or under ``limit_mib`` (None: no growth seen)."""
        if self.slope_mib_per_sample <= 0.0:
            return None
        return max(0, math.floor((limit_mib - self.intercept_mib) / self.slope_mib_per_sample))


def fit_memory(trials: Sequence[Trial]) -> MemoryModel | None:
    """Least-squares line through (batch, peak memory) of the trials that fitted.

    None with fewer than two distinct batch sizes: one point cannot separate the fixed part
    (weights, optimizer state, runtime) from the per-sample part (activations).
    """
    pts = [
        (float(t.batch_size), t.peak_memory_mib)
        for t in trials
        if t.status == "ok" and t.peak_memory_mib is not None
    ]
    xs = {x for x, _ in pts}
    if len(xs) < 2:
        return None
    n = len(pts)
    mx = sum(x for x, _ in pts) / n
    my = sum(y for _, y in pts) / n
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    sxy = sum((x - mx) * (y - my) for x, y in pts)
    slope = sxy / sxx
    return MemoryModel(intercept_mib=my - slope * mx, slope_mib_per_sample=slope, points=n)
