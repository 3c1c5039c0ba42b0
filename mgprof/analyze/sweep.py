"""Batch-size sweep: which size to try next, and what the trials say (pure: no torch).

``SweepPlanner`` is a small state machine shared by the CLI sweep (one process per trial) and
the in-process ``find_sweet_spot``: it grows the batch geometrically until a trial runs out of
memory, goes over the memory margin, or stops paying in throughput, then bisects the boundary, so
the number of trials is logarithmic in the range. Once two trials fit it predicts memory as
``a + b * batch`` (least squares) and skips sizes predicted not to fit, so a known-doomed size
never costs a trial. ``summarize`` turns the trials into the answer (largest fit within the
margin, throughput optimum, sweet spot) and plot-ready series. Every figure is measured or named
as a prediction; nothing is made up.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Literal

import msgspec

from mgprof.records import RunRecord

SWEEP_SCHEMA_VERSION = 1
"""Version of ``sweep.json``; bump when a field changes meaning or is removed."""

DEFAULT_MARGIN = 0.1
SWEET_SPOT_FRACTION = 0.95
PLATEAU_GAIN = 0.03
DEFAULT_RESOLUTION = 0.1
MULTIPLE = 8

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

    ``samples_per_s`` is the job total (sum over ranks of per-device samples/s);
    ``samples_per_s_per_device`` its mean over ranks; ``step_time_ms`` the slowest rank's mean
    (DDP steps in lock-step, so the slowest rank sets the pace); ``peak_memory_mib`` the highest
    rank's peak; ``comm_pct`` / ``exposed_comm_pct`` the mean over ranks.
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
            self.stop_reason = (
                f"throughput rose less than {100 * self.plateau_gain:.0f} % over the last "
                f"×{self.growth} step (plateau)"
            )

    def _plateaued(self) -> bool:
        if not self.stop_on_plateau:
            return False
        ok = sorted(
            (t for t in self.trials if self.within_margin(t) and t.samples_per_s is not None),
            key=lambda t: t.batch_size,
        )
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
        bad = [b for b in batch_sizes if b < 1]
        if bad:
            raise ValueError(f"batch sizes must be at least 1, got {bad[0]}")
    elif lo < 1 or hi < lo:
        raise ValueError(f"batch range must satisfy 1 <= LO <= HI, got {lo}:{hi}")
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


# ------------------------------------------------------------------------------------------
# Result


class SeriesPoint(_Struct):
    """One row of the plot-ready series (per trial that ran, in batch order)."""

    batch_size: int
    global_batch: int
    status: TrialStatus
    samples_per_s: float | None
    samples_per_s_per_device: float | None
    step_time_ms: float | None
    peak_memory_mib: float | None
    comm_pct: float | None
    comm_pct_least_waiting: float | None
    exposed_comm_pct: float | None


class SweepResult(_Struct):
    """The sweep's answer and the evidence behind it (what ``sweep.json`` holds)."""

    schema_version: int = SWEEP_SCHEMA_VERSION
    script: str | None = None
    sweep_dir: str | None = None
    created_utc: str = ""
    mode: Literal["cli", "in-process"] = "cli"
    device_kind: str = "cpu"
    world_size: int = 1
    capacity_mib: float | None = None
    capacity_source: str | None = None
    margin: float = DEFAULT_MARGIN
    memory_definition: str = ""
    fixed_global_batch: int | None = None
    trials: list[Trial] = msgspec.field(default_factory=list)
    largest_fit: int | None = None
    """Largest measured batch that ran and kept the margin free."""
    throughput_optimal: int | None = None
    sweet_spot: int | None = None
    """Smallest measured batch within the margin reaching 95 % of the best throughput."""
    peak_samples_per_s: float | None = None
    memory_model: MemoryModel | None = None
    predicted_max_batch: int | None = None
    """From the memory model: largest batch predicted to fit within the margin (a prediction)."""
    first_oom: int | None = None
    stop_reason: str | None = None
    trial_count: int = 0
    series: list[SeriesPoint] = msgspec.field(default_factory=list)
    comm_trend: str | None = None
    caveats: list[str] = msgspec.field(default_factory=list)
    not_applicable: dict[str, str] = msgspec.field(default_factory=dict)


