"""The HTML report: one offline file, every section, charts that really render in a browser, and
names from traces (``<img src=x onerror=alert(1)>``, ``&``) shown as text, never as markup."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

from mgprof.analyze.findings import evaluate_findings
from mgprof.analyze.run.analysis import analyze_run
from mgprof.analyze.run.schema import RunAnalysis, decode_analysis
from mgprof.errors import UsageError
from mgprof.records import (
    DeviceInfo,
    DeviceSamples,
    MemoryRecord,
    RankRecord,
    RunRecord,
    SamplerRecord,
    StepRecord,
    TrainingFacts,
    read_run,
)

pytest.importorskip("plotly", reason="the HTML report needs plotly: pip install 'mgprof[html]'")

from mgprof.report.html import page as html_report
from mgprof.report.html.text import unintern_strings
from tests._analysis import trace_summary as full_summary

EVIL = "<img src=x onerror=alert(1)>"
AMP_KERNEL = "void at::native::vectorized_elementwise_kernel<4, AddFunctor<float>&>"
ALL_CHARTS = (
    "chart-step-breakdown",
    "chart-utilisation",
    "chart-memory",
    "chart-comparison",
    "chart-sweep",
)


def nvml_sampler(rank: int, start: float) -> SamplerRecord:
    dev = DeviceSamples(
        device=f"cuda:{rank}",
        t_s=[0.0, 0.5, 1.0, 1.5],
        columns={
            "gpu_util_pct": [10.0, 92.0, 95.0, None],
            "mem_used_mib": [1200.0, 40_000.0, 41_000.0, 41_500.0],
        },
        summary={"gpu_util_pct_mean": 65.7},
        facts={"name": "NVIDIA H100 80GB HBM3", "started_unix_s": start, "uuid": f"GPU-{rank}"},
    )
    return SamplerRecord(kind="nvml", interval_s=0.5, devices=[dev])


def to_html(run: RunRecord, analysis: dict[str, Any]) -> str:
    """The page of an analysis dict, decoded as ``mgprof report`` decodes run.json's."""
    return html_report.run_to_html(run, decode_analysis(analysis))


def trace_summary(path: Path) -> dict[str, Any]:
    return full_summary(
        kind="gpu",
        totals={
            "window_us": 200_000.0,
            "busy_pct": 80.0,
            "idle_pct": 20.0,
            "compute_pct": 65.0,
            "comm_pct": 30.0,
            "exposed_comm_pct": 12.0,
        },
        collectives=[
            {
                "type": "all_reduce",
                "count": 20,
                "total_us": 60_000.0,
                "exposed_us": 24_000.0,
                "bytes": 400_000_000,
                "group_size": 2,
                "busbw_gbps": 150.0,
            }
        ],
        top_kernels=[
            {"name": EVIL, "count": 3, "total_us": 40_000.0, "pct_of_compute": 30.0},
            {"name": AMP_KERNEL, "count": 9, "total_us": 20_000.0, "pct_of_compute": 15.0},
        ],
    )


