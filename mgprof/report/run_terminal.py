"""Rich terminal rendering of a run report (``mgprof report --format term``).

Every cell is a ``rich.text.Text``, never markup: kernel and device names come from traces and
a name like ``[bold]`` or ``[/]`` must print as itself, not restyle or break the report.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich import box
from rich.console import Console
from rich.panel import Panel
from rich.table import Table as RichTable
from rich.text import Text

from mgprof.records import RunRecord
from mgprof.report.run_sections import Section, build_sections, definitions

_SEVERITY_STYLE = {"high": "bold red", "medium": "yellow", "low": "cyan", "info": "dim"}


def _cell(text: str) -> Text:
    return Text(text, style="dim" if text.startswith("n/a") else "")


def _render_section(section: Section, console: Console) -> None:
    console.rule(Text(section.title, style="bold"), align="left")
    if section.notice:
        console.print(
            Panel(
                Text(section.notice),
                title=Text("CPU fallback", style="bold yellow"),
                border_style="yellow",
                expand=True,
            )
        )
    if section.facts:
        facts = RichTable.grid(padding=(0, 2))
        facts.add_column(style="bold")
        facts.add_column()
        for key, value in section.facts:
            facts.add_row(Text(key), _cell(value))
        console.print(facts)
    for table in section.tables:
        out = RichTable(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
        for i, col in enumerate(table.columns):
            out.add_column(
                Text(col), justify="left" if i < table.numeric_from else "right", overflow="fold"
            )
        for row in table.rows:
            out.add_row(*(_cell(c) for c in row))
        console.print(out)
    for finding in section.findings:
        severity = finding.get("severity", "")
        head = Text.assemble(
            (f"[{severity}] ", _SEVERITY_STYLE.get(severity.lower(), "")),
            (finding.get("title", ""), "bold"),
        )
        console.print(head)
        if finding.get("evidence"):
            console.print(Text("  evidence: " + finding["evidence"]))
        if finding.get("cause"):
            console.print(Text("  cause:    " + finding["cause"]))
        if finding.get("change"):
            console.print(Text("  change:   " + finding["change"]))
        if finding.get("saving"):
            console.print(Text("  saving:   " + finding["saving"]))
    for note in section.notes:
        console.print(Text(note, style="italic"))
    for footnote in section.footnotes:
        console.print(Text(footnote, style="dim"))
    console.print()


def render_run(run: RunRecord, analysis: Mapping[str, Any], console: Console) -> None:
    """Print the run report: Setup, step time, utilisation, energy, communication, memory,
    data loading, slowest rank, top kernels (with traces), findings, then the definitions."""
    for section in build_sections(run, analysis):
        _render_section(section, console)
    defs = definitions(analysis)
    if defs:
        console.rule(Text("Definitions", style="bold"), align="left")
        for name, text in defs:
            console.print(Text.assemble((name, "bold"), ": ", text))
