"""What a user sees first: a summary at the top of every run report, not-applicable said once
in words, kernel names short enough to read.

On a real 2-rank CPU run (``cpu_run_dir``, made once per session by ``conftest``), the recorded
H200 run and recorded traces: the summary opens the terminal, Markdown and JSON reports and
quotes the figures of the sections it sums up as they show them; the terminal form keeps to 80
columns; no text form names an internal figure (a ``not_applicable`` key); tables show short
kernel names and JSON the full ones.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest
from _data import GPU, TRACES
from rich.console import Console

from mgprof.analyze.run.schema import RunAnalysis, given
from mgprof.analyze.trace.job import JobTraceSummary, analyze_job, find_trace_files
from mgprof.cli import main
from mgprof.commands.report import build_analysis
from mgprof.records import RunRecord, read_run
from mgprof.report.kernel_names import short_kernel_name, short_kernel_names
from mgprof.report.run.as_json import run_to_json
from mgprof.report.run.markdown import escape_md, run_to_markdown
from mgprof.report.run.section_model import Footnotes, figure_words
from mgprof.report.run.sections import Section, build_sections
from mgprof.report.run.summary import MAX_LINES, run_summary
from mgprof.report.run.terminal import render_run
from mgprof.report.trace_terminal import not_applicable_lines, render_job

H200_RUN = GPU / "mgprof-run-h200"
WIDTH = 80
DECIMAL = re.compile(r"(?<![\w.])\d[\d,]*\.\d+(?![\w.])")
SNAKE = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:[_.][A-Za-z0-9]+)+")


@dataclass
class Rendered:
    run: RunRecord
    analysis: RunAnalysis
    term: str
    md: str
    json: dict


def terminal(run: RunRecord, analysis: RunAnalysis, width: int = WIDTH) -> str:
    buf = io.StringIO()
    render_run(run, analysis, Console(file=buf, width=width, color_system=None))
    return buf.getvalue()


def rendered(run: RunRecord, analysis: RunAnalysis) -> Rendered:
    return Rendered(
        run,
        analysis,
        terminal(run, analysis),
        run_to_markdown(run, analysis),
        json.loads(run_to_json(run, analysis)),
    )


@pytest.fixture(scope="module")
def cpu_run(cpu_run_dir: Path) -> Rendered:
    """The session's real ``mgprof analyze examples/mlp_context.py --gpus 2`` run."""
    run = read_run(cpu_run_dir)
    return rendered(run, build_analysis(run, cpu_run_dir))


@pytest.fixture(scope="module")
def h200_run() -> Rendered:
    """A recorded single-GPU run: NVML, headroom, kernels, four findings."""
    run = read_run(H200_RUN)
    return rendered(run, build_analysis(run, H200_RUN))


@pytest.fixture(params=["cpu", "h200"])
def report(request: pytest.FixtureRequest) -> Rendered:
    return request.getfixturevalue(f"{request.param}_run")


def _summary_block(term: str) -> list[str]:
    lines = term.splitlines()
    assert lines[0].startswith("Summary ─")
    end = lines.index("", 1)
    return [line.rstrip() for line in lines[1:end]]


def _section_text(section: Section) -> list[str]:
    """Every string a section shows: facts, cells, notes, findings' texts."""
    out = [v for _, v in section.facts]
    out += [c for t in section.tables for row in t.rows for c in row]
    out += section.notes + section.footnotes
    for f in section.findings:
        out += [f.title, f.evidence, f.saving or ""]
    return out


def _internal_names(analysis: RunAnalysis, *jobs: JobTraceSummary) -> set[str]:
    """Figure keys of every ``not_applicable`` the analysis has (not the ids of findings,
    which the Findings section shows on purpose), and a few the issue named."""
    names = {"device_self_us", "dataloader_share_pct", "operators_by_name.device_self_us"}
    for r in analysis.ranks:
        names |= set(r.not_applicable)
    if analysis.job is not None:
        names |= set(analysis.job.not_applicable)
    for summaries in analysis.traces.ranks.values():
        for s in summaries:
            names |= set(s.not_applicable)
    for job in jobs:
        names |= set(job.not_applicable)
        for r in job.ranks:
            names |= set(r.not_applicable)
    ids = {f.id for f in given(analysis.findings) or []}
    return {n for n in names if ("_" in n or "." in n) and n not in ids}


def _without_glossary(text: str) -> str:
    """The report up to its Definitions glossary, which defines the JSON's figure names."""
    return text.split("## Definitions", 1)[0].split("Definitions ─", 1)[0]