def gpu_run(tmp_path: Path) -> tuple[RunRecord, dict[str, Any]]:
    (tmp_path / "traces").mkdir(exist_ok=True)
    ranks = []
    for r in range(2):
        rel = f"traces/rank{r}.pt.trace.json"
        (tmp_path / rel).write_text("{}")
        ranks.append(
            RankRecord(
                rank=r,
                world_size=2,
                strategy="ddp",
                backend="nccl",
                device=DeviceInfo(kind="cuda", index=r, name="NVIDIA H100 80GB HBM3"),
                steps=[
                    StepRecord(index=i, duration_ms=100.0 + 30.0 * r, batch_size=64)
                    for i in range(5)
                ],
                sampler=nvml_sampler(r, 1_700_000_000.0 + 0.2 * r),
                memory=MemoryRecord(
                    kind="cuda",
                    peak_allocated_mib=40_000,
                    peak_reserved_mib=42_000,
                    total_mib=81_559,
                ),
                training=TrainingFacts(distributed_sampler=True, set_epoch_called=False),
                traces=[rel],
            )
        )
    run = RunRecord(run_id="20250101T000000Z-train", strategy="ddp", world_size=2, ranks=ranks)
    analysis = analyze_run(run, tmp_path, trace_analyzer=trace_summary)
    analysis["comparison"] = {
        "rows": [
            {"strategy": "single", "devices": 1, "run": "single", "status": "complete",
             "step_time_ms": 80.0, "samples_per_s": 800.0, "speedup": 1.0, "efficiency": 1.0,
             "comm_share_pct": 0.0, "peak_mem_mib": [30_000]},
            {"strategy": "ddp", "devices": 2, "run": "ddp", "status": "complete",
             "step_time_ms": 100.0, "samples_per_s": 1280.0, "speedup": 1.6, "efficiency": 0.8,
             "comm_share_pct": 12.0, "peak_mem_mib": [42_000, 42_000]},
        ]
    }  # fmt: skip
    analysis["sweep"] = {
        "series": [
            {
                "name": f"ddp {EVIL}",
                "points": [
                    {"batch_size": b, "samples_per_s": s, "peak_mem_mib": m, "comm_share_pct": c}
                    for b, s, m, c in ((32, 700.0, 20_000, 25.0), (64, 1280.0, 42_000, 12.0),
                                       (128, 1500.0, 80_000, 6.0))
                ],
            }
        ]
    }  # fmt: skip
    analysis["findings"] = evaluate_findings(run, analysis)
    return run, analysis


@pytest.fixture
def report(tmp_path: Path) -> str:
    run, analysis = gpu_run(tmp_path)
    return to_html(run, analysis)


def chart_data(text: str) -> dict[str, Any]:
    """The summary charts (chart id -> Plotly figure) from the page's one JSON block."""
    m = re.search(r'<script type="application/json" id="mgprof-charts">(.*?)</script>', text, re.S)
    assert m is not None
    return dict(unintern_strings(json.loads(m.group(1)))["charts"])


# ------------------------------------------------------------------ structure


def test_one_offline_file_with_every_section_and_chart(report: str) -> None:
    assert report.startswith("<!DOCTYPE html>")
    for title in ("Setup", "Step time per rank", "Utilisation", "Communication",
                  "Memory &amp; headroom", "Top kernels", "Strategy comparison",
                  "Batch-size sweep", "Findings", "Definitions"):  # fmt: skip
        assert f"<h2>{title}</h2>" in report
    for chart in ALL_CHARTS:
        assert f'<div class="chart" id="{chart}"></div>' in report
    # plotly.js is inlined from the installed package; nothing else loads from anywhere.
    library = html_report._plotly_js()
    assert report.count(library) == 1 and len(library) > 1_000_000
    page = report.replace(library, "")
    assert not re.search(r"<(script|link|img|iframe)\b[^>]*\b(src|href)=", page)
    assert "http://" not in page and "https://" not in page
    assert "default-src &#x27;none&#x27;" in report  # CSP: no network
    figs = chart_data(report)
    assert set(figs) == set(ALL_CHARTS)


def test_chart_figures_hold_the_measured_numbers(report: str) -> None:
    figs = chart_data(report)
    bars = {t["name"]: t["y"] for t in figs["chart-step-breakdown"]["data"]}
    # rank 0: 100 ms mean step x 65 % compute, 12 % exposed, 20 % idle, 3 % other.
    assert bars["compute (incl. overlapped comm)"][0] == pytest.approx(65.0)
    assert bars["exposed communication"][1] == pytest.approx(130.0 * 0.12)
    assert bars["idle"][0] == pytest.approx(20.0)
    assert bars["other device work (memcpy/memset)"][0] == pytest.approx(3.0)
    util = figs["chart-utilisation"]["data"]
    assert util[0]["y"] == [10.0, 92.0, 95.0, None]
    # ranks' samplers started 0.2 s apart: one shared clock.
    assert util[1]["x"][0] == pytest.approx(0.2)
    mem = figs["chart-memory"]["data"]
    assert mem[0]["y"][-1] == 41_500.0
    comp = figs["chart-comparison"]["data"][0]
    assert comp["y"] == [800.0, 1280.0]
    sweep = figs["chart-sweep"]["data"]
    assert sweep[0]["x"] == [32, 64, 128] and sweep[1]["y"] == [20_000, 42_000, 80_000]


