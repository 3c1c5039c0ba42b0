"""What each rank was doing, on the job's one clock: a few rows of bars per rank, for a chart.

``mgprof timeline`` writes every event of every rank onto one clock for Perfetto; a report that
must open offline and stay small draws a summary of the same thing instead: per rank, its traced
steps, its ``mgprof.region`` blocks, and where its time went by the trace metric definitions
(DESIGN.md), each as a row of intervals:

- GPU trace: compute (compute kernels), communication (communication kernels and host-side
  gloo collectives), other device work (memcpy/memset), idle (the trace window, first to last
  device event, less all of them): the sets ``breakdown.gpu_breakdown`` measures;
- CPU-only trace: compute (the main thread's operators, communication cut out), communication
  (``gloo:*`` ops on any thread), idle (the union of the ProfilerStep spans less both), each
  inside that window: the sets ``breakdown.cpu_breakdown`` measures.

So a row's length inside the window is the figure the report's tables give. The rows come from
the trace loader (:func:`~mgprof.analyze.tracefile.load.load_trace`), the regions from one light
pass (:mod:`~mgprof.analyze.timeline.annotations`). The clock is the timeline's: each trace is
scanned as ``mgprof timeline`` scans it and :func:`~mgprof.analyze.timeline.clock.align_clocks`
gives each rank's offset, with the same origin (the job's first event at 0), so that a time on
the chart is the ``ts`` of the same moment in ``timeline.json.gz``; when that file was written
from these very traces, its own offsets and origin are read back instead of scanning the traces
again. The bars are cut down to a budget (:mod:`~mgprof.analyze.timeline.coarsen`), so a large
run's report stays small.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np

from mgprof.analyze import intervals as iv
from mgprof.analyze.intervals import FloatArray
from mgprof.analyze.timeline.annotations import region_spans
from mgprof.analyze.timeline.clock import ClockOffset, RankClock, align_clocks
from mgprof.analyze.timeline.coarsen import Segments, coarsen, share_budget
from mgprof.analyze.timeline.inputs import assign_ranks
from mgprof.analyze.timeline.scan import RankScan, scan_trace
from mgprof.analyze.timeline.summary import read_timeline_facts
from mgprof.analyze.trace.breakdown import cpu_spans, cpu_window, host_collectives
from mgprof.analyze.tracefile.load import (
    KIND_COMM,
    KIND_COMPUTE,
    KIND_MEMCPY,
    KIND_MEMSET,
    RankTrace,
    load_trace,
)
from mgprof.errors import TraceError
from mgprof.safe_read import format_size

__all__ = [
    "MAX_RANKS",
    "MAX_SEGMENTS",
    "MAX_TRACE_BYTES",
    "ROW_KINDS",
    "ActivityRow",
    "JobActivity",
    "RankActivity",
    "job_activity",
    "too_large",
]

ROW_KINDS = ("steps", "regions", "compute", "communication", "other device work", "idle")
"""The rows of a rank, top to bottom; a row with nothing in it is left out."""
MAX_SEGMENTS = 4000
"""Bars of the whole chart: about 30 bytes of the page each, 120 KB in all at most."""
MAX_RANKS = 32
"""Ranks drawn (the lowest); the others are named in a note, and are in the timeline file."""
MAX_TRACE_BYTES = 64 << 20
"""Trace files (on disk) past which the chart is not made: reading them twice more would slow
the end of a run by much more than the chart is worth; Perfetto opens the timeline file."""

Pair = tuple[FloatArray, FloatArray]


class ActivityRow(msgspec.Struct):
    """One row of a rank: its kind (``ROW_KINDS``) and its bars on the job's clock."""

    kind: str
    segments: Segments


class RankActivity(msgspec.Struct):
    """One rank's rows; ``window_us`` is its trace window on the job's clock."""

    rank: int
    file: str
    clock: ClockOffset
    device: bool
    """A GPU trace: compute and communication are device work."""
    window_us: tuple[float, float] | None
    rows: list[ActivityRow]


class JobActivity(msgspec.Struct):
    """Every drawn rank's rows on the reference rank's clock, µs from ``origin_trace_us`` (the
    reference rank's trace time of the job's first event, as in ``timeline.json.gz``)."""

    reference_rank: int
    origin_trace_us: float
    max_segments: int
    ranks: list[RankActivity]
    ranks_left_out: list[int]
    notes: list[str]
    clock_source: str = "traces"
    """Where the offsets came from: the traces (scanned as ``mgprof timeline`` scans them), or
    the ``timeline.json.gz`` that was written from them."""

    @property
    def intervals(self) -> int:
        return sum(r.segments.intervals for rank in self.ranks for r in rank.rows)

    @property
    def segments(self) -> int:
        return sum(len(r.segments.count) for rank in self.ranks for r in rank.rows)

    @property
    def merged(self) -> int:
        """Intervals drawn inside a bar with others."""
        return sum(r.segments.merged for rank in self.ranks for r in rank.rows)


