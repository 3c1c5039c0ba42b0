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
        "--bandwidth",
        metavar="FILE",
        help="a baseline from 'mgprof doctor --bandwidth --out FILE': each collective's busbw "
        "is shown as a share of what this machine reached at that message size",
    )
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
    baseline = _read_baseline(Path(args.bandwidth)) if args.bandwidth else None
    skipped: list[str] = []
    groups = find_trace_files(args.paths, skipped)
    jobs = [analyze_job(files, top=args.top, workers=args.workers) for files in groups.values()]
    if skipped:
        for job in jobs:
            job.not_applicable["skipped_files"] = "; ".join(skipped)
    if baseline is not None:
        import msgspec

        from mgprof.analyze.bandwidth import against_baseline

        for job in jobs:
            for rank in job.ranks:
                plain = msgspec.to_builtins(rank.collectives)
                rank.attainable = against_baseline(plain, baseline)
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


def _read_baseline(path: Path) -> dict[str, Any]:
    """A ``mgprof doctor --bandwidth --out`` file; UsageError (exit 2) when it is not one."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(
            f"{path} not found; make it with 'mgprof doctor --bandwidth --out {path}'"
        ) from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path} is not a bandwidth baseline ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise UsageError(
            f"{path} is not a bandwidth baseline; make one with 'mgprof doctor --bandwidth --out'"
        )
    return data
