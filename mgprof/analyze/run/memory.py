"""``analysis["memory"]``: what ``--memory`` tracking shows per rank, and across ranks.

Per tracked rank one profile: its peak (allocated, reserved), the step and region of the peak,
the sites live at the peak, the allocation curve, and on CUDA the cache's unused part. The
source is the allocator snapshot on CUDA (``memory_snapshot``) when there is one, else the
profiler's memory events in the rank's traces (``memory_events``). Across ranks: the rank whose
peak stands out from the others, and DataParallel's device-0 excess.

Pure analysis (no torch); every figure that cannot be computed is None with a reason.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mgprof.analyze.memory.events import memory_timeline
from mgprof.analyze.memory.snapshot import (
    describe_device0_imbalance,
    load_snapshot,
    summarize_snapshot,
)
from mgprof.errors import MgprofError
from mgprof.records import RankRecord, RunRecord

DIFFERS_PCT = 10.0
"""A rank's peak must exceed the median of the other ranks' by more than 10 %..."""
DIFFERS_MIB = 16.0
"""...and by at least 16 MiB (or 1 % of the device, when larger): smaller gaps are allocator
and measurement noise, not a rank that needs more memory."""

DEFINITIONS = {
    "memory.source": "allocator snapshot (CUDA, --memory): PyTorch's _snapshot() at the end of "
    "the traced steps, its trace replayed; profiler memory events: torch.profiler's [memory] "
    "events of the traced steps (profile_memory=True)",
    "memory.peak_allocated_mib": "highest allocated total over the tracked window (MiB)",
    "memory.peak_step/peak_phase": "the step and the innermost mgprof.region / record_function "
    "annotation containing the moment of the peak",
    "memory.top_sites": "allocations live at the peak grouped by where they were made (the "
    "annotation and operator around the allocation; on CUDA its first user frame): MiB, count, "
    "largest block",
    "memory.fragmentation_mib": "reserved minus allocated at the peak: cache the allocator holds "
    "but cannot use for the live tensors (CUDA)",
    "memory.comparison": f"the rank with the highest peak against the median of the other "
    f"ranks' peaks; named when above it by > {DIFFERS_PCT:.0f} % and by ≥ {DIFFERS_MIB:.0f} MiB "
    "(or 1 % of the device's memory, when larger)",
}


def _site_name(row: Mapping[str, Any]) -> str:
    region, op = row.get("region"), row.get("op")
    if region and op:
        return f"{region} › {op}"
    return str(region or op or "outside any annotation")


def _peak(fig: Mapping[str, Any]) -> float:
    return float(fig.get("peak_allocated_mib") or 0.0)


def _from_events(rank: RankRecord, run_dir: Path) -> dict[str, Any]:
    """The profile from the profiler memory events of the rank's trace files."""
    own = "cpu" if rank.device.kind != "cuda" else f"cuda:{rank.device.index or 0}"
    best: dict[str, Any] | None = None
    reasons: list[str] = []
    for rel in rank.traces:
        try:
            timeline = memory_timeline(run_dir / rel)
        except (MgprofError, OSError, ValueError) as exc:
            reasons.append(f"{rel}: {exc}")
            continue
        if timeline is None:
            reasons.append(f"{rel}: no memory events (profile_memory was off)")
            continue
        devices = timeline.get("devices") or {}
        fig = devices.get(own) or next(iter(devices.values()), None)
        if fig is not None and (
            best is None
            or (fig.get("peak_allocated_mib") or 0) > (best.get("peak_allocated_mib") or 0)
        ):
            best = fig
    if best is None:
        why = "; ".join(reasons) or "no trace recorded on this rank"
        return {"source": None, "not_applicable": {"profile": why}}
    live = best.get("live_at_peak") or {}
    region = best.get("peak_region")
    return {
        "source": "profiler memory events",
        "peak_allocated_mib": best.get("peak_allocated_mib"),
        "peak_reserved_mib": best.get("peak_reserved_mib"),
        "peak_step": best.get("peak_step"),
        "peak_phase": region or best.get("peak_op"),
        "fragmentation_mib": None,
        "fragmentation_pct": None,
        "top_sites": [
            {
                "site": _site_name(r),
                "mib": r.get("mib"),
                "count": r.get("count"),
                "largest_mib": r.get("largest_mib"),
            }
            for r in live.get("sites") or []
        ],
        "curve": best.get("curve"),
        "growth_mib": (best.get("growth") or {}).get("growth_mib"),
        "not_applicable": dict(best.get("not_applicable") or {}),
    }


def _profile(rank: RankRecord, run_dir: Path | None) -> dict[str, Any]:
    mem = rank.memory
    base: dict[str, Any] = {
        "rank": rank.rank,
        "oom": {"text": rank.error.splitlines()[0]} if mem and mem.oom and rank.error else None,
        "snapshots": list(mem.snapshots) if mem else [],
    }
    if mem is not None and mem.oom and base["oom"] is None:
        base["oom"] = {"text": "yes"}
    if run_dir is None:
        return {**base, "source": None, "not_applicable": {"profile": "no run directory"}}
    snapshot = _from_snapshot(rank, run_dir)
    profile = {**base, **(snapshot if snapshot is not None else _from_events(rank, run_dir))}
    if profile.get("oom") is None and base["oom"] is not None:
        profile["oom"] = base["oom"]
    return profile


def _sites(rows: Any) -> list[dict[str, Any]]:
    return [
        {"site": r.site, "mib": r.mib, "count": r.count, "largest_mib": r.largest_mib} for r in rows
    ]


