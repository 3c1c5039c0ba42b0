"""Findings on the distributed setup: DataParallel, exposed communication, DDP flags.

The straggler rule lives in ``straggler``; what advice may assume about the device and the
machine in ``fit``.
"""

from __future__ import annotations

from typing import Any

from mgprof.analyze.findings.core import (
    Finding,
    _facts,
    _mean_step_ms,
    _rank_list,
    _trace_summaries,
    finding_id,
)
from mgprof.analyze.findings.fit import ddp_buckets, device_word, grad_sync_status
from mgprof.analyze.run.schema import ComparisonRow, RunAnalysis, given
from mgprof.analyze.stats import percentile
from mgprof.records import RunRecord

# --------------------------------------------------------------------------------------------
# Thresholds

EXPOSED_COMM_PCT = 10.0
"""Exposed (not overlapped) communication above 10 % of the trace window is worth tuning: below
it, bucket and batch changes rarely repay the effort (PyTorch DDP notes: overlap hides most).
Judged on the median over the ranks: which rank waits most changes between identical runs."""
EXPOSED_COMM_HIGH_PCT = 25.0
"""A quarter of the window spent waiting on the network: the scaling is broken, not just slow."""


# --------------------------------------------------------------------------------------------
# Rules


def dataparallel_in_use(run: RunRecord, figures: RunAnalysis) -> Finding | None:
    """nn.DataParallel over several GPUs: one process, GIL-bound, device 0 does extra work."""
    if run.strategy != "dp":
        return None
    devices = max((r.devices_used for r in run.ranks), default=0)
    if devices < 2:
        return None
    parts = [f"strategy dp over {devices} devices in one process"]
    figs: dict[str, Any] = {"devices": devices}
    rank0 = next(iter(figures.ranks), None)
    step_ms = _mean_step_ms(rank0) if rank0 is not None else None
    if step_ms is not None:
        parts.append(f"mean step {step_ms:,.2f} ms")
        figs["mean_step_ms"] = step_ms
    per_device = rank0.memory.per_device if rank0 is not None and rank0.memory else {}
    peaks = {
        name: peak
        for name, v in sorted(per_device.items())
        if (peak := given(v.peak_allocated_mib)) is not None
    }
    if len(peaks) >= 2:
        first = sorted(peaks)[0]
        others = [v for k, v in peaks.items() if k != first and v is not None]
        parts.append(
            f"{first} peak {peaks[first]:,.0f} MiB vs others up to {max(others):,.0f} MiB "
            f"(outputs and gradients gather on {first})"
        )
        figs["per_device_peak_allocated_mib"] = peaks
    saving = _ddp_saving(figures, figs)
    return Finding(
        id=finding_id("dataparallel"),
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
        fix=[
            f"mgprof analyze script.py --gpus {devices} --strategy ddp",
            f"torchrun --nproc-per-node {devices} script.py",
            "DistributedDataParallel(model, device_ids=[local_rank])",
        ],
        saving=saving,
        figures=figs,
    )


def _comparison_rows(figures: RunAnalysis) -> list[ComparisonRow]:
    table = given(figures.comparison)
    return table.rows if table is not None else []


def _ddp_saving(figures: RunAnalysis, figs: dict[str, Any]) -> str | None:
    """DDP vs DP throughput from ``mgprof compare``, when the run has a comparison."""
    rows = _comparison_rows(figures)
    rate = {r.strategy: r.samples_per_s for r in rows}
    dp, ddp = rate.get("dp"), rate.get("ddp")
    if dp is None or ddp is None or dp <= 0 or ddp <= dp:
        return None
    figs["ddp_samples_per_s"], figs["dp_samples_per_s"] = ddp, dp
    return (
        f"measured by mgprof compare: {ddp:,.1f} samples/s with DDP vs {dp:,.1f} with "
        f"DataParallel ({ddp / dp:.2f}x)"
    )


