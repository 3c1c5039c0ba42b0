"""``mgprof report RUN_DIR``: analyse a saved run and render it (terminal, JSON, Markdown).

Works on any machine: the path from run.json to the report imports neither torch nor pynvml.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from mgprof.errors import UsageError

Renderer = Callable[[Any, Mapping[str, Any]], str]


def _html_renderer() -> Renderer | None:
    """``run_to_html`` when the HTML report module is part of this build, else None."""
    try:
        module = importlib.import_module("mgprof.report.html")
    except ModuleNotFoundError as exc:
        if exc.name == "mgprof.report.html":
            return None
        raise
    render = getattr(module, "run_to_html", None)
    return render if callable(render) else None


def _text_renderers() -> dict[str, Renderer]:
    from mgprof.report.run_json import run_to_json
    from mgprof.report.run_markdown import run_to_markdown

    renderers: dict[str, Renderer] = {"json": run_to_json, "md": run_to_markdown}
    html = _html_renderer()
    if html is not None:
        renderers["html"] = html
    return renderers


def register(subparsers: Any) -> None:
    formats = ["term", "json", "md"] + (["html"] if _html_renderer() is not None else [])
    p = subparsers.add_parser(
        "report",
        help="render a saved run (run.json + traces) as a report",
        description="Analyse a run directory made by 'mgprof analyze' and render its report.",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="run directory (or its run.json)")
    p.add_argument(
        "--format", choices=formats, default="term", help="output format (default: term)"
    )
    p.add_argument("--out", metavar="FILE", help="write to FILE (atomically) instead of stdout")
    p.add_argument("--force", action="store_true", help="let --out replace an existing file")
    p.set_defaults(func=run)


def build_analysis(run: Any, run_dir: Path) -> dict[str, Any]:
    """Fresh figures and findings over whatever ``run.analysis`` already holds.

    Findings are evaluated again so a saved run gets the current rule set, never stale advice.
    """
    from mgprof.analyze.findings import evaluate_findings
    from mgprof.analyze.run_analysis import analyze_run

    analysis = {**(run.analysis or {}), **analyze_run(run, run_dir)}
    analysis["findings"] = evaluate_findings(run, analysis)
    return analysis


def run(args: argparse.Namespace) -> int:
    from mgprof.records import read_run

    out = Path(args.out) if args.out else None
    if out is not None and args.format == "term":
        raise UsageError("--out needs --format json, md or html; the terminal report is printed")
    if out is not None and out.exists() and not args.force:
        raise UsageError(f"{out} exists; pass --force to replace it or choose another --out")
    path = Path(args.run_dir)
    if not path.exists():
        raise UsageError(f"{path} does not exist; give a run directory made by 'mgprof analyze'")
    if _is_comparison(path):
        return _render_comparison(path, args.format, out)
    if _is_sweep(path):
        return _render_sweep(path, args.format, out)
    run_record = read_run(path)
    run_dir = path if path.is_dir() else path.parent
    analysis = build_analysis(run_record, run_dir)
    if args.format == "term":
        from rich.console import Console

        from mgprof.report.run_terminal import render_run

        render_run(run_record, analysis, Console())
        return 0
    text = _text_renderers()[args.format](run_record, analysis)
    return _emit(text, out)


def _emit(text: str, out: Path | None) -> int:
    """Text reports go to --out atomically, else to stdout."""
    if out is not None:
        from mgprof.atomic import write_text_atomic

        write_text_atomic(out, text)
    else:
        sys.stdout.write(text)
    return 0


def _is_sweep(path: Path) -> bool:
    """A directory made by ``mgprof sweep`` (sweep.json, no run.json), or that file."""
    if path.is_dir():
        return (path / "sweep.json").is_file() and not (path / "run.json").exists()
    return path.name == "sweep.json"


def _render_sweep(path: Path, fmt: str, out: Path | None) -> int:
    from mgprof.report.sweep_view import render_sweep, sweep_to_json, sweep_to_markdown
    from mgprof.studies.sweep import read_sweep

    result = read_sweep(path / "sweep.json" if path.is_dir() else path)
    if fmt == "term":
        from rich.console import Console

        render_sweep(result, Console())
        return 0
    if fmt == "html":
        raise UsageError("a sweep renders as term, json or md; open each trial's run for HTML")
    return _emit(sweep_to_json(result) if fmt == "json" else sweep_to_markdown(result), out)


def _is_comparison(path: Path) -> bool:
    """A directory made by ``mgprof compare`` (comparison.json, no run.json), or that file."""
    if path.is_dir():
        return (path / "comparison.json").is_file() and not (path / "run.json").exists()
    return path.name == "comparison.json"


def _render_comparison(path: Path, fmt: str, out: Path | None) -> int:
    from mgprof.analyze.scaling import read_comparison
    from mgprof.report import compare_view

    comp = read_comparison(path)
    if fmt == "term":
        from rich.console import Console

        compare_view.render_comparison(comp, Console(), str(path))
        return 0
    if fmt == "html":
        raise UsageError("a comparison renders as term, json or md; open each run for HTML")
    text = (
        compare_view.comparison_to_json(comp)
        if fmt == "json"
        else compare_view.comparison_to_markdown(comp)
    )
    return _emit(text, out)