def too_large(files: Sequence[Path], limit: int = MAX_TRACE_BYTES) -> str | None:
    """Why the chart is not made for these traces (their size on disk), else None."""
    try:
        total = sum(f.stat().st_size for f in files)
    except OSError as exc:
        return f"a trace file cannot be read ({exc.strerror}: {exc.filename})"
    if total > limit:
        return f"the traces take {format_size(total)} (over {format_size(limit)})"
    return None


def _pair(values: Sequence[float]) -> FloatArray:
    return iv.as_array(values)


def _device_rows(rt: RankTrace) -> tuple[dict[str, Pair], tuple[float, float] | None]:
    """GPU trace: the sets ``gpu_breakdown`` measures over the whole trace."""
    kind = rt.dev_kind
    gloo = host_collectives(rt)

    def rows_of(mask: np.ndarray) -> Pair:
        return rt.dev_start[mask], rt.dev_end[mask]

    compute = iv.merge(*rows_of(kind == KIND_COMPUTE))
    kernels = rows_of(kind == KIND_COMM)
    comm = iv.merge(np.concatenate((kernels[0], gloo[0])), np.concatenate((kernels[1], gloo[1])))
    other = iv.merge(*rows_of((kind == KIND_MEMCPY) | (kind == KIND_MEMSET)))
    busy = iv.merge(np.concatenate((rt.dev_start, gloo[0])), np.concatenate((rt.dev_end, gloo[1])))
    if not busy[0].size:
        return {}, None
    lo, hi = float(busy[0][0]), float(busy[1][-1])
    idle = iv.subtract((_pair([lo]), _pair([hi])), busy)
    rows = {"compute": compute, "communication": comm, "other device work": other, "idle": idle}
    return rows, (lo, hi)


def _host_rows(rt: RankTrace) -> tuple[dict[str, Pair], tuple[float, float] | None]:
    """CPU-only trace: the sets ``cpu_breakdown`` measures, inside the window."""
    window = iv.merge(*cpu_window(rt))
    if not window[0].size:
        return {}, None
    spans = cpu_spans(rt)
    compute = iv.intersect(spans.compute, window)
    comm = iv.intersect(spans.comm, window)
    busy = iv.merge(np.concatenate((compute[0], comm[0])), np.concatenate((compute[1], comm[1])))
    idle = iv.subtract(window, busy)
    rows = {"compute": compute, "communication": comm, "idle": idle}
    return rows, (float(window[0][0]), float(window[1][-1]))


@dataclass
class _RankRows:
    """One rank's intervals before they are cut down, on the job's clock."""

    device: bool
    window_us: tuple[float, float] | None
    rows: dict[str, tuple[FloatArray, FloatArray, list[str] | None]]


def _rank_rows(
    rt: RankTrace, regions: list[tuple[str, float, float]], shift_us: float
) -> _RankRows:
    """The rank's rows, moved onto the job's clock: ``shift_us`` is added to the trace's own
    ``ts`` (its offset less the origin); the loader's times are from ``time_base_us``."""
    device = rt.has_device_events
    work, window = _device_rows(rt) if device else _host_rows(rt)
    here = rt.time_base_us + shift_us  # two large clocks cancel before the small times join
    rows: dict[str, tuple[FloatArray, FloatArray, list[str] | None]] = {}
    if rt.steps:
        rows["steps"] = (
            _pair([s.start for s in rt.steps]) + here,
            _pair([s.end for s in rt.steps]) + here,
            [f"step {s.number}" for s in rt.steps],
        )
    if regions:
        rows["regions"] = (
            _pair([r[1] for r in regions]) + shift_us,
            _pair([r[2] for r in regions]) + shift_us,
            [r[0] for r in regions],
        )
    for kind, (starts, ends) in work.items():
        rows[kind] = (starts + here, ends + here, None)
    placed = (window[0] + here, window[1] + here) if window is not None else None
    return _RankRows(device, placed, rows)


def _scan_all(files: Sequence[Path], notes: list[str]) -> list[RankScan]:
    scans = []
    for path in files:
        scan = scan_trace(path)
        if scan.generated:
            notes.append(f"{path.name}: a timeline mgprof wrote, not a rank's trace; skipped")
            continue
        scan.release()
        scans.append(scan)
    if not scans:
        raise TraceError("no rank trace among the inputs (only timelines mgprof wrote)")
    return scans


