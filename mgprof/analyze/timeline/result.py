"""What ``mgprof timeline`` wrote: one record per rank and the file's facts.

Kept apart from :mod:`~mgprof.analyze.timeline.build` so that the summary lines
(:mod:`~mgprof.analyze.timeline.summary`) read the result without importing the builder.
"""

from __future__ import annotations

import msgspec

from mgprof.analyze.timeline.clock import ClockOffset
from mgprof.analyze.timeline.write import EventCounts


class RankFacts(msgspec.Struct):
    """One rank of the timeline: where it came from, how its clock moved, what was kept."""

    rank: int
    pid: int
    file: str
    rank_source: str
    name: str
    clock: ClockOffset
    events: EventCounts
    steps_found: list[int] | None = None


class TimelineResult(msgspec.Struct):
    """What :func:`build_timeline` wrote (also the file's ``otherData``, with ``generator``)."""

    path: str
    size_bytes: int
    seconds: float
    reference_rank: int
    origin_trace_us: float
    origin_unix_us: float | None
    steps: str | None
    min_dur_us: float | None
    ranks: list[RankFacts]
    events: EventCounts
    notes: list[str]
