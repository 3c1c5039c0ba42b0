"""The Regions section: ``mgprof.region`` timings per rank as a tree, from the analysis alone.

Up to ``PER_RANK_UP_TO`` ranks the table has one row per rank and region. Beyond that a row per
rank would bury the point, so each region gets one row of the mean over the ranks that ran it
and one for the rank whose total was highest (the one to look at first).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mgprof.analyze.readers import num as _num
from mgprof.analyze.readers import rank_dicts as _ranks
from mgprof.analyze.stats import mean
from mgprof.report.run.section_model import Section, Table, fixed

PER_RANK_UP_TO = 4
COLUMNS = ["rank", "region", "count", "total ms", "mean ms", "p95 ms", "% of step"]


def _label(row: Mapping[str, Any]) -> str:
    depth = int(_num(row.get("depth")) or 0)
    name = str(row.get("name", "?"))
    return ("  " * (depth - 1) + "└ " + name) if depth > 0 else name


def _cells(row: Mapping[str, Any]) -> list[str]:
    two = fixed(2)
    out = [str(int(_num(row.get("count")) or 0))]
    for key, fmt in (("total_ms", two), ("mean_ms", two), ("p95_ms", two), ("share_pct", fixed(1))):
        value = _num(row.get(key))
        out.append(fmt(value) if value is not None else "n/a")
    return out


def _rows(rank: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [r for r in rank.get("regions") or [] if isinstance(r, dict)]


def regions_section(analysis: Mapping[str, Any]) -> Section | None:
    """None when no rank recorded a region (the section would be empty)."""
    ranks = [r for r in _ranks(analysis) if _rows(r)]
    if not ranks:
        return None
    sec = Section("Regions")
    table = Table(list(COLUMNS), numeric_from=2)
    if len(ranks) <= PER_RANK_UP_TO:
        for rank in ranks:
            for i, row in enumerate(_rows(rank)):
                who = str(rank.get("rank")) if i == 0 else ""
                table.rows.append([who, _label(row), *_cells(row)])
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


def _summary_rows(ranks: list[dict[str, Any]]) -> list[list[str]]:
    by_path: dict[tuple[str, ...], list[tuple[int, dict[str, Any]]]] = {}
    order: list[tuple[str, ...]] = []
    for rank in ranks:
        for row in _rows(rank):
            path = tuple(str(p) for p in row.get("path") or [row.get("name", "?")])
            if path not in by_path:
                by_path[path] = []
                order.append(path)
            by_path[path].append((int(_num(rank.get("rank")) or 0), row))
    out: list[list[str]] = []
    for path in order:
        entries = by_path[path]
        first = entries[0][1]
        avg = {"name": first.get("name"), "depth": first.get("depth")}
        for key in ("count", "total_ms", "mean_ms", "p95_ms", "share_pct"):
            values = [v for _, r in entries if (v := _num(r.get(key))) is not None]
            avg[key] = mean(values) if values else None
        avg["count"] = round(avg["count"] or 0)
        out.append([f"mean of {len(entries)}", _label(avg), *_cells(avg)])
        top_rank, top = max(entries, key=lambda e: _num(e[1].get("total_ms")) or 0.0)
        out.append([f"max: {top_rank}", "", *_cells(top)])
    return out
