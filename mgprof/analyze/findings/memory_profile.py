"""Findings from ``--memory`` tracking: one rank that needs much more memory than the others,
and a fragmented CUDA cache. Both read ``analysis["memory"]`` (``mgprof.analyze.run.memory``).
"""

from __future__ import annotations

from mgprof.analyze.findings.core import Finding, finding_id
from mgprof.analyze.findings.fit import uses_gpu
from mgprof.analyze.run.schema import MemoryAnalysis, MemoryProfile, RunAnalysis, given
from mgprof.records import RunRecord

FRAGMENTED_PCT = 25.0
"""Reserved but unallocated at the peak, as a share of reserved: a quarter of the cache idle."""
FRAGMENTED_MIB = 1024.0
"""...and at least 1 GiB of it: below that the waste is not worth a setting."""


def _memory(figures: RunAnalysis) -> MemoryAnalysis:
    return given(figures.memory) or MemoryAnalysis()


def _sites_text(profile: MemoryProfile | None, most: int = 3) -> str:
    sites = (given(profile.top_sites) or [])[:most] if profile is not None else []
    return ", ".join(f"{s.site} {s.mib or 0.0:,.0f} MiB" for s in sites)


def memory_imbalance(run: RunRecord, figures: RunAnalysis) -> Finding | None:
    """One rank's peak memory far from the median of the ranks (``comparison.differs``)."""
    comparison = _memory(figures).comparison
    differs = comparison.differs if comparison is not None else None
    if comparison is None or differs is None:
        return None
    rank, delta, pct = differs.rank, differs.delta_mib, differs.delta_pct
    basis = comparison.basis or "peak memory"
    profile = next((p for p in _memory(figures).ranks if p.rank == rank), None)
    sites = _sites_text(profile)
    others = differs.median_others_mib
    shown = f" ({pct:+.0f} %)" if pct is not None else ""
    evidence = (
        f"rank {rank}'s {basis} is {delta:,.1f} MiB{shown} above the median of the other ranks"
        + (f" ({others:,.1f} MiB)" if others is not None else "")
        + f" (fires beyond {comparison.threshold_pct or 10:.0f} % and "
        f"{comparison.threshold_mib or 16:,.0f} MiB)"
    )
    if sites:
        evidence += f"; live at its peak: {sites}"
    device = "GPU" if uses_gpu(run) else "rank"
    return Finding(
        id=finding_id("memory_imbalance", rank),
        rule="memory_imbalance",
        severity="medium",
        title="One rank needs much more memory than the others",
        evidence=evidence,
        cause=(
            "work that only one rank does (logging, evaluation, checkpointing or metrics on rank "
            f"0), uneven batches, or DataParallel gathering outputs on device 0: the job's batch "
            f"size is limited by the fullest {device}."
        ),
        change=(
            "move rank-specific work out of the training step or give it to every rank; with "
            "DataParallel, switch to `DistributedDataParallel`; the sites above say what the "
            "rank holds at its peak"
        ),
        fix=["DistributedDataParallel(model)"],
        figures={
            "rank": rank,
            "delta_mib": delta,
            "delta_pct": pct,
            "median_others_mib": others,
            "basis": basis,
            "threshold_pct": comparison.threshold_pct or 10.0,
            "threshold_mib": comparison.threshold_mib or 16.0,
            "sites_mib": [
                s.mib for s in ((given(profile.top_sites) or []) if profile is not None else [])[:3]
            ],
        },
    )


def memory_fragmentation(run: RunRecord, figures: RunAnalysis) -> Finding | None:
    """Much of the CUDA cache reserved but not allocated at the peak (allocator snapshots)."""
    if not uses_gpu(run):
        return None
    worst: tuple[int, float, float] | None = None
    for p in _memory(figures).ranks:
        frag, pct = given(p.fragmentation_mib), given(p.fragmentation_pct)
        if frag is None or pct is None:
            continue
        if pct >= FRAGMENTED_PCT and frag >= FRAGMENTED_MIB and (worst is None or frag > worst[1]):
            worst = (p.rank, frag, pct)
    if worst is None:
        return None
    rank, frag, pct = worst
    return Finding(
        id=finding_id("memory_fragmentation"),
        rule="memory_fragmentation",
        severity="medium",
        title="The CUDA cache holds memory it cannot use",
        evidence=(
            f"rank {rank}: {frag:,.0f} MiB ({pct:.0f} % of reserved) reserved but not allocated at "
            f"the peak (fires at ≥ {FRAGMENTED_PCT:.0f} % and ≥ {FRAGMENTED_MIB:,.0f} MiB)"
        ),
        cause=(
            "blocks freed between allocations of different sizes leave gaps that a larger "
            "request cannot use, so the allocator reserves more (and can OOM with memory free)."
        ),
        change=(
            "set `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` before the first CUDA "
            "allocation (segments then grow in place instead of fragmenting)"
        ),
        fix=["PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"],
        saving=f"up to {frag:,.0f} MiB of device memory on rank {rank}",
        figures={
            "rank": rank,
            "fragmentation_mib": frag,
            "fragmentation_pct": pct,
            "threshold_pct": FRAGMENTED_PCT,
            "threshold_mib": FRAGMENTED_MIB,
        },
    )
