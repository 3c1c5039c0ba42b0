"""Findings on device memory: too little headroom (OOM risk) or so much that the batch can grow."""

from __future__ import annotations

import re
from typing import Any

from mgprof.analyze.findings.core import Finding, _cuda_ranks, finding_id
from mgprof.analyze.findings.fit import uses_gpu
from mgprof.analyze.run.results import DevicePeaks, MemoryFigures
from mgprof.analyze.run.schema import RunAnalysis, given
from mgprof.records import RunRecord

# --------------------------------------------------------------------------------------------
# Thresholds

HEADROOM_LOW_PCT = 10.0
"""Under 10 % free device memory: allocator fragmentation or a longer batch can OOM the run."""
HEADROOM_CRITICAL_PCT = 5.0
"""Under 5 % free: the next larger input will most likely fail with CUDA out of memory."""
HEADROOM_HIGH_PCT = 50.0
"""More than half the device unused: a larger batch (or model) is likely to raise throughput."""


# --------------------------------------------------------------------------------------------
# Rules


_Memory = MemoryFigures | DevicePeaks
"""A rank's memory figures, or one device's of a DataParallel rank."""


def _headroom(mem: _Memory) -> float | None:
    return given(mem.headroom_pct)


def _memory_rows(run: RunRecord, figures: RunAnalysis) -> list[tuple[str, _Memory]]:
    """(label, memory figures) per CUDA device: each DataParallel device counts on its own."""
    rows: list[tuple[str, _Memory]] = []
    if not uses_gpu(run):
        return rows
    for rank in figures.ranks:
        mem = rank.memory
        if mem is None or mem.kind != "cuda":
            continue
        if mem.per_device:
            rows.extend((f"rank {rank.rank} {k}", v) for k, v in sorted(mem.per_device.items()))
        else:
            rows.append((f"rank {rank.rank} {rank.device}".strip(), mem))
    return [(label, m) for label, m in rows if _headroom(m) is not None]


def _mem_text(label: str, mem: _Memory, figs: dict[str, Any]) -> str:
    """One device's headroom as text; its numbers go into ``figs[label]``."""
    reserved, total = given(mem.peak_reserved_mib), given(mem.total_mib)
    pct = _headroom(mem) or 0.0
    text = f"{label}: {pct:.1f} % free"
    dev: dict[str, Any] = {"headroom_pct": pct}
    if reserved is not None and total is not None:
        text += f" (peak reserved {reserved:,.0f} MiB of {total:,.0f} MiB)"
        dev["peak_reserved_mib"], dev["total_mib"] = reserved, total
    figs.setdefault("devices", {})[label] = dev
    return text


def memory_near_limit(run: RunRecord, figures: RunAnalysis) -> Finding | None:
    """Peak reserved memory close to the device total: the next longer input may OOM."""
    rows = _memory_rows(run, figures)
    tight = [(label, m) for label, m in rows if (_headroom(m) or 0) < HEADROOM_LOW_PCT]
    if not tight:
        return None
    label, mem = min(tight, key=lambda r: _headroom(r[1]) or 0.0)
    pct = _headroom(mem) or 0.0
    figs: dict[str, Any] = {
        "device": label,
        "headroom_pct": pct,
        "threshold_headroom_pct": HEADROOM_LOW_PCT,
        "threshold_high_headroom_pct": HEADROOM_CRITICAL_PCT,
    }
    evidence = "; ".join(_mem_text(lbl, m, figs) for lbl, m in tight)
    evidence += f" (fires < {HEADROOM_LOW_PCT:.0f} % free, high < {HEADROOM_CRITICAL_PCT:.0f} %)"
    live = _largest_live(figures, label, figs)
    if live:
        evidence += f"; largest live at the peak (--memory): {live}"
    return Finding(
        id=finding_id("memory_near_limit"),
        rule="memory_near_limit",
        severity="high" if pct < HEADROOM_CRITICAL_PCT else "medium",
        title="Device memory is nearly full",
        evidence=evidence,
        cause=(
            "activations of the batch, parameters, gradients and optimizer state fill the "
            "device; fragmentation or a longer input can then fail with CUDA out of memory."
        ),
        change=(
            "checkpoint activations (`torch.utils.checkpoint.checkpoint(block, x, "
            "use_reentrant=False)`), use a smaller batch with gradient accumulation, enable "
            '`torch.autocast("cuda", dtype=torch.bfloat16)`, or set '
            "`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` against fragmentation"
        ),
        fix=[
            "torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)",
            'torch.autocast("cuda", dtype=torch.bfloat16)',
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
        ],
        figures=figs,
    )


