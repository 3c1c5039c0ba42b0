"""report.html's views (the TensorBoard profiler plugin's, offline): what each view holds, from
hand-made trace summaries and from a real 2-rank run with regions; that every view draws in
headless Chromium with no console error and names shown as text; and that a 16-rank report stays
a file a browser opens in under 2 s."""

from __future__ import annotations

import copy
import json
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgspec
import pytest

from mgprof.analyze.findings import evaluate_findings
from mgprof.analyze.run.analysis import analyze_run
from mgprof.analyze.run.schema import decode_analysis
from mgprof.records import RegionRecord, RunRecord, read_run
from tests._analysis import TOTALS, trace_summary

pytest.importorskip("plotly", reason="the HTML report needs plotly: pip install 'mgprof[html]'")

from test_html_report import CHROMIUM, render_in_chromium

from mgprof.report.html import page as html_report
from mgprof.report.html.text import unintern_strings
from mgprof.report.html.views import VIEWS

ROOT = Path(__file__).resolve().parents[1]
H200_RUN = ROOT / "tests" / "data" / "gpu" / "mgprof-run-h200"
SCRIPT = "<script>alert(1)</script>"
CLOSE = "</script>"
SIZE_BOUND = 6_000_000
"""Bytes of a 16-rank report: plotly.js (~4.6 MB) plus the data of every view."""
LOAD_BOUND_MS = 2000.0


def to_html(run: RunRecord, analysis: dict[str, Any]) -> str:
    """The page of an analysis dict, decoded as ``mgprof report`` decodes run.json's."""
    return html_report.run_to_html(run, decode_analysis(analysis))


def page_data(text: str) -> dict[str, Any]:
    m = re.search(r'<script type="application/json" id="mgprof-charts">(.*?)</script>', text, re.S)
    assert m is not None
    assert not set("<>&") & set(m.group(1)), "the JSON block must not hold < > &"
    return unintern_strings(json.loads(m.group(1)))


def table(data: dict[str, Any], table_id: str) -> list[dict[str, Any]]:
    """A table's rows as dicts keyed by column label."""
    spec = data["tables"][table_id]
    labels = [c["label"] for c in spec["columns"]]
    return [dict(zip(labels, row)) for row in spec["rows"]]


# ------------------------------------------------------------------ hand-made trace summaries


def op(name: str, shapes: str, calls: int, host_self: float, device: float | None) -> dict:
    return {"name": name, "input_shapes": shapes, "calls": calls,
            "host_total_us": host_self * 2, "host_self_us": host_self,
            "device_total_us": None if device is None else device * 2,
            "device_self_us": device}  # fmt: skip


def by_name_op(name: str, calls: int, host_self: float, device: float | None) -> dict:
    row = {k: v for k, v in op(name, "", calls, host_self, device).items() if k != "input_shapes"}
    return {**row, "input_shape_groups": 1}


def kernel(name: str, calls: int, total: float, tc: bool, pct: float) -> dict:
    return {"name": name, "count": calls, "calls": calls, "total_us": total,
            "mean_us": total / calls, "min_us": total / calls / 2, "max_us": total / calls * 2,
            "tensor_core": tc, "kind": "tensor_core" if tc else "other",
            "pct_of_compute": pct}  # fmt: skip