def test_findings_rendered_with_cause_and_saving(report: str, tmp_path: Path) -> None:
    _, analysis = gpu_run(tmp_path)
    rules = {f["rule"] for f in analysis["findings"]}
    assert {"exposed_comm", "rank_imbalance", "set_epoch_missing"} <= rules
    assert report.count('<li class="finding ') == len(analysis["findings"])
    assert "<dt>cause</dt>" in report and "<dt>could save</dt>" in report
    assert 'class="finding high"' in report


def test_trace_names_are_escaped(report: str) -> None:
    assert EVIL not in report
    assert "<img" not in report
    assert "&lt;img src=x onerror=alert(1)&gt;" in report
    assert "AddFunctor&lt;float&gt;&amp;&gt;" in report
    block = re.search(r'id="mgprof-charts">(.*?)</script>', report, re.S)
    assert block is not None and not set("<>&") & set(block.group(1))
    # In chart labels the name is entity-escaped too (Plotly reads HTML in labels).
    names = [t["name"] for t in chart_data(report)["chart-sweep"]["data"]]
    assert names[0] == "ddp &lt;img src=x onerror=alert(1)&gt;: samples/s"


def test_optional_charts_absent_without_their_data(tmp_path: Path) -> None:
    run, analysis = gpu_run(tmp_path)
    for key in ("comparison", "sweep"):
        analysis.pop(key)
    text = to_html(run, analysis)
    assert "chart-comparison" not in text and "chart-sweep" not in text
    assert "<h2>Strategy comparison</h2>" not in text
    assert set(chart_data(text)) == set(ALL_CHARTS[:3])


def test_bare_run_renders_without_charts() -> None:
    text = html_report.run_to_html(RunRecord(), RunAnalysis())
    assert chart_data(text) == {} and "<h2>Findings</h2>" in text and "no findings" in text


def test_sweep_accepts_a_plain_point_list_and_columns(tmp_path: Path) -> None:
    run, analysis = gpu_run(tmp_path)
    analysis["sweep"] = [
        {"batch_size": 64, "samples_per_s": 10.0},
        {"batch_size": 32, "samples_per_s": 6.0},
    ]
    assert chart_data(to_html(run, analysis))["chart-sweep"]["data"][0]["y"] == [
        6.0,
        10.0,
    ]
    analysis["sweep"] = {"series": {"batch_size": [16, 8], "samples_per_s": [3.0, 2.0]}}
    assert chart_data(to_html(run, analysis))["chart-sweep"]["data"][0]["x"] == [
        8,
        16,
    ]


def test_missing_plotly_is_a_usage_error_naming_pip(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "plotly.offline", None)
    with pytest.raises(html_report.HtmlDependencyMissing) as exc:
        html_report.run_to_html(RunRecord(), RunAnalysis())
    assert isinstance(exc.value, UsageError) and isinstance(exc.value, ImportError)
    assert "pip install" in str(exc.value) and "plotly" in str(exc.value)


# ------------------------------------------------------------------ a real run, via the CLI