class _Clocks(msgspec.Struct):
    """Which file is which rank, each rank's offset and the job's origin."""

    paths: list[Path]
    ranks: list[int]
    clocks: dict[int, ClockOffset]
    origin_us: float
    source: str
    notes: list[str]


def _from_timeline(files: Sequence[Path], timeline: Path | None) -> _Clocks | None:
    """The clocks ``timeline.json.gz`` was written with (its ``otherData``), when it is the
    timeline of exactly these files, of every step, and newer than each of them: the same
    numbers as a scan would find, without reading the traces once more."""
    if timeline is None:
        return None
    facts = read_timeline_facts(timeline)
    if not facts or facts.get("steps") is not None or not facts.get("ranks"):
        return None
    try:
        newest = max(f.stat().st_mtime for f in files)
        if timeline.stat().st_mtime < newest:
            return None
        by_name = {f.name: f for f in files}
        ranks = facts["ranks"]
        if sorted(str(r.get("file")) for r in ranks) != sorted(by_name):
            return None
        clocks = {int(r["rank"]): msgspec.convert(r["clock"], ClockOffset) for r in ranks}
        origin = float(facts["origin_trace_us"])
        paths = [by_name[str(r["file"])] for r in ranks]
        numbers = [int(r["rank"]) for r in ranks]
    except (OSError, KeyError, TypeError, ValueError, msgspec.ValidationError):
        return None
    if len(clocks) != len(numbers):
        return None
    notes = [str(n) for n in facts.get("notes") or [] if "not a rank's trace" not in str(n)]
    return _Clocks(paths, numbers, clocks, origin, timeline.name, notes)


def _from_traces(files: Sequence[Path]) -> _Clocks:
    """The clocks as ``mgprof timeline`` finds them: each trace scanned, the ranks' offsets from
    their shared collectives, the job's first event at 0."""
    notes: list[str] = []
    scans = _scan_all(files, notes)
    ranks = assign_ranks(scans, notes)
    clocks = align_clocks({r: RankClock(s.anchors, s.base_us) for r, s in zip(ranks, scans)})
    firsts = [s.ts_min + clocks[r].offset_us for r, s in zip(ranks, scans) if s.ts_min is not None]
    origin = min(firsts) if firsts else 0.0
    return _Clocks([s.path for s in scans], ranks, clocks, origin, "traces", notes)


def job_activity(
    files: Sequence[Path],
    region_names: Collection[str] = (),
    *,
    timeline: Path | None = None,
    max_segments: int = MAX_SEGMENTS,
    max_ranks: int = MAX_RANKS,
) -> JobActivity:
    """Every rank's rows (module docstring) from one job's traces, one file per rank; at most
    ``max_segments`` bars in all (and one a row at least) and the lowest ``max_ranks`` ranks.
    ``timeline``: the job's ``timeline.json.gz``, whose clocks are taken when it was written
    from these very files. TraceError (one line) when a trace cannot be read or two files
    claim one rank."""
    found = _from_timeline(files, timeline) or _from_traces(files)
    order = sorted(range(len(found.paths)), key=lambda i: found.ranks[i])
    drawn, rest = order[:max_ranks], order[max_ranks:]
    out = JobActivity(
        reference_rank=min(found.ranks),
        origin_trace_us=found.origin_us,
        max_segments=max_segments,
        ranks=[],
        ranks_left_out=[found.ranks[i] for i in rest],
        notes=found.notes,
        clock_source=found.source,
    )
    left = max_segments
    for k, i in enumerate(drawn):
        path, rank = found.paths[i], found.ranks[i]
        clock = found.clocks[rank]
        rt = load_trace(path)
        got = _rank_rows(rt, region_spans(path, region_names), clock.offset_us - found.origin_us)
        del rt
        kinds = [kind for kind in ROW_KINDS if kind in got.rows and got.rows[kind][0].size]
        budgets = share_budget(
            [int(got.rows[kind][0].size) for kind in kinds], left // (len(drawn) - k)
        )
        rows = []
        for kind, budget in zip(kinds, budgets):
            starts, ends, labels = got.rows[kind]
            segments = coarsen(starts, ends, budget, labels, noun=kind)
            left -= len(segments.count)
            rows.append(ActivityRow(kind, segments))
        out.ranks.append(RankActivity(rank, path.name, clock, got.device, got.window_us, rows))
    return out
