"""The host events FSDP attribution needs, read from one rank's trace file (or a list of events).

FSDP2 (``fully_shard``) marks its work with ``record_function`` spans (``FSDP::pre_forward
(layers.0)``, ``FSDP::all_gather (layers.0)``, ``FSDP::backward_prefetch for layers.2``,
``FSDP::post_backward_reduce (layers.0)``...). They are annotations, which the loader
(:mod:`~mgprof.analyze.tracefile.load`) reduces away, so a trace that holds FSDP2's operators
(``fsdp::all_gather_copy_in``...) is read once more here for them, for the ``c10d::*``
collectives it issued (their ``Input Dims`` × ``Input type``), and for the process groups
(``distributedInfo.pg_config``, and ``Process Group Name`` / ``Ranks`` / ``Description`` args
on any event). The file is opened with the loader's bounds and read about 1 MB of JSON at a
time; a slice that names none of these is not decoded, so the pass costs little more than the
decompression.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from mgprof.analyze.tracefile.gc_pause import gc_paused
from mgprof.analyze.tracefile.reduce import _MAX_DUR_US, _MAX_TS_US
from mgprof.analyze.tracefile.schema import Num, Text, _as_int, _as_str, _TraceOutline, dtype_bytes
from mgprof.analyze.tracefile.stream import (
    _event_chunks,
    _open_trace,
    _read_bytes,
    event_slices,
    events_key,
)
from mgprof.errors import TraceError

__all__ = ["FsdpEvents", "HostCollective", "HostSpan", "ProcessGroupInfo", "read_fsdp_events"]

_SPAN_PREFIX = "FSDP::"
_OP_PREFIX = "c10d::"
_NEEDLES = (b'"FSDP::', b'"c10d::', b"Process Group Name")
"""A slice of the event list holding none of these has nothing for this pass."""
_INT64 = 1 << 63


class HostSpan(msgspec.Struct, frozen=True):
    """One ``FSDP::*`` span on a host thread; times in the trace's µs."""

    name: str
    tid: str
    start: float
    end: float


class HostCollective(msgspec.Struct, frozen=True):
    """One ``c10d::*`` collective op on the thread that issued it."""

    name: str
    tid: str
    start: float
    end: float
    sizes: tuple[int, ...]
    """Bytes of its first two tensor arguments (output, input) where ``Input Dims`` × ``Input
    type`` give them; the larger is nccl-tests' buffer (the gathered output of an all-gather,
    the full input of a reduce-scatter)."""
    pg_name: str | None = None

    @property
    def nbytes(self) -> int | None:
        return max(self.sizes) if self.sizes else None


class ProcessGroupInfo(msgspec.Struct):
    """A process group as the trace describes it."""

    name: str
    """``Process Group Name`` / ``pg_config``'s ``pg_name``."""
    description: str | None = None
    """``Process Group Description`` / ``pg_desc`` (``default_pg``...)."""
    size: int | None = None
    ranks: list[int] | None = None
    """Global ranks in the group (``Process Group Ranks`` / ``pg_config``'s ``ranks``)."""


class FsdpEvents(msgspec.Struct):
    """What :func:`read_fsdp_events` found: spans and ops sorted by start."""

    spans: list[HostSpan]
    ops: list[HostCollective]
    groups: dict[str, ProcessGroupInfo]


class _Args(msgspec.Struct, gc=False):
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Input type")
    pg_name: Text = msgspec.field(default=None, name="Process Group Name")
    pg_desc: Text = msgspec.field(default=None, name="Process Group Description")
    pg_ranks: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Process Group Ranks")
    group_size: Num = msgspec.field(default=None, name="Group size")


class _Ev(msgspec.Struct, gc=False):
    ph: str | None = None
    name: str | None = None
    ts: Num = None
    dur: Num = None
    tid: Text = None
    args: _Args | None = None


class _PgConfig(msgspec.Struct):
    pg_name: Text = None
    pg_desc: Text = None
    pg_size: Num = None
    ranks: list[Any] | None = None


class _DistInfo(msgspec.Struct):
    pg_config: list[_PgConfig] | None = None