def gpu_summary(rank: int, evil: str = SCRIPT) -> dict[str, Any]:
    """A trace summary in the shape the trace engine writes (operators, kernels, steps)."""
    ops = [
        op("aten::addmm", "[[64, 256], [256, 512]]", 20, 4000.0 + rank, 9000.0),
        op("aten::addmm", "[[64, 512], [512, 10]]", 20, 1000.0, 500.0),
        op(evil, "", 3, 10.0, 1.0),
    ]
    by_name = [by_name_op("aten::addmm", 40, 5000.0 + rank, 9500.0), by_name_op(evil, 3, 10.0, 1.0)]
    step = {
        "step": 3, "cpu_duration_us": 10_000.0, "device_events": 10,
        "cpu_start_us": 1e9 + rank * 100.0,
        "totals": {**dict.fromkeys(TOTALS), "window_us": 10_000.0, "compute_us": 6000.0,
                   "exposed_comm_us": 2000.0, "idle_us": 1500.0, "compute_pct": 60.0,
                   "exposed_comm_pct": 20.0, "idle_pct": 15.0},
    }  # fmt: skip
    return trace_summary(
        kind="gpu",
        totals={"window_us": 10_000.0, "compute_pct": 60.0, "exposed_comm_pct": 20.0,
                "idle_pct": 15.0},
        steps=[step, {**step, "step": 4, "cpu_start_us": 1e9 + 10_000.0}],
        collectives=[{"type": "all_reduce", "count": 4, "total_us": 3000.0,
                      "exposed_us": 2000.0, "bytes": 6_000_000, "group_size": 2,
                      "algbw_gbps": 2.0, "busbw_gbps": 2.0 + rank,
                      "sizes": [[1_500_000, 4]]}],
        top_kernels=[kernel("ampere_sgemm_tc", 40, 8000.0, True, 80.0),
                     kernel(evil, 4, 2000.0, False, 20.0)],
        tensor_cores={"tensor_core_us": 8000.0, "fp32_gemm_us": 0.0,
                      "tensor_core_kernels": 40, "fp32_gemm_kernels": 0,
                      "tensor_core_pct": 80.0, "fp32_gemm_pct": 0.0},
        operators=ops,
        operators_by_name=by_name,
        operators_dropped={"groups": 7, "calls": 70, "host_self_us": 300.0,
                           "device_self_us": None},
    )  # fmt: skip


def with_summaries(run: RunRecord, analysis: dict[str, Any], per_rank: dict[int, list[dict]]):
    analysis = copy.deepcopy(analysis)
    analysis["traces"] = {
        "ranks": {str(r): s for r, s in per_rank.items()},
        "job": {"cross_rank": {
            "ranks": sorted(per_rank), "match_key": "order", "matched_calls": 4,
            "unmatched_calls": 0,
            "per_type": [{"type": "all_reduce", "matched": 4, "transfer_us": 2500.0,
                          "wait_us_by_rank": {"0": 0.0, "1": 400.0}}],
            "per_rank": [{"rank": 0, "wait_us": 0.0, "last_arrivals": 4},
                         {"rank": 1, "wait_us": 400.0, "last_arrivals": 0}],
            "slowest_rank": 0}},
    }  # fmt: skip
    return run, analysis


@pytest.fixture(scope="module")
def h200() -> tuple[RunRecord, dict[str, Any]]:
    """The recorded H200 run (GPU-shaped memory and sampler data), analysed from its trace."""
    run = read_run(H200_RUN)
    analysis = analyze_run(run, H200_RUN)
    analysis["findings"] = evaluate_findings(run, analysis)
    return run, analysis


def two_gpu_ranks(h200: tuple[RunRecord, dict[str, Any]]) -> tuple[RunRecord, dict[str, Any]]:
    run, analysis = h200
    ranks = [msgspec.structs.replace(run.ranks[0], rank=r, world_size=2) for r in range(2)]
    run = msgspec.structs.replace(run, ranks=ranks, world_size=2, strategy="ddp")
    analysis = copy.deepcopy(analysis)
    analysis["ranks"] = [{**analysis["ranks"][0], "rank": r} for r in range(2)]
    # two trace files on rank 1: its groups are summed over them
    per_rank = {0: [gpu_summary(0)], 1: [gpu_summary(1, evil=CLOSE)] * 2}
    return with_summaries(run, analysis, per_rank)


def test_operators_view_groups_by_name_and_shape_with_host_and_device_time(
    h200: tuple[RunRecord, dict[str, Any]],
) -> None:
    data = page_data(to_html(*two_gpu_ranks(h200)))
    by_name = table(data, "ops-by-name")
    addmm0 = next(r for r in by_name if r["rank"] == 0 and r["operator"] == "aten::addmm")
    assert addmm0 == {"rank": 0, "operator": "aten::addmm", "calls": 40,
                      "host self ms": 5.0, "host total ms": 10.0,
                      "device self ms": 9.5, "device total ms": 19.0}  # fmt: skip
    addmm1 = next(r for r in by_name if r["rank"] == 1 and r["operator"] == "aten::addmm")
    assert addmm1["calls"] == 80 and addmm1["host self ms"] == pytest.approx(10.002)
    by_shape = table(data, "ops-by-shape")
    shapes = {r["input shapes"] for r in by_shape if r["rank"] == 0}
    assert shapes == {"[[64, 256], [256, 512]]", "[[64, 512], [512, 10]]", ""}
    assert data["tables"]["ops-by-name"]["sort"] == [5, "desc"]  # device self, largest first
    top = data["figures"]["ops-top"]
    assert set(top["by_rank"]) == {"0", "1"}
    summed = top["all"]["data"]
    assert [t["name"] for t in summed] == ["host self", "device self"]
    assert summed[1]["x"][0] == pytest.approx(9.5 + 19.0)  # ranks summed, rank 1 twice


