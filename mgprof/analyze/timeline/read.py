"""A trace's events in bounded slices, for the two passes of ``mgprof timeline``.

The timeline reads every rank's trace twice: once to learn what it needs (collectives, steps,
lanes: :mod:`~mgprof.analyze.timeline.scan`) and once to write each event out, shifted onto the
job's clock (:mod:`~mgprof.analyze.timeline.write`). Each pass decodes ``traceEvents`` about
1 MB of JSON at a time and drops a slice before the next, so neither pass holds a whole trace.

The limits and error messages are :mod:`~mgprof.analyze.tracefile.load`'s (size limit, gzip ratio,
regular files only, one TraceError line), reused here rather than repeated: the slicing is the
same as its streaming path, but the two passes need decoders of their own (light typed events
for the scan, every field for the output), which its reducer does not take.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Generic, TypeVar

import msgspec

from mgprof.analyze.tracefile.gc_pause import gc_paused
from mgprof.analyze.tracefile.stream import (
    _Bounded,
    _decode,
    _open_trace,
    _read_bytes,
    event_slices,
    events_key,
)
from mgprof.errors import TraceError

__all__ = ["GENERATOR", "TraceMeta", "read_events"]

GENERATOR = "mgprof timeline"
"""``otherData.generator`` of the files ``mgprof timeline`` writes."""

T = TypeVar("T")
Num = int | float | None
Text = str | int | float | None


class _OtherData(msgspec.Struct):
    generator: Text = None


class TraceMeta(msgspec.Struct):
    """The top-level keys of a trace besides ``traceEvents`` that the timeline uses."""

    baseTimeNanoseconds: Num = None
    host_name: Text = None
    distributedInfo: msgspec.Raw = msgspec.Raw()
    otherData: _OtherData | None = None
    """Set in files ``mgprof timeline`` wrote (``generator``), so that one is never read as a
    rank's trace."""


class _Outline(TraceMeta):
    traceEvents: msgspec.Raw = msgspec.Raw()


class _Restart(Exception):
    """A slice failed to decode after earlier ones were consumed: start over from the whole
    document, which gives the precise error (or succeeds where a cut fell inside a string)."""


def _merge(into: TraceMeta, part: TraceMeta) -> None:
    for field in TraceMeta.__struct_fields__:
        value = getattr(part, field)
        if value is not None and value != msgspec.Raw():
            setattr(into, field, value)


def _stream(
    path: Path, stream: _Bounded, decoder: msgspec.json.Decoder[list[T]], meta: TraceMeta
) -> Iterator[list[T]]:
    """Slices of decoded events; returns without yielding when the layout is not recognised
    (the whole-document path decides), raises _Restart when a slice fails after others."""
    found = events_key(path, stream)
    if found is None:
        return
    head, rest = found
    try:
        _merge(meta, msgspec.json.decode(head, type=_Outline))
    except (msgspec.ValidationError, msgspec.DecodeError):
        return

    def decode(piece: bytes) -> list[T]:
        try:
            return decoder.decode(piece)
        except (msgspec.ValidationError, msgspec.DecodeError):
            raise _Restart from None

    yield from event_slices(stream, rest, decode)
    try:
        tail = msgspec.json.decode(b"".join((b'{"traceEvents": [', rest)), type=_Outline)
        events = decoder.decode(tail.traceEvents) if tail.traceEvents else []
    except (msgspec.ValidationError, msgspec.DecodeError):
        raise _Restart from None
    _merge(meta, tail)
    yield events


def _whole(
    path: Path, decoder: msgspec.json.Decoder[list[T]], meta: TraceMeta
) -> Iterator[list[T]]:
    """The whole (decompressed) document in memory once: odd layouts, and precise errors."""
    raw = _read_bytes(path)
    try:
        outline = msgspec.json.decode(raw, type=_Outline)
    except (msgspec.ValidationError, msgspec.DecodeError):
        _decode(path, raw)  # raises the loader's one-line TraceError for this input
        raise TraceError(
            f"{path}: not a Kineto/Chrome trace; pass a torch.profiler trace file"
        ) from None
    if not outline.traceEvents:
        raise TraceError(
            f"{path}: JSON has no 'traceEvents' list, so it is not a Kineto/Chrome trace; "
            "pass a torch.profiler trace file"
        )
    _merge(meta, outline)
    try:
        events = decoder.decode(outline.traceEvents)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        msg = str(exc).replace("\n", " ")
        raise TraceError(
            f"{path}: not a Kineto/Chrome trace ({msg}); pass a torch.profiler trace file"
        ) from None
    del raw, outline
    yield events


class _Pass(Generic[T]):
    """One pass over one file: streaming first, the whole document when streaming cannot."""

    def __init__(self, path: Path, decoder: msgspec.json.Decoder[list[T]]) -> None:
        self.path = path
        self.decoder = decoder

    def run(self, feed: Callable[[list[T]], None], whole: bool) -> tuple[TraceMeta, bool]:
        meta = TraceMeta()
        if not whole:
            fed = False
            bounded = _open_trace(self.path)
            with bounded.raw:
                try:
                    for events in _stream(self.path, bounded, self.decoder, meta):
                        fed = True
                        feed(events)
                    if fed:
                        return meta, False
                except (OSError, EOFError, zlib.error):
                    if fed:
                        raise _Restart from None
            meta = TraceMeta()
        for events in _whole(self.path, self.decoder, meta):
            feed(events)
        return meta, True


def read_events(
    path: Path,
    decoder: msgspec.json.Decoder[list[Any]],
    start: Callable[[], Callable[[list[Any]], None]],
    *,
    whole: bool = False,
    restart_ok: bool = True,
) -> tuple[TraceMeta, bool]:
    """Feed every event of ``path``, slice by slice, to the consumer ``start()`` returns.

    Returns the trace's top-level keys and whether the whole document had to be read at once
    (``whole=True`` asks for that from the start: the second pass over a file does what the
    first did). When a slice fails to decode after others were fed, the pass starts over with
    a fresh consumer on the whole document, or, with ``restart_ok=False`` (a consumer that
    cannot undo what it did), raises TraceError. Every failure is one TraceError line.
    """
    one = _Pass(path, decoder)
    try:
        with gc_paused():
            try:
                return one.run(start(), whole)
            except _Restart:
                if not restart_ok:
                    raise TraceError(
                        f"{path}: the trace changed while it was read; read it again once "
                        "nothing writes to it"
                    ) from None
                return one.run(start(), True)
    except RecursionError:
        raise TraceError(
            f"{path}: JSON is nested too deeply (about 1000 levels or more), as no profiler trace "
            "is; pass a torch.profiler trace file"
        ) from None
    except MemoryError:
        raise TraceError(f"{path}: ran out of memory while reading the trace") from None