@pytest.mark.slow
def test_real_run_writes_report_html_and_report_command_renders_it(
    cpu_run_dir: Path, tmp_path: Path
) -> None:
    written = (cpu_run_dir / "report.html").read_text()
    assert "CPU fallback" in written and "chart-step-breakdown" in written
    figs = chart_data(written)
    assert {"chart-step-breakdown", "chart-utilisation", "chart-memory"} <= set(figs)
    out = tmp_path / "again.html"
    proc = subprocess.run(
        [sys.executable, "-m", "mgprof", "report", str(cpu_run_dir), "--format", "html",
         "--out", str(out)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert set(chart_data(out.read_text())) == set(figs)
    run = read_run(cpu_run_dir)
    assert run.analysis is not None and "findings" in run.analysis


# ------------------------------------------------------------------ headless Chromium

CHROMIUM = next(
    (shutil.which(n) for n in ("chromium", "chromium-browser") if shutil.which(n)), None
)


def render_in_chromium(page: Path, profile: Path, fragment: str = "") -> tuple[str, list[str]]:
    """The DOM after scripts ran, and the console lines Chromium logged to stderr;
    ``fragment`` is the URL's ``#...`` part (``view=kernels`` opens that view)."""
    assert CHROMIUM is not None
    url = page.resolve().as_uri() + (f"#{fragment}" if fragment else "")
    proc = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
         "--virtual-time-budget=10000", "--dump-dom", url],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    console = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]
    return proc.stdout, console


def assert_clean_render(dom: str, console: list[str], view: str = "overview") -> list[str]:
    """No console error, no error shown on the page, and every chart of ``view`` (the one the
    page opened) drawn, the other views' charts not yet (they are drawn when shown); returns
    the ids of the charts drawn."""
    bad = [c for c in console if re.search(r"error|uncaught|refused|failed", c, re.I)]
    assert not bad, bad
    assert f'id="view-{view}" data-view="{view}" data-view-rendered="1"' in dom
    charts = re.findall(r'<div class="chart[^"]*" id="([^"]+)"([^>]*)>', dom)
    start = dom.index(f'id="view-{view}"')
    end = dom.find('<section class="view"', start)
    mine = re.findall(
        r'<div class="chart[^"]*" id="([^"]+)"', dom[start : end if end > 0 else None]
    )
    drawn = [c for c, attrs in charts if 'data-rendered="1"' in attrs]
    assert drawn == mine and dom.count('class="main-svg"') >= len(mine)
    errors = re.search(r'<div id="mgprof-errors"([^>]*)>(.*?)</div>', dom, re.S)
    assert errors is not None and "hidden" in errors.group(1) and errors.group(2) == ""
    return drawn


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install chromium)")
def test_report_renders_in_headless_chromium(tmp_path: Path) -> None:
    run, analysis = gpu_run(tmp_path)
    page = tmp_path / "report.html"
    page.write_text(to_html(run, analysis))
    dom, console = render_in_chromium(page, tmp_path / "profile")
    drawn = assert_clean_render(dom, console)
    assert {"chart-utilisation", "chart-comparison", "chart-sweep"} <= set(drawn)
    # The malicious kernel name is text in a table cell, not an element.
    assert "<img" not in dom
    assert re.search(r'<td( class="[^"]*")?>&lt;img src=x onerror=alert\(1\)&gt;</td>', dom)
    # Plotly drew the sweep legend with the name as text as well.
    assert "ddp &lt;img src=x onerror=alert(1)&gt;: samples/s" in dom


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install chromium)")
def test_real_run_report_renders_in_headless_chromium(cpu_run_dir: Path, tmp_path: Path) -> None:
    page = cpu_run_dir / "report.html"
    assert len(chart_data(page.read_text())) >= 3
    dom, console = render_in_chromium(page, tmp_path / "profile", fragment="view=memory")
    assert "chart-memory" in assert_clean_render(dom, console, view="memory")


def test_report_keys_round_trip_through_run_json(tmp_path: Path) -> None:
    """Findings stored in run.json decode back unchanged (the HTML can be re-rendered later)."""
    run, analysis = gpu_run(tmp_path)
    stored = msgspec.structs.replace(run, analysis=analysis)
    back = msgspec.json.decode(msgspec.json.encode(stored), type=RunRecord)
    assert back.analysis is not None
    assert to_html(back, back.analysis) == to_html(run, analysis)