def summarize(
    trials: Sequence[Trial],
    capacity_mib: float | None,
    margin: float = DEFAULT_MARGIN,
    *,
    fraction: float = SWEET_SPOT_FRACTION,
    stop_reason: str | None = None,
) -> SweepResult:
    """The sweep's answer from its trials (see ``SweepResult`` for each figure's meaning)."""
    limit = None if capacity_mib is None else (1.0 - margin) * capacity_mib
    ran = sorted((t for t in trials if t.status != "skipped"), key=lambda t: t.batch_size)
    fitted = [t for t in ran if t.status == "ok"]
    within = [
        t
        for t in fitted
        if limit is None or t.peak_memory_mib is None or t.peak_memory_mib <= limit
    ]
    result = SweepResult(
        capacity_mib=capacity_mib,
        margin=margin,
        trials=list(trials),
        stop_reason=stop_reason,
        trial_count=len(ran),
        world_size=max((t.world_size for t in trials), default=1),
    )
    na = result.not_applicable
    result.largest_fit = max((t.batch_size for t in within), default=None)
    timed = [t for t in within if t.samples_per_s is not None]
    if timed:
        best = max(timed, key=lambda t: t.samples_per_s or 0.0)
        result.throughput_optimal = best.batch_size
        result.peak_samples_per_s = best.samples_per_s
        target = fraction * (best.samples_per_s or 0.0)
        result.sweet_spot = min(t.batch_size for t in timed if (t.samples_per_s or 0.0) >= target)
    else:
        na["sweet_spot"] = "no trial that fitted within the margin measured a throughput"
    ooms = [t.batch_size for t in ran if t.status == "oom"]
    result.first_oom = min(ooms) if ooms else None
    result.memory_model = fit_memory(fitted)
    if result.memory_model is not None and limit is not None:
        result.predicted_max_batch = result.memory_model.max_batch(limit)
    elif capacity_mib is None:
        na["predicted_max_batch"] = (
            "memory capacity unknown (CPU without --memory-budget-mib): no memory boundary"
        )
    else:
        na["predicted_max_batch"] = "fewer than two fitted trials with a memory figure"
    result.series = [
        SeriesPoint(
            batch_size=t.batch_size,
            global_batch=t.global_batch,
            status=t.status,
            samples_per_s=t.samples_per_s,
            samples_per_s_per_device=t.samples_per_s_per_device,
            step_time_ms=t.step_time_ms,
            peak_memory_mib=t.peak_memory_mib,
            comm_pct=t.comm_pct,
            comm_pct_least_waiting=t.comm_pct_least_waiting,
            exposed_comm_pct=t.exposed_comm_pct,
        )
        for t in ran
    ]
    result.comm_trend = comm_trend(fitted)
    result.caveats = caveats(result, fitted)
    return result


def comm_trend(fitted: Sequence[Trial]) -> str | None:
    """How the communication share changes from the smallest to the largest fitted batch.

    Uses the least-waiting rank's share when known: the collective's own cost, which is what a
    larger batch amortises (waiting for a slower rank is imbalance, not communication).
    """
    pts = [(t.batch_size, _comm(t), t.exposed_comm_pct) for t in fitted if _comm(t) is not None]
    if len(pts) < 2:
        return None
    (b0, c0, e0), (b1, c1, e1) = pts[0], pts[-1]
    assert c0 is not None and c1 is not None
    text = f"communication share {c0:.1f} % at batch {b0} -> {c1:.1f} % at batch {b1}"
    if e0 is not None and e1 is not None:
        text += f" (exposed {e0:.1f} % -> {e1:.1f} %)"
    if c1 < c0:
        text += ": the all-reduce is amortised over more samples"
    return text


