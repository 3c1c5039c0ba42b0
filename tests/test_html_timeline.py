"""report.html's own timeline: every rank's steps, regions, compute, communication and idle time
as rows of bars on the clock ``mgprof timeline`` aligns, bounded in size.

Checked on recorded traces: the rows measure what the trace figures measure (their lengths are
the trace summary's compute, communication and idle), the clock is the timeline file's (a step
starts on the chart at its ``ts`` in timeline.json.gz), a trace of many thousand events is cut
down to the budget with its busy time kept; and the page of a real 2-rank run draws the chart in
headless Chromium with no console error.
"""

from __future__ import annotations

import copy
import gzip
import json
import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgspec
import pytest

from mgprof.analyze.run.analysis import analyze_run
from mgprof.analyze.run.schema import decode_analysis
from mgprof.analyze.timeline.activity import MAX_SEGMENTS, JobActivity, job_activity
from mgprof.analyze.timeline.build import build_timeline, find_inputs, parse_steps
from mgprof.analyze.timeline.coarsen import coarsen, share_budget
from mgprof.analyze.trace.summary import analyze_trace_file
from mgprof.errors import TraceError
from mgprof.records import read_run

pytest.importorskip("plotly", reason="the HTML report needs plotly: pip install 'mgprof[html]'")

from test_html_report import CHROMIUM, render_in_chromium

from mgprof.report.html.page import run_to_html
from mgprof.report.html.text import unintern_strings

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
GLOO = sorted((DATA / "traces" / "cpu-gloo-ddp-mlp-2ranks").glob("*.gz"))
NCCL = sorted((DATA / "traces" / "gpu-nccl-128ranks-sampled").glob("*.gz"))
H200_RUN = DATA / "gpu" / "mgprof-run-h200"


def row(act: JobActivity, rank: int, kind: str) -> Any:
    found = [r.segments for ra in act.ranks if ra.rank == rank for r in ra.rows if r.kind == kind]
    return found[0] if found else None


def covered_us(segments: Any) -> float:
    return sum(segments.busy_us) if segments is not None else 0.0


def page_data(text: str) -> dict[str, Any]:
    m = re.search(r'<script type="application/json" id="mgprof-charts">(.*?)</script>', text, re.S)
    assert m is not None
    return unintern_strings(json.loads(m.group(1)))


# ------------------------------------------------------------------ cutting rows down


def test_coarsen_closes_the_smallest_gaps_first() -> None:
    starts = [0.0, 1.1, 10.0, 11.05, 30.0]
    ends = [1.0, 2.0, 11.0, 12.0, 31.0]
    seg = coarsen(starts, ends, 3)
    assert seg.start_us == [0.0, 10.0, 30.0] and seg.end_us == [2.0, 12.0, 31.0]
    assert seg.count == [2, 2, 1] and seg.merged == 4 and seg.intervals == 5
    assert seg.busy_us == pytest.approx([1.9, 1.95, 1.0])
    assert coarsen(starts, ends, 5).count == [1] * 5  # within budget: as they are
    one = coarsen(starts, ends, 1)
    assert (one.start_us, one.end_us, one.count) == ([0.0], [31.0], [5])


def test_coarsen_names_merged_steps_and_counts_nested_regions_once() -> None:
    steps = coarsen([0.0, 10.0, 25.0, 35.0], [9.0, 19.0, 34.0, 44.0], 2,
                    [f"step {n}" for n in (3, 4, 5, 6)], noun="steps")  # fmt: skip
    assert steps.labels == ["steps 3–4", "steps 5–6"]
    # forward holds attn; backward far later: the outer and the inner one merge, covered once
    names = ["forward", "attn", "backward"]
    regions = coarsen([0.0, 2.0, 50.0], [10.0, 5.0, 60.0], 2, names, "regions")
    assert regions.labels == ["2 regions (forward, attn)", "backward"]
    assert regions.busy_us == [10.0, 10.0] and regions.end_us == [10.0, 60.0]
    same = coarsen([0.0, 3.0, 100.0], [1.0, 4.0, 101.0], 2, ["forward"] * 3)
    assert same.labels == ["forward ×2", "forward"]