def _largest_live(figures: RunAnalysis, label: str, figs: dict[str, Any]) -> str:
    """What the tightest device's rank held at its peak, from ``--memory`` tracking: the sites
    the change (checkpointing, a smaller micro-batch, bf16) would shrink. "" without it."""
    match = re.match(r"rank (\d+)", label)
    if match is None:
        return ""
    rank = int(match.group(1))
    memory = given(figures.memory)
    for p in memory.ranks if memory is not None else []:
        if p.rank != rank:
            continue
        sites = (given(p.top_sites) or [])[:3]
        figs["live_sites_mib"] = [s.mib for s in sites]
        return ", ".join(f"{s.site} {s.mib or 0.0:,.1f} MiB" for s in sites)
    return ""


def memory_headroom(run: RunRecord, figures: RunAnalysis) -> Finding | None:
    """Most of every device unused: room for a larger batch, which usually raises throughput."""
    rows = _memory_rows(run, figures)
    if not rows or len(rows) < len(_cuda_ranks(run)):
        return None  # one unmeasured device might be the full one
    if min(_headroom(m) or 0.0 for _, m in rows) <= HEADROOM_HIGH_PCT:
        return None
    label, mem = min(rows, key=lambda r: _headroom(r[1]) or 0.0)
    reserved, total = given(mem.peak_reserved_mib), given(mem.total_mib)
    batch = _batch_size(run)
    change = "raise the per-GPU batch size (scale the learning rate with it)"
    if batch is not None:
        change = f"raise the per-GPU batch size above {batch} (scale the learning rate with it)"
    change += "; find the throughput sweet spot with `mgprof sweep`"
    figs: dict[str, Any] = {
        "device": label,
        "headroom_pct": _headroom(mem),
        "batch_size": batch,
        "threshold_headroom_pct": HEADROOM_HIGH_PCT,
    }
    saving = None
    if reserved and total and batch:
        # Upper bound: parameters and optimizer state do not grow with the batch.
        figs["batch_size_bound"] = int(batch * 0.9 * total / reserved)
        saving = (
            f"memory allows up to about {figs['batch_size_bound']} samples per GPU "
            "(upper bound; throughput gain depends on utilisation, measure with mgprof sweep)"
        )
    evidence = "least free device: " + _mem_text(label, mem, figs)
    evidence += f" (fires when every device has > {HEADROOM_HIGH_PCT:.0f} % free)"
    return Finding(
        id=finding_id("memory_headroom"),
        rule="memory_headroom",
        severity="low",
        title="Most of the device memory is unused",
        evidence=evidence,
        cause="the batch (or model) uses a small part of the device's memory.",
        change=change,
        fix=_headroom_fix(run, batch, figs.get("batch_size_bound")),
        saving=saving,
        figures=figs,
    )


def _batch_size(run: RunRecord) -> int | None:
    sizes = [s.batch_size for r in run.ranks for s in r.steps if s.batch_size is not None]
    return max(set(sizes), key=sizes.count) if sizes else None


def _headroom_fix(run: RunRecord, batch: int | None, bound: int | None) -> list[str]:
    """The sweep command over the range memory allows, and the batch to try first."""
    per_node = run.world_size // max(run.nnodes, 1)
    gpus = max([per_node, 1, *(r.devices_used for r in run.ranks)])
    fix = []
    if batch is not None:
        fix.append(f"DataLoader(batch_size={batch * 2})")
    sweep = f"mgprof sweep script.py --gpus {gpus}"
    if batch is not None and bound is not None and bound > batch:
        sweep += f" --range {batch}:{bound}"
    return [*fix, sweep]
