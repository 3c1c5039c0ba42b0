"""Finds a run's trace files and runs the trace engine over them; failures become reasons."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec

from mgprof.records import RunRecord
from mgprof.safe_read import file_problem

TraceAnalyzer = Callable[[Path], Any]
"""Turns one trace file into a summary (a msgspec Struct or a dict); raises on a bad trace."""

_DROPPED_TRACE_FIELDS = ("collective_calls",)
"""Per-call lists: raw data, not figures; they would bloat run.json (re-run ``mgprof trace``)."""


def _as_dict(summary: Any) -> dict[str, Any]:
    plain = summary if isinstance(summary, dict) else msgspec.to_builtins(summary)
    if not isinstance(plain, dict):
        raise TypeError(f"trace summary is a {type(plain).__name__}, not a mapping")
    return {k: v for k, v in plain.items() if k not in _DROPPED_TRACE_FIELDS}


def _resolve_trace(run_dir: Path, rel: str) -> Path | None:
    """The trace path inside the run directory; None for a path that escapes it (run.json is
    untrusted). Lexical, so a trace symlinked into the run directory is still accepted."""
    base = Path(os.path.abspath(run_dir))
    path = Path(os.path.normpath(base / rel))
    if path != base and base not in path.parents:
        return None
    return path


class RunTraces:
    """Trace summaries per rank, why a rank has none, and the cross-rank summary."""

    def __init__(self) -> None:
        self.per_rank: dict[int, list[dict[str, Any]]] = {}
        self.reasons: dict[int, str] = {}
        self.job: dict[str, Any] | None = None
        self.warnings: list[str] = []


def _trace_files(
    run: RunRecord, run_dir: Path | None, traces: RunTraces
) -> list[tuple[int, str, Path]]:
    """(rank, name in run.json, resolved path) of every trace file that can be read."""
    files: list[tuple[int, str, Path]] = []
    for rec in run.ranks:
        if not rec.traces:
            traces.reasons[rec.rank] = (
                "no trace recorded on this rank (the torch.profiler window was off)"
            )
            continue
        if run_dir is None:
            traces.reasons[rec.rank] = "run directory not given: the trace files cannot be located"
            continue
        found = 0
        for rel in rec.traces:
            path = _resolve_trace(run_dir, rel)
            if path is None:
                traces.warnings.append(f"rank {rec.rank}: trace {rel} is outside the run directory")
            elif (problem := file_problem(path)) is not None:
                what = "is missing from" if not os.path.lexists(path) else f"({problem}) in"
                traces.warnings.append(f"rank {rec.rank}: trace {rel} {what} {run_dir}")
            else:
                files.append((rec.rank, rel, path))
                found += 1
        if not found:
            traces.reasons[rec.rank] = "trace files listed in run.json are missing or unreadable"
    return files


def _engine_summaries(
    files: Sequence[tuple[int, str, Path]], traces: RunTraces
) -> dict[Path, dict[str, Any]] | None:
    """All files through the trace engine's ``analyze_job`` (one pass, cross-rank matching).

    None when the job as a whole fails (one bad file fails it): the caller then goes file by
    file so the good traces still count.
    """
    from mgprof.analyze.trace.job import analyze_job

    try:
        job = _as_dict(analyze_job([path for _, _, path in files]))
    except Exception as exc:  # the per-file pass reports each file's own error
        traces.warnings.append(f"job trace summary not computed: {type(exc).__name__}: {exc}")
        return None
    by_path: dict[Path, dict[str, Any]] = {}
    for summary in job.pop("ranks", []):
        if isinstance(summary, dict) and isinstance(summary.get("source"), str):
            by_path[Path(os.path.abspath(summary["source"]))] = _as_dict(summary)
    traces.job = job if len(files) > 1 else None
    return by_path


def analyze_traces(
    run: RunRecord, run_dir: Path | None, analyzer: TraceAnalyzer | None
) -> RunTraces:
    """Run the trace engine over every rank's trace files; failures become reasons."""
    traces = RunTraces()
    files = _trace_files(run, run_dir, traces)
    if not files:
        return traces
    by_path: dict[Path, dict[str, Any]] | None = None
    if analyzer is None:
        # Imported here: the trace engine is a sibling module and this keeps the run analysis
        # usable (trace figures marked not applicable) in a build that lacks it.
        try:
            from mgprof.analyze.trace.summary import analyze_trace_file
        except ImportError as exc:
            for rank, _, _ in files:
                traces.reasons[rank] = f"trace engine not available ({exc})"
            return traces
        analyzer = analyze_trace_file
        by_path = _engine_summaries(files, traces)
    failures: dict[int, list[str]] = {}
    for rank, rel, path in files:
        summary = by_path.get(path) if by_path is not None else None
        if summary is None:
            try:
                summary = _as_dict(analyzer(path))
            except Exception as exc:  # a broken trace must not hide the other figures
                failures.setdefault(rank, []).append(f"{rel}: {type(exc).__name__}: {exc}")
                continue
        traces.per_rank.setdefault(rank, []).append(summary)
    for rank, msgs in failures.items():
        traces.warnings.extend(f"rank {rank}: trace not analysed: {m}" for m in msgs)
        if rank not in traces.per_rank:
            traces.reasons[rank] = "trace analysis failed: " + "; ".join(msgs)
    return traces
