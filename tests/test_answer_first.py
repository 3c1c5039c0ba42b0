"""Comparisons and sweeps open with their answer in every form: the verdict's sentences and its
caveats, then the table, then how it was measured (a recorded 2-rank comparison: the verdict
was the 55th line of 80 columns, after the header and four tables)."""

from __future__ import annotations

import io
import re
from pathlib import Path

import msgspec
from rich.console import Console

from mgprof.analyze.compare.scaling import Comparison, Row, read_comparison
from mgprof.analyze.compare.verdict import verdict, verdict_parts
from mgprof.analyze.step_samples import Interval
from mgprof.analyze.sweep.result import SweepResult
from mgprof.report import compare_view, sweep_view
from mgprof.report.html.study.compare_page import comparison_to_html
from mgprof.report.html.study.sweep_page import sweep_to_html
from mgprof.studies.sweep import read_sweep

STUDIES = Path(__file__).parent / "data" / "studies"
COMPARE_DIR = STUDIES / "compare-fsdp-bf16"


def _terminal(comp: Comparison, width: int = 80) -> list[str]:
    buf = io.StringIO()
    compare_view.render_comparison(comp, Console(file=buf, width=width))
    return buf.getvalue().splitlines()


def test_the_recorded_comparison_opens_with_its_answer_then_the_table() -> None:
    comp = read_comparison(COMPARE_DIR)
    assert comp.answer and comp.caveats  # a CPU run on a busy machine has caveats
    lines = _terminal(comp)
    assert lines[1].startswith("answer: ")
    flat = " ".join(" ".join(lines).split())
    for sentence in [*comp.answer, *comp.caveats]:
        assert " ".join(sentence.split()) in flat
    table = next(i for i, line in enumerate(lines) if line.startswith("strategy "))
    caveat = max(i for i, line in enumerate(lines) if line.startswith("caveat: "))
    script = next(i for i, line in enumerate(lines) if line.startswith("script: "))
    assert caveat < table < script  # the answer, its caveats, the table, then what was run
    assert table <= 20
    assert not any(line.startswith("verdict: ") for line in lines)
    assert max(len(line) for line in lines) <= 80


def test_the_answer_lines_join_to_the_one_line_verdict() -> None:
    comp = read_comparison(COMPARE_DIR)
    assert comp.verdict.startswith(comp.answer[0])
    for part in [*comp.caveats, *comp.answer[1:]]:
        assert part in comp.verdict


def test_markdown_and_html_open_with_the_answer() -> None:
    comp = read_comparison(COMPARE_DIR)
    md = compare_view.comparison_to_markdown(comp)
    assert md.index("**Answer:**") < md.index("| strategy") < md.index("- script: ")
    assert "**Verdict:**" not in md
    page = comparison_to_html(comp)
    assert page.index('class="callout verdict"') < page.index('id="sec-strategies"')
    assert page.count('<ul class="caveats">') == 1
    assert len(re.findall(r"<li>", page.split('<ul class="caveats">')[1].split("</ul>")[0])) == len(
        comp.caveats
    )


def test_a_comparison_recorded_before_the_answer_opens_with_its_verdict() -> None:
    raw = msgspec.json.decode((COMPARE_DIR / "comparison.json").read_bytes())
    raw.pop("answer"), raw.pop("caveats")
    old = msgspec.convert(raw, Comparison)
    lines = _terminal(old)
    assert lines[1].startswith("verdict: ")
    assert "**Verdict:** " in compare_view.comparison_to_markdown(old)


def _rows() -> list[Row]:
    return [
        Row(
            strategy=name,
            devices=d,
            run=name,
            status="complete",
            samples_per_s=rate,
            speedup=rate / 100.0,
            efficiency_pct=100.0 * rate / 100.0 / d,
        )
        for name, d, rate in (("single", 1, 100.0), ("ddp", 2, 180.0), ("fsdp", 2, 150.0))
    ]


def test_verdict_parts_keep_the_caveats_apart_and_compact_a_busy_machine() -> None:
    rows = _rows()
    intervals = [
        Interval(a="ddp", b="single", ratio=1.8, low=1.6, high=2.0),
        Interval(a="ddp", b="fsdp", ratio=1.2, low=1.1, high=1.3),
    ]
    busy = [
        "single: other processes used 1.4 cores",
        "ddp: other processes used 0.9 cores",
        "fsdp: other processes used 1.2 cores, 12 % of the CPU time was stolen by the hypervisor",
    ]
    parts = verdict_parts(rows, True, "weak", intervals, busy, ["threads differ"], rounds=1)
    assert parts.answer.startswith("best: ddp")
    assert not any(word in parts.answer for word in ("busy", "CPU ranks", "one round"))
    assert parts.line() == verdict(rows, True, "weak", intervals, busy, ["threads differ"], 1)
    busy_line = next(c for c in parts.caveats if "busy" in c)
    assert "3 rows ran while other processes used 0.9–1.4 cores" in busy_line
    assert "up to 12 % of the CPU time was stolen" in busy_line
    two = verdict_parts(rows, False, "weak", intervals, busy[:2])
    assert "single: other processes used 1.4 cores; ddp:" in two.line()  # two are listed


def test_sweeps_open_with_the_recommendation_and_the_sweet_spot() -> None:
    result: SweepResult = read_sweep(STUDIES / "sweep-noise")
    keys = [k for k, _ in sweep_view.answer_facts(result)]
    assert keys[:2] == ["recommendation", "sweet spot"]
    assert "gradient noise scale" in keys and "knee vs B_simple" in keys
    assert "devices" not in keys and "memory figure" not in keys
    buf = io.StringIO()
    sweep_view.render_sweep(result, Console(file=buf, width=80))
    lines = buf.getvalue().splitlines()
    table = next(i for i, line in enumerate(lines) if line.startswith("batch "))
    devices = next(i for i, line in enumerate(lines) if line.startswith("devices "))
    assert lines[1].startswith("recommendation ") and table < devices
    md = sweep_view.sweep_to_markdown(result)
    assert md.index("**recommendation**") < md.index("| batch") < md.index("**devices**")
    page = sweep_to_html(result)
    assert page.index('id="sec-answer"') < page.index('id="sec-trials"')
    assert page.index('id="sec-trials"') < page.index('id="sec-how-it-was-measured"')
