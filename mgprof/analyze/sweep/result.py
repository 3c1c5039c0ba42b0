"""Batch-size sweep: which size to try next, and what the trials say (pure: no torch).

``SweepPlanner`` is a small state machine shared by the CLI sweep (one process per trial) and
the in-process ``find_sweet_spot``: it grows the batch geometrically until a trial runs out of
memory, goes over the memory margin, or stops paying in throughput, then bisects the boundary, so
the number of trials is logarithmic in the range. Once two trials fit it predicts memory as
``a + b * batch`` (least squares) and skips sizes predicted not to fit, so a known-doomed size
never costs a trial. ``summarize`` turns the trials into the answer (largest fit within the
margin, throughput optimum, sweet spot) and plot-ready series. Every figure is measured or named
as a prediction; nothing is made up.

The trial records, OOM detection and memory model live in :mod:`mgprof.analyze.sweep.trials`,
the planner in :mod:`mgprof.analyze.sweep.planner`; both are re-exported here, so
``mgprof.analyze.sweep.result`` stays the one import for callers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import msgspec

from mgprof.analyze.step_samples import RowSamples, rate_intervals
from mgprof.analyze.sweep.planner import (
    DEFAULT_RESOLUTION,
    MULTIPLE,
    PLATEAU_GAIN,
    SweepPlanner,
    check_sweep_args,
    max_trials,
    round_to_multiple,
)
from mgprof.analyze.sweep.trials import (
    DEFAULT_MARGIN,
    MemoryModel,
    RankTrial,
    Trial,
    TrialStatus,
    _Struct,
    fit_memory,
    is_oom_error,
)
from mgprof.records import RunRecord

__all__ = [
    "BATCH_NOT_APPLIED",
    "DEFAULT_MARGIN",
    "DEFAULT_RESOLUTION",
    "MULTIPLE",
    "PLATEAU_GAIN",
    "SWEEP_SCHEMA_VERSION",
    "SWEET_SPOT_FRACTION",
    "MemoryModel",
    "RankTrial",
    "SeriesPoint",
    "SweepPlanner",
    "SweepResult",
    "Trial",
    "TrialStatus",
    "batch_evidence",
    "caveats",
    "check_sweep_args",
    "comm_trend",
    "fit_memory",
    "is_oom_error",
    "lr_scaling",
    "max_trials",
    "round_to_multiple",
    "summarize",
]

SWEEP_SCHEMA_VERSION = 1
"""Version of ``sweep.json``; bump when a field changes meaning or is removed."""

SWEET_SPOT_FRACTION = 0.95


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
    sweet_spot_vs_best: list[float] | None = None
    """Throughput at the sweet spot ÷ the best, with its 95 % interval: [ratio, low, high]."""
    tied_with_optimal: list[int] = msgspec.field(default_factory=list)
    """Batches whose throughput is not measurably different from the throughput-optimal one
    (the 95 % interval of their ratio holds 1): the optimum is one of them, not a point."""
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
        _intervals(result, timed, best)
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


def _intervals(result: SweepResult, timed: Sequence[Trial], best: Trial) -> None:
    """The sweet spot's throughput against the best with its interval, and the trials the
    best cannot be told from (``mgprof.analyze.step_samples``: one run per trial, so the
    interval holds step-to-step noise)."""
    samples = {
        str(t.batch_size): RowSamples([t.step_times_ms], t.global_batch or None)
        for t in timed
        if t.step_times_ms
    }
    key = str(best.batch_size)
    if key not in samples:
        return
    pairs = [(k, key) for k in samples if k != key]
    found = {i.a: i for i in rate_intervals(samples, pairs)}
    result.tied_with_optimal = sorted(int(k) for k, i in found.items() if i.high >= 1.0)
    spot = found.get(str(result.sweet_spot))
    if spot is not None:
        result.sweet_spot_vs_best = [spot.ratio, spot.low, spot.high]


def comm_trend(fitted: Sequence[Trial]) -> str | None:
    """How the communication share changes from the smallest to the largest fitted batch.

    The figures are the table's (``comm_pct`` and ``exposed_comm_pct``, means over ranks), so the
    summary and the table say the same thing; the least-waiting rank's share (the collective's
    own cost, without waiting for a slower rank) follows when it differs. The verdict is read
    from the exposed share when both ends have it: what the step waits on.
    """
    pts = [(t.batch_size, t.comm_pct, t.exposed_comm_pct) for t in fitted if t.comm_pct is not None]
    if len(pts) < 2:
        return None
    (b0, c0, e0), (b1, c1, e1) = pts[0], pts[-1]
    assert c0 is not None and c1 is not None
    text = f"communication share {c0:.1f} % at batch {b0} -> {c1:.1f} % at batch {b1}"
    if e0 is not None and e1 is not None:
        text += f" (exposed {e0:.1f} % -> {e1:.1f} %)"
    first = next(t for t in fitted if t.batch_size == b0)
    last = next(t for t in fitted if t.batch_size == b1)
    l0, l1 = first.comm_pct_least_waiting, last.comm_pct_least_waiting
    if l0 is not None and l1 is not None and (abs(l0 - c0) > 0.05 or abs(l1 - c1) > 0.05):
        text += f"; least-waiting rank {l0:.1f} % -> {l1:.1f} %"
    # The verdict follows what costs step time: the exposed share when both ends have it. The
    # total grows with the batch whenever the all-reduce overlaps a longer backward (on shared
    # CPU cores the overlapped collective is stretched by the compute beside it), while the part
    # left for the step to wait on falls: that is the amortisation.
    v0, v1, what = (e0, e1, "exposed ") if e0 is not None and e1 is not None else (c0, c1, "")
    if v1 < v0:
        text += f": the {what}all-reduce is amortised over more samples"
        if c1 >= c0:
            text += " (its total rises as it overlaps a longer backward)"
    elif v1 > v0:
        text += f": {what}communication takes a larger share as the batch grows"
    return text


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

    from mgprof.analyze.run.steps import usual_batch_sizes

    usual = usual_batch_sizes(run)
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