def exposed_communication(run: RunRecord, figures: RunAnalysis) -> Finding | None:
    """Communication the compute does not hide: every rank waits for it each step."""
    shares = [
        (pct, rank.rank, rank.comm, rank)
        for rank in figures.ranks
        if rank.comm is not None and (pct := rank.comm.exposed_comm_pct) is not None
    ]
    if not shares:
        return None
    median = percentile([s[0] for s in shares], 50.0)
    if median < EXPOSED_COMM_PCT:
        return None
    pct, worst_rank, comm, rank = max(shares, key=lambda s: (s[0], -s[1]))
    exposed_ms = comm.exposed_comm_us / 1000.0
    window_ms = comm.window_us / 1000.0
    figs: dict[str, Any] = {
        "median_exposed_comm_pct": median,
        "ranks_measured": len(shares),
        "threshold_exposed_comm_pct": EXPOSED_COMM_PCT,
        "threshold_high_exposed_comm_pct": EXPOSED_COMM_HIGH_PCT,
        "rank": worst_rank,
        "exposed_comm_pct": pct,
        "exposed_comm_ms": exposed_ms,
        "window_ms": window_ms,
    }
    evidence = (
        f"exposed communication {median:.1f} % of the trace window (median of {len(shares)} "
        f"ranks; fires ≥ {EXPOSED_COMM_PCT:.0f} %, high ≥ {EXPOSED_COMM_HIGH_PCT:.0f} %); "
        f"most on rank {worst_rank}: {pct:.1f} % ({exposed_ms:,.2f} ms of {window_ms:,.2f} ms)"
    )
    overlap = comm.comm_overlap_pct
    if overlap is not None:
        evidence += f"; only {overlap:.1f} % of its communication overlaps compute"
        figs["comm_overlap_pct"] = overlap
    busbw = comm.busbw_gbps
    if busbw is not None:
        evidence += f"; bus bandwidth {busbw:,.2f} GB/s"
        figs["busbw_gbps"] = busbw
    advice = _comm_advice(run, figures, figs)
    evidence += advice.evidence
    step_ms = _mean_step_ms(rank)
    saving = None
    if step_ms is not None:
        figs["mean_step_ms"] = step_ms
        saving = (
            f"up to {step_ms * median / 100.0:,.2f} ms per step ({median:.1f} % of the "
            f"{step_ms:,.2f} ms mean step) if all of it were overlapped"
        )
    return Finding(
        id=finding_id("exposed_comm"),
        rule="exposed_comm",
        severity="high" if median >= EXPOSED_COMM_HIGH_PCT else "medium",
        title="Communication is not hidden behind compute",
        evidence=evidence,
        cause=advice.cause,
        change="; ".join(advice.change),
        fix=advice.fix,
        saving=saving,
        figures=figs,
    )


class _Advice:
    """What the exposed communication is (DDP gradients, the script's own collectives, or
    collectives of replicas that never synchronised) and what to change for that."""

    def __init__(self) -> None:
        self.evidence = ""
        self.cause = ""
        self.change: list[str] = []
        self.fix: list[str] = []


def _comm_advice(run: RunRecord, figures: RunAnalysis, figs: dict[str, Any]) -> _Advice:
    out = _Advice()
    status, how = grad_sync_status(figures)
    per = device_word(run)
    batch = (
        f"raise the per-{per} batch (or accumulate gradients over k steps inside "
        "`with model.no_sync():` for k-1 of them)"
    )
    if status == "independent":
        out.evidence = "; the ranks never synchronised gradients"
        out.cause = (
            "the ranks never synchronised gradients, so this communication is the script's own "
            "(barriers, metric all_reduces, broadcasts), and every rank blocks on it each step."
        )
        out.change = [
            "run per-step collectives only when needed (metrics every N steps), or issue them "
            "with `async_op=True` and `.wait()` only where the result is used"
        ]
        out.fix = ["dist.all_reduce(t, async_op=True)"]
        return out
    if how == "script all_reduce":
        out.evidence = "; communication from the script's own all_reduce calls (no DDP)"
        out.cause = (
            "the script all-reduces by hand after the backward, so nothing overlaps it; DDP "
            "would all-reduce gradient buckets while the backward still runs."
        )
        out.change = [
            "wrap the model in `DistributedDataParallel(model)` instead of all-reducing by hand, "
            "or issue the all_reduce with `async_op=True` and `.wait()` before the optimizer step",
            batch,
        ]
        out.fix = ["DistributedDataParallel(model)", "dist.all_reduce(t, async_op=True)"]
        return out
    if how == "fsdp":
        return _fsdp_advice(run, out, _fsdp_phases(figures, figs))
    out.cause = (
        "gradients are all-reduced after the backward pass has little compute left to hide "
        "them behind: the per-" + per + " batch is small relative to the model, buckets are "
        "launched late, or the interconnect is slow."
    )
    out.change = [batch]
    out.fix = ["model.no_sync()"]
    buckets = ddp_buckets(run)
    if buckets is not None:
        grad_mib, cap_mb = buckets
        figs["ddp_gradient_mib"], figs["bucket_cap_mb"] = grad_mib, cap_mb
        out.evidence = f"; DDP gradients {grad_mib:,.1f} MiB, bucket_cap_mb={cap_mb:g}"
        if grad_mib > cap_mb:
            bigger = f"{2 * cap_mb:g}"
            out.change.append(
                f"tune `DistributedDataParallel(model, bucket_cap_mb={bigger}, "
                "gradient_as_bucket_view=True, static_graph=True)` (static_graph only when the "
                "graph is the same every step)"
            )
            out.fix.append(
                f"DistributedDataParallel(model, bucket_cap_mb={bigger}, "
                "gradient_as_bucket_view=True, static_graph=True)"
            )
        else:
            out.evidence += " (the gradients fit within one bucket: a bucket size changes nothing)"
    return out


FSDP_PHASE_WORDS = {
    "forward_all_gather": "forward all-gather",
    "backward_all_gather": "backward all-gather",
    "post_backward_reduce_scatter": "reduce-scatter",
    "other": "other FSDP collectives",
}