class _Tail(msgspec.Struct):
    traceEvents: list[_Ev] | None = None
    distributedInfo: msgspec.Raw = msgspec.Raw()


_DECODER = msgspec.json.Decoder(list[_Ev])


def _decode_slice(data: bytes) -> list[_Ev]:
    return _DECODER.decode(data) if any(n in data for n in _NEEDLES) else []


def _ranks(raw: object) -> list[int] | None:
    """``[0, 1]``, or the string ``"[0, 1]"`` some torch versions write."""
    if isinstance(raw, str):
        try:
            raw = msgspec.json.decode(raw)
        except msgspec.DecodeError:
            return None
    if not isinstance(raw, list) or len(raw) > 1 << 20:
        return None
    out = [_as_int(r) for r in raw]
    return None if any(r is None for r in out) else [r for r in out if r is not None]


def _numel(shape: object) -> int | None:
    """Elements of one ``Input Dims`` entry: a shape, or a list of shapes (tensor lists)."""
    if not isinstance(shape, list) or not shape:
        return None
    if all(type(d) is int and d >= 0 for d in shape):
        return math.prod(shape)
    parts = [_numel(s) for s in shape if isinstance(s, list)]
    known = [p for p in parts if p is not None]
    return sum(known) if known and len(known) == len(shape) else None


def _tensor_bytes(args: _Args | None) -> tuple[int, ...]:
    """Bytes of the op's first two tensor arguments (a ``c10d::*`` op lists output, input)."""
    if args is None or not args.input_dims or not args.input_type:
        return ()
    try:
        dims = msgspec.json.decode(args.input_dims)
        types = msgspec.json.decode(args.input_type)
    except msgspec.DecodeError:
        return ()
    if not isinstance(dims, list) or not isinstance(types, list):
        return ()
    out: list[int] = []
    for shape, typ in list(zip(dims, types))[:2]:
        size = dtype_bytes(typ) if isinstance(typ, str) else None
        n = _numel(shape)
        if size is None or n is None:
            continue
        nbytes = n * size
        if nbytes >= _INT64:
            return ()  # no tensor is this large: hostile Input Dims
        out.append(nbytes)
    return tuple(out)


class _Collector:
    """Keeps the FSDP spans, the c10d ops and the process groups while the events stream by."""

    def __init__(self) -> None:
        self.spans: list[HostSpan] = []
        self.ops: list[HostCollective] = []
        self.groups: dict[str, ProcessGroupInfo] = {}

    def feed(self, events: Iterable[_Ev]) -> None:
        for e in events:
            args = e.args
            if args is not None and args.pg_name is not None:
                self._group(args)
            name = e.name
            if e.ph != "X" or not name or not name.startswith((_SPAN_PREFIX, _OP_PREFIX)):
                continue
            ts, dur = e.ts, e.dur
            if ts is None or dur is None or not (-_MAX_TS_US < ts < _MAX_TS_US):
                continue
            if not 0.0 <= dur < _MAX_DUR_US:
                continue
            tid = _as_str(e.tid) or ""
            if name.startswith(_SPAN_PREFIX):
                self.spans.append(HostSpan(name, tid, float(ts), float(ts + dur)))
            else:
                pg = _as_str(args.pg_name) if args is not None else None
                self.ops.append(
                    HostCollective(name, tid, float(ts), float(ts + dur), _tensor_bytes(args), pg)
                )

    def _group(self, args: _Args) -> None:
        name = _as_str(args.pg_name)
        if name is None:
            return
        g = self.groups.setdefault(name, ProcessGroupInfo(name))
        if g.description is None:
            g.description = _as_str(args.pg_desc)
        if g.size is None:
            g.size = _as_int(args.group_size)
        if g.ranks is None and args.pg_ranks:
            try:
                g.ranks = _ranks(msgspec.json.decode(args.pg_ranks))
            except msgspec.DecodeError:
                pass

    def dist_info(self, raw: msgspec.Raw) -> None:
        if not raw:
            return
        try:
            info = msgspec.json.decode(raw, type=_DistInfo)
        except (msgspec.ValidationError, msgspec.DecodeError):
            return  # malformed metadata must not hide the spans
        for pg in info.pg_config or []:
            name = _as_str(pg.pg_name)
            if name is None:
                continue
            g = self.groups.setdefault(name, ProcessGroupInfo(name))
            g.description = g.description or _as_str(pg.pg_desc)
            g.size = g.size if g.size is not None else _as_int(pg.pg_size)
            g.ranks = g.ranks if g.ranks is not None else _ranks(pg.ranks)

    def result(self) -> FsdpEvents:
        self.spans.sort(key=lambda s: (s.start, -s.end))
        self.ops.sort(key=lambda o: o.start)
        return FsdpEvents(self.spans, self.ops, self.groups)


