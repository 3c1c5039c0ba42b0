"""Figures across the ranks of a run: job throughput and energy, slowest rank, identical batches."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mgprof.analyze.readers import num as _float_or_none
from mgprof.analyze.run.grad_sync import grad_sync, strategy_label
from mgprof.analyze.run.results import JobAnalysis, RankAnalysis
from mgprof.analyze.run.steps import dataloader_totals, steady_state_steps
from mgprof.analyze.stats import (
    binomial_upper_tail,
    mean_difference_halfwidth,
    ratio_pct,
    spread_pct,
)
from mgprof.records import RunRecord


def job_analysis(
    run: RunRecord, ranks: Sequence[RankAnalysis], trace_job: Mapping[str, Any] | None = None
) -> JobAnalysis:
    """The job figures of ``run`` from its records and its ranks' figures."""
    sync = grad_sync(run)
    job = JobAnalysis(
        strategy=run.strategy,
        world_size=run.world_size,
        ranks_reported=len(run.ranks),
        strategy_label=strategy_label(run, sync),
        grad_sync=sync,
        missing_ranks=sorted(run.missing_ranks),
    )
    _job_throughput(run, ranks, job)
    _job_energy(run, ranks, job)
    _job_dataloader(run, job)
    _job_slowest(run, ranks, job, trace_job)
    _job_identical_batches(run, job)
    _cpu_fallback(run, job)
    return job


def _job_throughput(run: RunRecord, ranks: Sequence[RankAnalysis], job: JobAnalysis) -> None:
    if job.grad_sync is not None and job.grad_sync.status in ("independent", "partial"):
        job.not_applicable["samples_per_s"] = (
            "the ranks did not train one model together (gradients not synchronised): "
            "their summed throughput is not a job's"
        )
        return
    missing = sorted(set(job.missing_ranks))
    if missing or len(ranks) < run.world_size:
        job.not_applicable["samples_per_s"] = (
            f"ranks {missing or 'some'} did not report; a job total would undercount"
        )
        return
    lacking = [r for r in ranks if r.samples_per_s is None]
    if not ranks or lacking:
        first = lacking[0] if lacking else None
        job.not_applicable["samples_per_s"] = (
            f"rank {first.rank}: {first.not_applicable.get('samples_per_s', 'no throughput')}"
            if first
            else "no rank reported"
        )
        return
    job.samples_per_s = sum(r.samples_per_s or 0.0 for r in ranks)
    job.samples_per_s_ci95 = _rate_interval(job.samples_per_s, ranks)


def _rate_interval(rate: float, ranks: Sequence[RankAnalysis]) -> list[float] | None:
    """``rate``'s 95 % interval from the slowest rank's step-time interval: the job trains
    its samples at that rank's pace, so the rate scales inversely with its mean step."""
    timed = [r.step_time_ms for r in ranks if r.step_time_ms is not None]
    if not timed:
        return None
    slow = max(timed, key=lambda st: st.mean)
    low, high = slow.ci95_low, slow.ci95_high
    if low is None or high is None or low <= 0.0 or slow.mean <= 0.0:
        return None
    return [rate * slow.mean / high, rate * slow.mean / low]


def _job_energy(run: RunRecord, ranks: Sequence[RankAnalysis], job: JobAnalysis) -> None:
    lacking = [r for r in ranks if r.energy_j is None]
    if not ranks or lacking:
        reason = lacking[0].not_applicable.get("energy_j", "no energy") if lacking else "no rank"
        job.not_applicable["energy_j"] = reason
        job.not_applicable["energy_per_sample_j"] = reason
        return
    # Ranks on one node may sample the same GPU: count each device (by NVML uuid) once.
    seen: set[str] = set()
    energy = 0.0
    for rec in run.ranks:
        for dev in rec.sampler.devices:
            uuid = dev.facts.get("uuid")
            if isinstance(uuid, str):
                if uuid in seen:
                    continue
                seen.add(uuid)
            energy += _float_or_none(dev.summary.get("energy_j")) or 0.0
    job.energy_j = energy
    if any(r.energy_per_sample_j is None for r in ranks):
        job.not_applicable["energy_per_sample_j"] = (
            "batch size not recorded for every step on every rank"
        )
        return
    samples = sum(s.batch_size or 0 for rec in run.ranks for s in rec.steps)
    job.energy_per_sample_j = energy / samples