def test_kernels_view_has_calls_times_tensor_cores_and_share(
    h200: tuple[RunRecord, dict[str, Any]],
) -> None:
    text = to_html(*two_gpu_ranks(h200))
    data = page_data(text)
    rows = table(data, "kernels-table")
    tc = next(r for r in rows if r["rank"] == 0 and r["kernel"] == "ampere_sgemm_tc")
    assert tc == {"rank": 0, "kernel": "ampere_sgemm_tc", "calls": 40, "total ms": 8.0,
                  "mean µs": 200.0, "min µs": 100.0, "max µs": 400.0, "tensor cores": "yes",
                  "% of compute": 80.0}  # fmt: skip
    tc1 = next(r for r in rows if r["rank"] == 1 and r["kernel"] == "ampere_sgemm_tc")
    assert tc1["calls"] == 80 and tc1["% of compute"] == 80.0  # two files, same share
    assert next(r for r in rows if r["kernel"] == SCRIPT)["tensor cores"] == "no"
    pie = data["figures"]["ov-tensor-cores"]["by_rank"]["0"]["data"][0]
    assert pie["type"] == "pie" and pie["values"] == [80.0, 0.0, 20.0]
    # chart labels entity-escaped (Plotly reads HTML in labels), table cells raw (textContent)
    bars = data["figures"]["kernels-top"]["all"]["data"]
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in bars[1]["y"]
    assert SCRIPT not in text and "alert(1)</" not in text
    # only the page's own three scripts close: </script> from rank 1's names is text
    page = text.replace(html_report._plotly_js(), "")
    assert page.count("</script>") == 3 and page.count("&lt;/script&gt;") >= 2
    assert CLOSE in [r["kernel"] for r in rows if r["rank"] == 1]


def test_distributed_and_steps_views(h200: tuple[RunRecord, dict[str, Any]]) -> None:
    run, analysis = two_gpu_ranks(h200)
    job = analysis["job"]  # the job's own verdict decides the callout, as analyze_run makes it
    job.update(slowest_rank=0, slowest_rank_basis="last to arrive at collectives (traces)")
    job["not_applicable"].pop("slowest_rank", None)
    text = to_html(run, analysis)
    data = page_data(text)
    coll = table(data, "dist-collectives")[0]
    assert coll["busbw GB/s"] == 2.0 and coll["MB"] == 6.0 and coll["message sizes"] == "1.5 MB ×4"
    wait = data["figures"]["dist-wait"]["all"]["data"]
    assert wait[0]["x"] == ["rank 0 (last to arrive)", "rank 1"]
    assert wait[0]["y"] == [2.5, 2.5] and wait[1]["y"] == [0.0, 0.4]
    assert "Slowest rank: 0 — it arrived last at 4 of 4 matched collectives" in text
    # within the run's noise the job names no rank, and the page says so and why
    job.update(slowest_rank=None, slowest_rank_basis=None)
    job["not_applicable"]["slowest_rank"] = "a 0.03 ms gap within the steps' own noise"
    quiet = to_html(run, analysis)
    assert "Slowest rank:" not in quiet
    assert "No slowest rank: a 0.03 ms gap within the steps&#x27; own noise" in quiet
    busbw = data["figures"]["dist-busbw"]["all"]["data"]
    assert [t["meta"]["rank"] for t in busbw] == [0, 1] and busbw[1]["y"] == [3.0]
    merged = next(r for r in table(data, "dist-collectives") if r["rank"] == 1)  # two files
    assert merged["calls"] == 8 and merged["message sizes"] == "1.5 MB ×8"
    steps = table(data, "steps-table")
    traced = next(r for r in steps if r["rank"] == 0 and r["step"] == 3)
    assert traced["traced"] == "yes" and traced["trace window ms"] == 10.0
    assert traced["compute %"] == 60.0
    per_step = data["figures"]["ov-step-breakdown"]["by_rank"]["0"]["data"]
    parts = {t["name"]: t["y"] for t in per_step}
    assert parts["compute (incl. overlapped comm)"] == [6.0, 6.0]
    assert parts["other device work (memcpy/memset)"] == [0.5, 0.5]  # 10 - 6 - 2 - 1.5
    timeline = data["figures"]["steps-timeline"]["all"]["data"]
    assert timeline[0]["base"] == [0.0, 10.0] and timeline[1]["base"][0] == 0.1


