"""The gradient noise scale B_simple = tr(Σ) / |G|² and what it says about the batch (pure).

McCandlish et al. 2018 ("An Empirical Model of Large-Batch Training", App. A.1) estimate it from
squared gradient norms at two batch sizes b < B. Under DDP every rank has both for free: its own
gradient (b = its samples in the update) before the all-reduce, and the averaged one (B = N·b)
after it. With |G_b|² the mean over ranks of each rank's squared norm and |G_B|² that of the
average, the unbiased estimators are

    |G|²  ≈ (B·|G_B|² − b·|G_b|²) / (B − b)
    tr(Σ) ≈ (|G_b|² − |G_B|²) / (1/b − 1/B)

per step. One step's ratio is far too noisy (and its |G|² may be negative), so, as the paper
advises, numerator and denominator are smoothed separately and B_simple is the ratio of their
means over the window; the band is a paired bootstrap over (blocks of) steps.

The estimators assume each gradient is a batch *mean* (a mean-reduced loss). A sum-reduced loss
with equal per-rank batches multiplies every norm by the same b², and gradient accumulation
with a loss divided (or not) by the micro-batch count by the same constant: B_simple, a ratio,
is unchanged; |G|² and tr(Σ) are then in those units. DDP averages the ranks with equal weight,
so with unequal per-rank batches b is their harmonic mean and B = N·b.

With one process and gradient accumulation the same estimators apply to the first micro-batch's
gradient (b = the micro-batch) against the accumulated one (B = all micro-batches).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from mgprof.analyze.sweep.result import SweepResult, Trial
from mgprof.records import NoiseScaleRecord, RunRecord

__all__ = [
    "CONFIDENCE",
    "DEFINITIONS",
    "EMA_DECAY",
    "NOISE_SCALE_VERSION",
    "Ema",
    "NoiseEstimate",
    "NoiseSweepResult",
    "StepNoise",
    "SweepNoiseScale",
    "TrialNoise",
    "estimate_pair",
    "noise_scale_analysis",
    "step_estimates",
    "summarize_steps",
    "sweep_noise_scale",
]

NOISE_SCALE_VERSION = 1
"""Version of the dict ``noise_scale_analysis`` returns (``analysis["noise_scale"]``)."""

CONFIDENCE = 0.95
BOOTSTRAP_SEED = 20180614
"""Fixed, so the same run always gives the same band."""
RESAMPLES = 2000
MAX_BLOCKS = 200
"""Steps are resampled in at most this many blocks of consecutive steps: long runs stay fast,
and a block keeps neighbouring steps (which share parameters) together."""
MIN_STEPS = 3
HALVES_MIN_STEPS = 20
"""From this many steps on, the report sets the window's first half against its second."""
EMA_DECAY = 0.95
"""Per update, for the running figure (``mgprof.noise_scale()``, "latest"): about the last 20
updates weigh most."""

NOT_MEASURED_OLD = (
    "no gradient norms recorded (a run recorded before mgprof measured them, or no rank "
    "recorded a step)"
)

DEFINITIONS = {
    "noise_scale.b_simple": (
        "simple gradient noise scale tr(Σ)/|G|² (McCandlish et al. 2018, App. A.1): mean over "
        "the window's steps of the unbiased tr(Σ) estimate (|G_b|²−|G_B|²)/(1/b−1/B) divided by "
        "the mean of the |G|² estimate (B·|G_B|²−b·|G_b|²)/(B−b); b = per-rank samples "
        "(harmonic mean over ranks), B = ranks × b, |G_b|² = mean over ranks of each rank's "
        "squared gradient norm before the all-reduce, |G_B|² = squared norm after it"
    ),
    "noise_scale.band": (
        "95 % percentile bootstrap of the ratio of means, resampling blocks of consecutive steps "
        "with replacement (numerator and denominator paired); covers sampling noise, not the "
        "change of B_simple during training"
    ),
    "noise_scale.global_batch": "mean samples per update over all ranks in the window",
    "noise_scale.sample_efficiency": (
        "progress a sample buys at this global batch relative to a small batch, "
        "1/(1 + global batch/B_simple), from the paper's E = E_min(1 + B/B_noise)"
    ),
}


