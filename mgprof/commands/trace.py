"""``mgprof trace PATH...``: analyse torch.profiler traces (files or folders of rank files)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mgprof.commands import help_formatter
from mgprof.errors import UsageError

EPILOG = """\
examples:
  mgprof trace ./traces              a folder of torch.profiler traces, one file per rank
  mgprof trace mgprof-runs/RUN --json --out summary.json
                                     a run directory's traces, the figures as JSON
  mgprof trace mgprof-runs/RUN --bandwidth bw.json
                                     collectives' bus bandwidth against this machine's
                                     (bw.json from 'mgprof doctor --bandwidth --out bw.json')"""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "trace",
        help="analyse torch.profiler / Kineto traces (busy, comm overlap, collectives, kernels)",
        description="Analyse torch.profiler traces, from any training run: per rank the busy "
        "and idle time, communication and how much of it overlaps compute, the collectives "
        "and the top kernels. One folder holds one job's rank files.",
        epilog=EPILOG,
        formatter_class=help_formatter(),
    )
    p.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="trace file(s), folder(s) of one job's traces, or run directories (their traces/)",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.add_argument(
        "--top", type=int, default=10, metavar="N", help="top kernels to list (default: 10)"
    )
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
    add_engine_flags(p)
    add_max_trace_size(p)
    p.set_defaults(func=run)


def add_engine_flags(p: argparse.ArgumentParser) -> None:
    """``--dask ADDRESS`` and ``--no-cache`` (shared with ``mgprof report``, which reads traces
    too)."""
    p.add_argument(
        "--dask",
        metavar="ADDRESS",
        default=None,
        help="analyse the ranks on a Dask cluster (e.g. tcp://host:8786; default "
        "$MGPROF_DASK_SCHEDULER); its workers read the traces at the same absolute paths. "
        "Needs pip install 'mgprof[dask]'",
    )
    p.add_argument(
        "--no-cache",
        action="store_true",
        help="analyse every trace again, neither reading nor writing the summary cache "
        "(under $MGPROF_CACHE_DIR, default ~/.cache/mgprof)",
    )


@contextmanager
def engine_env(args: argparse.Namespace) -> Iterator[None]:
    """``--dask`` and ``--no-cache`` as the environment the analysis reads
    (``MGPROF_DASK_SCHEDULER``, ``MGPROF_NO_CACHE``), for commands whose analysis runs deep
    below them (``mgprof report``); the previous values are restored after."""
    from mgprof.analyze.execution.cache import NO_CACHE_ENV
    from mgprof.analyze.execution.executor import DASK_ENV

    wanted = {DASK_ENV: getattr(args, "dask", None) or None}
    if getattr(args, "no_cache", False):
        wanted[NO_CACHE_ENV] = "1"
    before = {k: os.environ.get(k) for k in wanted}
    for key, value in wanted.items():
        if value is not None:
            os.environ[key] = value
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def size_arg(text: str) -> int:
    """argparse type for ``4G``, ``512M``, a byte count."""
    from mgprof.safe_read import parse_size

    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_max_trace_size(p: argparse.ArgumentParser) -> None:
    """``--max-trace-size SIZE`` (shared with ``mgprof report``, which reads traces too)."""
    p.add_argument(
        "--max-trace-size",
        type=size_arg,
        default=None,
        metavar="SIZE",
        help="largest trace read, decompressed (e.g. 8G, 512M; default 4G, or "
        "$MGPROF_MAX_TRACE_BYTES); setting it also lifts the gzip compression-ratio check",
    )


@contextmanager
def trace_size_override(nbytes: int | None) -> Iterator[None]:
    """Set ``MGPROF_MAX_TRACE_BYTES`` (read by the loader, inherited by worker processes) for
    the duration of a command; the previous value is restored after. A bad value already set
    in the environment is reported here, in one line, before any work."""
    from mgprof.analyze.tracefile.load import MAX_TRACE_ENV, trace_size_limit

    if nbytes is None:
        trace_size_limit()
        yield
        return
    before = os.environ.get(MAX_TRACE_ENV)
    os.environ[MAX_TRACE_ENV] = str(nbytes)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(MAX_TRACE_ENV, None)
        else:
            os.environ[MAX_TRACE_ENV] = before


def write_out(out: Path, text: str) -> None:
    """``--out``, written atomically; a failed write (read-only folder, full disk) is one line."""
    from mgprof.atomic import write_text_atomic

    try:
        write_text_atomic(out, text)
    except OSError as exc:
        raise UsageError(
            f"cannot write --out {out}: {exc.strerror or exc}; choose another --out"
        ) from None


def run(args: argparse.Namespace) -> int:
    # Imports here keep `mgprof --help` fast and free of numpy.
    from mgprof.analyze.trace.job import find_trace_files
    from mgprof.report.trace_terminal import jobs_to_json, render_job
    from mgprof.safe_read import check_out_path

    if args.top < 0:
        raise UsageError("--top must be 0 or more")
    from mgprof.analyze.execution.executor import MAX_WORKERS  # loaded on use

    if args.workers is not None and not 1 <= args.workers <= MAX_WORKERS:
        raise UsageError(f"--workers must be from 1 to {MAX_WORKERS:,}")
    if args.workers is not None and args.dask:
        raise UsageError("--workers sets local processes and --dask a cluster; pass one of them")
    out = Path(args.out) if args.out else None
    if out is not None:
        check_out_path(out, force=args.force)
    baseline = _read_baseline(Path(args.bandwidth)) if args.bandwidth else None
    skipped: list[str] = []
    groups = find_trace_files(args.paths, skipped)
    if out is not None:
        inputs = [f for files in groups.values() for f in files]
        check_out_path(out, force=args.force, inputs=[*inputs, *args.paths])
    jobs = _analyze(groups, args)
    if skipped:
        for job in jobs:
            unreadable = job.not_applicable.get("skipped_files")
            job.not_applicable["skipped_files"] = "; ".join(
                skipped + ([unreadable] if unreadable else [])
            )
    if baseline is not None:
        import msgspec

        from mgprof.analyze.trace.bandwidth import against_baseline

        for job in jobs:
            for rank in job.ranks:
                plain = msgspec.to_builtins(rank.collectives)
                rank.attainable = against_baseline(plain, baseline)
    if out is not None or args.json:
        text = _dumps(jobs_to_json(jobs))
        if out is not None:
            write_out(out, text)
        else:
            sys.stdout.write(text)
        return 0
    from rich.console import Console

    console = Console()
    for job in jobs:
        render_job(job, console, top=args.top)
    return 0


def _analyze(groups: dict[str, list[Path]], args: argparse.Namespace) -> list[Any]:
    """Every folder's job, on one executor (one connection to a Dask cluster for them all)."""
    from mgprof.analyze.execution.executor import make_executor
    from mgprof.analyze.trace.job import analyze_job

    progress = None
    if sys.stdout.isatty() and sys.stderr.isatty():  # rich only where a line can be drawn
        from mgprof.report.progress import RankProgress

        progress = RankProgress.on_terminal()
    with trace_size_override(getattr(args, "max_trace_size", None)):
        executor = make_executor(args.workers, args.dask)
        try:
            return [
                analyze_job(
                    files,
                    top=args.top,
                    executor=executor,
                    cache=False if args.no_cache else None,
                    progress=progress,
                )
                for files in groups.values()
            ]
        finally:
            executor.close()


