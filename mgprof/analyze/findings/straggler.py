"""The straggler finding: one rank slower than the others, beyond the run's own noise.

Mean step times of ranks differ in every run, and on a noisy machine the slowest rank changes
from run to run. The rule fires only when two things hold, both measured on the run itself:
the rank is the slowest in most steady-state steps (compared step by step, by step index), and
the spread of the ranks' mean step times exceeds the step-time scatter within the ranks. Its
severity comes from the median per-step excess, which one outlier step does not move.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from mgprof.analyze.findings.core import Finding, finding_id
from mgprof.analyze.findings.fit import cores_per_rank, ranks_per_host, uses_gpu
from mgprof.analyze.run.schema import RunAnalysis
from mgprof.analyze.run.steps import steady_state_steps
from mgprof.analyze.stats import mean, percentile
from mgprof.records import RankRecord, RunRecord

# --------------------------------------------------------------------------------------------
# Thresholds

SLOWEST_STEPS_PCT = 75.0
"""The rank must be the slowest in at least 3 of 4 compared steps: with two equally fast ranks
each is the slowest in about half, so a majority alone is what noise gives a third of the time
over a handful of steps."""
MIN_STEPS_COMPARED = 4
"""Fewer steady-state steps common to every rank cannot show that one rank is consistently
slower."""
SPREAD_PCT = 10.0
"""The floor for the spread of mean step times, even on a run with no scatter: below 10 % a
rebalance rarely repays the effort."""
SPREAD_HIGH_PCT = 25.0
"""A median per-step excess of a quarter: the whole job loses a fifth of its throughput to one
rank. Judged on the median so one slow step cannot change the severity."""
SCATTER_QUANTILES = (50.0, 95.0)
"""The run's own noise: 100 * (p95 / p50 - 1) of a rank's steady-state step times, the largest
over the ranks. A spread of means smaller than that could be scatter."""


# --------------------------------------------------------------------------------------------
# Figures


class _Steps:
    """Steady-state step durations of every rank, compared step by step."""

    def __init__(self, run: RunRecord) -> None:
        self.by_rank: dict[int, dict[int, float]] = {
            rec.rank: {s.index: s.duration_ms for s in steady_state_steps(rec.steps)}
            for rec in sorted(run.ranks, key=lambda r: r.rank)
        }
        self.by_rank = {r: d for r, d in self.by_rank.items() if d}
        sets = [set(d) for d in self.by_rank.values()]
        self.common = sorted(set.intersection(*sets)) if len(sets) >= 2 else []

    def slowest_counts(self) -> Counter[int]:
        """How many compared steps each rank was strictly the slowest in (ties count for none)."""
        wins: Counter[int] = Counter()
        for i in self.common:
            times = sorted(((d[i], r) for r, d in self.by_rank.items()), reverse=True)
            if times[0][0] > times[1][0]:
                wins[times[0][1]] += 1
        return wins

    def means_ms(self) -> dict[int, float]:
        return {r: mean(d.values()) for r, d in self.by_rank.items()}

    def scatter_pct(self) -> tuple[float, int] | None:
        """(largest p95/p50 scatter in %, its rank) over the ranks with a positive median."""
        out: list[tuple[float, int]] = []
        lo, hi = SCATTER_QUANTILES
        for r, d in self.by_rank.items():
            values = list(d.values())
            p50 = percentile(values, lo)
            if p50 > 0:
                out.append((100.0 * (percentile(values, hi) / p50 - 1.0), r))
        return max(out) if out else None

    def median_excess_pct(self, slow: int) -> float | None:
        """Median over compared steps of how much longer ``slow``'s step was than the fastest
        other rank's same step, in percent."""
        excess = []
        for i in self.common:
            others = min(d[i] for r, d in self.by_rank.items() if r != slow)
            if others > 0:
                excess.append(100.0 * (self.by_rank[slow][i] - others) / others)
        return percentile(excess, 50.0) if excess else None


# --------------------------------------------------------------------------------------------
# The rule


