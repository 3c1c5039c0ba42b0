"""After a run: analyse it, write run.json's analysis and the report files, print the report."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mgprof.analyze.run.schema import RunAnalysis, decode_analysis
from mgprof.records import RunRecord
from mgprof.report.files import write_html_report, write_report_files

__all__ = ["finish_run", "print_report", "write_html_report"]


def finish_run(run_dir: Path, run: RunRecord) -> tuple[RunRecord, dict[str, Any]]:
    """Analyse the run, save the analysis into run.json and write report.md and report.html
    beside it (``mgprof.report.files``, shared with the in-code API), plus TensorBoard scalars
    when the ``tensorboard`` extra is installed."""
    run, analysis, _written, _typed = write_report_files(run_dir, run)
    try:
        import tensorboard  # noqa: F401  (the optional extra: scalars only when it is there)
    except ImportError:
        pass
    else:
        from mgprof.view.scalars import write_scalars

        write_scalars(run_dir, run)
    return run, analysis


def print_report(
    run: RunRecord,
    analysis: RunAnalysis | Mapping[str, Any],
    run_dir: Path,
    fmt: str,
    *,
    definitions: bool = False,
) -> None:
    """Render to stdout in the chosen format; the terminal form ends with where files are (and
    the figure definitions only with ``definitions``). JSON writes the analysis as given (the
    dict as saved in run.json); the other formats read it decoded (``decode_analysis``)."""
    if fmt == "json":
        from mgprof.report.run.as_json import run_to_json

        sys.stdout.write(run_to_json(run, analysis))
        return
    typed = decode_analysis(analysis)
    if fmt == "md":
        from mgprof.report.run.markdown import run_to_markdown

        sys.stdout.write(run_to_markdown(run, typed))
        return
    from rich.console import Console

    from mgprof.report.run.terminal import render_run
    from mgprof.report.safe_text import rich_text

    console = Console()
    render_run(run, typed, console, definitions=definitions)
    # The path holds the user's --out and the script's name: text, never markup (a folder named
    # "[/x]" must not turn a finished run into a crash), control characters shown escaped.
    console.print()
    console.print(rich_text(f"run directory: {run_dir}", highlight=True))
    console.print(rich_text(f"view traces: mgprof view {run_dir}", highlight=True))
    console.print(rich_text(f"re-render:   mgprof report {run_dir}", highlight=True))
