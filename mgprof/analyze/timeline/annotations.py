"""The ``mgprof.region`` blocks of one rank's trace, as spans on its own clock.

A region is a ``record_function`` block, so the trace holds it as a host annotation span
(``cat`` ``user_annotation``) named as the region; CUDA traces copy it onto the device as
``gpu_user_annotation``, which is left out here (the host span is when the code ran). Other
annotations (``ProfilerStep#N``, ``DistributedDataParallel.forward``, ``Optimizer.step``...)
carry names that no region of the run has, so the run's own region names pick the regions out.
The trace is read in bounded slices, as the timeline reads it
(:mod:`~mgprof.analyze.timeline.read`), decoding only the five fields a span needs.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import msgspec

from mgprof.analyze.timeline.events import is_device_cat, num
from mgprof.analyze.timeline.read import read_events

__all__ = ["region_spans"]


class _Span(msgspec.Struct, gc=False):
    ph: Any = None
    cat: Any = None
    name: Any = None
    ts: Any = None
    dur: Any = None


_DECODER = msgspec.json.Decoder(list[_Span])


def region_spans(path: Path, names: Collection[str]) -> list[tuple[str, float, float]]:
    """(name, start µs, end µs) of every complete host event named as one of ``names``, on the
    trace's own clock (its ``ts`` as written); nothing to read when ``names`` is empty.
    TraceError (one line) when the file cannot be read."""
    wanted = frozenset(names)
    if not wanted:
        return []
    spans: list[tuple[str, float, float]] = []

    def start() -> Callable[[list[Any]], None]:
        spans.clear()  # a restart reads the file again from its beginning
        return feed

    def feed(events: list[_Span]) -> None:
        for ev in events:
            name = ev.name
            if ev.ph != "X" or type(name) is not str or name not in wanted:
                continue
            if is_device_cat(ev.cat):
                continue
            ts, dur = num(ev.ts), num(ev.dur)
            if ts is not None and dur is not None and dur > 0:
                spans.append((name, ts, ts + dur))

    read_events(path, _DECODER, start)
    return spans
