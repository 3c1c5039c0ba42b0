"""The Regions section: ``mgprof.region`` timings per rank as a tree, from the analysis alone.

Up to ``PER_RANK_UP_TO`` ranks the table has one row per rank and region. Beyond that a row per
rank would bury the point, so each region gets one row of the mean over the ranks that ran it
and one for the rank whose total was highest (the one to look at first).
"""

from __future__ import annotations

from dataclasses import dataclass

from mgprof.analyze.run.results import RankAnalysis, RegionFigures
from mgprof.analyze.run.schema import RunAnalysis
from mgprof.analyze.stats import mean
from mgprof.report.run.section_model import Section, Table, fixed

PER_RANK_UP_TO = 4
COLUMNS = ["rank", "region", "count", "total ms", "mean ms", "p95 ms", "% of step"]


@dataclass
class _Row:
    """A region row's shown figures: one rank's, or their mean over the ranks."""

    name: str
    depth: int
    count: int
    total_ms: float | None
    mean_ms: float | None
    p95_ms: float | None
    share_pct: float | None

    @classmethod
    def of(cls, r: RegionFigures) -> _Row:
        return cls(r.name, r.depth, r.count, r.total_ms, r.mean_ms, r.p95_ms, r.share_pct)


def _label(row: _Row) -> str:
    depth = row.depth
    return ("  " * (depth - 1) + "└ " + row.name) if depth > 0 else row.name


def _cells(row: _Row) -> list[str]:
    two = fixed(2)
    out = [str(row.count)]
    for value, fmt in (
        (row.total_ms, two),
        (row.mean_ms, two),
        (row.p95_ms, two),
        (row.share_pct, fixed(1)),
    ):
        out.append(fmt(value) if value is not None else "n/a")
    return out


def regions_section(analysis: RunAnalysis) -> Section | None:
    """None when no rank recorded a region (the section would be empty)."""
    ranks = [r for r in analysis.ranks if r.regions]
    if not ranks:
        return None
    sec = Section("Regions")
    table = Table(list(COLUMNS), numeric_from=2)
    if len(ranks) <= PER_RANK_UP_TO:
        for rank in ranks:
            for i, row in enumerate(rank.regions):
                who = str(rank.rank) if i == 0 else ""
                table.rows.append([who, _label(_Row.of(row)), *_cells(_Row.of(row))])
    else:
        table.rows.extend(_summary_rows(ranks))
        sec.notes.append(
            f"{len(ranks)} ranks: per region the mean over the ranks that ran it, then the rank "
            "with the highest total (per-rank rows: report.html or --format json)."
        )
    sec.tables.append(table)
    sec.notes.append(
        "% of step: region total / the rank's total step time; nested regions (└) are part of "
        "their parent's time."
    )
    return sec


def _mean_of(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return mean(known) if known else None


def _summary_rows(ranks: list[RankAnalysis]) -> list[list[str]]:
    by_path: dict[tuple[str, ...], list[tuple[int, RegionFigures]]] = {}
    order: list[tuple[str, ...]] = []
    for rank in ranks:
        for row in rank.regions:
            path = tuple(row.path or [row.name])
            if path not in by_path:
                by_path[path] = []
                order.append(path)
            by_path[path].append((rank.rank, row))
    out: list[list[str]] = []
    for path in order:
        entries = by_path[path]
        rows = [r for _, r in entries]
        first = rows[0]
        avg = _Row(
            name=first.name,
            depth=first.depth,
            count=round(mean([float(r.count) for r in rows])),
            total_ms=_mean_of([r.total_ms for r in rows]),
            mean_ms=_mean_of([r.mean_ms for r in rows]),
            p95_ms=_mean_of([r.p95_ms for r in rows]),
            share_pct=_mean_of([r.share_pct for r in rows]),
        )
        out.append([f"mean of {len(entries)}", _label(avg), *_cells(avg)])
        top_rank, top = max(entries, key=lambda e: e[1].total_ms)
        out.append([f"max: {top_rank}", "", *_cells(_Row.of(top))])
    return out
