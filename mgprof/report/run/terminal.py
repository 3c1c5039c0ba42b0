"""Rich terminal rendering of a run report (``mgprof report --format term``).

Every cell is a ``rich.text.Text``, never markup: kernel and device names come from traces and
a name like ``[bold]`` or ``[/]`` must print as itself, not restyle or break the report. Every
string goes through ``safe_text`` (``rich_text``), so an escape sequence in a name or an error
shows as ``\\x1b`` instead of acting on the terminal.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.table import Table as RichTable
from rich.text import Text

from mgprof.analyze.run.schema import Finding, RunAnalysis, decode_analysis
from mgprof.records import RunRecord
from mgprof.report.failure_summary import FailureSummary, failure_summary, sections_after
from mgprof.report.run.sections import Section, Table, build_sections
from mgprof.report.run.sections import definitions as figure_definitions
from mgprof.report.run.summary import RunSummary, run_summary
from mgprof.report.safe_text import printable, rich_text
from mgprof.report.term_table import Col, print_fitted

_SEVERITY_STYLE = {"high": "bold red", "medium": "yellow", "low": "cyan", "info": "dim"}


def _cell(text: str, multiline: bool = False) -> Text:
    return rich_text(text, style="dim" if text.startswith("n/a") else "", multiline=multiline)


def _facts(facts: list[tuple[str, str]], console: Console) -> None:
    grid = RichTable.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    for key, value in facts:
        grid.add_row(rich_text(key), _cell(value, multiline=True))
    console.print(grid)


def _table(table: Table, console: Console) -> None:
    """The table at the console's width: numbers whole, columns that do not fit continued in a
    second table (``term_table``)."""
    columns = [Col(printable(c), numeric=not table.is_text(i)) for i, c in enumerate(table.columns)]
    rows = [[_cell(c) for c in row] for row in table.shown_rows()]
    print_fitted(console, columns, rows, labels=min(table.numeric_from, len(columns)))


def _render_failure(summary: FailureSummary, console: Console) -> None:
    """The failure summary: the error and first failing rank, the end of its traceback, steps
    recorded per rank, then notes (short: the report of a failed run starts, or is, this)."""
    sec = summary.section
    console.rule(rich_text(sec.title, style="bold red"), align="left")
    _facts(sec.facts, console)
    if summary.traceback:
        console.print(rich_text(summary.traceback_title + ":", style="bold"))
        for line in summary.traceback:
            console.print(rich_text("  " + line, style="dim" if line.startswith(" ") else ""))
    for table in sec.tables:
        _table(table, console)
    for note in sec.notes:
        console.print(rich_text(note, style="italic", multiline=True))
    console.print()


def _finding(finding: Finding, console: Console) -> None:
    """Title line (severity, title, stable id), then evidence/cause/change/saving in a grid so a
    wrapped line stays indented under its label."""
    severity = finding.severity
    head = Text.assemble(
        rich_text(f"[{severity}] ", _SEVERITY_STYLE.get(severity.lower(), "")),
        rich_text(finding.title, "bold"),
    )
    if finding.id:
        head.append_text(rich_text(f"  ({finding.id})", "dim"))
    console.print(head)
    grid = RichTable.grid(padding=(0, 1))
    grid.add_column(no_wrap=True)
    grid.add_column(overflow="fold")
    parts = (
        ("evidence", finding.evidence),
        ("cause", finding.cause),
        ("change", finding.change),
        ("saving", finding.saving),
    )
    for key, text in parts:
        if text:
            grid.add_row(Text("  " + key + ":", style="dim"), rich_text(text, multiline=True))
    console.print(grid)


def render_summary(summary: RunSummary, console: Console) -> None:
    """The summary (``summary``): a label and a line per figure, then the top findings with
    their severity in colour in the label column; a long line wraps under its text."""
    console.rule(Text("Summary", style="bold"), align="left")
    grid = RichTable.grid(padding=(0, 2))
    grid.add_column(no_wrap=True)
    grid.add_column()
    for line in summary.lines:
        grid.add_row(rich_text(line.label, "bold"), _cell(line.text, multiline=True))
    for severity, text in summary.finding_rows():
        style = _SEVERITY_STYLE.get(severity.lower(), "")
        label = rich_text(f"[{severity}]", style) if severity else rich_text("findings", "bold")
        grid.add_row(label, rich_text(text, multiline=True))
    console.print(grid)
    console.print()


def render_section(section: Section, console: Console) -> None:
    if section.brief is not None:
        console.print(
            Text.assemble(rich_text(section.title, "bold"), ": ", rich_text(section.brief, "dim"))
        )
        console.print()
        return
    console.rule(rich_text(section.title, style="bold"), align="left")
    if section.notice:  # the summary has it in one line; the whole of it here, unboxed
        console.print(
            Text.assemble(
                rich_text("CPU fallback: ", "bold yellow"),
                rich_text(section.notice, multiline=True),
            )
        )
    if section.facts:
        _facts(section.facts, console)
    for table in section.tables:
        _table(table, console)
    for finding in section.findings:
        _finding(finding, console)
    for note in section.notes:
        console.print(rich_text(note, style="italic", multiline=True))
    for footnote in section.footnotes:
        console.print(rich_text(footnote, style="dim", multiline=True))
    console.print()


def render_run(
    run: RunRecord,
    analysis: RunAnalysis | Mapping[str, Any],
    console: Console,
    *,
    definitions: bool = False,
) -> None:
    """Print the run report: the summary (``summary``), then Setup, step time, regions,
    utilisation, energy, communication, memory, data loading, slowest rank, top kernels (with
    traces), findings; the glossary of figure definitions only when asked (``--definitions``:
    it is long, and the same every run).

    A failed run's report opens with the failure summary (``failure_summary``), then the
    summary and Setup; the other sections (and the summary) follow only when enough steps were
    recorded to give figures. An analysis dict (``analyze_run``'s, run.json's) is decoded first
    (``decode_analysis``).
    """
    analysis = decode_analysis(analysis)
    summary = failure_summary(run, analysis)
    if summary is None:
        sections = build_sections(run, analysis)
    else:
        _render_failure(summary, console)
        sections = sections_after(summary, run, analysis)
    if summary is None or summary.full_report:
        render_summary(run_summary(run, analysis), console)
    for section in sections:
        render_section(section, console)
    if summary is not None and not summary.full_report:
        return
    defs = figure_definitions(analysis) if definitions else []
    if defs:
        console.rule(Text("Definitions", style="bold"), align="left")
        for name, text in defs:
            console.print(
                Text.assemble(rich_text(name, "bold"), ": ", rich_text(text, multiline=True))
            )