def test_memory_view_on_the_h200_run(h200: tuple[RunRecord, dict[str, Any]]) -> None:
    data = page_data(to_html(*h200))
    peaks = {t["name"]: t["y"] for t in data["figures"]["mem-peaks"]["all"]["data"]}
    assert peaks["peak allocated (tensors)"] == [68.486]
    assert peaks["peak reserved (caching allocator)"] == [70.0]
    row = table(data, "mem-table")[0]
    assert row["device"] == "cuda:0" and row["reserved − allocated MiB"] == pytest.approx(1.514)
    assert row["sampled peak used MiB"] == 1445.875
    assert data["charts"]["chart-memory"]["data"][0]["meta"] == {"rank": 0}
    # one rank: no selector
    assert 'id="rank-select"' not in to_html(*h200)


def test_views_without_their_data_say_why(h200: tuple[RunRecord, dict[str, Any]]) -> None:
    """A run.json from before operators and regions: every view is there, with a note."""
    run, analysis = h200
    old = copy.deepcopy(analysis)
    for summaries in old["traces"]["ranks"].values():
        for s in summaries:
            for key in ("operators", "operators_by_name", "operators_dropped"):
                s.pop(key, None)
    for rank in old["ranks"]:
        rank.pop("regions", None)
    text = to_html(run, old)
    for view in VIEWS:
        assert f'<section class="view" id="view-{view}" data-view="{view}">' in text
    assert "No operator table in this analysis" in text and "No regions recorded" in text
    data = page_data(text)
    assert "ops-by-name" not in data["tables"] and "regions-table" not in data["tables"]


def test_failed_run_with_too_few_steps_has_the_overview_alone(
    h200: tuple[RunRecord, dict[str, Any]],
) -> None:
    run, analysis = h200
    ranks = [msgspec.structs.replace(r, steps=r.steps[:1]) for r in run.ranks]
    failed = msgspec.structs.replace(run, ranks=ranks, status="incomplete", error="boom")
    text = to_html(failed, analysis)
    assert text.index('class="failure"') < text.index('<nav class="tabs"')
    assert re.findall(r'<section class="view" id="view-(\w+)"', text) == ["overview"]
    assert page_data(text)["figures"] == {} and page_data(text)["charts"] == {}


def test_utilisation_axis_title_is_short_and_auto_margined(
    h200: tuple[RunRecord, dict[str, Any]],
) -> None:
    util = page_data(to_html(*h200))["charts"]["chart-utilisation"]["layout"]
    assert util["yaxis"]["title"]["text"] == "GPU util %" and util["yaxis"]["automargin"] is True


# ------------------------------------------------------------------ a real 2-rank run with regions


@pytest.fixture(scope="module")
def regions_run(cpu_run_dir: Path) -> tuple[RunRecord, dict[str, Any]]:
    """The real run (examples/mlp_context.py: regions forward and backward), with a hostile
    region nested in forward on rank 0, analysed again from its traces."""
    run = read_run(cpu_run_dir)
    assert {r.name for r in run.ranks[0].regions} >= {"forward", "backward"}
    evil = [
        RegionRecord(name=SCRIPT, count=2, total_ms=1.0, max_ms=0.6, path=["forward", SCRIPT],
                     p50_ms=0.5, p95_ms=0.6),
        RegionRecord(name=CLOSE, count=1, total_ms=0.2, max_ms=0.2, path=[CLOSE]),
    ]  # fmt: skip
    ranks = [msgspec.structs.replace(run.ranks[0], regions=run.ranks[0].regions + evil)]
    run = msgspec.structs.replace(run, ranks=ranks + run.ranks[1:])
    analysis = analyze_run(run, cpu_run_dir)
    analysis["findings"] = evaluate_findings(run, analysis)
    return run, analysis