# -- estimators -------------------------------------------------------------------------------


def estimate_pair(
    small_sq: float, big_sq: float, b_small: float, b_big: float
) -> tuple[float, float] | None:
    """(|G|², tr Σ) from squared norms at batch sizes ``b_small`` < ``b_big``, or None when the
    sizes cannot tell the two apart (equal sizes, or a size that is not positive)."""
    if not (0.0 < b_small < b_big) or not (math.isfinite(small_sq) and math.isfinite(big_sq)):
        return None
    g2 = (b_big * big_sq - b_small * small_sq) / (b_big - b_small)
    trace = (small_sq - big_sq) / (1.0 / b_small - 1.0 / b_big)
    return g2, trace


class Ema:
    """Exponential moving averages of |G|² and tr(Σ), kept apart as the paper advises (an average
    of per-step ratios would be dominated by steps whose |G|² is near 0). Their ratio needs no
    start-up bias correction: both averages carry the same missing weight."""

    def __init__(self, decay: float = EMA_DECAY) -> None:
        self.decay = decay
        self._g2 = 0.0
        self._trace = 0.0
        self._weight = 0.0
        self.updates = 0

    def update(self, g2: float, trace: float) -> None:
        d = self.decay
        self._g2 = d * self._g2 + (1.0 - d) * g2
        self._trace = d * self._trace + (1.0 - d) * trace
        self._weight = d * self._weight + (1.0 - d)
        self.updates += 1

    @property
    def b_simple(self) -> float | None:
        """tr(Σ)/|G|² from the averages; None before any update or while |G|² ≤ 0."""
        if self._weight <= 0.0 or self._g2 <= 0.0:
            return None
        return max(0.0, self._trace / self._g2)


@dataclass(frozen=True)
class StepNoise:
    """One step's estimates, the ranks combined."""

    index: int
    g2: float
    trace: float
    b_small: float
    b_big: float
    samples: float
    """Samples in the update over all ranks (the global batch)."""


@dataclass
class _Inputs:
    """What the ranks' records say besides the steps: the source, why not, what was left out."""

    source: str | None = None
    group_size: int = 1
    reasons: list[str] = field(default_factory=list)
    dropped: dict[str, int] = field(default_factory=dict)
    no_batch: str = "batch size unknown (pass batch= or batch_size= to prof.step)"
    """Why a step without a batch is dropped, in words the script's author can act on."""


def _harmonic(values: Sequence[float]) -> float:
    return len(values) / sum(1.0 / v for v in values)


def _records(run: RunRecord) -> list[tuple[int, NoiseScaleRecord]]:
    return [
        (r.rank, r.noise_scale) for r in sorted(run.ranks, key=lambda r: r.rank) if r.noise_scale
    ]


def _step_batches(run: RunRecord) -> dict[tuple[int, int], int]:
    return {
        (r.rank, s.index): s.batch_size
        for r in run.ranks
        for s in r.steps
        if s.batch_size is not None
    }


def _drop(dropped: dict[str, int], why: str) -> None:
    dropped[why] = dropped.get(why, 0) + 1


def step_estimates(run: RunRecord) -> tuple[list[StepNoise], _Inputs]:
    """Per-step estimates of a run (ranks combined), and what went into them."""
    inputs = _Inputs()
    if run.ranks and all(r.step_form == "auto" for r in run.ranks):
        inputs.no_batch = (
            "batch size unknown (the trained module's inputs had no leading batch dimension)"
        )
    records = _records(run)
    for _, rec in records:
        for why, count in rec.dropped.items():  # ranks drop the same steps: the most, not a sum
            inputs.dropped[why] = max(inputs.dropped.get(why, 0), count)
        if rec.source is None and rec.reason and rec.reason not in inputs.reasons:
            inputs.reasons.append(rec.reason)
    ddp = [(rank, r) for rank, r in records if r.source == "ddp"]
    if ddp:
        inputs.source = "ddp"
        inputs.group_size = max(r.group_size for _, r in ddp)
        return _ddp_steps(run, ddp, inputs), inputs
    accum = [r for _, r in records if r.source == "accumulation"]
    if accum and run.world_size <= 1:
        inputs.source = "accumulation"
        return _accumulation_steps(accum[0], inputs), inputs
    if accum:
        inputs.reasons.append(
            f"{run.world_size} ranks without a DDP model built by mgprof: the micro-batches of "
            "independent processes do not measure the job's global batch"
        )
    return [], inputs


