"""What ``mgprof timeline`` reads: a run directory, a folder of one job's traces, or files.

A run directory (``run.json`` beside ``traces/``) gives its traces and, from run.json, each
rank's device and host for the process names; anything else is found as ``mgprof trace`` finds
it. Ranks come from each trace (``distributedInfo``), else from the file name; files that name
no rank are numbered in file order, but only when none does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mgprof.analyze.timeline.scan import RankScan
from mgprof.analyze.trace.job import find_trace_files
from mgprof.errors import TraceError, UsageError

__all__ = [
    "DEFAULT_NAME",
    "TimelineInputs",
    "assign_ranks",
    "check_min_dur",
    "choose_out",
    "find_inputs",
    "is_run_dir",
]

DEFAULT_NAME = "timeline.json.gz"
"""The timeline of a run directory, beside its run.json (a file mgprof derives and replaces)."""


@dataclass
class TimelineInputs:
    """The trace files of one job, and what a run directory says about its ranks."""

    files: list[Path]
    run_dir: Path | None = None
    labels: dict[int, dict[str, str]] = field(default_factory=dict)
    """Rank -> ``device`` (``cuda:1``, ``cpu``) and ``host``, from the run's run.json."""
    skipped: list[str] = field(default_factory=list)


def is_run_dir(path: Path) -> bool:
    return path.is_dir() and (path / "run.json").is_file()


def _run_labels(run_dir: Path) -> dict[int, dict[str, str]]:
    """Device and host per rank from run.json; nothing when it cannot be read (the traces
    alone still make a timeline)."""
    from mgprof.records import read_run

    try:
        run = read_run(run_dir)
    except UsageError:
        return {}
    out: dict[int, dict[str, str]] = {}
    for rec in run.ranks:
        dev = rec.device
        device = (
            "cpu" if dev.kind == "cpu" else f"cuda:{dev.index}" if dev.index is not None else "cuda"
        )
        out[rec.rank] = {"device": device, **({"host": rec.host} if rec.host else {})}
    return out


def choose_out(paths: Sequence[str | Path], out: str | None) -> tuple[Path, bool]:
    """The output file, and whether it is mgprof's own (RUN/timeline.json.gz of a run
    directory, which re-running replaces); ``./timeline.json.gz`` for other inputs, which is
    never replaced without ``--force``. UsageError for a name that is not *.json[.gz]."""
    derived = out is None and len(paths) == 1 and is_run_dir(Path(paths[0]))
    path = Path(paths[0]) / DEFAULT_NAME if derived else Path(out or DEFAULT_NAME)
    if not path.name.endswith((".json", ".json.gz")):
        raise UsageError(f"--out {path}: name it *.json or *.json.gz (gzip by the name)")
    return path, derived


def check_min_dur(min_dur_us: float | None) -> None:
    """``--min-dur`` must be a duration: 0 or more, finite."""
    if min_dur_us is not None and not 0 <= min_dur_us < float("inf"):
        raise UsageError(f"--min-dur {min_dur_us:g}: give a duration in µs, 0 or more")


def find_inputs(paths: Sequence[str | Path]) -> TimelineInputs:
    """A run directory (its ``traces/``), a folder of one job's traces, or trace files."""
    if not paths:
        raise UsageError("no input given; pass a run directory, a trace folder or trace files")
    skipped: list[str] = []
    first = Path(paths[0])
    if len(paths) == 1 and is_run_dir(first):
        traces = first / "traces"
        if not traces.is_dir():
            raise TraceError(
                f"{first}: the run has no traces/ folder (no step was traced); run it again "
                "with tracing on"
            )
        groups = find_trace_files([traces], skipped)
        files = sorted({f for fs in groups.values() for f in fs})
        return TimelineInputs(files, first, _run_labels(first), skipped)
    groups = find_trace_files(paths, skipped)
    files = sorted({f for fs in groups.values() for f in fs})
    return TimelineInputs(files, None, {}, skipped)


def assign_ranks(scans: list[RankScan], notes: list[str]) -> list[int]:
    known = [s.rank for s in scans]
    if all(r is None for r in known):
        if len(scans) > 1:
            notes.append("no file names its rank: ranks follow the file names' order")
            for s in scans:
                s.rank_source = "file order"
        return list(range(len(scans)))
    if any(r is None for r in known):
        lost = ", ".join(s.path.name for s in scans if s.rank is None)
        raise TraceError(
            f"{lost}: no rank in the trace (distributedInfo) nor in the file name; name the "
            "files rank<N>.pt.trace.json.gz or pass only the files of one job"
        )
    ranks = [int(r) for r in known if r is not None]
    seen: dict[int, Path] = {}
    for s, r in zip(scans, ranks):
        if r in seen:
            raise TraceError(
                f"{seen[r].name} and {s.path.name} are both rank {r}: pass the traces of one "
                "profiling window (one file per rank)"
            )
        seen[r] = s.path
    sizes = {s.world_size for s in scans if s.world_size is not None}
    if len(sizes) > 1:
        raise TraceError(
            f"the traces disagree on world_size ({sorted(sizes)}): pass the traces of one job"
        )
    return ranks
