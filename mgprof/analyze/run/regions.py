"""Region figures of one rank: ``mgprof.region`` timings as a tree with shares of step time.

Pure: reads the rank's ``RegionRecord`` list (which the collector keys by nesting path) and its
steps. A record written before regions nested has no path; it is a top-level region.
"""

from __future__ import annotations

from collections.abc import Sequence

from mgprof.analyze.run.results import RegionFigures
from mgprof.records import RegionRecord, StepRecord


def region_figures(
    regions: Sequence[RegionRecord], steps: Sequence[StepRecord]
) -> list[RegionFigures]:
    """Rows in tree order (each parent, then its children, siblings by total time, longest
    first); ``share_pct`` is None when the rank recorded no step time."""
    step_ms = sum(s.duration_ms for s in steps)
    rows = {tuple(r.path) if r.path else (r.name,): r for r in regions if r.count > 0}
    children: dict[tuple[str, ...], list[tuple[str, ...]]] = {}
    for path in rows:
        parent = path[:-1]
        while parent and parent not in rows:  # a parent never closed: attach higher up
            parent = parent[:-1]
        children.setdefault(parent, []).append(path)
    out: list[RegionFigures] = []

    def visit(parent: tuple[str, ...], depth: int) -> None:
        for path in sorted(children.get(parent, []), key=lambda p: (-rows[p].total_ms, p)):
            r = rows[path]
            out.append(
                RegionFigures(
                    name=r.name,
                    path=list(path),
                    depth=depth,
                    count=r.count,
                    total_ms=r.total_ms,
                    mean_ms=r.total_ms / r.count,
                    p50_ms=r.p50_ms,
                    p95_ms=r.p95_ms,
                    max_ms=r.max_ms,
                    share_pct=100.0 * r.total_ms / step_ms if step_ms > 0 else None,
                )
            )
            visit(path, depth + 1)

    visit((), 0)
    return out