def rank_imbalance(run: RunRecord, figures: RunAnalysis) -> Finding | None:
    """One rank consistently slower than the others, by more than the run's noise."""
    steps = _Steps(run)
    n = len(steps.common)
    if n < MIN_STEPS_COMPARED:
        return None
    top = steps.slowest_counts().most_common(2)
    if not top or (len(top) == 2 and top[0][1] == top[1][1]):
        return None
    slow, wins = top[0]
    slowest_pct = 100.0 * wins / n
    means = steps.means_ms()
    fast_ms, fast = min((ms, r) for r, ms in means.items() if r != slow)
    slow_ms = means[slow]
    scatter = steps.scatter_pct()
    excess = steps.median_excess_pct(slow)
    if slowest_pct < SLOWEST_STEPS_PCT or scatter is None or excess is None or fast_ms <= 0:
        return None
    spread = 100.0 * (slow_ms - fast_ms) / fast_ms
    scatter_pct, scatter_rank = scatter
    needed = max(SPREAD_PCT, scatter_pct)
    if spread <= needed:
        return None
    figs: dict[str, Any] = {
        "slowest_rank": slow,
        "steps_slowest": wins,
        "steps_compared": n,
        "slowest_steps_pct": slowest_pct,
        "slowest_mean_step_ms": slow_ms,
        "fastest_rank": fast,
        "fastest_mean_step_ms": fast_ms,
        "step_time_spread_pct": spread,
        "step_time_scatter_pct": scatter_pct,
        "scatter_rank": scatter_rank,
        "median_step_excess_pct": excess,
        "threshold_slowest_steps_pct": SLOWEST_STEPS_PCT,
        "threshold_spread_pct": SPREAD_PCT,
        "threshold_high_excess_pct": SPREAD_HIGH_PCT,
    }
    evidence = (
        f"rank {slow} is the slowest in {wins}/{n} steady-state steps ({slowest_pct:.0f} %; "
        f"needs ≥ {SLOWEST_STEPS_PCT:.0f} %); mean step {slow_ms:,.2f} ms vs rank {fast} "
        f"{fast_ms:,.2f} ms: spread {spread:.1f} % > {needed:.1f} % (the larger of the "
        f"{SPREAD_PCT:.0f} % floor and the run's own scatter, p95/p50 of rank {scatter_rank}'s "
        f"step times: {scatter_pct:.1f} %); median per-step excess {excess:.1f} % "
        f"(high ≥ {SPREAD_HIGH_PCT:.0f} %)"
    )
    evidence += _collective_waits(figures, figs)
    gpu = uses_gpu(run)
    rec = next(r for r in run.ranks if r.rank == slow)
    fix = ["DataLoader(..., drop_last=True)"]
    if gpu and rec.device.kind == "cuda":
        check = f"check rank {slow}'s GPU with `nvidia-smi -q -d PERFORMANCE,TEMPERATURE`"
        fix.append("nvidia-smi -q -d PERFORMANCE,TEMPERATURE")
    else:
        check = f"check what else runs on rank {slow}'s host (`top`)"
        threads = _fitting_threads(run, rec)
        if threads is not None:
            check += f" and give each rank its share of the cores: `OMP_NUM_THREADS={threads}`"
            fix.append(f"OMP_NUM_THREADS={threads}")
    return Finding(
        id=finding_id("rank_imbalance", slow),
        rule="rank_imbalance",
        severity="high" if excess >= SPREAD_HIGH_PCT else "medium",
        title="Ranks run at different speeds (straggler)",
        evidence=evidence,
        cause=_cause(run, rec, gpu),
        change=(
            "give every rank equal work (bucket inputs by length, `drop_last=True`); move "
            f"rank-0-only work (logging, evaluation, checkpoints) out of the step; {check}"
        ),
        fix=fix,
        saving=(
            f"up to {slow_ms - fast_ms:,.2f} ms per step "
            f"({100.0 * (slow_ms - fast_ms) / slow_ms:.1f} % of the slowest rank's step) "
            "if every rank ran at the fastest rank's pace"
        ),
        figures=figs,
    )


def _fitting_threads(run: RunRecord, rec: RankRecord) -> int | None:
    """Threads per rank that fit the host's cores, when the ranks oversubscribe them now."""
    cores, threads = cores_per_rank(run), rec.training.cpu_threads
    if cores is None or threads is None or threads <= max(cores, 1):
        return None
    return max(cores, 1)


def _cause(run: RunRecord, rec: RankRecord, gpu: bool) -> str:
    if gpu:
        return (
            "uneven work per rank (variable-length inputs, extra logging or checkpointing on "
            "rank 0), a slower or throttled GPU, or CPU contention on one host."
        )
    text = (
        "uneven work per rank (variable-length inputs, extra logging or checkpointing on "
        "rank 0), or CPU contention: the ranks of a host share its cores"
    )
    cores, threads = rec.training.cpu_cores, rec.training.cpu_threads
    if cores is not None and threads is not None:
        ranks = ranks_per_host(run, rec.host)
        text += (
            f" (rank {rec.rank}'s host: {ranks} ranks x {threads} thread(s) on {cores} cores"
            + (", oversubscribed" if ranks * threads > cores else "")
            + ")"
        )
    return text + "."


def _collective_waits(figures: RunAnalysis, figs: dict[str, Any]) -> str:
    """Who arrived last at the traced collectives and how long the others waited."""
    trace_job = figures.traces.job
    last = trace_job.slowest_rank if trace_job is not None else None
    if trace_job is None or last is None:
        return ""
    text = f"; last to arrive at collectives: rank {last}"
    figs["last_to_arrive_rank"] = last
    waits = trace_job.cross_rank.per_rank if trace_job.cross_rank is not None else []
    wait_ms: dict[str, float] = {}
    for w in waits:
        if w.rank != last:
            text += f"; rank {w.rank} waited {w.wait_us / 1000.0:,.2f} ms"
            wait_ms[str(w.rank)] = w.wait_us / 1000.0
    if wait_ms:
        figs["collective_wait_ms_by_rank"] = wait_ms
    return text