def test_share_budget_gives_what_small_rows_leave_to_large_ones() -> None:
    assert share_budget([3, 1000, 10, 0], 100) == [3, 87, 10, 0]
    assert share_budget([500, 500], 100) == [50, 50]
    assert share_budget([5, 5], 1) == [1, 1]  # every row keeps a bar


# ------------------------------------------------------------------ rows on recorded traces


def test_cpu_rows_measure_the_trace_figures_on_the_timeline_clock(tmp_path: Path) -> None:
    act = job_activity(GLOO, max_segments=100_000)
    written = build_timeline(find_inputs(GLOO), tmp_path / "t.json.gz")
    assert act.origin_trace_us == pytest.approx(written.origin_trace_us, abs=1e-6)
    for facts in written.ranks:
        mine = next(r for r in act.ranks if r.rank == facts.rank)
        assert mine.clock == facts.clock
    assert act.ranks[1].clock.method == "collectives" and act.merged == 0
    for ra in act.ranks:
        totals = analyze_trace_file(GLOO[ra.rank]).totals
        assert not ra.device
        assert covered_us(row(act, ra.rank, "compute")) == pytest.approx(totals.compute_us, 1e-9)
        assert covered_us(row(act, ra.rank, "communication")) == pytest.approx(totals.comm_us)
        assert covered_us(row(act, ra.rank, "idle")) == pytest.approx(totals.idle_us, abs=1e-3)
        assert row(act, ra.rank, "steps").labels == ["step 2", "step 3", "step 4"]
    # a step starts on the chart where it starts in timeline.json.gz (ts in µs from its origin)
    with gzip.open(tmp_path / "t.json.gz") as fh:
        events = json.load(fh)["traceEvents"]
    for ra in act.ranks:
        steps = row(act, ra.rank, "steps")
        file_ts = sorted(
            e["ts"] for e in events
            if e.get("pid") == ra.rank + 1 and str(e.get("name", "")).startswith("ProfilerStep#")
        )  # fmt: skip
        assert steps.start_us == pytest.approx(file_ts, abs=2e-3)


def test_gpu_rows_on_two_ranks_of_an_nccl_job() -> None:
    act = job_activity(NCCL, max_segments=100_000)
    assert [r.rank for r in act.ranks] == [0, 1] and act.ranks[1].clock.method == "collectives"
    for ra, path in zip(act.ranks, NCCL):
        totals = analyze_trace_file(path).totals
        assert ra.device and ra.window_us is not None
        assert ra.window_us[1] - ra.window_us[0] == pytest.approx(totals.window_us)
        assert covered_us(row(act, ra.rank, "compute")) == pytest.approx(totals.compute_us)
        assert covered_us(row(act, ra.rank, "communication")) == pytest.approx(totals.comm_us)
        assert covered_us(row(act, ra.rank, "other device work")) == pytest.approx(totals.memcpy_us)
        assert covered_us(row(act, ra.rank, "idle")) == pytest.approx(totals.idle_us)


def test_bars_are_capped_and_keep_their_busy_time() -> None:
    full = job_activity(NCCL, max_segments=100_000)
    small = job_activity(NCCL, max_segments=300)
    assert full.merged == 0 and full.segments == full.intervals > 3000
    assert small.segments <= 300 and small.intervals == full.intervals and small.merged > 0
    for ra in full.ranks:
        for r in ra.rows:
            cut = row(small, ra.rank, r.kind)
            assert sum(cut.count) == r.segments.intervals
            assert covered_us(cut) == pytest.approx(covered_us(r.segments))
    assert row(small, 0, "steps").count == [1, 1]  # two steps: room for both


def synthetic_trace(path: Path, ops: int) -> Path:
    """A CPU trace of 2 steps with ``ops`` short operators on the main thread, 1 µs apart."""
    per = ops // 2
    events: list[dict[str, Any]] = []
    for step in range(2):
        t0 = step * per * 3.0
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}",
                       "pid": 1, "tid": 1, "ts": t0, "dur": per * 3.0})  # fmt: skip
        events.extend(
            {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1,
             "ts": t0 + 3.0 * k, "dur": 2.0}
            for k in range(per)
        )  # fmt: skip
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode()))
    return path