def _snake_words(text: str) -> set[str]:
    return set(SNAKE.findall(text.replace("\\", "")))


# --------------------------------------------------------------------------------------------
# The summary comes first


def test_the_summary_opens_every_text_format(report: Rendered) -> None:
    assert report.term.splitlines()[0].startswith("Summary ─")
    md = report.md.splitlines()
    assert md[0].startswith("# mgprof report: ") and md[2] == "## Summary"
    assert md.index("## Summary") < md.index("## Setup")
    assert list(report.json)[:2] == ["schema_version", "summary"]


def test_the_cpu_run_summary_is_a_handful_of_lines_with_every_figure(cpu_run: Rendered) -> None:
    block = _summary_block(cpu_run.term)
    summary = run_summary(cpu_run.run, cpu_run.analysis)
    # 5-8 entries; a finding's saving may fold onto a second terminal line at 80 columns
    assert 5 <= len(summary.lines) + len(summary.finding_rows()) <= MAX_LINES, block
    labels = [line.split("  ")[0] for line in block]
    assert labels[:6] == ["CPU run", "step time", "throughput", "utilisation", "comm", "memory"]
    assert block[0].startswith("CPU run") and "not GPU performance" in block[0]
    assert "samples/s" in block[2] and "peak RSS" in block[5] and "MiB" in block[5]
    assert "exposed" in block[4] and "overlap" in block[4]
    findings = given(cpu_run.analysis.findings) or []
    if findings:
        assert block[6].startswith(f"[{findings[0].severity}]")
        assert findings[0].title in " ".join(cpu_run.term.split("Setup ─")[0].split())


def test_the_cpu_fallback_notice_is_one_summary_line_and_unboxed_in_setup(
    cpu_run: Rendered,
) -> None:
    assert cpu_run.run.cpu_fallback
    head = cpu_run.term.split("Setup ─")[0]
    assert sum("CPU run" in line for line in head.splitlines()) == 1
    assert not any(ch in cpu_run.term for ch in "╭╮╰╯│")
    setup = cpu_run.term.split("Setup ─", 1)[1].split("Step time per rank")[0]
    assert "CPU fallback: This run used the CPU" in setup
    assert "- **CPU run:**" in cpu_run.md and "> **CPU fallback:**" in cpu_run.md


def test_the_gpu_summary_has_headroom_utilisation_and_findings(h200_run: Rendered) -> None:
    block = " ".join(_summary_block(h200_run.term))
    assert "NVML GPU util 0.5 %" in block and "MFU" in block
    assert "headroom 143,086 MiB (100.0 %)" in block
    assert "(+1 more below)" in block  # four findings, three named
    summary = run_summary(h200_run.run, h200_run.analysis)
    assert len(summary.lines) + len(summary.finding_rows()) <= MAX_LINES


def test_the_summary_agrees_with_the_sections(report: Rendered) -> None:
    """Each figure the summary quotes is a cell (or text) of the section it sums up, formatted
    the same; its text holds no other decimal; the findings are the Findings section's."""
    summary = run_summary(report.run, report.analysis)
    sections = {s.title: s for s in build_sections(report.run, report.analysis)}
    for line in summary.lines:
        shown = _section_text(sections[line.section])
        for figure in line.quoted:
            assert figure in line.text, (figure, line.text)
            assert any(figure == cell or figure in cell.split() for cell in shown), (
                f"{line.label}: {figure} is not in {line.section}"
            )
        assert set(DECIMAL.findall(line.text)) <= set(line.quoted), line.text
    findings = sections["Findings"].findings
    assert [f.title for f in summary.findings] == [
        f.title for f in findings[: len(summary.findings)]
    ]
    for short, full in zip(summary.findings, findings):
        assert short.saving is None or (full.saving or "").startswith(short.saving)
    assert summary.findings_total == len(findings)


def test_every_format_quotes_the_same_figures(report: Rendered) -> None:
    """The terminal's summary lines, the Markdown list and JSON's ``summary`` say the same, and
    every number in them appears again in the report below the summary."""
    summary = run_summary(report.run, report.analysis)
    doc = report.json["summary"]
    assert doc["text"] == summary.text_lines()
    flat_term = " ".join(" ".join(_summary_block(report.term)).split())
    for line in summary.lines:
        assert " ".join(line.text.split()) in flat_term
        assert f"- **{line.label}:**" in report.md
        assert doc[line.key] == line.figures
        numbers = [v for v in line.figures.values() if isinstance(v, float)]
        numbers += [x for v in line.figures.values() if isinstance(v, list) for x in v]
        for n, figure in zip(sorted(numbers), sorted(map(float, _plain(line.quoted)))):
            assert n == figure
    below = report.term.split("Setup ─", 1)[1]
    for line in summary.lines:
        for figure in line.quoted:
            assert figure in below, figure


