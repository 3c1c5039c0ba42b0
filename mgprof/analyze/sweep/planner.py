"""Batch-size sweep planner: which size to try next, given the trials so far (pure: no torch).

Split out of :mod:`mgprof.analyze.sweep.result`, which re-exports every public name here.
``SweepPlanner`` is a small state machine shared by the CLI sweep (one process per trial) and
the in-process ``find_sweet_spot``: it grows the batch geometrically until a trial runs out of
memory, goes over the memory margin, or stops paying in throughput, then bisects the boundary, so
the number of trials is logarithmic in the range. Once two trials fit it predicts memory as
``a + b * batch`` and skips sizes predicted not to fit, so a known-doomed size never costs a trial.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

from mgprof.analyze.sweep.trials import DEFAULT_MARGIN, MemoryModel, Trial, fit_memory

__all__ = [
    "DEFAULT_RESOLUTION",
    "MULTIPLE",
    "PLATEAU_GAIN",
    "SweepPlanner",
    "check_sweep_args",
    "max_trials",
    "round_to_multiple",
]

PLATEAU_GAIN = 0.03
DEFAULT_RESOLUTION = 0.1
MULTIPLE = 8


def round_to_multiple(value: float, multiple: int) -> int:
    """Nearest multiple of ``multiple`` (at least ``multiple``), or the value when it is smaller."""
    if value < multiple:
        return max(1, round(value))
    return max(multiple, round(value / multiple) * multiple)


class SweepPlanner:
    """Which batch size to try next, given the trials so far.

    Range mode (``lo``..``hi``): grow ×``growth`` from ``lo`` while trials fit within the margin
    and throughput still rises by at least ``plateau_gain`` per step; on a failure (OOM, over the
    margin, or predicted over it) bisect between the last good and first bad size until they are
    within ``max(multiple, resolution * good)``. List mode (``batch_sizes``): try each size in
    increasing order, skipping sizes at or above a known bad one and sizes predicted not to fit.
    A trial that fails for another reason ends the sweep: the boundary would be meaningless.
    """

    def __init__(
        self,
        lo: int = 8,
        hi: int = 4096,
        *,
        batch_sizes: Sequence[int] | None = None,
        capacity_mib: float | None = None,
        margin: float = DEFAULT_MARGIN,
        growth: int = 2,
        plateau_gain: float = PLATEAU_GAIN,
        resolution: float = DEFAULT_RESOLUTION,
        multiple: int = MULTIPLE,
        stop_on_plateau: bool = True,
    ) -> None:
        check_sweep_args(lo, hi, batch_sizes, margin, resolution)
        if growth < 2:
            raise ValueError(f"growth must be at least 2, got {growth}")
        self.lo, self.hi = lo, hi
        self.sizes = sorted(set(batch_sizes)) if batch_sizes else None
        self.capacity_mib = capacity_mib
        self.margin = margin
        self.growth = growth
        self.plateau_gain = plateau_gain
        self.resolution = resolution
        self.multiple = multiple
        self.stop_on_plateau = stop_on_plateau
        self.trials: list[Trial] = []
        self.good: int | None = None
        self.bad: int | None = None
        self.phase: Literal["grow", "bisect", "done"] = "grow"
        self.stop_reason: str | None = None

    # -- classification ----------------------------------------------------------------------

    @property
    def limit_mib(self) -> float | None:
        """Memory allowed with the headroom margin kept free."""
        return None if self.capacity_mib is None else (1.0 - self.margin) * self.capacity_mib

    def within_margin(self, trial: Trial) -> bool:
        if trial.status != "ok":
            return False
        limit = self.limit_mib
        return limit is None or trial.peak_memory_mib is None or trial.peak_memory_mib <= limit

    def model(self) -> MemoryModel | None:
        return fit_memory(self.trials)

    def predicted_over(self, batch: int) -> float | None:
        """The predicted memory when ``batch`` is predicted above the limit, else None."""
        model, limit = self.model(), self.limit_mib
        if model is None or limit is None or model.slope_mib_per_sample <= 0.0:
            return None
        predicted = model.predict(batch)
        return predicted if predicted > limit else None

    # -- state machine -----------------------------------------------------------------------

    def record(self, trial: Trial) -> None:
        """Take a finished trial into account (``skipped`` trials come from ``next_size``)."""
        self.trials.append(trial)
        if trial.status == "failed":
            self.phase = "done"
            self.stop_reason = f"trial at batch {trial.batch_size} failed: {trial.error or '?'}"
            return
        b = trial.batch_size
        if self.within_margin(trial):
            self.good = b if self.good is None else max(self.good, b)
        else:
            self.bad = b if self.bad is None else min(self.bad, b)
            if self.phase == "grow":
                self.phase = "bisect"
        if self.phase == "grow" and self.sizes is None and self._plateaued():
            self.phase = "done"
            self.stop_reason = self._plateau_reason()

    def _plateau_reason(self) -> str:
        """Why growing stopped, in the words the figures support: a fall is a fall."""
        ok = self._timed_within()
        prev, last = ok[-2], ok[-1]
        before, after = prev.samples_per_s or 0.0, last.samples_per_s or 0.0
        change = f"{before:,.0f} -> {after:,.0f} samples/s from batch {prev.batch_size} to "
        change += f"{last.batch_size}"
        if after < before:
            return f"throughput fell ({change})"
        return (
            f"throughput rose less than {100 * self.plateau_gain:.0f} % over the last "
            f"×{self.growth} step ({change}: a plateau)"
        )

    def _timed_within(self) -> list[Trial]:
        return sorted(
            (t for t in self.trials if self.within_margin(t) and t.samples_per_s is not None),
            key=lambda t: t.batch_size,
        )

    def _plateaued(self) -> bool:
        if not self.stop_on_plateau:
            return False
        ok = self._timed_within()
        if len(ok) < 2:
            return False
        prev, last = ok[-2], ok[-1]
        return (last.samples_per_s or 0.0) < (prev.samples_per_s or 0.0) * (1 + self.plateau_gain)

    def next_size(self) -> int | None:
        """The next batch size to run, or None when the sweep is over (see ``stop_reason``).

        Sizes predicted not to fit are recorded as ``skipped`` trials and count as bad sizes.
        """
        while True:
            candidate = self._candidate()
            if candidate is None:
                return None
            predicted = self.predicted_over(candidate)
            if predicted is None:
                return candidate
            self.trials.append(
                Trial(
                    batch_size=candidate,
                    status="skipped",
                    predicted_memory_mib=predicted,
                    note=(
                        f"predicted {predicted:.0f} MiB > {self.limit_mib:.0f} MiB "
                        f"({100 * (1 - self.margin):.0f} % of capacity): not run"
                    ),
                )
            )
            self.bad = candidate if self.bad is None else min(self.bad, candidate)
            if self.phase == "grow":
                self.phase = "bisect"

    def _candidate(self) -> int | None:
        if self.phase == "done":
            return None
        tried = {t.batch_size for t in self.trials}
        if self.sizes is not None:
            for size in self.sizes:
                if size not in tried and (self.bad is None or size < self.bad):
                    return size
            return self._finish("every listed size tried or ruled out")
        if self.phase == "grow":
            if self.good is None:
                return self.lo if self.lo not in tried else self._finish("the smallest size failed")
            if self.good >= self.hi:
                return self._finish(f"reached the top of the range ({self.hi})")
            return min(self.hi, self.good * self.growth)
        return self._bisect(tried)

    def _bisect(self, tried: set[int]) -> int | None:
        if self.good is None:
            return self._finish(f"the smallest size ({self.lo}) does not fit")
        assert self.bad is not None
        step = max(self.multiple, self.resolution * self.good)
        if self.bad - self.good <= step:
            return self._finish(f"boundary located between {self.good} and {self.bad}")
        mid = round_to_multiple((self.good + self.bad) / 2, self.multiple)
        if mid <= self.good or mid >= self.bad or mid in tried:
            mid = (self.good + self.bad) // 2
        if mid <= self.good or mid >= self.bad or mid in tried:
            return self._finish(f"boundary located between {self.good} and {self.bad}")
        return mid

    def _finish(self, reason: str) -> int | None:
        """End the sweep with ``reason`` (kept if one was already given); no next size."""
        self.phase = "done"
        self.stop_reason = self.stop_reason or reason
        return None


MAX_BATCH = 2**31 - 1
"""The largest per-device batch a sweep or compare takes: a batch dimension past a signed
32-bit index holds no real training step, and a bound keeps a typed 10**20 out of the
launches."""


def check_sweep_args(
    lo: int,
    hi: int,
    batch_sizes: Sequence[int] | None,
    margin: float,
    resolution: float = DEFAULT_RESOLUTION,
) -> None:
    """Reject a range or list that cannot describe a sweep (ValueError, one line)."""
    if batch_sizes is not None:
        if not batch_sizes:
            raise ValueError("batch sizes must not be empty")
        bad = [b for b in batch_sizes if not 1 <= b <= MAX_BATCH]
        if bad:
            raise ValueError(f"batch sizes must be from 1 to {MAX_BATCH:,}, got {bad[0]}")
    elif lo < 1 or hi < lo:
        raise ValueError(f"batch range must satisfy 1 <= LO <= HI, got {lo}:{hi}")
    elif hi > MAX_BATCH:
        raise ValueError(f"batch range must end at {MAX_BATCH:,} at most, got {lo}:{hi}")
    if not 0.0 <= margin < 1.0:
        raise ValueError(f"margin must be within [0, 1), got {margin}")
    if not 0.0 < resolution <= 1.0:
        raise ValueError(f"resolution must be within (0, 1], got {resolution}")


def max_trials(lo: int, hi: int, resolution: float = DEFAULT_RESOLUTION) -> int:
    """Upper bound on the trials of a range sweep: growth steps plus bisection steps.

    Growth takes at most ``ceil(log2(hi/lo)) + 1`` trials; bisecting a gap of at most ``hi/2``
    down to ``resolution * good`` takes at most ``ceil(log2(1/resolution)) + 2`` more.
    """
    growth = math.ceil(math.log2(max(hi / lo, 1.0))) + 1
    return growth + math.ceil(math.log2(1.0 / resolution)) + 2
