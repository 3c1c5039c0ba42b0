"""The report files of a run directory: analysis in run.json, report.md and report.html beside it.

One writer for both ways a run ends: the launcher (``mgprof analyze``, ``compare``, ``sweep``
through ``mgprof.run.finish``) and the in-code API (``mgprof.profile`` / ``@mgprof.profile_step``,
whose rank 0 writes them when no launcher is around). It works on saved data only: no torch, no
pynvml, nothing from the layers that run training.

The in-code API runs it as ``python -m mgprof.report.files RUN_DIR`` (see :func:`main`), in a
fresh process rather than inside the training script: the trace engine analyses several ranks'
traces in worker processes, which must not be forked from a training process (threads, CUDA,
NCCL) nor re-import its unguarded ``__main__`` (forkserver, spawn), and which cannot start at all
once the interpreter is exiting (``@profile_step`` closes its session at exit).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import msgspec

from mgprof import rundir
from mgprof.analyze.run.schema import RunAnalysis, decode_analysis
from mgprof.atomic import write_text_atomic
from mgprof.records import RunRecord

REPORT_MD = "report.md"
REPORT_HTML = "report.html"


class ReportFiles(NamedTuple):
    """What :func:`write_report_files` did."""

    run: RunRecord
    """The run with its ``analysis`` filled in, as now saved in run.json."""
    analysis: dict[str, Any]
    """The analysis as saved (a dict)."""
    written: list[Path]
    """The report files written beside run.json, in order (report.md; report.html when plotly
    could render it)."""
    typed: RunAnalysis
    """The same analysis decoded (what the report files were rendered from)."""


def _analysed(run: RunRecord, run_dir: Path | None) -> tuple[dict[str, Any], RunAnalysis]:
    from mgprof.analyze.run.analysis import analyze_run

    data = dict(analyze_run(run, run_dir))
    try:
        from mgprof.analyze.findings import with_findings
    except ImportError:
        return data, decode_analysis(data)
    return with_findings(run, data)


def analyze_with_findings(run: RunRecord, run_dir: Path | None) -> dict[str, Any]:
    """The run's figures (``analyze_run``) with its findings under ``"findings"``."""
    return _analysed(run, run_dir)[0]


def write_report_files(run_dir: Path, run: RunRecord) -> ReportFiles:
    """Analyse the run, save the analysis into run.json, write report.md and report.html.

    report.html is skipped when its renderer reports plotly missing (an ImportError); anything
    else that goes wrong raises, for the caller to decide (the launcher reports it, the in-code
    API turns it into one warning).
    """
    from mgprof.report.run.markdown import run_to_markdown

    data, analysis = _analysed(run, run_dir)
    run = msgspec.structs.replace(run, analysis=data)
    rundir.write_run(run_dir, run)
    written = [write_text_atomic(run_dir / REPORT_MD, run_to_markdown(run, analysis))]
    html = write_html_report(run_dir, run, analysis)
    if html is not None:
        written.append(html)
    return ReportFiles(run, data, written, analysis)


def write_html_report(
    run_dir: Path, run: RunRecord, analysis: RunAnalysis | Mapping[str, Any]
) -> Path | None:
    """report.html beside run.json; skipped (None) when plotly is missing, since the HTML report
    is optional and the run itself must not fail for it. A dict analysis (as stored) is decoded
    first (``decode_analysis``)."""
    try:
        from mgprof.report.html.page import run_to_html

        html = run_to_html(run, decode_analysis(analysis))
    except ImportError:  # HtmlDependencyMissing is an ImportError too
        return None
    return write_text_atomic(run_dir / REPORT_HTML, html)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m mgprof.report.files RUN_DIR``: write the report files of a saved run and print
    their names, one a line, on stdout. A failure is one line on stderr and exit code 1."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m mgprof.report.files RUN_DIR", file=sys.stderr)
        return 2
    from mgprof.records import read_run

    run_dir = Path(args[0])
    try:
        result = write_report_files(run_dir, read_run(run_dir))
    except Exception as exc:
        from mgprof.report.safe_text import printable

        print(printable(f"{type(exc).__name__}: {exc}"), file=sys.stderr)
        return 1
    for path in result.written:
        print(path.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