def _ddp_steps(
    run: RunRecord, records: list[tuple[int, NoiseScaleRecord]], inputs: _Inputs
) -> list[StepNoise]:
    fallback = _step_batches(run)
    per_step: dict[int, list[tuple[float, float, int | None]]] = {}
    for rank, rec in records:
        for i, (index, local, avg) in enumerate(zip(rec.index, rec.local_sq, rec.avg_sq)):
            batch = rec.batch_size[i] if i < len(rec.batch_size) else None
            if batch is None:
                batch = fallback.get((rank, index))
            per_step.setdefault(index, []).append((local, avg, batch))
    n = inputs.group_size
    dropped = inputs.dropped
    out = []
    for index in sorted(per_step):
        entries = per_step[index]
        batches = [float(b) for _, _, b in entries if b is not None and b > 0]
        if not batches:
            _drop(dropped, inputs.no_batch)
            continue
        b_small = _harmonic(batches)
        pair = estimate_pair(
            sum(e[0] for e in entries) / len(entries),
            sum(e[1] for e in entries) / len(entries),
            b_small,
            n * b_small,
        )
        if pair is None:
            _drop(dropped, "non-finite norm or a single rank")
            continue
        samples = sum(batches) * n / len(batches)  # ranks without a record: the mean batch
        out.append(StepNoise(index, pair[0], pair[1], b_small, n * b_small, samples))
    return out


def _accumulation_steps(rec: NoiseScaleRecord, inputs: _Inputs) -> list[StepNoise]:
    dropped = inputs.dropped
    out = []
    for i, (index, local, avg) in enumerate(zip(rec.index, rec.local_sq, rec.avg_sq)):
        batch = rec.batch_size[i] if i < len(rec.batch_size) else None
        k = rec.micro_batches[i] if i < len(rec.micro_batches) else 1
        if batch is None or batch <= 0 or k < 1:
            _drop(dropped, inputs.no_batch)
            continue
        pair = estimate_pair(local, avg, batch / k, float(batch))
        if pair is None:
            _drop(dropped, "non-finite norm or a single micro-batch")
            continue
        out.append(StepNoise(index, pair[0], pair[1], batch / k, float(batch), float(batch)))
    return out


# -- the window's figure ----------------------------------------------------------------------


