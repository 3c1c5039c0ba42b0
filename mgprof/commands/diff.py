"""``mgprof diff BASE NEW``: did a change make training slower, by how much, how sure, and why.

Exit codes: 0 (no ``--fail-on`` limit failed), 1 (a limit failed, or could not be checked), 2 (bad
input). The logic is in ``mgprof.analyze.diff.changes``; this module parses arguments and prints.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from mgprof.commands import help_formatter
from mgprof.errors import UsageError

EPILOG = """\
examples:
  mgprof diff mgprof-runs/BASE mgprof-runs/NEW
  mgprof diff BASE NEW --fail-on 5%             exit 1 if step time rose >= 5 %
                                                (significantly)
  mgprof diff BASE NEW --fail-on throughput:-5% --json > verdict.json
  mgprof diff old/traces new/traces             two folders of torch.profiler traces

--fail-on METRIC:LIMIT: METRIC is time (default: step time, or time per sample
when the batch changed), throughput, memory or comm (exposed communication per
step). A positive limit fails on a rise, a negative one on a fall (throughput
without a sign: a fall). A limit fails when the change is beyond it and
significant (its 95 % interval excludes 0); figures with one value per run
(memory, comm) fail on the value; a figure that is missing fails too."""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "diff",
        help="compare two runs (or trace folders): what changed, how sure, where it went",
        description="Compare two runs or two folders of traces: step time and throughput with a "
        "95 % bootstrap interval, utilisation, communication, memory, regions and kernels that "
        "moved, findings added or removed. Setup differences are listed first.",
        epilog=EPILOG,
        formatter_class=help_formatter(),
    )
    p.add_argument("base", metavar="BASE", help="run directory (or run.json) or trace folder")
    p.add_argument("new", metavar="NEW", help="run directory (or run.json) or trace folder")
    p.add_argument(
        "--fail-on",
        action="append",
        default=[],
        metavar="LIMIT",
        help="exit 1 when the change is significant and beyond LIMIT (e.g. 5%%, "
        "throughput:-5%%, memory:10%%); may be given more than once",
    )
    p.add_argument("--json", action="store_true", help="print the verdict object as JSON")
    p.add_argument(
        "--format",
        choices=("term", "md", "json", "html"),
        default=None,
        help="output format (default: term; --json is --format json)",
    )
    p.add_argument("--out", metavar="FILE", help="write to FILE (atomically) instead of stdout")
    p.add_argument("--force", action="store_true", help="let --out replace an existing file")
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="processes for trace folders (default: CPU count)",
    )
    from mgprof.commands.trace import add_engine_flags, add_max_trace_size

    add_max_trace_size(p)
    add_engine_flags(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from mgprof.analyze.diff.changes import diff_sides, parse_fail_on
    from mgprof.analyze.diff.load import load_sides
    from mgprof.commands.trace import engine_env, trace_size_override, write_out
    from mgprof.report.diff_view import diff_to_html, diff_to_json, diff_to_markdown, render_diff
    from mgprof.safe_read import check_out_path

    fmt = args.format or ("json" if args.json else "term")
    if args.json and args.format not in (None, "json"):
        raise UsageError(f"--json and --format {args.format} disagree; give one of them")
    from mgprof.analyze.execution.executor import MAX_WORKERS  # loaded on use

    if args.workers is not None and not 1 <= args.workers <= MAX_WORKERS:
        raise UsageError(f"--workers must be from 1 to {MAX_WORKERS:,}")
    try:
        specs = [parse_fail_on(text) for text in args.fail_on]
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    out = Path(args.out) if args.out else None
    if out is not None and fmt == "term":
        raise UsageError(
            "--out needs --format json, md or html (or --json); the terminal report is printed"
        )
    if out is not None:
        check_out_path(out, force=args.force, inputs=[Path(args.base), Path(args.new)])
    with trace_size_override(getattr(args, "max_trace_size", None)), engine_env(args):
        base, new = load_sides(args.base, args.new, workers=args.workers)
    diff = diff_sides(base, new, specs)
    if fmt == "term":
        from rich.console import Console

        render_diff(diff, Console())
    else:
        render = {"json": diff_to_json, "md": diff_to_markdown, "html": diff_to_html}[fmt]
        text = render(diff)
        if out is not None:
            write_out(out, text)
            print(f"wrote {out}", file=sys.stderr)
        else:
            sys.stdout.write(text)
    return int(diff["exit_code"])
