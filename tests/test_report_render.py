"""Renderers: every section appears, n/a carries its reason, names from traces are escaped."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from mgprof.analyze.run.analysis import analyze_run
from mgprof.analyze.run.schema import decode_analysis
from mgprof.records import (
    DeviceInfo,
    MemoryRecord,
    RankRecord,
    RunRecord,
    StepRecord,
    decode_run,
)
from mgprof.report.run.as_json import run_to_json
from mgprof.report.run.markdown import escape_md, run_to_markdown
from mgprof.report.run.terminal import render_run
from tests._analysis import trace_summary

EVIL = "<img src=x onerror=alert(1)>"
SECTIONS = (
    "Setup",
    "Step time per rank",
    "Utilisation",
    "Energy",
    "Communication",
    "Memory & headroom",
    "Data loading",
    "Slowest rank",
    "Top kernels",
    "Findings",
)


def summary(path: Path) -> dict[str, Any]:
    return trace_summary(
        kind="cpu",
        totals={
            "window_us": 1000.0,
            "busy_pct": 50.0,
            "comm_pct": 20.0,
            "exposed_comm_pct": 5.0,
        },
        top_kernels=[
            {
                "name": EVIL,
                "count": 3,
                "total_us": 400.0,
                "pct_of_compute": 80.0,
                "kind": "compute",
            },
            {
                "name": "a|b",
                "count": 1,
                "total_us": 100.0,
                "pct_of_compute": 20.0,
                "kind": "compute",
            },
            {
                "name": "[bold]x[/bold]",
                "count": 1,
                "total_us": 1.0,
                "pct_of_compute": 0.1,
                "kind": "compute",
            },
        ],
        collectives=[
            {
                "type": "all_reduce",
                "count": 2,
                "total_us": 200.0,
                "exposed_us": 50.0,
                "busbw_gbps": None,
                "not_applicable": "bytes unknown",
            }
        ],
    )


def make(tmp_path: Path, **kw: Any) -> tuple[RunRecord, dict[str, Any]]:
    (tmp_path / "t.json").write_text("{}")
    ranks = [
        RankRecord(
            rank=r,
            world_size=2,
            host="node1",
            device=DeviceInfo(kind="cpu"),
            steps=[StepRecord(index=i, duration_ms=10.0 + r, batch_size=4) for i in range(4)],
            memory=MemoryRecord(kind="cpu", peak_rss_mib=512.0),
            traces=["t.json"],
        )
        for r in range(2)
    ]
    run = RunRecord(
        run_id="20250101-train", world_size=2, strategy="ddp", backend="gloo", ranks=ranks, **kw
    )
    return run, analyze_run(run, tmp_path, trace_analyzer=summary)


def terminal(run: RunRecord, analysis: dict[str, Any]) -> str:
    buf = io.StringIO()
    render_run(run, decode_analysis(analysis), Console(file=buf, width=120))
    return buf.getvalue()


def test_terminal_has_every_section_and_na_with_reason(tmp_path: Path) -> None:
    run, analysis = make(tmp_path)
    out = terminal(run, analysis)
    for title in SECTIONS:
        assert title in out
    assert "n/a [" in out
    # The reason behind an n/a is printed, not only the marker.
    assert "CPU %" in out and "no sampler ran on this rank" in out
    # a CPU run: GPU-only figures are one line, not columns of n/a
    assert "Energy: not measured on a CPU run" in out
    assert "NVML utilisation, TFLOP/s and MFU are GPU figures" in out
    assert "no findings" in out
    assert "CPU fallback" not in out
    assert "[bold]x[/bold]" in out  # markup in a kernel name prints literally
    assert "11.00" in out  # rank 1 mean step time


def test_terminal_cpu_fallback_notice_and_error(tmp_path: Path) -> None:
    run, analysis = make(
        tmp_path,
        cpu_fallback=True,
        cpu_fallback_reason="no CUDA device visible",
        status="incomplete",
        error="rank 1 exited with code 1",
    )
    out = terminal(run, analysis)
    assert "CPU fallback" in out
    assert "no CUDA device visible" in out
    assert "incomplete" in out and "rank 1 exited with code 1" in out


def test_findings_rendered(tmp_path: Path) -> None:
    run, analysis = make(tmp_path)
    analysis["findings"] = [
        {
            "id": "identical_batches",
            "rule": "identical_batches",
            "severity": "high",
            "title": "Ranks train on the same data",
            "evidence": "4/4 steps",
            "cause": "",
            "change": "use DistributedSampler",
            "fix": [],
        }
    ]
    out = terminal(run, analysis)
    assert "Ranks train on the same data" in out and "use DistributedSampler" in out
    assert "no findings" not in out
    md = run_to_markdown(run, decode_analysis(analysis))
    assert "use DistributedSampler" in md


def test_markdown_escapes_names_from_traces(tmp_path: Path) -> None:
    run, analysis = make(tmp_path)
    md = run_to_markdown(run, decode_analysis(analysis))
    assert EVIL not in md and "<img" not in md
    assert "&lt;img src=x onerror=alert(1)&gt;" in md
    assert "a\\|b" in md
    for title in SECTIONS:
        assert f"## {escape_md(title)}" in md
    # Every row of every table has as many cells as its header.
    lines = md.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("|---") or line.startswith("|--"):
            width = len(_cells(lines[i - 1]))
            j = i + 1
            while j < len(lines) and lines[j].startswith("|"):
                assert len(_cells(lines[j])) == width, lines[j]
                j += 1


def _cells(row: str) -> list[str]:
    out, cur, k = [], "", 1
    body = row.strip()
    while k < len(body) - 1:
        ch = body[k]
        if ch == "\\":
            cur += body[k : k + 2]
            k += 2
            continue
        if ch == "|":
            out.append(cur)
            cur = ""
        else:
            cur += ch
        k += 1
    out.append(cur)
    return out


@pytest.mark.parametrize(
    ("raw", "escaped"),
    [
        ("a|b", "a\\|b"),
        ("<b>&", "&lt;b&gt;&"),
        ("&amp; &#60;", "&amp;amp; &amp;#60;"),
        ("x\ny", "x y"),
        ("_init_", "\\_init\\_"),
    ],
)
def test_escape_md(raw: str, escaped: str) -> None:
    assert escape_md(raw) == escaped


def test_json_round_trip(tmp_path: Path) -> None:
    run, analysis = make(tmp_path)
    text = run_to_json(run, analysis)
    back = decode_run(text.encode())
    assert back.run_id == run.run_id and len(back.ranks) == 2
    assert back.analysis == json.loads(json.dumps(analysis))
    assert back.analysis is not None and back.analysis["ranks"][1]["step_time_ms"]["mean"] == 11.0