@pytest.mark.slow
def test_real_run_every_view_and_region_rows(regions_run: tuple[RunRecord, dict]) -> None:
    run, analysis = regions_run
    text = to_html(run, analysis)
    for view in VIEWS:
        assert f'id="view-{view}"' in text and f'href="#view={view}"' in text
    assert '<option value="1">rank 1</option>' in text
    data = page_data(text)
    rows = table(data, "regions-table")
    expected = [(r["rank"], x["name"]) for r in analysis["ranks"] for x in r["regions"]]
    assert [(r["rank"], r["region"]) for r in rows] == expected
    fwd = next(r for r in rows if r["rank"] == 0 and r["region"] == "forward")
    src = next(x for x in analysis["ranks"][0]["regions"] if x["name"] == "forward")
    assert fwd["count"] == src["count"] and fwd["total ms"] == pytest.approx(
        src["total_ms"], abs=1e-3
    )
    assert fwd["p95 ms"] == pytest.approx(src["p95_ms"], abs=1e-3)
    # the tree: the hostile region sits under forward, one level in
    depth = data["tables"]["regions-table"]["depth"]
    assert depth[[r["region"] for r in rows].index(SCRIPT)] == 1
    bars = data["figures"]["regions-bars"]["all"]["data"]
    assert [t["meta"]["rank"] for t in bars] == [0, 1]
    assert "forward › &lt;script&gt;alert(1)&lt;/script&gt;" in bars[0]["x"]
    # never raw in the page; the Regions view draws its own table (no duplicate shared section)
    assert SCRIPT not in text and "alert(1)</" not in text
    assert '<section id="sec-regions"' not in text
    assert data["figures"]["steps-duration"]["all"]["data"][0]["meta"] == {"rank": 0}
    # operators from the real traces: CPU ops, host time only
    summary = analysis["traces"]["ranks"]["0"][0]
    ops = {o["name"]: o for o in summary["operators_by_name"]}
    by_name = [r for r in table(data, "ops-by-name") if r["rank"] == 0]
    assert {r["operator"] for r in by_name} == set(ops)
    for row in by_name:
        src_op = ops[row["operator"]]
        assert row["calls"] == src_op["calls"]
        assert row["host self ms"] == pytest.approx(src_op["host_self_us"] / 1e3, abs=1e-3)
    assert "device self ms" not in by_name[0] and "Device time: not applicable" in text
    shapes = [r for r in table(data, "ops-by-shape") if r["rank"] == 0]
    assert len(shapes) == len(summary["operators"]) and any(r["input shapes"] for r in shapes)
    assert "kernels-table" not in data["tables"] and "No kernels: CPU-only traces" in text


# ------------------------------------------------------------------ headless Chromium


def view_of(dom: str, view: str) -> str:
    """One view's markup in a dumped DOM (up to the next view, or the page's data block)."""
    start = dom.index(f'id="view-{view}"')
    ends = [dom.find(m, start) for m in ('<section class="view"', '<script type="application')]
    return dom[start : min(e for e in ends if e > 0)]


def no_console_error(console: list[str]) -> None:
    bad = [c for c in console if re.search(r"error|uncaught|refused|failed", c, re.I)]
    assert not bad, bad


def clean(dom: str, console: list[str]) -> None:
    no_console_error(console)
    errors = re.search(r'<div id="mgprof-errors"([^>]*)>(.*?)</div>', dom, re.S)
    assert errors is not None and "hidden" in errors.group(1) and errors.group(2) == ""