class NoiseEstimate(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    """B_simple over a window of steps, its band and what the global batch means against it."""

    b_simple: float | None = None
    """None when the window's |G|² estimate is not positive (noise dominates)."""
    band_low: float | None = None
    band_high: float | None = None
    """None with ``band_unbounded``: the bootstrap could not bound B_simple from above."""
    band_unbounded: bool = False
    confidence: float = CONFIDENCE
    steps: int = 0
    first_step: int | None = None
    last_step: int | None = None
    g2_mean: float | None = None
    trace_mean: float | None = None
    b_small: float | None = None
    b_big: float | None = None
    global_batch: float | None = None
    latest_b_simple: float | None = None
    """Bias-corrected EMA (decay ``EMA_DECAY``) at the window's last step."""
    first_half: float | None = None
    second_half: float | None = None
    reason: str | None = None
    """Why ``b_simple`` is missing, when it is."""


ZERO_GRADIENTS_REASON = (
    "not defined: gradients are zero (every gradient norm measured over {n} step(s) was "
    "exactly 0, so there is no signal and no noise: the model does not learn; check the loss)"
)


def _ratio(trace: float, g2: float) -> float:
    if g2 <= 0.0:
        return math.inf
    return max(0.0, trace / g2)


def _band(steps: Sequence[StepNoise], seed: int) -> tuple[float, float]:
    """Percentile bootstrap of sum(trace)/sum(g2) over blocks of consecutive steps."""
    size = max(1, math.ceil(len(steps) / MAX_BLOCKS))
    blocks = [
        (sum(s.trace for s in steps[i : i + size]), sum(s.g2 for s in steps[i : i + size]))
        for i in range(0, len(steps), size)
    ]
    rng = random.Random(seed)
    k = len(blocks)
    ratios = []
    for _ in range(RESAMPLES):
        trace = g2 = 0.0
        for t, g in rng.choices(blocks, k=k):
            trace += t
            g2 += g
        ratios.append(_ratio(trace, g2))
    ratios.sort()
    tail = (1.0 - CONFIDENCE) / 2.0
    low = ratios[max(0, math.floor(tail * len(ratios)))]
    high = ratios[min(len(ratios) - 1, math.ceil((1.0 - tail) * len(ratios)) - 1)]
    return low, high


def summarize_steps(steps: Sequence[StepNoise], seed: int = BOOTSTRAP_SEED) -> NoiseEstimate:
    """B_simple over ``steps`` (in step order): ratio of the means, band, halves, latest EMA."""
    ordered = sorted(steps, key=lambda s: s.index)
    est = NoiseEstimate(steps=len(ordered))
    if ordered and all(s.g2 == 0.0 and s.trace == 0.0 for s in ordered):
        est.first_step, est.last_step = ordered[0].index, ordered[-1].index
        est.reason = ZERO_GRADIENTS_REASON.format(n=len(ordered))
        return est
    if len(ordered) < MIN_STEPS:
        est.reason = f"{len(ordered)} step(s) measured; the estimate needs at least {MIN_STEPS}"
        return est
    n = len(ordered)
    est.first_step, est.last_step = ordered[0].index, ordered[-1].index
    est.g2_mean = sum(s.g2 for s in ordered) / n
    est.trace_mean = sum(s.trace for s in ordered) / n
    est.b_small = sum(s.b_small for s in ordered) / n
    est.b_big = sum(s.b_big for s in ordered) / n
    est.global_batch = sum(s.samples for s in ordered) / n
    ema = Ema()
    for s in ordered:
        ema.update(s.g2, s.trace)
    est.latest_b_simple = ema.b_simple
    low, high = _band(ordered, seed)
    est.band_low = low
    est.band_unbounded = math.isinf(high)
    est.band_high = None if est.band_unbounded else high
    if est.g2_mean <= 0.0:
        est.reason = (
            "the |G|² estimate is not positive over the window: gradient noise swamps the "
            "signal (B_simple is larger than these steps can resolve); measure more steps"
        )
    else:
        est.b_simple = _ratio(est.trace_mean, est.g2_mean)
    if n >= HALVES_MIN_STEPS:
        half = n // 2
        est.first_half = _half(ordered[:half])
        est.second_half = _half(ordered[half:])
    return est


def _half(steps: Sequence[StepNoise]) -> float | None:
    g2 = sum(s.g2 for s in steps)
    return None if g2 <= 0.0 else _ratio(sum(s.trace for s in steps), g2)


# -- the run's figures --------------------------------------------------------------------------


def batch_effects(global_batch: float, b_simple: float) -> dict[str, float]:
    """What the global batch means against B_simple by the paper's model (S = S_min(1 + B_noise/B),
    E = E_min(1 + B/B_noise)): progress per sample, per step, and what doubling the batch buys."""
    ratio = global_batch / b_simple if b_simple > 0 else math.inf
    out = {"ratio": ratio}
    if math.isfinite(ratio):
        out["sample_efficiency"] = 1.0 / (1.0 + ratio)
        out["step_efficiency"] = ratio / (1.0 + ratio)
        out["doubling_steps_saved_pct"] = 100.0 * (1.0 - (1.0 + 0.5 / ratio) / (1.0 + 1.0 / ratio))
    return out


def noise_scale_analysis(run: RunRecord) -> dict[str, Any]:
    """The run's noise-scale figures as a JSON-ready dict (``analysis["noise_scale"]``)."""
    steps, inputs = step_estimates(run)
    out: dict[str, Any] = {
        "version": NOISE_SCALE_VERSION,
        "source": inputs.source,
        "ranks": inputs.group_size if inputs.source == "ddp" else 1,
        "dropped": dict(inputs.dropped),
    }
    if inputs.source is None:
        out["measured"] = False
        out["reason"] = "; ".join(inputs.reasons) if inputs.reasons else NOT_MEASURED_OLD
        return out
    est = summarize_steps(steps)
    out["measured"] = True
    out.update(msgspec.to_builtins(est))
    if est.b_simple is not None and est.global_batch is not None and est.b_simple > 0:
        out.update(batch_effects(est.global_batch, est.b_simple))
    return out


# -- the batch-size sweep -----------------------------------------------------------------------


class TrialNoise(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    """One sweep trial's own estimate (a few steps: read the pooled figure first)."""

    batch_size: int
    global_batch: int
    b_simple: float | None = None
    steps: int = 0
    reason: str | None = None


class SweepNoiseScale(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    """B_simple pooled over a sweep's trials and the batch recommended with it and the knee."""

    estimate: NoiseEstimate | None = None
    """Pooled over every trial's steps: the estimators are unbiased at any pair of sizes."""
    trials: list[TrialNoise] = msgspec.field(default_factory=list)
    knee_batch: int | None = None
    """The hardware sweet spot (per device) and its global batch."""
    knee_global_batch: int | None = None
    recommended_batch: int | None = None
    """Per device: the fitted trial with the least time to a given loss,
    (G + B_simple) / (samples/s)."""
    recommended_global_batch: int | None = None
    recommended_range: list[int] = msgspec.field(default_factory=list)
    """The recommended per-device batch at the band's two ends (low, high)."""
    knee_time_pct: float | None = None
    """How much longer the knee takes to a given loss than the recommendation (%)."""
    time_to_target: dict[str, float] = msgspec.field(default_factory=dict)
    """Per-device batch -> relative time to a given loss (the recommendation = 1)."""
    recommendation: str | None = None
    reason: str | None = None
    """Why there is no B_simple or no recommendation."""


class NoiseSweepResult(SweepResult):
    """``SweepResult`` with the gradient noise scale beside the hardware knee."""

    noise_scale: SweepNoiseScale | None = None


def _usable(result: SweepResult) -> list[Trial]:
    """Fitted trials within the memory margin that measured a throughput (the knee's pool)."""
    limit = None if result.capacity_mib is None else (1.0 - result.margin) * result.capacity_mib
    return sorted(
        (
            t
            for t in result.trials
            if t.status == "ok"
            and t.samples_per_s
            and (limit is None or t.peak_memory_mib is None or t.peak_memory_mib <= limit)
        ),
        key=lambda t: t.batch_size,
    )


def _best(trials: Sequence[Trial], b_simple: float) -> Trial:
    return min(trials, key=lambda t: (t.global_batch + b_simple) / (t.samples_per_s or 1.0))


def sweep_noise_scale(
    result: SweepResult, per_trial: Mapping[int, tuple[list[StepNoise], str | None]]
) -> SweepNoiseScale:
    """Pool the trials' steps into one B_simple and recommend the batch that reaches a given loss
    soonest: by the paper's model time ∝ steps × step time ∝ (G + B_simple) / (samples/s), so
    a batch past B_simple must buy proportionally more samples/s to pay."""
    out = SweepNoiseScale()
    pooled: list[StepNoise] = []
    reasons: list[str] = []
    for trial in sorted(result.trials, key=lambda t: t.batch_size):
        steps, why = per_trial.get(trial.batch_size, ([], None))
        if trial.status == "skipped":
            continue
        own = summarize_steps(steps) if steps else None
        out.trials.append(
            TrialNoise(
                batch_size=trial.batch_size,
                global_batch=trial.global_batch,
                b_simple=own.b_simple if own is not None else None,
                steps=len(steps),
                reason=why if not steps else (own.reason if own is not None else None),
            )
        )
        # steps get a per-trial offset so the pooled window keeps each trial's steps together
        pooled.extend(
            StepNoise(s.index + 1_000_000 * trial.batch_size, s.g2, s.trace, s.b_small, s.b_big,
                      s.samples)
            for s in steps
        )  # fmt: skip
        if why and why not in reasons:
            reasons.append(why)
    if not pooled:
        out.reason = "; ".join(reasons) or "no trial recorded gradient norms"
        return out
    est = summarize_steps(pooled)
    # steps of trials at different batches, in trial order: no window, no trend, no one batch
    est.first_step = est.last_step = est.latest_b_simple = None
    est.first_half = est.second_half = None
    est.b_small = est.b_big = est.global_batch = None
    out.estimate = est
    if result.sweet_spot is not None:
        out.knee_batch = result.sweet_spot
        knee = next((t for t in result.trials if t.batch_size == result.sweet_spot), None)
        out.knee_global_batch = knee.global_batch if knee is not None else None
    if est.b_simple is None:
        out.reason = est.reason
        return out
    if est.b_simple <= 0:  # no gradient noise at all: a batch size cannot be weighed against it
        out.reason = (
            "B_simple is 0: the ranks' gradients did not differ (every rank trained on the same "
            "batches?), so there is no noise scale to weigh batch sizes against"
        )
        return out
    usable = _usable(result)
    if not usable:
        out.reason = "no fitted trial within the memory margin measured a throughput"
        return out
    _recommend(out, usable, est)
    return out


def _recommend(out: SweepNoiseScale, usable: Sequence[Trial], est: NoiseEstimate) -> None:
    assert est.b_simple is not None
    bs = est.b_simple
    best = _best(usable, bs)
    cost_best = (best.global_batch + bs) / (best.samples_per_s or 1.0)
    out.recommended_batch = best.batch_size
    out.recommended_global_batch = best.global_batch
    out.time_to_target = {
        str(t.batch_size): round((t.global_batch + bs) / (t.samples_per_s or 1.0) / cost_best, 4)
        for t in usable
    }
    ends = [est.band_low if est.band_low is not None else bs]
    ends.append(est.band_high if est.band_high is not None else 1e30)
    out.recommended_range = sorted({_best(usable, e).batch_size for e in ends})
    knee = next((t for t in usable if t.batch_size == out.knee_batch), None)
    if knee is not None:
        cost_knee = (knee.global_batch + bs) / (knee.samples_per_s or 1.0)
        out.knee_time_pct = 100.0 * (cost_knee / cost_best - 1.0)
    out.recommendation = recommendation_text(out, est, knee)


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if value >= 10 else f"{value:.3g}"


def recommendation_text(out: SweepNoiseScale, est: NoiseEstimate, knee: Trial | None) -> str:
    """One paragraph: the batch to use, and why, with both the knee and B_simple in it."""
    bs = est.b_simple or 0.0
    rec_b, rec_g = out.recommended_batch, out.recommended_global_batch or 0
    where = f"batch {rec_b} per device (global {rec_g}, {rec_g / bs:.2g}x B_simple ≈ {_fmt(bs)})"
    if knee is None:
        text = f"Use {where}: the least time to a given loss among the fitted trials."
    elif knee.batch_size == rec_b:
        text = (
            f"Use {where}: the hardware sweet spot is also the least time to a given loss; "
            "its samples still buy progress."
        )
    elif (rec_b or 0) < knee.batch_size:
        text = (
            f"Use {where} rather than the hardware sweet spot {knee.batch_size} (global "
            f"{knee.global_batch} = {knee.global_batch / bs:.2g}x B_simple): past B_simple a "
            "step's extra samples buy little progress, so the sweet spot would take about "
            f"{_fmt(out.knee_time_pct or 0.0)} % longer to reach a given loss although it "
            "processes more samples/s."
        )
    else:
        text = (
            f"Use {where} rather than the hardware sweet spot {knee.batch_size} (global "
            f"{knee.global_batch}): B_simple is above the sweet spot's global batch, so the "
            "larger batch's extra samples still pay: the sweet spot would take about "
            f"{_fmt(out.knee_time_pct or 0.0)} % longer to reach a given loss."
        )
    if len(out.recommended_range) > 1:
        lo, hi = out.recommended_range[0], out.recommended_range[-1]
        text += f" Across B_simple's band the choice moves between batch {lo} and {hi}."
    return text


def pooled_steps_note(trials: Iterable[TrialNoise]) -> str:
    """How many trials and steps the sweep's B_simple rests on."""
    used = [t for t in trials if t.steps > 0]
    total = sum(t.steps for t in used)
    return f"{total} steps from {len(used)} trial(s)"
