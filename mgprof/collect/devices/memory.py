"""Peak memory per rank: CUDA allocator peaks per device, or the process's peak RSS on CPU."""

from __future__ import annotations

import resource
import sys

import torch

from mgprof.records import MemoryRecord

MIB = 1024.0 * 1024.0


def reset_peaks(cuda_indices: list[int]) -> None:
    """Start the peak counters at the session start so earlier allocations don't count."""
    for idx in cuda_indices:
        torch.cuda.reset_peak_memory_stats(idx)


def peak_rss_mib() -> float:
    """Peak resident set size of this process (ru_maxrss is KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / MIB if sys.platform == "darwin" else peak / 1024.0


def collect_memory(cuda_indices: list[int]) -> MemoryRecord:
    """Peaks since :func:`reset_peaks`; the first device is this rank's own."""
    if not cuda_indices:
        return MemoryRecord(kind="cpu", peak_rss_mib=round(peak_rss_mib(), 3))
    per_device: dict[str, dict[str, float | None]] = {}
    for idx in cuda_indices:
        total = torch.cuda.get_device_properties(idx).total_memory
        per_device[f"cuda:{idx}"] = {
            "peak_allocated_mib": round(torch.cuda.max_memory_allocated(idx) / MIB, 3),
            "peak_reserved_mib": round(torch.cuda.max_memory_reserved(idx) / MIB, 3),
            "total_mib": round(total / MIB, 3),
        }
    own = per_device[f"cuda:{cuda_indices[0]}"]
    return MemoryRecord(
        kind="cuda",
        peak_allocated_mib=own["peak_allocated_mib"],
        peak_reserved_mib=own["peak_reserved_mib"],
        total_mib=own["total_mib"],
        peak_rss_mib=round(peak_rss_mib(), 3),
        per_device=per_device,
    )