def _from_snapshot(rank: RankRecord, run_dir: Path) -> dict[str, Any] | None:
    """The profile from the rank's CUDA allocator snapshot (the OOM one when the rank ran out
    of memory: it holds the moment of failure); None when the rank saved none."""
    mem = rank.memory
    files = list(mem.snapshots) if mem else []
    if mem is None or not files:
        return None
    chosen = next((f for f in files if f.endswith(".oom.json")), files[0])
    try:
        snapshot = load_snapshot(run_dir / chosen)
        summary = summarize_snapshot(
            snapshot,
            step_marks=mem.step_marks,
            phase_marks=mem.phase_marks,
            device_total_mib=mem.total_mib,
        )
    except (MgprofError, OSError, ValueError, TypeError) as exc:
        return {"source": None, "not_applicable": {"profile": f"{chosen}: {exc}"}}
    frag = summary.fragmentation_at_peak
    at_snapshot = summary.fragmentation_at_snapshot
    profile: dict[str, Any] = {
        "source": "allocator snapshot",
        "peak_allocated_mib": summary.peak_allocated_mib,
        "peak_reserved_mib": summary.peak_reserved_mib,
        "peak_step": summary.peak_step,
        "peak_phase": summary.peak_phase,
        "fragmentation_mib": frag.free_mib if frag else None,
        "fragmentation_pct": frag.free_pct if frag else None,
        "largest_free_block_mib": at_snapshot.largest_free_block_mib if at_snapshot else None,
        "top_sites": _sites(summary.top_sites),
        "curve": None,
        "growth_mib": None,
        "notes": list(summary.notes),
        "not_applicable": {"curve": "an allocator snapshot gives peaks and sites, not a curve"},
    }
    if summary.oom is not None:
        o = summary.oom
        profile["oom"] = {
            "text": f"an allocation of {o.requested_mib:,.1f} MiB failed"
            + (f" in step {o.step}" if o.step is not None else "")
            + (f" during {o.phase}" if o.phase else "")
            + f" with {o.allocated_mib:,.1f} MiB allocated, {o.reserved_mib:,.1f} MiB reserved"
            + (
                f", {o.device_free_mib:,.1f} MiB free on the device"
                if o.device_free_mib is not None
                else ""
            ),
            "requested_mib": o.requested_mib,
            "top_sites": _sites(o.top_sites),
        }
    return profile


def _comparison(profiles: list[dict[str, Any]], run: RunRecord) -> dict[str, Any]:
    reserved = {p["rank"]: p.get("peak_reserved_mib") for p in profiles}
    use_reserved = bool(reserved) and all(v is not None for v in reserved.values())
    basis = "peak reserved" if use_reserved else "peak allocated"
    key = "peak_reserved_mib" if use_reserved else "peak_allocated_mib"
    peaks: dict[int, float] = {
        int(p["rank"]): float(p[key]) for p in profiles if p.get(key) is not None
    }
    out: dict[str, Any] = {
        "basis": basis,
        "peaks_mib": {str(r): v for r, v in sorted(peaks.items())},
        "threshold_pct": DIFFERS_PCT,
        "threshold_mib": DIFFERS_MIB,
        "differs": None,
        "text": None,
    }
    if len(peaks) >= 2:
        top = max(sorted(peaks), key=lambda r: peaks[r])
        others = statistics.median(v for r, v in peaks.items() if r != top)
        totals = [r.device.total_memory_mib for r in run.ranks if r.device.total_memory_mib]
        floor = max(DIFFERS_MIB, 0.01 * min(totals)) if totals else DIFFERS_MIB
        out["threshold_mib"] = floor
        delta = peaks[top] - others
        pct = 100.0 * delta / others if others > 0 else None
        if delta >= floor and (pct is None or pct > DIFFERS_PCT):
            # a percentage of almost nothing (a CPU rank with no tensors) says nothing
            shown = f" ({pct:+,.0f} %)" if pct is not None and others >= 1.0 else ""
            out["differs"] = {
                "rank": top,
                "delta_mib": delta,
                "delta_pct": pct if others >= 1.0 else None,
                "median_others_mib": others,
            }
            out["text"] = (
                f"rank {top}'s {basis} is {delta:,.1f} MiB{shown} above the median of the "
                f"other ranks ({others:,.1f} MiB)"
            )
        else:
            out["text"] = (
                f"no rank stands out: {basis} within {floor:,.0f} MiB / {DIFFERS_PCT:.0f} %"
            )
    out["dp_imbalance"] = _dp_imbalance(run)
    return out


def _dp_imbalance(run: RunRecord) -> str | None:
    """DataParallel's device 0 (its first device, which gathers) against the mean of the other
    devices of its one process."""
    for rank in run.ranks:
        per_device = rank.memory.per_device if rank.memory else {}
        peaks = [v.get("peak_reserved_mib") for _, v in sorted(per_device.items(), key=_index)]
        if len(peaks) < 2 or any(v is None for v in peaks):
            continue
        found = describe_device0_imbalance({i: float(v or 0.0) for i, v in enumerate(peaks)})
        if found is not None and found.text is not None:
            return found.text
    return None


def _index(item: tuple[str, Any]) -> int:
    """``cuda:3`` -> 3, for device order."""
    tail = item[0].rpartition(":")[2]
    return int(tail) if tail.isdigit() else 0


def memory_analysis(run: RunRecord, run_dir: Path | None) -> dict[str, Any] | None:
    """None when no rank tracked memory (``--memory`` was off)."""
    tracked = [r for r in sorted(run.ranks, key=lambda r: r.rank) if r.memory and r.memory.tracked]
    if not tracked:
        return None
    profiles = [_profile(r, run_dir) for r in tracked]
    return {
        "ranks": profiles,
        "comparison": _comparison(profiles, run),
        "definitions": dict(DEFINITIONS),
    }
