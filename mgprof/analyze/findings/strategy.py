"""Findings on the distributed setup: DataParallel, exposed communication, DDP flags, stragglers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mgprof.analyze.findings.core import Finding, _facts, _job, _mean_step_ms, _rank_list
from mgprof.analyze.readers import as_dict as _dict
from mgprof.analyze.readers import num as _num
from mgprof.analyze.readers import rank_dicts as _ranks
from mgprof.records import RunRecord

# --------------------------------------------------------------------------------------------
# Thresholds

EXPOSED_COMM_PCT = 10.0
"""Exposed (not overlapped) communication above 10 % of the trace window is worth tuning: below
it, bucket and batch changes rarely repay the effort (PyTorch DDP notes: overlap hides most)."""
EXPOSED_COMM_HIGH_PCT = 25.0
"""A quarter of the window spent waiting on the network: the scaling is broken, not just slow."""

SPREAD_PCT = 10.0
"""Ranks' mean step times more than 10 % apart: every collective waits for the slowest rank,
so the job runs at its speed; smaller spreads are within run-to-run noise."""
SPREAD_HIGH_PCT = 25.0
"""A quarter slower: the whole job loses a fifth of its throughput to one rank."""


# --------------------------------------------------------------------------------------------
# Rules


def dataparallel_in_use(run: RunRecord, figures: Mapping[str, Any]) -> Finding | None:
    """nn.DataParallel over several GPUs: one process, GIL-bound, device 0 does extra work."""
    if run.strategy != "dp":
        return None
    devices = max((r.devices_used for r in run.ranks), default=0)
    if devices < 2:
        return None
    parts = [f"strategy dp over {devices} devices in one process"]
    figs: dict[str, Any] = {"devices": devices}
    rank0 = next(iter(_ranks(figures)), {})
    step_ms = _mean_step_ms(rank0)
    if step_ms is not None:
        parts.append(f"mean step {step_ms:,.2f} ms")
        figs["step_time_ms"] = step_ms
    per_device = _dict(_dict(rank0.get("memory")).get("per_device"))
    peaks = {
        name: _num(_dict(v).get("peak_allocated_mib"))
        for name, v in per_device.items()
        if _num(_dict(v).get("peak_allocated_mib")) is not None
    }
    if len(peaks) >= 2:
        first = sorted(peaks)[0]
        others = [v for k, v in peaks.items() if k != first and v is not None]
        parts.append(
            f"{first} peak {peaks[first]:,.0f} MiB vs others up to {max(others):,.0f} MiB "
            "(outputs and gradients gather on device 0)"
        )
        figs["per_device_peak_allocated_mib"] = peaks
    saving = _ddp_saving(figures)
    return Finding(
        rule="dataparallel",
        severity="high",
        title="nn.DataParallel in use where DistributedDataParallel applies",
        evidence="; ".join(parts),
        cause=(
            "DataParallel runs every replica from one Python process (GIL contention), copies "
            "the model to each device every step and gathers outputs on device 0, which then "
            "does more work and holds more memory than the others."
        ),
        change=(
            "use DistributedDataParallel, one process per GPU: `mgprof analyze script.py --gpus "
            f"{devices} --strategy ddp`, or `torchrun --nproc-per-node {devices} script.py` with "
            "`model = DistributedDataParallel(model, device_ids=[local_rank])`"
        ),
        saving=saving,
        figures=figs,
    )


def _comparison_rows(figures: Mapping[str, Any]) -> list[dict[str, Any]]:
    raw = figures.get("comparison")
    if isinstance(raw, dict):
        raw = raw.get("rows")
    return [r for r in raw if isinstance(r, dict)] if isinstance(raw, list) else []


def _ddp_saving(figures: Mapping[str, Any]) -> str | None:
    """DDP vs DP throughput from ``mgprof compare``, when the run has a comparison."""
    rows = _comparison_rows(figures)
    rate = {str(r.get("strategy")): _num(r.get("samples_per_s")) for r in rows}
    dp, ddp = rate.get("dp"), rate.get("ddp")
    if dp is None or ddp is None or dp <= 0 or ddp <= dp:
        return None
    return (
        f"measured by mgprof compare: {ddp:,.1f} samples/s with DDP vs {dp:,.1f} with "
        f"DataParallel ({ddp / dp:.2f}x)"
    )


def exposed_communication(run: RunRecord, figures: Mapping[str, Any]) -> Finding | None:
    """Communication the compute does not hide: every rank waits for it each step."""
    worst: tuple[float, dict[str, Any], dict[str, Any]] | None = None
    for rank in _ranks(figures):
        comm = _dict(rank.get("comm"))
        pct = _num(comm.get("exposed_comm_pct"))
        if pct is not None and (worst is None or pct > worst[0]):
            worst = (pct, rank, comm)
    if worst is None or worst[0] < EXPOSED_COMM_PCT:
        return None
    pct, rank, comm = worst
    exposed_ms = (_num(comm.get("exposed_comm_us")) or 0.0) / 1000.0
    window_ms = (_num(comm.get("window_us")) or 0.0) / 1000.0
    overlap = _num(comm.get("comm_overlap_pct"))
    evidence = (
        f"rank {rank.get('rank')}: exposed communication {pct:.1f} % of the trace window "
        f"({exposed_ms:,.2f} ms of {window_ms:,.2f} ms)"
    )
    if overlap is not None:
        evidence += f"; only {overlap:.1f} % of communication overlaps compute"
    busbw = _num(comm.get("busbw_gbps"))
    if busbw is not None:
        evidence += f"; bus bandwidth {busbw:,.2f} GB/s"
    caps = _facts(run, "ddp_bucket_cap_mb")
    cap = next(iter(caps.values()), None)
    if cap is not None:
        evidence += f"; bucket_cap_mb={cap:g}"
    step_ms = _mean_step_ms(rank)
    saving = None
    if step_ms is not None:
        saving = (
            f"up to {step_ms * pct / 100.0:,.2f} ms per step ({pct:.1f} % of the "
            f"{step_ms:,.2f} ms mean step) if all of it were overlapped"
        )
    return Finding(
        rule="exposed_comm",
        severity="high" if pct >= EXPOSED_COMM_HIGH_PCT else "medium",
        title="Communication is not hidden behind compute",
        evidence=evidence,
        cause=(
            "gradients are all-reduced after the backward pass has little compute left to hide "
            "them behind: the per-GPU batch is small relative to the model, buckets are "
            "launched late, or the interconnect is slow."
        ),
        change=(
            "raise the per-GPU batch (or accumulate gradients over k steps inside "
            "`with model.no_sync():` for k-1 of them); tune "
            "`DistributedDataParallel(model, bucket_cap_mb=50, gradient_as_bucket_view=True, "
            "static_graph=True)` (static_graph only when the graph is the same every step)"
        ),
        saving=saving,
        figures={
            "rank": rank.get("rank"),
            "exposed_comm_pct": pct,
            "exposed_comm_us": _num(comm.get("exposed_comm_us")),
            "comm_overlap_pct": overlap,
            "busbw_gbps": busbw,
            "bucket_cap_mb": cap,
        },
    )


def rank_imbalance(run: RunRecord, figures: Mapping[str, Any]) -> Finding | None:
    """One rank slower than the others: every collective waits for it."""
    job = _job(figures)
    spread = _num(job.get("step_time_spread_pct"))
    slow, fast = job.get("slowest_rank"), job.get("fastest_rank")
    slow_ms, fast_ms = _num(job.get("slowest_mean_step_ms")), _num(job.get("fastest_mean_step_ms"))
    if spread is None or slow_ms is None or fast_ms is None or spread < SPREAD_PCT:
        return None
    evidence = (
        f"rank {slow} mean step {slow_ms:,.2f} ms vs rank {fast} {fast_ms:,.2f} ms "
        f"(spread {spread:.1f} %)"
    )
    trace_job = _dict(_dict(figures.get("traces")).get("job"))
    last = trace_job.get("slowest_rank")
    if isinstance(last, int):
        evidence += f"; last to arrive at collectives: rank {last}"
        waits = _dict(trace_job.get("cross_rank")).get("per_rank")
        for w in waits if isinstance(waits, list) else []:
            wait_us = _num(_dict(w).get("wait_us"))
            if wait_us is not None and w.get("rank") != last:
                evidence += f"; rank {w.get('rank')} waited {wait_us / 1000.0:,.2f} ms"
    return Finding(
        rule="rank_imbalance",
        severity="high" if spread >= SPREAD_HIGH_PCT else "medium",
        title="Ranks run at different speeds (straggler)",
        evidence=evidence,
        cause=(
            "uneven work per rank (variable-length inputs, extra logging or checkpointing on "
            "rank 0), a slower or throttled GPU, or CPU contention on one host."
        ),
        change=(
            "give every rank equal work (bucket inputs by length, `drop_last=True`); move "
            "rank-0-only work (logging, evaluation, checkpoints) out of the step; check the slow "
            "rank's GPU with `nvidia-smi -q -d PERFORMANCE,TEMPERATURE`"
        ),
        saving=(
            f"up to {slow_ms - fast_ms:,.2f} ms per step "
            f"({100.0 * (slow_ms - fast_ms) / slow_ms:.1f} % of the slowest rank's step) "
            "if every rank ran at the fastest rank's pace"
        ),
        figures={"spread_pct": spread, "slowest_rank": slow, "fastest_rank": fast},
    )


def find_unused_parameters(run: RunRecord, figures: Mapping[str, Any]) -> Finding | None:
    """DDP(find_unused_parameters=True): an autograd-graph traversal every iteration."""
    flagged = [r for r, v in _facts(run, "find_unused_parameters").items() if v is True]
    if not flagged or run.strategy != "ddp":
        return None
    means = [m for r in _ranks(figures) if (m := _mean_step_ms(r)) is not None]
    evidence = (
        f"DistributedDataParallel(find_unused_parameters=True) on ranks {_rank_list(flagged)}"
    )
    if means:
        evidence += f"; mean step {sum(means) / len(means):,.2f} ms"
    return Finding(
        rule="find_unused_parameters",
        severity="low",
        title="DDP searches for unused parameters every step",
        evidence=evidence,
        cause=(
            "find_unused_parameters=True makes DDP walk the autograd graph after each forward "
            "and delays bucket all-reduces until it knows which gradients will never arrive."
        ),
        change=(
            "`DistributedDataParallel(model, find_unused_parameters=False)`; if some parameters "
            "really are unused in every step, keep it off and pass `static_graph=True`"
        ),
        figures={"ranks": flagged},
    )
