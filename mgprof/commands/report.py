"""``mgprof report RUN_DIR``: analyse a saved run and render it (terminal, JSON, Markdown, HTML);
a comparison (``mgprof compare``) or a sweep (``mgprof sweep``) directory renders its own
report in the same formats.

Works on any machine: the path from run.json to the report imports neither torch nor pynvml.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from mgprof.commands import help_formatter
from mgprof.commands.analyze import add_definitions_flag
from mgprof.commands.trace import (
    add_engine_flags,
    add_max_trace_size,
    engine_env,
    trace_size_override,
    write_out,
)
from mgprof.errors import UsageError

if TYPE_CHECKING:
    from mgprof.analyze.run.schema import RunAnalysis

Renderer = Callable[[Any, "RunAnalysis"], str]
T = TypeVar("T")


def _html_renderer() -> Renderer | None:
    """``run_to_html`` when the HTML report module is part of this build, else None."""
    try:
        module = importlib.import_module("mgprof.report.html.page")
    except ModuleNotFoundError as exc:
        if exc.name == "mgprof.report.html.page":
            return None
        raise
    render = getattr(module, "run_to_html", None)
    return render if callable(render) else None


def _text_renderers() -> dict[str, Renderer]:
    """md and html; json writes the analysis dict itself (``run_to_json``)."""
    from mgprof.report.run.markdown import run_to_markdown

    renderers: dict[str, Renderer] = {"md": run_to_markdown}
    html = _html_renderer()
    if html is not None:
        renderers["html"] = html
    return renderers


EPILOG = """\
examples:
  mgprof report mgprof-runs/RUN      the run's report in the terminal, analysed again
  mgprof report mgprof-runs/RUN --format md > report.md
                                     the same as Markdown, into a file"""


def register(subparsers: Any) -> None:
    formats = ["term", "json", "md"] + (["html"] if _html_renderer() is not None else [])
    p = subparsers.add_parser(
        "report",
        help="render a saved run, comparison or sweep as a report",
        description="Render a run directory made by 'mgprof analyze' (analysed again from its "
        "run.json and traces), or a folder made by 'mgprof compare' or 'mgprof sweep', in the "
        "terminal, as JSON, as Markdown or as one self-contained HTML page.",
        epilog=EPILOG,
        formatter_class=help_formatter(),
    )
    p.add_argument(
        "run_dir",
        metavar="RUN_DIR",
        help="run directory (or its run.json), or a comparison's or sweep's folder",
    )
    p.add_argument(
        "--format", choices=formats, default="term", help="output format (default: term)"
    )
    p.add_argument(
        "--out",
        metavar="FILE",
        help="write to FILE (atomically) instead of stdout; --format html without --out "
        "writes RUN_DIR/report.html (a comparison's or a sweep's directory: its report.html)",
    )
    p.add_argument("--force", action="store_true", help="let --out replace an existing file")
    add_max_trace_size(p)
    add_engine_flags(p)
    add_definitions_flag(p)
    p.set_defaults(func=run)


def analysis_data(run: Any, run_dir: Path) -> tuple[dict[str, Any], RunAnalysis]:
    """Fresh figures and findings over whatever ``run.analysis`` already holds: the dict (what
    ``--format json`` writes) and the same analysis decoded once, for the renderers.

    Findings are evaluated again so a saved run gets the current rule set, never stale advice.
    """
    from mgprof.analyze.findings import with_findings
    from mgprof.analyze.run.analysis import analyze_run

    return with_findings(run, {**(run.analysis or {}), **analyze_run(run, run_dir)})


def build_analysis(run: Any, run_dir: Path) -> RunAnalysis:
    """The typed analysis ``mgprof report`` renders (:func:`analysis_data`)."""
    return analysis_data(run, run_dir)[1]


def run(args: argparse.Namespace) -> int:
    from mgprof.records import read_run
    from mgprof.report.safe_text import printable
    from mgprof.safe_read import check_out_path, file_problem

    out = Path(args.out) if args.out else None
    if out is not None and args.format == "term":
        raise UsageError("--out needs --format json, md or html; the terminal report is printed")
    if out is not None:
        check_out_path(out, force=args.force)
    path = Path(args.run_dir)
    # file_problem and os.path.isdir never raise (Path.exists does, on permission denied)
    problem = file_problem(path)
    if problem == "no such file":
        raise UsageError(f"{path} does not exist; give a run directory made by 'mgprof analyze'")
    if problem is not None and not os.path.isdir(path):
        raise UsageError(
            f"{path}: {problem}; give a run directory made by 'mgprof analyze' or its run.json"
        )
    if _is_comparison(path):
        return _render_comparison(path, args.format, out, args.force)
    if _is_sweep(path):
        return _render_sweep(path, args.format, out, args.force)
    run_record = read_run(path)
    run_dir = path if path.is_dir() else path.parent
    force = args.force
    if out is None and args.format == "html":
        # a page is no use on a terminal: it goes beside run.json, replacing the one mgprof wrote
        out, force = run_dir / "report.html", True
    if out is not None:
        check_out_path(out, force=force, inputs=_run_inputs(run_record, path, run_dir))
    with trace_size_override(getattr(args, "max_trace_size", None)), engine_env(args):
        data, analysis = analysis_data(run_record, run_dir)
    if args.format == "term":
        from rich.console import Console

        from mgprof.report.run.terminal import render_run

        render_run(run_record, analysis, Console(), definitions=getattr(args, "definitions", False))
        return 0
    if args.format == "json":
        from mgprof.report.run.as_json import run_to_json

        text = run_to_json(run_record, data)
    else:
        text = _text_renderers()[args.format](run_record, analysis)
    code = _emit(text, out)
    if out is not None and args.format == "html" and not args.out:
        print(f"wrote {printable(str(out))}")
    return code


def _run_inputs(run_record: Any, path: Path, run_dir: Path) -> list[Path]:
    """The files a run report reads: run.json and every trace it lists."""
    files = [path / "run.json" if path.is_dir() else path]
    files += [run_dir / rel for rec in run_record.ranks for rel in rec.traces]
    return files


def _emit(text: str, out: Path | None) -> int:
    """Text reports go to --out atomically, else to stdout."""
    if out is not None:
        write_out(out, text)
    else:
        sys.stdout.write(text)
    return 0


def _read_record(path: Path, reader: Callable[[Path], T]) -> T:
    """``reader(path)`` on a comparison.json / sweep.json checked first to be a regular file
    within the record size limit; deep nesting or memory exhaustion is one line too."""
    from mgprof.safe_read import check_size, open_regular

    hint = "give a directory made by 'mgprof compare' or 'mgprof sweep', or its JSON file"
    with open_regular(path, hint=hint) as fh:
        check_size(fh, path)  # the reader then reads the file itself
    try:
        return reader(path)
    except RecursionError:
        raise UsageError(
            f"{path}: JSON is nested too deeply (about 1000 levels or more): not an mgprof record"
        ) from None
    except MemoryError:
        raise UsageError(f"{path}: ran out of memory while reading it; free memory") from None


def _study_html(path: Path, record: Path, out: Path | None, force: bool) -> tuple[Path, bool, bool]:
    """Where a study's page goes: --out, else beside its JSON (the directory's report.html,
    replacing the one the study wrote, as a run's is); (file, force, say where it went)."""
    if out is not None:
        return out, force, False
    folder = path if os.path.isdir(path) else record.parent
    return folder / "report.html", True, True


