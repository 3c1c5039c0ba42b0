"""``mgprof.region`` timings: nesting, quantiles, shares of step time, and the report section."""

from __future__ import annotations

import io
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

import mgprof
from mgprof.analyze.run.regions import region_figures
from mgprof.analyze.run.schema import RunAnalysis, decode_analysis
from mgprof.collect.session.region_stats import RegionStats
from mgprof.records import RegionRecord, StepRecord
from mgprof.report.run.markdown import escape_md
from mgprof.report.run.regions import PER_RANK_UP_TO, regions_section
from mgprof.report.run.terminal import render_section


def test_nested_regions_are_recorded_under_their_parent(tmp_path: Path) -> None:
    sleeps = [0.001 * (1 + i % 5) for i in range(10)]
    with mgprof.profile(out=tmp_path, trace=False, sample=False, quiet=True) as prof:
        for s in sleeps:
            with prof.step(batch_size=4):
                with mgprof.region("forward"), mgprof.region("attention"):
                    time.sleep(s)
                with mgprof.region("backward"):
                    time.sleep(0.001)
        with mgprof.region("attention"):  # same name, top level: a region of its own
            time.sleep(0.001)
    regions = {tuple(r.path): r for r in prof.record.regions}
    assert set(regions) == {("forward",), ("forward", "attention"), ("backward",), ("attention",)}
    inner = regions[("forward", "attention")]
    assert inner.count == 10 and regions[("attention",)].count == 1
    assert inner.total_ms <= regions[("forward",)].total_ms
    # the quantiles follow the sleeps (1..5 ms): p50 near 3 ms, p95 near 5 ms, never inverted
    assert inner.min_ms is not None and inner.p50_ms is not None and inner.p95_ms is not None
    assert inner.min_ms <= inner.p50_ms <= inner.p95_ms <= inner.max_ms
    assert 2.5 <= inner.p50_ms <= 5.0 and 4.5 <= inner.p95_ms <= 8.0

    rows = region_figures(prof.record.regions, prof.record.steps)
    assert [(r.name, r.depth) for r in rows] == [
        ("forward", 0),
        ("attention", 1),
        ("backward", 0),
        ("attention", 0),
    ]
    step_ms = sum(s.duration_ms for s in prof.record.steps)
    fwd = rows[0]
    assert fwd.share_pct is not None
    assert abs(fwd.share_pct - 100 * fwd.total_ms / step_ms) < 1e-9
    assert 0 < fwd.share_pct + (rows[2].share_pct or 0) <= 100.5


def test_region_left_open_by_an_exception_does_not_nest_the_next(tmp_path: Path) -> None:
    with (
        mgprof.profile(out=tmp_path, trace=False, sample=False, quiet=True) as prof,
        prof.step(batch_size=1),
    ):
        try:
            with mgprof.region("outer"):
                raise ValueError("boom")
        except ValueError:
            pass
        with mgprof.region("after"):
            pass
    assert sorted(tuple(r.path) for r in prof.record.regions) == [("after",), ("outer",)]


def test_region_stats_stay_bounded_and_exact_where_promised() -> None:
    stats = RegionStats(kept=512)
    rng = random.Random(1)
    values = [rng.random() for _ in range(20_000)]
    for v in values:
        stats.add(("r",), v)
    (rec,) = stats.records()
    assert rec.count == 20_000
    assert abs(rec.total_ms - sum(values)) < 1e-3
    assert rec.max_ms == round(max(values), 6) and rec.min_ms == round(min(values), 6)
    assert len(stats._stats[("r",)].kept) == 512
    # a uniform sample of 512 from U(0,1): its p95 lies within a few percent of the true one
    assert rec.p95_ms is not None and abs(rec.p95_ms - float(np.percentile(values, 95))) < 0.04
    small = RegionStats()
    for v in (1.0, 2.0, 3.0, 4.0):
        small.add(("s",), v)
    (s,) = small.records()
    assert s.p50_ms == float(np.percentile([1, 2, 3, 4], 50))
    assert s.p95_ms == round(float(np.percentile([1, 2, 3, 4], 95)), 6)


def test_old_records_without_paths_are_top_level() -> None:
    rows = region_figures(
        [RegionRecord(name="train", count=5, total_ms=50.0, max_ms=12.0)],
        [StepRecord(index=i, duration_ms=20.0) for i in range(5)],
    )
    assert [(r.name, r.depth, r.share_pct) for r in rows] == [("train", 0, 50.0)]
    assert rows[0].p95_ms is None and rows[0].mean_ms == 10.0


def _analysis(n_ranks: int, name: str = "forward") -> RunAnalysis:
    ranks = []
    for r in range(n_ranks):
        regions = [
            {"name": name, "path": [name], "depth": 0, "count": 10, "total_ms": 100.0 + r,
             "mean_ms": 10.0 + r / 10, "p50_ms": 9.5, "p95_ms": 14.25, "max_ms": 15.0,
             "share_pct": 40.0},
            {"name": "attention", "path": [name, "attention"], "depth": 1, "count": 10,
             "total_ms": 60.0, "mean_ms": 6.0, "p50_ms": 6.0, "p95_ms": 7.5, "max_ms": 8.0,
             "share_pct": 24.0},
        ]  # fmt: skip
        ranks.append({"rank": r, "device": "cpu", "regions": regions})
    analysis = decode_analysis({"ranks": ranks})
    assert analysis.warnings == []
    return analysis


def _terminal(section: Any) -> str:
    buf = io.StringIO()
    render_section(section, Console(file=buf, width=80, color_system=None))
    return buf.getvalue()


def test_section_per_rank_then_summarised_beyond_four_ranks() -> None:
    few = regions_section(_analysis(2))
    assert few is not None
    assert [row[:2] for row in few.tables[0].rows] == [
        ["0", "forward"],
        ["", "└ attention"],
        ["1", "forward"],
        ["", "└ attention"],
    ]
    assert few.tables[0].rows[0][2:] == ["10", "100.00", "10.00", "14.25", "40.0"]
    many = regions_section(_analysis(PER_RANK_UP_TO + 4))
    assert many is not None
    labels = [row[0] for row in many.tables[0].rows]
    assert labels[:2] == ["mean of 8", "max: 7"]  # rank 7 has the highest forward total
    assert many.tables[0].rows[1][3] == "107.00"
    assert regions_section(decode_analysis({"ranks": [{"rank": 0, "regions": []}]})) is None


def test_region_names_are_text_in_every_format() -> None:
    hostile = "[bold]x[/] <script>alert(1)</script> | `a`"
    sec = regions_section(_analysis(1, hostile))
    assert sec is not None
    out = _terminal(sec)
    assert "[bold]x[/]" in out
    assert "<script>" not in escape_md(sec.tables[0].rows[0][1])