def _fsdp_phases(figures: RunAnalysis, figs: dict[str, Any]) -> dict[str, float]:
    """Exposed milliseconds per traced step by FSDP phase, on the rank the finding names
    (``figs["rank"]``), from the trace's per-unit table; the first all-gather of each step
    (nothing to overlap with) apart as ``first_all_gather``."""
    rank = figs.get("rank")
    summaries = _trace_summaries(figures, rank) if isinstance(rank, int) else []
    out: dict[str, float] = {}
    steps = 0
    for summary in summaries:
        fsdp = summary.fsdp
        if fsdp is None:
            continue
        steps += max(1, len(summary.steps))
        for row in fsdp.rows:
            if row.exposed_us is not None:
                out[row.phase] = out.get(row.phase, 0.0) + row.exposed_us / 1000.0
        first = fsdp.first_all_gather
        if first is not None and first.exposed_us is not None:
            out["first_all_gather"] = out.get("first_all_gather", 0.0) + first.exposed_us / 1000.0
    if not steps:
        return {}
    per_step = {k: v / steps for k, v in out.items()}
    figs["fsdp_exposed_ms_per_step"] = per_step
    return per_step


def _fsdp_advice(run: RunRecord, out: _Advice, phases: dict[str, float]) -> _Advice:
    """FSDP's communication is per unit: all-gathers before forward and backward, a
    reduce-scatter after; what hides it is compute per unit and parameters kept gathered."""
    fsdp = next(iter(_facts(run, "fsdp").values()), None)
    out.evidence = "; FSDP: parameters all-gathered per unit, gradients reduce-scattered"
    if phases:
        parts = [
            f"{word} {phases[key]:,.2f} ms"
            for key, word in FSDP_PHASE_WORDS.items()
            if phases.get(key)
        ]
        first = phases.get("first_all_gather")
        if first:
            parts.append(
                f"of which each step's first all-gather {first:,.2f} ms (nothing to overlap)"
            )
        out.evidence += "; exposed per traced step: " + ", ".join(parts)
    out.cause = (
        "FSDP all-gathers each unit's parameters before its forward (and again before its "
        "backward when they were freed after forward) and reduce-scatters its gradients after; "
        "the first unit's all-gather has nothing to overlap with, and little compute per unit "
        "leaves the others exposed too."
    )
    out.change = [
        f"raise the per-{device_word(run)} batch: more compute per all-gather to hide it behind "
        "(or accumulate gradients over k micro-batches with "
        "`model.set_requires_gradient_sync(False)` for k-1 of them, FSDP2's no_sync)"
    ]
    out.fix = ["model.set_requires_gradient_sync(False)"]
    reshard = fsdp.reshard_after_forward if fsdp is not None else []
    backward = phases.get("backward_all_gather")
    if True in reshard:
        saving = (
            f" (its exposed backward all-gathers: {backward:,.2f} ms per step)" if backward else ""
        )
        out.change.append(
            "keep the gathered parameters from forward to backward where memory allows: "
            "`fully_shard(module, reshard_after_forward=False)` skips the backward all-gather"
            f"{saving}; measure it: `mgprof compare script.py --strategies fsdp,fsdp-noreshard`"
        )
        out.fix.append("fully_shard(module, reshard_after_forward=False)")
    exposed = sum(v for k, v in phases.items() if k != "first_all_gather")
    forward = phases.get("forward_all_gather", 0.0) - phases.get("first_all_gather", 0.0)
    if forward > 0 and forward >= 0.5 * exposed:
        out.change.append(
            "prefetch more forward all-gathers: `model.layers[i].set_modules_to_forward_prefetch("
            "[model.layers[i + 1], model.layers[i + 2]])` (FSDP2 prefetches one unit ahead by "
            f"default; {forward:,.2f} ms per step of forward all-gather after the first is exposed)"
        )
        out.fix.append("set_modules_to_forward_prefetch")
    scatter = phases.get("post_backward_reduce_scatter")
    if scatter and scatter >= 0.5 * exposed:
        out.change.append(
            f"the reduce-scatters are the exposed part ({scatter:,.2f} ms per step): the last "
            "units' gradients are reduced after the backward has no compute left; more compute "
            "per step (batch) or gradient accumulation with set_requires_gradient_sync(False) "
            "spreads them"
        )
    return out


def find_unused_parameters(run: RunRecord, figures: RunAnalysis) -> Finding | None:
    """DDP(find_unused_parameters=True): an autograd-graph traversal every iteration."""
    flagged = sorted(r for r, v in _facts(run, "find_unused_parameters").items() if v is True)
    if not flagged or run.strategy != "ddp":
        return None
    means = [m for r in figures.ranks if (m := _mean_step_ms(r)) is not None]
    evidence = (
        f"DistributedDataParallel(find_unused_parameters=True) on ranks {_rank_list(flagged)}"
    )
    figs: dict[str, Any] = {"ranks": sorted(flagged)}
    if means:
        evidence += f"; mean step {sum(means) / len(means):,.2f} ms"
        figs["mean_step_ms"] = sum(means) / len(means)
    return Finding(
        id=finding_id("find_unused_parameters"),
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
        fix=[
            "DistributedDataParallel(model, find_unused_parameters=False)",
            "DistributedDataParallel(model, static_graph=True)",
        ],
        figures=figs,
    )