def render_all(page: Path, hashes: list[str], tmp: Path) -> list[tuple[str, list[str]]]:
    """Each ``page#hash`` in its own headless Chromium, two at a time."""

    def one(i: int) -> tuple[str, list[str]]:
        return render_in_chromium(page, tmp / f"profile{i}", fragment=hashes[i])

    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(one, range(len(hashes))))


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install chromium)")
def test_every_view_draws_in_headless_chromium(
    regions_run: tuple[RunRecord, dict], tmp_path: Path
) -> None:
    run, analysis = regions_run
    page = tmp_path / "report.html"
    text = to_html(run, analysis)
    page.write_text(text)
    data = page_data(text)
    # the views, then Steps for rank 1 with its table sorted and filtered by the link
    link = "view=steps&rank=1&table=steps-table&sort=2&dir=asc&filter=yes"
    hashes = [f"view={v}" for v in VIEWS] + [link]
    results = render_all(page, hashes, tmp_path)
    for view, (dom, console) in zip(VIEWS, results):
        clean(dom, console)
        part = view_of(dom, view)
        assert 'data-view-rendered="1"' in part.split(">", 1)[0], view
        assert "<script" not in part and "alert(1)</" not in part
        charts = re.findall(r'<div class="chart[^"]*" id="([^"]+)"([^>]*)>', part)
        assert all('data-rendered="1"' in attrs for _, attrs in charts), (view, charts)
        for t in re.findall(r'data-table="([^"]+)"(?! hidden)[^>]*data-rows="(\d+)"', part):
            assert int(t[1]) == min(len(data["tables"][t[0]]["rows"]), 500), (view, t)
        others = [v for v in VIEWS if v != view]
        assert all('data-view-rendered="1"' not in view_of(dom, v)[:300] for v in others)
    overview = view_of(results[0][0], "overview")
    assert "<h2>Setup</h2>" in overview and "<h2>Findings</h2>" in overview
    assert len(re.findall(r'class="chart[^"]*" id="[^"]+" data-rendered="1"', overview)) >= 2
    regions = view_of(results[VIEWS.index("regions")][0], "regions")
    # the names are text in table cells and in Plotly's labels, never an element
    drawn = regions.split('data-table="regions-table"', 1)[1].split("</table>", 1)[0]
    assert re.search(r'<td class="text"[^>]*>└ &lt;script&gt;alert\(1\)&lt;/script&gt;</td>', drawn)
    assert re.search(r'<td class="text"[^>]*>&lt;/script&gt;</td>', drawn)
    assert "&lt;/script&gt;" in regions
    assert "forward › &lt;script&gt;alert(1)&lt;/script&gt;" in regions  # the bar chart's label
    # rank=1: the selector filters the tables and charts; the link sorted and filtered a table
    dom, console = results[-1]
    clean(dom, console)
    part = view_of(dom, "steps")
    assert 'data-rank="1"' in part.split(">", 1)[0]
    legend = re.findall(r'class="legendtext"[^>]*>([^<]*)<', part)
    assert "rank 1" in legend and "rank 0" not in legend
    traced = sorted(
        r["step ms"] for r in table(data, "steps-table") if r["rank"] == 1 and r["traced"] == "yes"
    )
    body = part.split('data-table="steps-table"', 1)[1].split("</tbody>", 1)[0]
    assert f'data-rows="{len(traced)}"' in body and 'aria-sort="ascending"' in body
    cells = r'<tr><td class="num">1</td><td class="num">\d+</td><td class="num">([\d.,]+)</td>'
    shown = [float(v.replace(",", "")) for v in re.findall(cells, body)]
    assert shown == pytest.approx(traced, abs=1e-3)