def _dumps(data: Any) -> str:
    """The JSON text; a non-finite number (which JSON cannot hold) is one line, not a traceback.

    The loader skips events whose times are out of range, so none should reach here. The text
    is json's compact form indented by msgspec: the same bytes as ``json.dumps(indent=2)``,
    whose indenting encoder is pure Python: 3.1 → 1.1 ms for one 10 MB trace's summary, 15 → 4
    ms for a 128-rank job's.
    """
    import msgspec

    try:
        compact = json.dumps(data, allow_nan=False)
    except ValueError as exc:
        raise UsageError(
            f"a figure came out non-finite ({exc}); the traces hold values out of range, "
            "please report it with the trace"
        ) from None
    return msgspec.json.format(compact.encode(), indent=2).decode() + "\n"


def _read_baseline(path: Path) -> dict[str, Any]:
    """A ``mgprof doctor --bandwidth --out`` file; UsageError (exit 2) when it is not one."""
    from mgprof.safe_read import file_problem, read_regular

    if file_problem(path) == "no such file":
        raise UsageError(f"{path} not found; make it with 'mgprof doctor --bandwidth --out {path}'")
    raw = read_regular(path, hint="give a file made by 'mgprof doctor --bandwidth --out'")
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise UsageError(f"{path} is not a bandwidth baseline ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise UsageError(
            f"{path} is not a bandwidth baseline; make one with 'mgprof doctor --bandwidth --out'"
        )
    return data
