"""The Memory profile section (``--memory``): each rank's peak, when and where it happened, what
was live at it, and the rank whose memory differs from the others.

Built from ``analysis.memory`` (``mgprof.analyze.run.memory``); absent when memory was not
tracked.
"""

from __future__ import annotations

from mgprof.analyze.run.schema import RunAnalysis, given
from mgprof.report.run.section_model import Section, Table

SITES_PER_RANK = 5
MIN_SITE_MIB = 0.1
"""Sites holding less than this at the peak are left out of the terminal table (JSON has all)."""


def _mib(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:,.1f}" if value >= 1.0 or value == 0 else f"{value:.3f}"


def memory_profile_section(analysis: RunAnalysis) -> Section | None:
    memory = given(analysis.memory)
    profiles = memory.ranks if memory is not None else []
    if memory is None or not profiles:
        return None
    sec = Section("Memory profile")
    peaks = Table(
        ["rank", "source", "peak step", "during", "peak alloc MiB", "peak resv MiB", "free MiB"],
        numeric_from=4,
    )
    sites = Table(["rank", "MiB", "count", "largest MiB", "live at the peak"], text_last=True)
    for p in profiles:
        frag = given(p.fragmentation_mib)
        step = given(p.peak_step)
        peaks.rows.append(
            [
                str(p.rank),
                p.source or "?",
                str(step) if step is not None else "n/a",
                given(p.peak_phase) or "-",
                _mib(given(p.peak_allocated_mib)),
                _mib(given(p.peak_reserved_mib)),
                f"{frag:,.1f}" if frag is not None else "n/a",
            ]
        )
        for s in (given(p.top_sites) or [])[:SITES_PER_RANK]:
            if (s.mib or 0.0) < MIN_SITE_MIB:
                continue
            sites.rows.append(
                [
                    str(p.rank),
                    _mib(s.mib),
                    "-" if s.count is None else str(s.count),
                    _mib(s.largest_mib),
                    s.site or "?",
                ]
            )
        if p.oom is not None:
            sec.notes.append(f"rank {p.rank}: out of memory — {p.oom.text or 'yes'}")
        for key, why in p.not_applicable.items():
            if key != "peak_reserved_mib" or p.source != "profiler memory events":
                sec.footnotes.append(f"rank {p.rank}: {why}")
    if all(given(p.peak_reserved_mib) is None for p in profiles):  # CPU: no cache
        cut = peaks.columns.index("peak resv MiB")
        peaks.columns.pop(cut)
        for row in peaks.rows:
            row.pop(cut)
    if all(given(p.fragmentation_mib) is None for p in profiles):
        peaks.columns.pop()
        for row in peaks.rows:
            row.pop()
    sec.tables.append(peaks)
    if sites.rows:
        sec.tables.append(sites)
    if any(p.source == "profiler memory events" for p in profiles):
        sec.notes.append(
            "profiler memory events count what was allocated inside the traced steps: memory "
            "allocated before them (parameters, optimizer state created earlier) is not in "
            "these peaks; the process's peak RSS is in Memory & headroom."
        )
    comparison = memory.comparison
    if comparison is not None and comparison.text:
        sec.notes.insert(0, comparison.text)
    snapshots = [s for p in profiles for s in p.snapshots]
    if snapshots:
        sec.notes.append(
            "allocator snapshots: "
            + ", ".join(snapshots)
            + " (PyTorch's memory_viz opens them: see docs/memory.md)"
        )
    return sec