def _job_dataloader(run: RunRecord, job: JobAnalysis) -> None:
    dl = dur = 0.0
    for rec in run.ranks:
        d, t = dataloader_totals(rec, steady_state_steps(rec.steps))
        dl += d
        dur += t
    job.dataloader_share_pct = ratio_pct(dl, dur)
    if job.dataloader_share_pct is None:
        job.not_applicable["dataloader_share_pct"] = "DataLoader wait was not timed on any rank"


CHANCE_P = 0.05
"""A rank is called slowest only when chance would give its lead less than 1 time in 20 (over
every rank or pair of ranks it could have been)."""


def _job_slowest(
    run: RunRecord,
    ranks: Sequence[RankAnalysis],
    job: JobAnalysis,
    trace_job: Mapping[str, Any] | None,
) -> None:
    """One definition of the slowest rank (also ``mgprof trace``'s): the rank the others wait
    for, i.e. the one that arrives last in the most matched collective calls; without matched
    collectives, the rank with the highest mean steady-state step time (ranks of a DDP job step
    in lock-step, so their mean step times differ by noise and rank order flips between runs).

    Either basis names a rank only beyond the run's own noise. The last arrivals: when chance
    (every rank equally likely to arrive last) would give that rank's count less than 1 time
    in 20 over the ranks; the calls of one step share their latecomer, so the count is judged
    as if each traced step were one draw (k of n calls over S steps counts as k·S/n of S). The
    step times: when the slowest and fastest means differ by more than their interval (Welch,
    Student's t, 95 % over every pair of ranks). Otherwise no rank is named, with the figures
    that say why (a "slowest rank 1" at 14.28 ms beside rank 0 at 14.31 ms named noise)."""
    timed = [(r.step_time_ms.mean, r.rank) for r in ranks if r.step_time_ms is not None]
    if len(timed) < 2:
        why = "fewer than two ranks with step times: nothing to compare"
        job.not_applicable["slowest_rank"] = why
        job.not_applicable["step_time_spread_pct"] = why
        return
    job.step_time_spread_pct = spread_pct([t for t, _ in timed])
    if job.step_time_spread_pct is None:
        job.not_applicable["step_time_spread_pct"] = "the fastest rank's mean step time is zero"
    mean_of = {rank: ms for ms, rank in timed}
    last, arrivals_why = _last_arrivals_beyond_chance(trace_job, mean_of)
    if last is not None:
        job.slowest_rank_basis = "last to arrive at collectives (traces)"
        slow_ms, slow_rank = mean_of[last], last
    else:
        slow_ms, slow_rank = max(timed)
        noise_why = _step_times_within_noise(run, timed)
        if noise_why is not None:
            why = noise_why if arrivals_why is None else f"{arrivals_why}; {noise_why}"
            job.not_applicable["slowest_rank"] = why
            job.not_applicable["fastest_rank"] = why
            return
        job.slowest_rank_basis = "highest mean step time"
    job.slowest_rank, job.slowest_mean_step_ms = slow_rank, slow_ms
    _job_fastest(timed, slow_rank, slow_ms, job)


def _last_arrivals_beyond_chance(
    trace_job: Mapping[str, Any] | None, mean_of: Mapping[int, float]
) -> tuple[int | None, str | None]:
    """The traces' last-arriving rank when its count of last arrivals is beyond chance, else
    None and, when the traces named one, why it is not taken."""
    last = (trace_job or {}).get("slowest_rank")
    if not isinstance(last, int) or last not in mean_of:
        return None, None
    cross = (trace_job or {}).get("cross_rank")
    per_rank = cross.get("per_rank") if isinstance(cross, Mapping) else None
    counts: dict[int, int] = {
        int(w["rank"]): int(w["last_arrivals"])
        for w in per_rank or []
        if isinstance(w, Mapping)
        and isinstance(w.get("rank"), int)
        and isinstance(w.get("last_arrivals"), int)
    }
    if last not in counts or len(counts) < 2:
        return last, None  # an older summary without the counts: taken as it was
    k, n = counts[last], sum(counts.values())
    steps = _traced_steps(trace_job)
    draws = min(n, steps) if steps else n
    wins = round(k * draws / n) if n else 0
    p = min(1.0, len(counts) * binomial_upper_tail(wins, draws, 1.0 / len(counts)))
    if p <= CHANCE_P:
        return last, None
    over = f" over {draws} traced steps" if draws < n else ""
    return None, (
        f"rank {last} arrived last at {k} of {n} collectives{over}, which chance gives "
        f"{p:.0%} of the time"
    )


