"""A job's traces: finding and grouping the trace files of a folder, and analysing every rank.

Each rank goes through :func:`mgprof.analyze.trace.summary.analyze_trace_file`, run by an
executor (this process, local worker processes, or a Dask cluster:
:mod:`mgprof.analyze.execution.executor`) that returns each rank's small summary; summaries of
unchanged files come from the cache (:mod:`mgprof.analyze.execution.cache`) instead. Then the
ranks' collectives are matched across the job.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

import msgspec

from mgprof.analyze.execution.cache import FileStamp, TraceCache, default_cache, file_stamp
from mgprof.analyze.execution.engine_id import engine_id
from mgprof.analyze.execution.executor import ProcessExecutor, RankExecutor, TaskLost, make_executor
from mgprof.analyze.execution.rank_task import RankOutcome, analyze_rank, size_limit_setting
from mgprof.analyze.trace.comm import CrossRankSummary, cross_rank
from mgprof.analyze.trace.kernels import KERNELS_LIMIT
from mgprof.analyze.trace.summary import DEFINITIONS_COMMON, RankTraceSummary
from mgprof.errors import TraceError
from mgprof.safe_read import file_problem

__all__ = [
    "JobProgress",
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
MGPROF_OUTPUTS = frozenset(
    {"run.json", "comparison.json", "sweep.json", "timeline.json", "timeline.json.gz"}
)
"""Files mgprof writes into a run directory: JSON, but never one rank's trace (the merged
timeline is every rank at once)."""


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
        if path.name in MGPROF_OUTPUTS:
            if skipped is not None:
                skipped.append(f"{path.name}: written by mgprof, not a profiler trace; skipped")
            continue
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
            # os.path never raises (Path.is_file does, in a folder that cannot be read)
            has_traces = os.path.isdir(p / "traces")
            run_dir = has_traces and os.path.isfile(p / "run.json")
            # an mgprof run directory: its traces/ (the folder itself holds only mgprof's files)
            files = [] if run_dir else _traces_in(p, here)
            if not files and has_traces:
                files = _traces_in(p / "traces", here)
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


class _Rank:
    """One file of the job: the path as given (what the summary shows) and its absolute path
    (what a worker on another machine, or in another folder, opens)."""

    def __init__(self, path: Path) -> None:
        self.display = str(path)
        self.absolute = os.path.abspath(self.display)
        self.stamp: FileStamp | None = None
        self.nbytes = 0


def _ranks(
    paths: list[Path],
    top: int,
    store: TraceCache | None,
    executor: RankExecutor | None,
    workers: int | None,
    progress: JobProgress | None,
) -> list[RankTraceSummary | TraceError]:
    """Each file's summary (from the cache when it holds one for the file as it is now) or the
    TraceError saying why it has none, in the order of ``paths``."""
    files = [_Rank(p) for p in paths]
    limit = size_limit_setting()
    for f in files:
        f.stamp = file_stamp(f.absolute) if store is not None else None
        if f.stamp is not None:
            f.nbytes = f.stamp.size
        else:
            try:
                f.nbytes = os.stat(f.absolute).st_size
            except OSError:
                pass
    # One summary answers every top up to KERNELS_LIMIT: its top_kernels are then the first
    # `top` of its `kernels` list, which does not depend on top. Computing (and caching) that
    # one costs nothing more, and `trace --top 5`, `diff` (top 200) and a run's analysis
    # (top 10) then share one cache entry per file.
    task_top = max(top, KERNELS_LIMIT)
    results: list[RankTraceSummary | TraceError | None] = [None] * len(files)
    ex = executor if executor is not None else make_executor(workers)
    if progress is not None:
        progress.start(
            str(paths[0].parent), len(files), sum(f.nbytes for f in files), ex.description
        )
    try:
        todo = []
        for i, f in enumerate(files):
            cached = _from_cache(store, f, task_top, limit)
            if cached is None:
                todo.append(i)
                continue
            results[i] = _as_asked(cached, f, top)
            if progress is not None:
                progress.advance(f.nbytes, cached=True)

        def done(k: int, outcome: Any) -> None:
            i = todo[k]
            got = _received(outcome, files[i], store, task_top, limit)
            results[i] = got if isinstance(got, TraceError) else _as_asked(got, files[i], top)
            if progress is not None:
                progress.advance(files[i].nbytes, cached=False)

        engine = engine_id()
        # One rank to analyse here, with more processes allowed: they share its reading.
        procs = ex.workers if isinstance(ex, ProcessExecutor) and len(todo) == 1 else 1
        tasks = [
            (files[i].absolute, files[i].display, task_top, limit, engine, procs) for i in todo
        ]
        ex.map_unordered(analyze_rank, tasks, done)
    finally:
        if executor is None:
            ex.close()
        if progress is not None:
            progress.finish()
    missing = [files[i].display for i, r in enumerate(results) if r is None]
    if missing:  # an executor that skipped a task without a word is a bug, not a user error
        raise RuntimeError(f"the executor returned no result for {', '.join(missing[:3])}")
    return [r for r in results if r is not None]


def _from_cache(
    store: TraceCache | None, f: _Rank, top: int, limit: str | None
) -> RankTraceSummary | None:
    if store is None or f.stamp is None:
        return None
    payload = store.get(f.absolute, top, limit, f.stamp)
    if payload is None:
        return None
    try:
        return _SUMMARY_DECODER.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError):
        store.hits -= 1  # an entry whose summary does not decode was no hit
        store.misses += 1
        store.rejected += 1
        return None


def _received(
    outcome: Any, f: _Rank, store: TraceCache | None, top: int, limit: str | None
) -> RankTraceSummary | TraceError:
    """The summary or error a task returned; the summary is cached when the file is unchanged
    since it was stamped (a file rewritten during its analysis is not cached)."""
    if isinstance(outcome, TaskLost):
        return TraceError(f"{f.display}: {outcome.reason}")
    if not isinstance(outcome, RankOutcome) or (outcome.summary is None) == (outcome.error is None):
        raise RuntimeError(f"{f.display}: the executor returned {type(outcome).__name__}")
    if outcome.error is not None:
        return TraceError(outcome.error)
    assert outcome.summary is not None
    summary = _SUMMARY_DECODER.decode(outcome.summary)
    if store is not None and f.stamp is not None and file_stamp(f.absolute) == f.stamp:
        store.put(f.absolute, top, limit, f.stamp, outcome.summary)
    return summary


def _as_asked(summary: RankTraceSummary, f: _Rank, top: int) -> RankTraceSummary:
    """A summary computed for ``max(top, KERNELS_LIMIT)`` (perhaps cached under another
    spelling of the path) as ``top`` and the path as given would have made it."""
    summary.source = f.display
    if len(summary.top_kernels) > top:
        summary.top_kernels = summary.top_kernels[: max(top, 0)]
    return summary


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


class JobProgress(Protocol):
    """Told about a job while it is analysed (``mgprof.report.progress.RankProgress`` draws it)."""

    def start(self, label: str, ranks: int, nbytes: int, where: str) -> None: ...

    def advance(self, nbytes: int, cached: bool) -> None:
        """One rank is done: ``nbytes`` is its file's size, ``cached`` whether its summary
        came from the cache."""

    def finish(self) -> None: ...


_SUMMARY_DECODER = msgspec.msgpack.Decoder(RankTraceSummary)


def analyze_job(
    files: Sequence[str | Path],
    top: int = 10,
    workers: int | None = None,
    *,
    executor: RankExecutor | None = None,
    cache: TraceCache | Literal[False] | None = None,
    progress: JobProgress | None = None,
) -> JobTraceSummary:
    """Analyse every rank file, then match collectives across ranks.

    ``executor`` runs the ranks (default: :func:`make_executor` with ``workers``: local worker
    processes, one per CPU; or the Dask scheduler in ``$MGPROF_DASK_SCHEDULER``); the result is
    the same whatever runs it. ``cache``: a :class:`TraceCache`, ``False`` for none, or None
    for the default one (:func:`default_cache`). A rank that cannot be analysed (bad or missing
    file, worker died) is named in ``not_applicable["skipped_files"]``; the job fails only when
    no rank can be analysed.
    """
    paths = [Path(f) for f in files]
    if not paths:
        raise TraceError("no trace files given; pass a trace file or a folder of them")
    store = default_cache() if cache is None else (cache or None)
    results = _ranks(paths, top, store, executor, workers, progress)
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
        summary = cross_rank({int(r.rank or 0): r.collective_calls or [] for r in ranks})
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