def _stream_file(path: Path) -> _Collector | None:
    """The events read ~1 MB of JSON at a time (as load_trace reads them); None where that does
    not work and the whole-document path decides."""
    found = _Collector()
    stream = _open_trace(path)
    with stream.raw:
        try:
            key = events_key(path, stream)
            if key is None:
                return None
            head_bytes, rest = key
            head = msgspec.json.decode(head_bytes, type=_TraceOutline)
            for events in event_slices(stream, rest, _decode_slice):
                found.feed(events)
            tail = msgspec.json.decode(b'{"traceEvents": [' + rest, type=_Tail)
        except (
            OSError,
            EOFError,
            zlib.error,
            msgspec.ValidationError,
            msgspec.DecodeError,
            TraceError,
        ):
            return None
    found.feed(tail.traceEvents or [])
    found.dist_info(tail.distributedInfo if len(tail.distributedInfo) else head.distributedInfo)
    return found


def _load_file(path: Path) -> _Collector:
    streamed = _stream_file(path)
    if streamed is not None:
        return streamed
    raw = _read_bytes(path)
    found = _Collector()
    try:
        outline = msgspec.json.decode(raw, type=_TraceOutline)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        msg = str(exc).replace("\n", " ")
        raise TraceError(f"{path}: not a readable Kineto/Chrome trace ({msg})") from None
    ranges = _event_chunks(outline.traceEvents)
    if ranges is None:
        raise TraceError(f"{path}: JSON has no 'traceEvents' list; pass a torch.profiler trace")
    view = memoryview(outline.traceEvents)
    try:
        for a, b in ranges:
            found.feed(_decode_slice(b"".join((b"[", view[a:b], b"]"))))
    except (msgspec.ValidationError, msgspec.DecodeError):
        found = _Collector()  # a cut fell inside a string: decode the list whole
        try:
            found.feed(msgspec.json.decode(outline.traceEvents, type=list[_Ev]))
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            msg = str(exc).replace("\n", " ")
            raise TraceError(f"{path}: not a readable Kineto/Chrome trace ({msg})") from None
    finally:
        view.release()
    found.dist_info(outline.distributedInfo)
    return found


def read_fsdp_events(source: str | Path | Sequence[Any] | Mapping[str, Any]) -> FsdpEvents:
    """The FSDP spans, c10d ops and process groups of a trace file, or of already-parsed events
    (a list of dicts, or a dict with ``traceEvents``); TraceError for an unreadable file.
    A malformed event in a list is skipped."""
    if isinstance(source, (str, Path)):
        path = Path(source)
        try:
            with gc_paused():
                return _load_file(path).result()
        except RecursionError:
            raise TraceError(f"{path}: JSON is nested too deeply to be a trace") from None
        except MemoryError:
            raise TraceError(f"{path}: ran out of memory while reading the trace") from None
    found = _Collector()
    if isinstance(source, Mapping):
        dist = source.get("distributedInfo")
        if dist is not None:
            found.dist_info(msgspec.Raw(msgspec.json.encode(dist)))
        source = source.get("traceEvents") or []
    for e in source:
        try:  # through JSON: the Raw fields decode only from it
            found.feed([msgspec.json.decode(msgspec.json.encode(e), type=_Ev)])
        except (msgspec.ValidationError, msgspec.DecodeError, TypeError, OverflowError):
            continue
    return found.result()
