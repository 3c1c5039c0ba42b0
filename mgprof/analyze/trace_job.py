"""A job's traces: finding and grouping the trace files of a folder, and analysing every rank.

Each rank goes through :func:`mgprof.analyze.trace_summary.analyze_trace_file` (one per worker
process when there are several), then the ranks' collectives are matched across the job.
These names are also importable from :mod:`mgprof.analyze.trace_summary`, the public API.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import msgspec

from mgprof.analyze.comm import CrossRankSummary, cross_rank
from mgprof.analyze.trace_summary import DEFINITIONS_COMMON, RankTraceSummary, analyze_trace_file
from mgprof.errors import TraceError, UsageError
from mgprof.safe_read import file_problem

__all__ = [
    "JobTraceSummary",
    "analyze_job",
    "execution_trace_reason",
    "find_trace_files",
]


class JobTraceSummary(msgspec.Struct):
    """All ranks of one folder, plus the cross-rank collective comparison."""

    directory: str
    ranks: list[RankTraceSummary]
    cross_rank: CrossRankSummary | None
    slowest_rank: int | None
    not_applicable: dict[str, str]
    definitions: dict[str, str]


_PATTERNS = ("*.json", "*.json.gz")


_SNIFF_BYTES = 64 * 1024


def execution_trace_reason(path: Path) -> str | None:
    """Why ``path`` is a PyTorch execution trace (``ExecutionTraceObserver``'s graph of nodes,
    written beside the Kineto trace), or None when it is not one or cannot be told cheaply."""
    name = path.name
    if name.endswith(("_et.json", "_et.json.gz")):
        return "named like a PyTorch execution trace (*_et.json)"
    try:
        if name.endswith(".gz"):
            import gzip

            with gzip.open(path, "rb") as fh:
                head = fh.read(_SNIFF_BYTES)
        else:
            with open(path, "rb") as fh:
                head = fh.read(_SNIFF_BYTES)
    except (OSError, EOFError):
        return None  # unreadable: load_trace says what is wrong with it
    if b'"traceEvents"' not in head and b'"nodes"' in head and b'"schema"' in head:
        return "a PyTorch execution trace (a graph of nodes, no traceEvents)"
    return None


def _traces_in(folder: Path, skipped: list[str] | None = None) -> list[Path]:
    """The regular ``*.json[.gz]`` files of ``folder``; the others (FIFOs, devices, folders,
    broken symlinks, execution traces) each get a line in ``skipped``."""
    try:
        os.listdir(folder)
    except PermissionError:
        raise TraceError(
            f"{folder}: cannot list the folder (permission denied); check its permissions"
        ) from None
    except OSError as exc:
        raise TraceError(f"{folder}: cannot list the folder ({exc.strerror})") from None
    found: set[Path] = set()
    for pattern in _PATTERNS:
        found.update(folder.glob(pattern))
    kept = []
    for path in sorted(found):
        problem = file_problem(path)
        if problem is not None:
            if skipped is not None:
                skipped.append(f"{path.name}: {problem}; skipped")
            continue
        why = execution_trace_reason(path)
        if why is None:
            kept.append(path)
        elif skipped is not None:
            skipped.append(f"{path.name}: {why}, not a Kineto trace; skipped")
    return kept


def find_trace_files(
    paths: Iterable[str | Path], skipped: list[str] | None = None
) -> dict[str, list[Path]]:
    """Group trace files by folder: a folder's ``*.json[.gz]`` (else its ``traces/``), or files.

    Each folder is taken to hold one job's ranks, as torch.profiler's tensorboard handler writes
    them; a folder with no trace raises TraceError, as does a path that does not exist or is not
    a regular file (a FIFO, a device). In a folder, execution traces (``*_et.json.gz``) and files
    that are not regular are skipped, each with a line in ``skipped``.
    """
    groups: dict[str, list[Path]] = {}
    for raw in paths:
        p = Path(raw)
        # file_problem and os.path.isdir never raise (Path.is_dir does, on permission denied)
        problem = file_problem(p)
        if problem == "no such file":
            raise TraceError(f"{p}: no such file or folder; check the path")
        is_folder = os.path.isdir(p)
        if problem is not None and not is_folder:
            raise TraceError(f"{p}: {problem}; pass a trace file or a folder of them")
        if is_folder:
            here: list[str] = []
            files = _traces_in(p, here) or (
                _traces_in(p / "traces", here) if (p / "traces").is_dir() else []
            )
            if skipped is not None:
                skipped.extend(here)
            if not files:
                found = f" (found: {'; '.join(here)})" if here else ""
                raise TraceError(
                    f"{p}: folder holds no *.json or *.json.gz trace (nor does {p / 'traces'})"
                    f"{found}; pass the folder torch.profiler wrote"
                )
            groups.setdefault(str(files[0].parent), []).extend(files)
        else:
            groups.setdefault(str(p.parent), []).append(p)
    return {k: sorted(set(v)) for k, v in groups.items()}


def _analyze_or_error(path: Path, top: int) -> RankTraceSummary | TraceError:
    """One rank's summary, or the TraceError that says why its file cannot be read (returned,
    not raised, so that one bad file does not stop the others)."""
    try:
        return analyze_trace_file(path, top)
    except UsageError as exc:
        return exc if isinstance(exc, TraceError) else TraceError(str(exc))


def _joined(errors: Sequence[TraceError], most: int = 3) -> str:
    text = "; ".join(str(e) for e in errors[:most])
    return text + (f"; and {len(errors) - most} more" if len(errors) > most else "")


def _one_job(ranks: list[RankTraceSummary]) -> str | None:
    """Why the ranks cannot be compared as one job, or None when they can."""
    if len(ranks) < 2:
        return "one rank only"
    ids = [r.rank for r in ranks]
    if any(i is None for i in ids):
        return "some files have no rank (no distributedInfo.rank, no rank in the file name)"
    if len(set(ids)) != len(ids):
        return "two files claim the same rank, so they are not one job"
    sizes = {r.world_size for r in ranks if r.world_size is not None}
    if len(sizes) > 1:
        return "files disagree on world_size, so they are not one job"
    if len({r.kind for r in ranks}) > 1:
        return "GPU and CPU-only traces mixed, so collectives cannot be matched"
    return None


def analyze_job(
    files: Sequence[str | Path], top: int = 10, workers: int | None = None
) -> JobTraceSummary:
    """Analyse every rank file, then match collectives across ranks.

    With several files and ``workers`` > 1 (default: CPU count), ranks are analysed in worker
    processes that return only their summaries.
    """
    paths = [Path(f) for f in files]
    if not paths:
        raise TraceError("no trace files given; pass a trace file or a folder of them")
    n_workers = min(len(paths), workers if workers is not None else (os.cpu_count() or 1))
    if n_workers > 1:
        try:
            with ProcessPoolExecutor(max_workers=n_workers) as pool:
                results = list(pool.map(_analyze_or_error, paths, [top] * len(paths)))
        except BrokenProcessPool:
            raise TraceError(
                f"{paths[0].parent}: a worker process died while analysing the traces (killed "
                "for memory?); pass --workers 1 to analyse one trace at a time"
            ) from None
    else:
        results = [_analyze_or_error(p, top) for p in paths]
    ranks = [r for r in results if isinstance(r, RankTraceSummary)]
    errors = [r for r in results if isinstance(r, TraceError)]
    if not ranks:
        if len(errors) == 1:
            raise errors[0]
        raise TraceError(
            f"{paths[0].parent}: none of the {len(errors)} trace files could be read: "
            + _joined(errors)
        )
    ranks.sort(key=lambda r: (r.rank is None, r.rank if r.rank is not None else 0, r.source))
    na: dict[str, str] = {}
    if errors:
        na["skipped_files"] = "; ".join(f"{e}; skipped" for e in errors)
    why_not = _one_job(ranks)
    summary: CrossRankSummary | None = None
    if why_not is None:
        summary = cross_rank({int(r.rank or 0): r.collective_calls for r in ranks})
        if summary is None or summary.matched_calls == 0:
            why_not = "no collective call could be matched across the ranks"
    if why_not is not None:
        na["cross_rank"] = why_not
    slowest = summary.slowest_rank if summary is not None else None
    if slowest is None:
        na["slowest_rank"] = why_not or "every matched call took equally long on every rank"
    return JobTraceSummary(
        directory=str(paths[0].parent),
        ranks=ranks,
        cross_rank=summary if why_not is None else None,
        slowest_rank=slowest,
        not_applicable=na,
        definitions=dict(DEFINITIONS_COMMON),
    )
