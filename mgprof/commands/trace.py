"""``mgprof trace PATH...``: analyse torch.profiler traces (files or folders of rank files)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from mgprof.errors import UsageError


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "trace",
        help="analyse torch.profiler / Kineto traces (busy, comm overlap, collectives, kernels)",
        description="Analyse torch.profiler traces: one folder = one job's rank files.",
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help="trace file(s) or folder(s)")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.add_argument("--top", type=int, default=10, metavar="N", help="top kernels to list")
    p.add_argument("--out", metavar="FILE", help="write the JSON to FILE (atomically)")
    p.add_argument("--force", action="store_true", help="let --out replace an existing file")
    p.add_argument(
        "--workers", type=int, default=None, metavar="N", help="processes (default: CPU count)"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # Imports here keep `mgprof --help` fast and free of numpy.
    from mgprof.analyze.trace_summary import analyze_job, find_trace_files
    from mgprof.atomic import write_text_atomic
    from mgprof.report.trace_terminal import jobs_to_json, render_job

    if args.top < 0:
        raise UsageError("--top must be 0 or more")
    if args.workers is not None and args.workers < 1:
        raise UsageError("--workers must be 1 or more")
    out = Path(args.out) if args.out else None
    if out is not None and out.exists() and not args.force:
        raise UsageError(f"{out} exists; pass --force to replace it or choose another --out")
    skipped: list[str] = []
    groups = find_trace_files(args.paths, skipped)
    jobs = [analyze_job(files, top=args.top, workers=args.workers) for files in groups.values()]
    if skipped:
        for job in jobs:
            job.not_applicable["skipped_files"] = "; ".join(skipped)
    if out is not None or args.json:
        text = json.dumps(jobs_to_json(jobs), indent=2, allow_nan=False) + "\n"
        if out is not None:
            write_text_atomic(out, text)
        else:
            sys.stdout.write(text)
        return 0
    from rich.console import Console

    console = Console()
    for job in jobs:
        render_job(job, console, top=args.top)
    return 0