def _plain(quoted: list[str]) -> list[str]:
    return [q.replace(",", "") for q in quoted]


def test_a_failed_run_opens_with_the_failure_then_the_summary(cpu_run: Rendered) -> None:
    failed = msgspec.structs.replace(cpu_run.run, status="incomplete", error="rank 1 died")
    term = terminal(failed, cpu_run.analysis)
    assert term.index("Run failed") < term.index("Summary ─") < term.index("Setup ─")
    md = run_to_markdown(failed, cpu_run.analysis)
    assert md.index("## Run failed") < md.index("## Summary") < md.index("## Setup")
    # too few steps for figures: the failure summary is the report, and JSON says no summary
    short = msgspec.structs.replace(
        failed, ranks=[msgspec.structs.replace(r, steps=r.steps[:1]) for r in failed.ranks]
    )
    assert "Summary ─" not in terminal(short, cpu_run.analysis)
    assert json.loads(run_to_json(short, cpu_run.analysis))["summary"] is None


# --------------------------------------------------------------------------------------------
# 80 columns, and words instead of field names


def test_no_terminal_line_passes_80_columns(report: Rendered) -> None:
    too_long = [line for line in report.term.splitlines() if len(line) > WIDTH]
    assert not too_long, too_long[:3]


def test_no_text_format_names_an_internal_figure(report: Rendered) -> None:
    internal = _internal_names(report.analysis)
    assert internal, "the analysis has no not_applicable key to look for"
    for form in (report.term, report.md):
        leaked = _snake_words(_without_glossary(form)) & internal
        assert not leaked, leaked
    # JSON keeps them
    keys = {k for r in report.json["analysis"]["ranks"] for k in r["not_applicable"]}
    assert keys and keys == {k for r in report.analysis.ranks for k in r.not_applicable}


def test_footnotes_say_each_reason_once_in_words() -> None:
    notes = Footnotes()
    why = "no NVML on this rank"
    cells = [
        notes.mark("energy_j", why, "rank 0"),
        notes.mark("energy_per_sample_j", why, "rank 0"),
        notes.mark("energy_j", why, "rank 1"),
        notes.mark("energy_j", why, "job"),
        notes.mark("dataloader_share_pct", "DataLoader wait was not timed", "rank 1"),
    ]
    assert cells == ["n/a [1]"] * 4 + ["n/a [2]"]
    assert notes.lines() == [
        "[1] energy and energy per sample (ranks 0, 1; job): no NVML on this rank",
        "[2] DataLoader wait (rank 1): DataLoader wait was not timed",
    ]


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("dataloader_share_pct", "DataLoader wait"),
        ("operators_by_name.device_self_us", "operator device times"),
        ("memcpy_pct", "memcpy"),
        ("comm_overlap_pct", "comm overlap"),
        ("some_new_figure_us", "some new figure time"),
        ("CPU %", "CPU %"),
    ],
)
def test_figure_words(name: str, words: str) -> None:
    assert figure_words(name) == words


def _job(folder: Path) -> JobTraceSummary:
    (files,) = find_trace_files([folder]).values()
    return analyze_job(files, workers=1)


def _trace_term(job: JobTraceSummary, width: int = WIDTH) -> str:
    buf = io.StringIO()
    render_job(job, Console(file=buf, width=width, color_system=None))
    return buf.getvalue()


def _not_applicable_block(text: str) -> list[str]:
    tail = text.split("Not applicable\n", 1)[1]
    return [line.strip() for line in tail.splitlines() if line.strip().startswith("•")]


def test_a_cpu_trace_file_says_not_applicable_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    (first, *_) = sorted((TRACES / "cpu-gloo-ddp-mlp-2ranks").iterdir())
    assert main(["trace", "--workers", "1", str(first)]) == 0
    block = _not_applicable_block(capsys.readouterr().out)
    assert block[0] == "• CPU-only trace: device figures do not apply"
    assert len(block) <= 2 and all("CPU-only" not in line for line in block[1:])