def replicate(run: RunRecord, analysis: dict[str, Any], n: int) -> tuple[RunRecord, dict]:
    """A ``n``-rank run made of copies of a real run's ranks, each with the trace engine's
    bounded lists full: 200 operator groups per table, 200 kernels with C++-length names."""
    src = sorted(run.ranks, key=lambda r: r.rank)
    ranks = [msgspec.structs.replace(src[i % len(src)], rank=i, world_size=n) for i in range(n)]
    out = copy.deepcopy(analysis)
    out["ranks"] = [{**analysis["ranks"][i % len(src)], "rank": i} for i in range(n)]
    traces = analysis["traces"]["ranks"]
    ops = [
        op(f"aten::op_{k}", f"[[{k}, 1024], [1024, {k}], [], []]", k + 1, 100.0 * k, None)
        for k in range(200)
    ]
    kernels = [
        kernel(f"void at::native::elementwise_kernel_{k}<128, 4, at::native::gpu_kernel_impl"
               f"<at::native::BinaryFunctor<float, float, float>>(at::TensorIteratorBase&)>"
               "(int, float*, float const*)", 10, 100.0 * k + 1, k % 3 == 0, 0.5)
        for k in range(200)
    ]  # fmt: skip
    per_rank = {}
    for i in range(n):
        summary = copy.deepcopy(traces[str(i % len(src))][0])
        summary["operators"] = ops
        summary["operators_by_name"] = [
            {**{k: v for k, v in o.items() if k != "input_shapes"}, "input_shape_groups": 1}
            for o in ops
        ]
        summary["kernels"] = kernels
        summary["top_kernels"] = kernels[:10]
        per_rank[str(i)] = [summary]
    out["traces"] = {**analysis["traces"], "ranks": per_rank}
    cross = out["traces"].get("job", {}).get("cross_rank")
    if cross:
        cross["per_rank"] = [
            {"rank": i, "wait_us": 100.0 * i, "last_arrivals": int(i == 0)} for i in range(n)
        ]
    return msgspec.structs.replace(run, ranks=ranks, world_size=n), out


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install chromium)")
def test_sixteen_rank_report_is_small_and_opens_in_under_two_seconds(
    regions_run: tuple[RunRecord, dict], tmp_path: Path
) -> None:
    run, analysis = replicate(*regions_run, 16)
    text = to_html(run, analysis)
    page = tmp_path / "report16.html"
    page.write_text(text)
    size = page.stat().st_size
    library = len(html_report._plotly_js())
    assert size < SIZE_BOUND, f"{size:,} bytes (plotly.js {library:,})"
    data = page_data(text)
    assert data["ranks"] == list(range(16))
    assert len(data["tables"]["ops-by-shape"]["rows"]) == len(
        data["tables"]["kernels-table"]["rows"]
    )
    assert len(data["tables"]["kernels-table"]["rows"]) == 16 * 200
    # Best of three: the figure is the page's own (navigation start to the Overview drawn),
    # and a loaded machine only ever makes it slower.
    best = script = None
    for attempt in range(3):
        ready_ms, script_ms = ready_time(page, tmp_path / f"p{attempt}")
        if best is None or ready_ms < best:
            best, script = ready_ms, script_ms
        if best < LOAD_BOUND_MS:
            break
    assert best is not None and script is not None
    print(f"16 ranks: {size:,} bytes, ready in {best:.0f} ms (plotly.js run by {script:.0f} ms)")
    if best >= LOAD_BOUND_MS:
        # Parsing plotly.js alone takes ~1 s on an idle 2-core VM; on a loaded one it can take
        # the whole budget. Then hold the report to its own share: at most 500 ms beyond a page
        # that holds nothing but plotly.js, measured now on the same machine.
        bare = tmp_path / "plotly-only.html"
        bare.write_text(
            f"<!DOCTYPE html><html><head><script>{html_report._plotly_js()}</script></head>"
            '<body><script>document.documentElement.setAttribute("data-ready-ms", '
            "performance.now().toFixed(0));</script></body></html>"
        )
        baseline = min(ready_time(bare, tmp_path / f"b{i}", report=False)[0] for i in range(2))
        print(f"plotly.js alone: {baseline:.0f} ms")
        assert baseline > LOAD_BOUND_MS - 500, f"{best:.0f} ms, plotly.js alone {baseline:.0f}"
        assert best - baseline < 500


def ready_time(page: Path, profile: Path, report: bool = True) -> tuple[float, float]:
    """(ms from navigation start to the first view drawn, ms when the page's script began).

    Every page is held to what it can show: no console error on any, and on a report page
    (``report``) also an empty, hidden error box; the plotly.js-only baseline has no such box.
    """
    dom, console = render_in_chromium(page, profile, fragment="view=overview")
    if report:
        clean(dom, console)
    else:
        no_console_error(console)
    ready = re.search(r'data-ready-ms="(\d+)"', dom)
    assert ready is not None, "the page did not finish drawing"
    script = re.search(r'data-script-ms="(\d+)"', dom)
    return float(ready.group(1)), float(script.group(1)) if script else 0.0
