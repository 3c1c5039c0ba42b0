"""``mgprof timeline RUN``: every rank in one Chrome/Perfetto trace, on one clock."""

from __future__ import annotations

import argparse
from typing import Any

from mgprof.commands import help_formatter
from mgprof.commands.trace import add_max_trace_size, trace_size_override
from mgprof.errors import UsageError

EPILOG = """\
examples:
  mgprof timeline mgprof-runs/RUN --force
                                     every rank on one clock: RUN/timeline.json.gz, made
                                     again (mgprof analyze wrote one; --force replaces it)
  mgprof timeline mgprof-runs/RUN --steps 3:4 --out steps.json.gz
                                     only ProfilerStep#3 and #4, in a file of its own"""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "timeline",
        help="every rank in one Chrome/Perfetto trace, clocks aligned across ranks",
        description=(
            "Merge one job's traces into one Chrome/Perfetto JSON: each rank is a process "
            "(host threads and device streams as its threads), every rank's clock moved onto "
            "the lowest rank's by offsets estimated from matched collectives (else the recorded "
            "clock base). The offsets and their error are printed and written into the file's "
            "otherData. Open the file in https://ui.perfetto.dev or chrome://tracing."
        ),
        epilog=EPILOG,
        formatter_class=help_formatter(),
    )
    p.add_argument(
        "paths",
        nargs="+",
        metavar="RUN",
        help="a run directory made by 'mgprof analyze', a folder of one job's torch.profiler "
        "traces, or trace files",
    )
    p.add_argument(
        "--steps",
        metavar="A:B",
        help="keep ProfilerStep#A to #B, both included (also A, A: or :B), and the device work "
        "those steps launched",
    )
    p.add_argument(
        "--min-dur",
        type=float,
        metavar="US",
        help="leave out complete events shorter than US microseconds (keeps large jobs loadable)",
    )
    p.add_argument(
        "--out",
        metavar="FILE",
        help="output .json or .json.gz (default: RUN/timeline.json.gz for a run directory, "
        "./timeline.json.gz otherwise)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="replace an existing output file, RUN/timeline.json.gz (which mgprof analyze "
        "writes) included",
    )
    add_max_trace_size(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from mgprof.analyze.timeline.build import (
        build_timeline,
        check_min_dur,
        choose_out,
        find_inputs,
        parse_steps,
        summary_lines,
    )
    from mgprof.report.safe_text import printable
    from mgprof.safe_read import check_out_path

    steps = parse_steps(args.steps) if args.steps is not None else None
    check_min_dur(args.min_dur)
    # RUN/timeline.json.gz is no less the user's than any other file: a --steps or --min-dur
    # timeline made over it would lose the whole one mgprof analyze wrote, so --force it is
    out, _ = choose_out(args.paths, args.out)
    check_out_path(out, force=args.force)
    inputs = find_inputs(args.paths)
    check_out_path(out, force=args.force, inputs=[*inputs.files, *args.paths])
    with trace_size_override(getattr(args, "max_trace_size", None)):
        try:
            result = build_timeline(inputs, out, steps=steps, min_dur_us=args.min_dur)
        except OSError as exc:
            raise UsageError(
                f"cannot write {out}: {exc.strerror or exc}; choose another --out"
            ) from None
    for line in summary_lines(result):
        print(printable(line))
    return 0