def test_a_cpu_trace_folder_says_it_once_for_every_rank() -> None:
    job = _job(TRACES / "cpu-gloo-ddp-mlp-2ranks")
    assert not_applicable_lines(job) == ["CPU-only trace: device figures do not apply"]
    fsdp = not_applicable_lines(_job(TRACES / "cpu-gloo-fsdp2-2ranks"))
    assert fsdp[0] == "CPU-only trace: device figures do not apply"
    assert "data loader (ranks 0, 1): no enumerate(DataLoader)#* spans in the trace" in fsdp


@pytest.mark.parametrize(
    "folder",
    [
        "cpu-gloo-ddp-mlp-2ranks",
        "gpu-v100-single",
        "gpu-nccl-a100-rank0of2",
        "misc/no-gpu-events.json.gz",
        "misc/a100-triton.json.gz",
    ],
)
def test_trace_reasons_are_grouped_in_words(folder: str) -> None:
    job = _job(TRACES / folder)
    text = _trace_term(job)
    assert all(len(line) <= WIDTH for line in text.splitlines())
    leaked = _snake_words(text) & _internal_names(RunAnalysis(), job)
    assert not leaked, leaked
    lines = not_applicable_lines(job)
    reasons = [line.split(": ", 1)[1] for line in lines if not line.startswith("CPU-only")]
    assert len(reasons) == len(set(reasons))  # each reason once
    every = {why for r in job.ranks for why in r.not_applicable.values()}
    every |= set(job.not_applicable.values())
    for why in every:
        assert why.startswith("CPU-only trace") or why in reasons, why
    # JSON keeps the keys (mgprof trace --json is job_to_json)
    from mgprof.report.trace_terminal import job_to_json

    doc = job_to_json(job)
    assert set(doc["not_applicable"]) == set(job.not_applicable)
    assert [set(r["not_applicable"]) for r in doc["ranks"]] == [
        set(r.not_applicable) for r in job.ranks
    ]


# --------------------------------------------------------------------------------------------
# Kernel names


def _long_names(job: JobTraceSummary) -> Iterator[str]:
    for r in job.ranks:
        for k in r.top_kernels[:10]:
            if k.name != short_kernel_name(k.name):
                yield k.name


def test_trace_tables_show_short_kernel_names_and_json_full_ones() -> None:
    from mgprof.report.trace_terminal import job_to_json

    job = _job(TRACES / "gpu-v100-single")
    text = _trace_term(job)
    longs = list(_long_names(job))
    assert longs, "no C++ kernel name in the v100 trace's top kernels"
    assert "cudnnTensorStruct" not in text and "at::native::" not in text
    flat = text.replace("\n", " ")
    assert "bn_bw_1C11_kernel_new<…128…>" in text and "bn_bw_1C11_kernel_new<…32…>" in text
    assert "vectorized_elementwise_kernel<…" in flat
    kernels = [k["name"] for r in job_to_json(job)["ranks"] for k in r["top_kernels"]]
    assert set(longs) <= set(kernels)


def test_run_report_tables_show_short_kernel_names_and_json_full_ones(h200_run: Rendered) -> None:
    full = [
        k.name
        for summaries in h200_run.analysis.traces.ranks.values()
        for s in summaries
        for k in s.top_kernels[:5]
    ]
    shorts = short_kernel_names(full)
    assert any(s != n for s, n in zip(shorts, full))
    top = h200_run.term.split("Top kernels ─", 1)[1].split("Findings ─")[0]
    assert "(anonymous" not in top and "Params)" not in top
    assert "multi_tensor_apply_kernel<…plus…>" in top
    md_top = h200_run.md.split("## Top kernels", 1)[1].split("## Findings")[0]
    for short in shorts:
        assert escape_md(short) in md_top, short
    assert "anonymous namespace" not in md_top
    stored = [
        k["name"]
        for summaries in h200_run.json["analysis"]["traces"]["ranks"].values()
        for s in summaries
        for k in s["top_kernels"][:5]
    ]
    assert stored == full


def test_kernel_rows_fold_a_few_lines_at_most(h200_run: Rendered) -> None:
    """A kernel row of the 80-column report is one or two lines (it was 10-14)."""
    top = h200_run.term.split("Top kernels ─", 1)[1].split("Findings ─")[0].splitlines()[3:]
    rows: list[int] = []
    for line in top:
        if not line.strip():
            continue
        if line[:1].strip():
            rows.append(1)
        else:
            rows[-1] += 1
    assert rows and max(rows) <= 2, rows