def _emit_html(text: str, out: Path, tell: bool) -> int:
    from mgprof.report.safe_text import printable

    write_out(out, text)
    if tell:
        print(f"wrote {printable(str(out))}")
    return 0


def _is_sweep(path: Path) -> bool:
    """A directory made by ``mgprof sweep`` (sweep.json, no run.json), or that file."""
    if os.path.isdir(path):  # os.path never raises (Path.is_file does, on permission denied)
        return os.path.isfile(path / "sweep.json") and not os.path.exists(path / "run.json")
    return path.name == "sweep.json"


def _render_sweep(path: Path, fmt: str, out: Path | None, force: bool) -> int:
    from mgprof.report.sweep_view import render_sweep, sweep_to_json, sweep_to_markdown
    from mgprof.safe_read import check_out_path
    from mgprof.studies.sweep import read_sweep

    record = path / "sweep.json" if path.is_dir() else path
    tell = False
    if fmt == "html":
        out, force, tell = _study_html(path, record, out, force)
    if out is not None:
        check_out_path(out, force=force, inputs=[record])
    result = _read_record(record, read_sweep)
    if fmt == "term":
        from rich.console import Console

        render_sweep(result, Console())
        return 0
    if fmt == "html" and out is not None:
        from mgprof.report.html.study.sweep_page import sweep_to_html

        return _emit_html(sweep_to_html(result), out, tell)
    return _emit(sweep_to_json(result) if fmt == "json" else sweep_to_markdown(result), out)


def _is_comparison(path: Path) -> bool:
    """A directory made by ``mgprof compare`` (comparison.json, no run.json), or that file."""
    if os.path.isdir(path):  # os.path never raises (Path.is_file does, on permission denied)
        return os.path.isfile(path / "comparison.json") and not os.path.exists(path / "run.json")
    return path.name == "comparison.json"


def _render_comparison(path: Path, fmt: str, out: Path | None, force: bool) -> int:
    from mgprof.analyze.compare.scaling import read_comparison
    from mgprof.report import compare_view
    from mgprof.safe_read import check_out_path

    record = path / "comparison.json" if path.is_dir() else path
    tell = False
    if fmt == "html":
        out, force, tell = _study_html(path, record, out, force)
    if out is not None:
        check_out_path(out, force=force, inputs=[record])
    comp = _read_record(record, read_comparison)
    if fmt == "term":
        from rich.console import Console

        compare_view.render_comparison(comp, Console(), str(path))
        return 0
    if fmt == "html" and out is not None:
        from mgprof.report.html.study.compare_page import comparison_to_html

        return _emit_html(comparison_to_html(comp), out, tell)
    text = (
        compare_view.comparison_to_json(comp)
        if fmt == "json"
        else compare_view.comparison_to_markdown(comp)
    )
    return _emit(text, out)