def test_a_trace_of_many_thousand_operators_stays_within_the_cap(tmp_path: Path) -> None:
    trace = synthetic_trace(tmp_path / "rank0.pt.trace.json.gz", 60_000)
    act = job_activity([trace])
    compute = row(act, 0, "compute")
    assert compute.intervals == 60_000 and act.segments <= MAX_SEGMENTS
    assert covered_us(compute) == pytest.approx(60_000 * 2.0)
    # a steady row (every gap 1 µs) becomes bars of even size, not one bar and many singles
    assert max(compute.count) <= -(-60_000 // len(compute.count)) + 1


def test_region_spans_are_the_host_blocks_of_the_runs_regions() -> None:
    trace = sorted((H200_RUN / "traces").glob("*.gz"))
    act = job_activity(trace, {"forward", "backward", "never ran"})
    regions = row(act, 0, "regions")
    # 3 steps × forward and backward, once each: the device copies (gpu_user_annotation) left out
    assert sorted(regions.labels) == ["backward"] * 3 + ["forward"] * 3
    steps = row(act, 0, "steps")
    for start, end in zip(regions.start_us, regions.end_us):
        assert any(a <= start and end <= b for a, b in zip(steps.start_us, steps.end_us))
    assert row(job_activity(trace), 0, "regions") is None


def test_two_files_of_one_rank_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="both rank 0"):
        job_activity([GLOO[0], synthetic_trace(tmp_path / "rank0.pt.trace.json.gz", 10)])


# ------------------------------------------------------------------ the page


@pytest.fixture(scope="module")
def h200() -> tuple[Any, dict[str, Any]]:
    run = read_run(H200_RUN)
    return run, analyze_run(run, H200_RUN)


def test_steps_view_draws_the_rows_and_says_how_they_were_bounded(h200: tuple) -> None:
    run, analysis = h200
    text = run_to_html(run, decode_analysis(analysis))
    data = page_data(text)
    assert "steps-timeline" not in data["figures"]  # the step bars are the chart's steps row
    fig = data["figures"]["steps-activity"]["all"]
    ticks = fig["layout"]["yaxis"]["ticktext"]
    assert ticks == ["rank 0 · steps", "rank 0 · regions", "rank 0 · compute",
                     "rank 0 · other device work", "rank 0 · idle"]  # fmt: skip
    bars = [t for t in fig["data"] if t.get("meta")]
    assert {t["name"] for t in bars} == {"steps", "regions", "compute", "other device work",
                                         "idle"}  # fmt: skip
    legend = [t["name"] for t in fig["data"] if not t.get("meta")]
    assert legend == ["steps", "regions", "compute", "other device work", "idle"]
    steps = next(t for t in bars if t["name"] == "steps")
    summary = analysis["traces"]["ranks"]["0"][0]
    cpu_ms = [s["cpu_duration_us"] / 1e3 for s in summary["steps"]]
    assert steps["x"] == pytest.approx(cpu_ms, abs=1e-3) and steps["text"][0] == "step 2"
    drawn = sum(len(t["x"]) for t in bars)
    assert f"Drawn: {drawn} bars for {drawn} intervals (at most 4,000 bars" in text
    size = len(json.dumps(fig, separators=(",", ":")))
    print(f"H200 run: chart {size:,} bytes of JSON for {drawn} bars; page {len(text):,} bytes")
    assert size < 40 * drawn + 5_000


def test_a_trace_that_cannot_be_read_or_is_gone_leaves_the_step_bars_and_says_why(
    h200: tuple, tmp_path: Path
) -> None:
    run, analysis = h200
    broken = tmp_path / "rank0.pt.trace.json.gz"
    broken.write_bytes(gzip.compress(b'{"traceEvents": [{"ph": "X", "ts": '))
    analysis = copy.deepcopy(analysis)
    analysis["traces"]["ranks"]["0"][0]["source"] = str(broken)
    text = run_to_html(run, decode_analysis(analysis))
    data = page_data(text)
    assert "steps-activity" not in data["figures"] and "steps-timeline" in data["figures"]
    assert "Timeline of every rank on one clock: not drawn here (" in text
    assert str(broken.name) in text
    broken.unlink()  # moved away since the analysis read it
    text = run_to_html(run, decode_analysis(analysis))
    assert "steps-timeline" in page_data(text)["figures"]
    assert f"not drawn here (the analysis read {broken}, which is not there any more)" in text


