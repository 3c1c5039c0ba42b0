"""After a run: analyse it, store the figures in run.json, write report.md, print the report."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import msgspec

from mgprof import rundir
from mgprof.atomic import write_text_atomic
from mgprof.records import RunRecord


def finish_run(run_dir: Path, run: RunRecord) -> tuple[RunRecord, dict[str, Any]]:
    """Analyse the run, save the analysis into run.json and write report.md beside it."""
    from mgprof.analyze.run_analysis import analyze_run
    from mgprof.report.run_markdown import run_to_markdown

    analysis = dict(analyze_run(run, run_dir))
    try:
        from mgprof.analyze.findings import evaluate_findings

        analysis["findings"] = evaluate_findings(run, analysis)
    except ImportError:
        pass
    run = msgspec.structs.replace(run, analysis=analysis)
    rundir.write_run(run_dir, run)
    write_text_atomic(run_dir / "report.md", run_to_markdown(run, analysis))
    try:
        import tensorboard  # noqa: F401  (the optional extra: scalars only when it is there)
    except ImportError:
        pass
    else:
        from mgprof.view.scalars import write_scalars

        write_scalars(run_dir, run)
    write_html_report(run_dir, run, analysis)
    return run, analysis


def write_html_report(run_dir: Path, run: RunRecord, analysis: dict[str, Any]) -> Path | None:
    """report.html beside run.json; skipped (None) when the ``html`` extra (plotly) is missing,
    since the HTML report is optional and the run itself must not fail for it."""
    try:
        from mgprof.report.html import run_to_html

        html = run_to_html(run, analysis)
    except ImportError:  # HtmlDependencyMissing is an ImportError too
        return None
    return write_text_atomic(run_dir / "report.html", html)


def print_report(run: RunRecord, analysis: dict[str, Any], run_dir: Path, fmt: str) -> None:
    """Render to stdout in the chosen format; the terminal form ends with where files are."""
    if fmt == "json":
        from mgprof.report.run_json import run_to_json

        sys.stdout.write(run_to_json(run, analysis))
        return
    if fmt == "md":
        from mgprof.report.run_markdown import run_to_markdown

        sys.stdout.write(run_to_markdown(run, analysis))
        return
    from rich.console import Console

    from mgprof.report.run_terminal import render_run

    console = Console()
    render_run(run, analysis, console)
    console.print(f"\nrun directory: {run_dir}")
    console.print(f"view traces: mgprof view {run_dir}   |   re-render: mgprof report {run_dir}")
