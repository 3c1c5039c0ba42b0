"""GitHub-flavoured Markdown rendering of a run report (``mgprof report --format md``).

Names from traces are untrusted: ``|`` would split a table cell and ``<``/``>``/``&`` could inject
HTML where Markdown is rendered (GitHub, MkDocs), so every cell is escaped; control characters
(terminal escape sequences) are shown escaped too, for whoever ``cat``s report.md
(``mgprof.report.safe_text``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from mgprof.analyze.run.schema import RunAnalysis, decode_analysis
from mgprof.records import RunRecord
from mgprof.report.failure_summary import FailureSummary, failure_summary, sections_after
from mgprof.report.run.sections import Section, Table, build_sections, definitions
from mgprof.report.run.summary import RunSummary, run_summary
from mgprof.report.safe_text import md_code, md_text, printable


def escape_md(text: str) -> str:
    """Text that renders literally in a GFM table cell or paragraph (one line, no HTML, control
    characters shown escaped): ``safe_text.md_text``."""
    return md_text(text)


def _table(table: Table) -> list[str]:
    lines = [
        "| " + " | ".join(escape_md(c) for c in table.columns) + " |",
        "|"
        + "|".join("---" if table.is_text(i) else "---:" for i in range(len(table.columns)))
        + "|",
    ]
    lines.extend("| " + " | ".join(escape_md(c) for c in row) + " |" for row in table.shown_rows())
    return lines


def summary_markdown(summary: RunSummary) -> list[str]:
    """The summary as a list: ``- **step time:** …``, then one item per finding named."""
    lines = ["## Summary", ""]
    lines += [f"- **{escape_md(line.label)}:** {escape_md(line.text)}" for line in summary.lines]
    for severity, text in summary.finding_rows():
        label = f"\\[{escape_md(severity)}\\]" if severity else "findings:"
        lines.append(f"- **{label}** {escape_md(text)}")
    return [*lines, ""]


def section_markdown(section: Section) -> list[str]:
    lines = [f"## {escape_md(section.title)}", ""]
    if section.brief is not None:
        return [*lines, escape_md(section.brief), ""]
    if section.notice:  # in one line in the summary; in full here
        lines += [f"> **CPU fallback:** {escape_md(section.notice)}", ""]
    if section.facts:
        lines += ["| | |", "|---|---|"]
        lines += [f"| {escape_md(k)} | {escape_md(v)} |" for k, v in section.facts]
        lines.append("")
    for table in section.tables:
        lines += [*_table(table), ""]
    for f in section.findings:
        ident = f" ({md_code(f.id)})" if f.id else ""
        lines.append(f"- **{escape_md(f.severity)}** {escape_md(f.title)}{ident}")
        if f.evidence:
            lines.append(f"  - evidence: {escape_md(f.evidence)}")
        if f.cause:
            lines.append(f"  - cause: {escape_md(f.cause)}")
        if f.change:
            lines.append(f"  - change: {escape_md(f.change)}")
        if f.saving:
            lines.append(f"  - could save: {escape_md(f.saving)}")
    if section.findings:
        lines.append("")
    for note in section.notes:
        lines += [escape_md(note), ""]
    if section.footnotes:
        lines += [f"- {escape_md(n)}" for n in section.footnotes]
        lines.append("")
    return lines


def _code_block(raw: list[str]) -> list[str]:
    """A fenced block shown verbatim: its fence is longer than any backtick run inside, and
    control characters are shown escaped (``safe_text.printable``)."""
    lines = [printable(line) for line in raw]
    longest = max((len(run) for line in lines for run in re.findall(r"`+", line)), default=0)
    fence = "`" * max(3, longest + 1)
    return [f"{fence}text", *lines, fence]


def _failure(summary: FailureSummary) -> list[str]:
    sec = summary.section
    lines = [f"## {escape_md(sec.title)}", ""]
    lines += ["| | |", "|---|---|"]
    lines += [f"| {escape_md(k)} | {escape_md(v)} |" for k, v in sec.facts]
    lines.append("")
    if summary.traceback:
        lines += [f"{escape_md(summary.traceback_title)}:", "", *_code_block(summary.traceback), ""]
    for table in sec.tables:
        lines += [*_table(table), ""]
    for note in sec.notes:
        lines += [escape_md(note), ""]
    return lines


def run_to_markdown(run: RunRecord, analysis: RunAnalysis | Mapping[str, Any]) -> str:
    """The run report as one Markdown document (same sections as the terminal report), the
    summary first (``summary``).

    A failed run's report opens with the failure summary, then the summary and Setup; the
    other sections (and the summary) follow only when enough steps were recorded to give
    figures (``failure_summary``). An analysis dict (``analyze_run``'s, run.json's) is decoded
    first (``decode_analysis``).
    """
    analysis = decode_analysis(analysis)
    title = escape_md(run.run_id or run.script or "run")
    lines = [f"# mgprof report: {title}", ""]
    summary = failure_summary(run, analysis)
    if summary is None:
        sections = build_sections(run, analysis)
    else:
        lines += _failure(summary)
        sections = sections_after(summary, run, analysis)
    if summary is None or summary.full_report:
        lines += summary_markdown(run_summary(run, analysis))
    for section in sections:
        lines += section_markdown(section)
    if summary is not None and not summary.full_report:
        return "\n".join(lines)
    defs = definitions(analysis)
    if defs:  # folded: GitHub and most Markdown viewers render <details> closed
        lines += ["## Definitions", "", "<details><summary>What each figure means</summary>", ""]
        lines += [f"- **{escape_md(name)}**: {escape_md(text)}" for name, text in defs]
        lines += ["", "</details>", ""]
    return "\n".join(lines)
