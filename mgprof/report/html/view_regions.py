"""The Regions view: ``mgprof.region`` timings per rank as a tree table and a per-region bar chart.

Rows are the analysis' ``ranks[i].regions`` (tree order: a region, then the regions nested in
it), each with count, total, mean, p50, p95, max and its share of the rank's step time.
"""

from __future__ import annotations

from typing import Any

from mgprof.analyze.run.results import RegionFigures
from mgprof.report.html.charts import layout
from mgprof.report.html.text import cell, label, short_label
from mgprof.report.html.view_model import Col, Context, View, figure_spec, rank_color, rounded

__all__ = ["region_rows", "regions_view"]

PATH_SEP = " › "


def region_rows(ctx: Context) -> dict[int, list[RegionFigures]]:
    """Rank -> its region rows, in tree order."""
    return {rank.rank: rank.regions for rank in ctx.rank_figures() if rank.regions}


def _path(row: RegionFigures) -> list[str]:
    return list(row.path) if row.path else [row.name]


def _bars(per_rank: dict[int, list[RegionFigures]]) -> dict[str, Any]:
    """Total time per region, one trace per rank (grouped), regions in tree order."""
    order: list[tuple[str, ...]] = []
    for rows in per_rank.values():
        for row in rows:
            key = tuple(_path(row))
            if key not in order:
                order.append(key)
    names = {key: short_label(PATH_SEP.join(key)) for key in order}
    data = []
    for rank, rows in per_rank.items():
        by_path = {tuple(_path(r)): r for r in rows}
        present = [key for key in order if key in by_path]
        data.append(
            {
                "type": "bar",
                "name": f"rank {rank}",
                "x": [names[k] for k in present],
                "y": [rounded(by_path[k].total_ms) for k in present],
                "customdata": [
                    [
                        float(by_path[k].count),
                        rounded(by_path[k].mean_ms),
                        rounded(by_path[k].p95_ms),
                        rounded(by_path[k].share_pct, 1),
                    ]
                    for k in present
                ],
                "hovertext": [label(PATH_SEP.join(k)) for k in present],
                "hovertemplate": "%{hovertext}<br>total %{y:,.3f} ms, %{customdata[0]} calls"
                "<br>mean %{customdata[1]:,.3f} ms, p95 %{customdata[2]:,.3f} ms"
                "<br>%{customdata[3]} % of step time<extra>%{fullData.name}</extra>",
                "marker": {"color": rank_color(rank)},
                "meta": {"rank": rank},
            }
        )
    lay = layout("Time per region (total over the run)", "region", "ms", barmode="group")
    lay["xaxis"].update({"type": "category", "categoryorder": "array",
                         "categoryarray": [names[k] for k in order]})  # fmt: skip
    return {"data": data, "layout": lay}


def regions_view(ctx: Context) -> View:
    """The per-region bar chart and the tree table, per rank."""
    view = View("regions", "Regions")
    per_rank = region_rows(ctx)
    if not per_rank:
        view.note(
            'No regions recorded. Time a part of a step with `with mgprof.region("forward"):` '
            "(regions nest) and it shows here per rank."
        )
        return view
    view.chart("regions-bars", figure_spec(_bars(per_rank)))
    cols = [
        Col("rank", digits=0),
        Col("region", num=False),
        Col("count", digits=0),
        Col("total ms", digits=3),
        Col("mean ms", digits=3),
        Col("p50 ms", digits=3),
        Col("p95 ms", digits=3),
        Col("max ms", digits=3),
        Col("% of step", digits=1),
    ]
    rows: list[list[Any]] = []
    depth: list[int] = []
    for rank, items in per_rank.items():
        for r in items:
            rows.append(
                [
                    rank,
                    cell(r.name),
                    float(r.count),
                    *(rounded(v) for v in (r.total_ms, r.mean_ms, r.p50_ms, r.p95_ms, r.max_ms)),
                    rounded(r.share_pct, 2),
                ]
            )
            depth.append(r.depth)
    view.table("regions-table", cols, rows, depth=depth)
    view.note(
        "Tree order: a region, then the regions nested in it (indented); a nested region's time "
        "is part of its parent's. % of step: the region's total / the rank's total step time. "
        "Click a header to sort, click it again to reverse; the third click restores the tree."
    )
    return view