def _traced_steps(trace_job: Mapping[str, Any] | None) -> int | None:
    """The fewest traced steps any rank's traces hold (the draws the last arrivals rest on)."""
    counts = [
        len(r["steps"])
        for r in (trace_job or {}).get("ranks") or []
        if isinstance(r, Mapping) and isinstance(r.get("steps"), list) and r["steps"]
    ]
    return min(counts) if counts else None


def _step_times_within_noise(run: RunRecord, timed: Sequence[tuple[float, int]]) -> str | None:
    """Why the ranks' mean step times do not single out a slowest rank, or None when they do."""
    (slow_ms, slow), (fast_ms, fast) = max(timed), min(timed)
    steps = {rec.rank: [s.duration_ms for s in steady_state_steps(rec.steps)] for rec in run.ranks}
    pairs = len(timed) * (len(timed) - 1) // 2  # the extremes are picked from every pair
    confidence = 1.0 - CHANCE_P / max(1, pairs)
    half = mean_difference_halfwidth(steps.get(slow, []), steps.get(fast, []), confidence)
    gap = slow_ms - fast_ms
    if half is None:
        return (
            f"rank {slow} {slow_ms:,.2f} ms vs rank {fast} {fast_ms:,.2f} ms mean step: too "
            "few steps to tell the ranks apart"
        )
    if gap > half:
        return None
    return (
        f"rank {slow} {slow_ms:,.2f} ms vs rank {fast} {fast_ms:,.2f} ms mean step: a "
        f"{gap:,.2f} ms gap within the steps' own noise (±{half:,.2f} ms, "
        f"{100 * confidence:.4g} %)"
    )


def _job_fastest(
    timed: Sequence[tuple[float, int]], slow_rank: int, slow_ms: float, job: JobAnalysis
) -> None:
    """The fastest rank: the lowest mean steady-state step time among the other ranks, never
    the slowest rank itself. When the slowest rank (by collectives) has the lowest mean step,
    the two bases disagree and no rank is named fastest: a "fastest" rank with a longer mean
    step than the slowest would contradict itself."""
    fast_ms, fast_rank = min((ms, rank) for ms, rank in timed if rank != slow_rank)
    if fast_ms > slow_ms:
        job.not_applicable["fastest_rank"] = (
            f"rank {slow_rank}, last to arrive at collectives, also has the lowest mean step "
            f"time ({slow_ms:,.2f} ms): the collectives and the step times disagree, so no "
            "other rank is faster"
        )
        return
    job.fastest_rank, job.fastest_mean_step_ms = fast_rank, fast_ms


def _job_identical_batches(run: RunRecord, job: JobAnalysis) -> None:
    if len(run.ranks) < 2:
        job.not_applicable["identical_batches"] = (
            "one process: nothing to compare across ranks (DataParallel splits each batch itself)"
        )
        return
    by_rank = [
        {s.index: s.fingerprint for s in rec.steps if s.fingerprint is not None}
        for rec in run.ranks
    ]
    common = set.intersection(*(set(fp) for fp in by_rank))
    if not common:
        job.not_applicable["identical_batches"] = (
            "no step index has a batch fingerprint on every rank"
        )
        return
    job.fingerprint_steps_compared = len(common)
    job.identical_batch_steps = sorted(i for i in common if len({fp[i] for fp in by_rank}) == 1)
    job.identical_batches = len(job.identical_batch_steps) == len(common)


def _cpu_fallback(run: RunRecord, job: JobAnalysis) -> None:
    job.cpu_fallback = run.cpu_fallback
    if run.cpu_fallback:
        reason = run.cpu_fallback_reason or "no CUDA device was available"
        job.cpu_fallback_notice = (
            f"This run used the CPU, not GPUs: {reason}. It proves the wiring (ranks, gloo "
            "communication, step timing), not GPU performance: NVML utilisation, MFU, energy "
            "and CUDA memory figures do not apply."
        )