# ------------------------------------------------------------------ a real run, in a browser


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install chromium)")
def test_real_two_rank_report_draws_the_timeline_in_headless_chromium(
    cpu_run_dir: Path, tmp_path: Path
) -> None:
    """The report ``mgprof analyze`` wrote: both ranks' rows, on the clock of the timeline file
    beside it, drawn with no console error; the rank selector keeps one rank's rows."""
    page = cpu_run_dir / "report.html"
    text = page.read_text()
    data = page_data(text)
    fig = data["figures"]["steps-activity"]["all"]
    ticks = fig["layout"]["yaxis"]["ticktext"]
    for rank in (0, 1):
        for kind in ("steps", "regions", "compute", "communication", "idle"):
            assert f"rank {rank} · {kind}" in ticks
    with gzip.open(cpu_run_dir / "timeline.json.gz") as fh:
        doc = json.load(fh)
    offset = doc["otherData"]["ranks"][1]["clock"]["offset_us"]
    assert f"rank 1 {offset:+,.1f} µs" in text
    first = min(
        e["ts"] for e in doc["traceEvents"]
        if e.get("pid") == 2 and str(e.get("name", "")).startswith("ProfilerStep#")
    )  # fmt: skip
    steps1 = next(t for t in fig["data"] if t.get("meta", {}).get("rank") == 1)
    assert steps1["base"][0] == pytest.approx(first / 1e3, abs=2e-3)
    cases = (("view=steps", {0, 1}), ("view=steps&rank=1", {1}))
    with ThreadPoolExecutor(2) as pool:  # one Chromium each, side by side
        pages = list(
            pool.map(lambda i: render_in_chromium(page, tmp_path / f"p{i}", cases[i][0]), (0, 1))
        )
    for (dom, console), (_, ranks) in zip(pages, cases):
        bad = [c for c in console if re.search(r"error|uncaught|refused|failed", c, re.I)]
        assert not bad, bad
        chart = re.search(r'<div class="chart[^"]*" id="steps-activity"([^>]*)>', dom)
        assert chart is not None and 'data-rendered="1"' in chart.group(1)
        part = dom[chart.start() : dom.find('<p class="note">', chart.start())]
        labels = set(re.findall(r"rank (\d) · communication", part))
        assert labels == {str(r) for r in ranks}
        assert len(re.findall(r'class="point"', part)) > 100  # the bars, as SVG
        legend = re.findall(r'class="legendtext"[^>]*>([^<]*)<', part)
        assert {"steps", "compute", "communication", "idle"} <= set(legend)
        errors = re.search(r'<div id="mgprof-errors"([^>]*)>(.*?)</div>', dom, re.S)
        assert errors is not None and "hidden" in errors.group(1) and errors.group(2) == ""
    print(f"2-rank run: report.html {page.stat().st_size:,} bytes, "
          f"chart {len(json.dumps(fig, separators=(',', ':'))):,} bytes of JSON")  # fmt: skip


def test_json_round_trip_of_the_activity() -> None:
    act = job_activity(GLOO)
    back = msgspec.json.decode(msgspec.json.encode(act), type=JobActivity)
    assert back.segments == act.segments and back.ranks[1].clock == act.ranks[1].clock


def test_the_clocks_of_a_timeline_file_written_from_these_traces_are_read_back(
    tmp_path: Path,
) -> None:
    traces = tmp_path / "traces"
    traces.mkdir()
    files = [traces / f.name for f in GLOO]
    for src, dst in zip(GLOO, files):
        dst.write_bytes(src.read_bytes())
    scanned = job_activity(files)
    made = tmp_path / "timeline.json.gz"
    build_timeline(find_inputs(files), made)
    read_back = job_activity(files, timeline=made)
    assert (scanned.clock_source, read_back.clock_source) == ("traces", "timeline.json.gz")
    assert msgspec.structs.replace(read_back, clock_source="traces") == scanned
    # a timeline of some steps has another origin; one older than a trace may be stale
    build_timeline(find_inputs(files), made, steps=parse_steps("3"))
    assert job_activity(files, timeline=made).clock_source == "traces"
    build_timeline(find_inputs(files), made)
    os.utime(files[1], (made.stat().st_mtime + 5, made.stat().st_mtime + 5))
    assert job_activity(files, timeline=made).clock_source == "traces"
    assert job_activity(files[:1], timeline=made).clock_source == "traces"  # not its files