def _comm(t: Trial) -> float | None:
    return t.comm_pct_least_waiting if t.comm_pct_least_waiting is not None else t.comm_pct


def lr_scaling(new_global: int, ref_global: int) -> tuple[float, float]:
    """(linear, square-root) learning-rate factors for a global batch change.

    Linear for SGD with warm-up (Goyal et al., 2017); square root for Adam-type optimizers
    (Malladi et al., 2022). Both are starting points, not guarantees.
    """
    ratio = new_global / ref_global
    return ratio, math.sqrt(ratio)


def caveats(result: SweepResult, fitted: Sequence[Trial]) -> list[str]:
    """The honest notes that go with a batch-size answer: optimisation changes with the batch."""
    notes = [
        "A larger batch changes optimisation, not only speed: the global batch (per-device "
        "batch x devices x accumulation steps) is what the optimizer sees."
    ]
    if fitted and result.sweet_spot is not None:
        ref = min(fitted, key=lambda t: t.batch_size)
        spot = next(t for t in fitted if t.batch_size == result.sweet_spot)
        if ref.global_batch and spot.global_batch and spot.global_batch != ref.global_batch:
            lin, sq = lr_scaling(spot.global_batch, ref.global_batch)
            notes.append(
                f"If your learning rate was tuned at global batch {ref.global_batch}, at the "
                f"sweet spot's global batch {spot.global_batch} start from lr x {lin:.3g} (SGD, "
                f"linear scaling with warm-up) or lr x {sq:.3g} (Adam, square-root scaling)."
            )
    if result.fixed_global_batch is None:
        notes.append(
            "To keep the optimisation unchanged, sweep with --global-batch G: the per-device "
            "batch varies and gradient accumulation keeps G samples per update."
        )
    return notes


BATCH_NOT_APPLIED = "batch size not applied"


def batch_evidence(
    run: RunRecord, requested: int, accumulation_steps: int = 1
) -> tuple[int | None, str | None, str | None]:
    """``(observed, applied_by, problem)`` for a trial that asked each process for ``requested``.

    ``observed`` is the most common per-process batch over the ranks' steady-state steps (the
    DataLoader hook sums the micro-batches of one update, hence ``requested x accumulation``
    is also right). ``problem`` is None when the trial really trained at the requested size, or
    one line saying why its figures cannot stand for that size.
    """
    from collections import Counter

    from mgprof.analyze.run_steps import steady_state_steps

    usual: list[int] = []
    for rank in run.ranks:
        seen = [s.batch_size for s in steady_state_steps(rank.steps) if s.batch_size]
        if seen:
            usual.append(Counter(seen).most_common(1)[0][0])
    observed = Counter(usual).most_common(1)[0][0] if usual else None
    facts = [r.training for r in run.ranks]
    read = any(f.batch_size_read for f in facts)
    applied = [a for f in facts for a in (f.batch_size_applied or [])]
    refused = [a for f in facts for a in (f.batch_size_refused or [])]
    how = "mgprof.batch_size()" if read else (applied[0] if applied else None)
    if observed is not None:
        if observed in (requested, requested * accumulation_steps):
            return observed, how, None
        hint = (
            refused[0]
            if refused
            else "the script sizes its batches itself (no DataLoader batch_size mgprof could "
            "set, no mgprof.batch_size())"
        )
        return (
            observed,
            how,
            (
                f"{BATCH_NOT_APPLIED}: asked for {requested} per process, the ranks trained on "
                f"{observed}; {hint}"
            ),
        )
    if read or applied:
        return None, how, None
    if not run.ranks:
        return None, None, None  # nothing ran: the run's own error says why
    why = (
        refused[0]
        if refused
        else (
            "the script neither calls mgprof.batch_size() nor builds a DataLoader, and its steps "
            "record no batch to check"
        )
    )
    return None, None, f"{BATCH_NOT_APPLIED}: {why}"
