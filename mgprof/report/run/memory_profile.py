"""The Memory profile section (``--memory``): each rank's peak, when and where it happened, what
was live at it, and the rank whose memory differs from the others.

Built from ``analysis["memory"]`` (``mgprof.analyze.run.memory``); absent when memory was not
tracked.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mgprof.analyze.readers import as_dict as _dict
from mgprof.analyze.readers import num as _num
from mgprof.report.run.section_model import Section, Table

SITES_PER_RANK = 5
MIN_SITE_MIB = 0.1
"""Sites holding less than this at the peak are left out of the terminal table (JSON has all)."""


def _mib(value: Any) -> str:
    num = _num(value)
    if num is None:
        return "n/a"
    return f"{num:,.1f}" if num >= 1.0 or num == 0 else f"{num:.3f}"


def _profiles(analysis: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [_dict(p) for p in _dict(analysis.get("memory")).get("ranks") or []]


def memory_profile_section(analysis: Mapping[str, Any]) -> Section | None:
    profiles = _profiles(analysis)
    if not profiles:
        return None
    sec = Section("Memory profile")
    peaks = Table(
        ["rank", "source", "peak step", "during", "peak alloc MiB", "peak resv MiB", "free MiB"],
        numeric_from=4,
    )
    sites = Table(["rank", "MiB", "count", "largest MiB", "live at the peak"], text_last=True)
    for p in profiles:
        frag = _num(p.get("fragmentation_mib"))
        step = p.get("peak_step")
        peaks.rows.append(
            [
                str(p.get("rank")),
                str(p.get("source") or "?"),
                str(step) if isinstance(step, int) else "n/a",
                str(p.get("peak_phase") or "-"),
                _mib(p.get("peak_allocated_mib")),
                _mib(p.get("peak_reserved_mib")),
                f"{frag:,.1f}" if frag is not None else "n/a",
            ]
        )
        for s in [_dict(x) for x in p.get("top_sites") or []][:SITES_PER_RANK]:
            if (_num(s.get("mib")) or 0.0) < MIN_SITE_MIB:
                continue
            sites.rows.append(
                [
                    str(p.get("rank")),
                    _mib(s.get("mib")),
                    str(s.get("count", "-")),
                    _mib(s.get("largest_mib")),
                    str(s.get("site") or "?"),
                ]
            )
        oom = _dict(p.get("oom"))
        if oom:
            sec.notes.append(f"rank {p.get('rank')}: out of memory — {oom.get('text') or 'yes'}")
        for key, why in _dict(p.get("not_applicable")).items():
            if key != "peak_reserved_mib" or p.get("source") != "profiler memory events":
                sec.footnotes.append(f"rank {p.get('rank')}: {why}")
    if all(_num(p.get("peak_reserved_mib")) is None for p in profiles):  # CPU: no cache
        cut = peaks.columns.index("peak resv MiB")
        peaks.columns.pop(cut)
        for row in peaks.rows:
            row.pop(cut)
    if all(_num(p.get("fragmentation_mib")) is None for p in profiles):
        peaks.columns.pop()
        for row in peaks.rows:
            row.pop()
    sec.tables.append(peaks)
    if sites.rows:
        sec.tables.append(sites)
    if any(p.get("source") == "profiler memory events" for p in profiles):
        sec.notes.append(
            "profiler memory events count what was allocated inside the traced steps: memory "
            "allocated before them (parameters, optimizer state created earlier) is not in "
            "these peaks; the process's peak RSS is in Memory & headroom."
        )
    comparison = _dict(_dict(analysis.get("memory")).get("comparison"))
    if comparison.get("text"):
        sec.notes.insert(0, str(comparison["text"]))
    snapshots = [s for p in profiles for s in p.get("snapshots") or []]
    if snapshots:
        sec.notes.append(
            "allocator snapshots: "
            + ", ".join(str(s) for s in snapshots)
            + " (PyTorch's memory_viz opens them: see docs/memory.md)"
        )
    return sec
