"""Load one torch.profiler / Kineto trace (``.json`` or ``.json.gz``) into compact arrays.

Why this shape: a rank's trace can hold millions of events, but the analyses need only a few
columns of a few event classes. msgspec decodes straight into typed Structs that list only those
fields (every other field is skipped without being built), and :func:`load_trace` then reduces
them to numpy arrays and small lists and lets the decoded events go, so memory per rank stays
bounded by the arrays, not by the JSON.

Both Kineto schemas are read: the current one (``cat`` = ``kernel``, ``gpu_memcpy``,
``gpu_memset``, ``cuda_runtime``, ``cpu_op``, ``user_annotation``) and the 2021 one (``Kernel``,
``Memcpy``, ``Memset``, ``Runtime``, ``Operator``; string ``tid`` such as ``"stream 7"``). ROCm
traces use the current names. Timestamps stay floats (fractional microseconds are kept as they
are, never rounded). A device event whose ``dur`` is missing, negative or not finite cannot be
placed on a timeline: it is skipped and counted in :attr:`RankTrace.skipped_device_events`.

This module reads the file and decodes ``traceEvents`` in bounded slices; the decoded fields are
in :mod:`~mgprof.analyze.trace_schema`, their reduction in :mod:`~mgprof.analyze.trace_reduce`,
GEMM/conv FLOP estimates in :mod:`~mgprof.analyze.flop_estimate` and the result type in
:mod:`~mgprof.analyze.rank_trace`. The names other modules use are re-exported here.
"""

from __future__ import annotations

import gc
import gzip
import re
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, cast

import msgspec

from mgprof.analyze.flop_estimate import (
    FLOPS_ESTIMATED,
    PREC_FP32,
    PREC_FP64,
    PREC_REDUCED,
    estimate_flops,
)
from mgprof.analyze.rank_trace import (
    KIND_COMM,
    KIND_COMPUTE,
    KIND_MEMCPY,
    KIND_MEMSET,
    CommArgs,
    CpuCommOp,
    RankTrace,
    Step,
)
from mgprof.analyze.trace_reduce import COMM_KERNEL_RE, _Reducer, rank_from_filename
from mgprof.analyze.trace_schema import (
    _device_props,
    _dist_info,
    _Event,
    _Trace,
    _TraceOutline,
    dtype_bytes,
)
from mgprof.errors import TraceError

__all__ = [
    "COMM_KERNEL_RE",
    "FLOPS_ESTIMATED",
    "KIND_COMM",
    "KIND_COMPUTE",
    "KIND_MEMCPY",
    "KIND_MEMSET",
    "PREC_FP32",
    "PREC_FP64",
    "PREC_REDUCED",
    "CommArgs",
    "CpuCommOp",
    "RankTrace",
    "Step",
    "dtype_bytes",
    "estimate_flops",
    "load_trace",
    "rank_from_filename",
]


def _read_bytes(path: Path) -> bytes:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file; pass an existing trace file or folder") from None
    except IsADirectoryError:
        raise TraceError(f"{path}: is a folder; pass it as a trace folder") from None
    except OSError as exc:
        raise TraceError(f"{path}: cannot read ({exc.strerror}); check permissions") from None
    if not raw or raw.isspace():
        raise TraceError(f"{path}: file is empty; re-export the trace from torch.profiler")
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (EOFError, OSError, zlib.error) as exc:
            raise TraceError(
                f"{path}: gzip data is truncated or corrupt ({exc}); copy the file again"
            ) from None
        if not raw or raw.isspace():
            raise TraceError(f"{path}: file is empty; re-export the trace from torch.profiler")
    return raw


def _decode(path: Path, raw: bytes) -> _Trace:
    try:
        return msgspec.json.decode(raw, type=_Trace)
    except msgspec.ValidationError as exc:
        msg = str(exc).replace("\n", " ")
        if "Expected `object`" in msg and "$." not in msg:
            msg = "top level is not a JSON object"
        raise TraceError(
            f"{path}: not a Kineto/Chrome trace ({msg}); pass a torch.profiler trace file"
        ) from None
    except msgspec.DecodeError as exc:
        msg = str(exc).replace("\n", " ")
        raise TraceError(
            f"{path}: not valid JSON ({msg}); the file may be truncated, export it again"
        ) from None


# --- Loading ---------------------------------------------------------------------------------
_CHUNK_BYTES = 1 << 20  # JSON bytes of traceEvents decoded at a time
_EVENT_GAP_RE = re.compile(rb"}\s*,\s*{")
_EVENTS_DECODER = msgspec.json.Decoder(list[_Event])


def _event_chunks(raw_events: msgspec.Raw) -> list[tuple[int, int]] | None:
    """(start, end) byte ranges of ``traceEvents`` that each hold whole events, or None.

    Ranges are cut at ``}, {`` gaps between array elements; whether a cut really fell between
    two events (and not inside a string or a nested list) is checked when the slice is decoded:
    a cut anywhere else leaves an unbalanced slice that fails to decode.
    """
    view = memoryview(raw_events)
    n = len(view)
    lo, hi = 0, n
    while lo < hi and view[lo] in b" \t\r\n":
        lo += 1
    while hi > lo and view[hi - 1] in b" \t\r\n":
        hi -= 1
    if hi - lo < 2 or view[lo] != ord("[") or view[hi - 1] != ord("]"):
        return None
    lo, hi = lo + 1, hi - 1
    ranges = []
    pos = lo
    while pos < hi:
        target = pos + _CHUNK_BYTES
        m = _EVENT_GAP_RE.search(view, target, hi) if target < hi else None
        if m is None:
            ranges.append((pos, hi))
            break
        ranges.append((pos, m.start() + 1))
        pos = m.end() - 1
    return ranges


_READ_BYTES = 1 << 20  # file bytes (decompressed) read at a time by the streaming path
_EVENTS_KEY_RE = re.compile(rb'"traceEvents"\s*:\s*\[')


def _stream_events(stream: IO[bytes]) -> tuple[_Reducer, msgspec.Raw, msgspec.Raw] | None:
    """Reduce ``traceEvents`` while reading ``stream``; None when the layout is not recognised.

    The head (up to ``"traceEvents": [``) is checked to be the start of a top-level object by
    decoding it closed as ``...[]}``; events are then decoded in slices of about 1 MB cut at
    ``}, {`` gaps (a cut inside a string or nested value makes the slice fail to decode), and the
    rest of the file, which holds the last events and the keys after the list, is decoded as a
    document of its own. Neither the whole file nor all decoded events are held at once.
    """
    buf = b""
    while True:
        block = stream.read(_READ_BYTES)
        if not block:
            return None
        searched = max(0, len(buf) - 32)
        buf += block
        m = _EVENTS_KEY_RE.search(buf, searched)
        if m is not None:
            break
    head = msgspec.json.decode(buf[: m.end()] + b"]}", type=_TraceOutline)
    rest = buf[m.end() :]
    del buf
    red = _Reducer()
    while True:
        block = stream.read(_READ_BYTES)
        if block:
            rest = b"".join((rest, block)) if rest else block
        pos = 0
        with memoryview(rest) as view:
            while len(rest) - pos > _CHUNK_BYTES:
                gap = _EVENT_GAP_RE.search(rest, pos + _CHUNK_BYTES)
                if gap is None:
                    break
                # One copy per slice: the join reads the bytes through the view (slicing a
                # bytearray and joining copied each slice twice, in fresh pages each time).
                red.feed(
                    _EVENTS_DECODER.decode(b"".join((b"[", view[pos : gap.start() + 1], b"]")))
                )
                pos = gap.end() - 1
        if pos:
            rest = rest[pos:]
        if not block:
            break
    tail = msgspec.json.decode(b"".join((b'{"traceEvents": [', rest)), type=_Trace)
    del rest
    red.feed(tail.traceEvents or [])
    dist = tail.distributedInfo if len(tail.distributedInfo) else head.distributedInfo
    props = tail.deviceProperties if len(tail.deviceProperties) else head.deviceProperties
    return red, dist, props


def _load_streaming(p: Path) -> RankTrace | None:
    """``load_trace`` reading the file in pieces; None where the in-memory path must decide."""
    try:
        f = open(p, "rb")  # noqa: SIM115 - closed below, the gzip reader wraps it
    except OSError:
        return None
    with f:
        try:
            gzipped = f.read(2) == b"\x1f\x8b"
            stream = cast(IO[bytes], gzip.GzipFile(fileobj=f) if gzipped else f)
            f.seek(0)
            got = _stream_events(stream)
        except (OSError, EOFError, zlib.error, msgspec.ValidationError, msgspec.DecodeError):
            return None
    if got is None:
        return None
    red, dist_raw, props_raw = got
    return red.finish(p, _dist_info(dist_raw), _device_props(props_raw))


def load_trace(path: str | Path) -> RankTrace:
    """Read, decode and reduce one rank's trace; raise :class:`TraceError` on bad input.

    The file is read and decoded in pieces (``_stream_events``), so neither the whole file nor
    all its decoded events are in memory at once. Where that does not apply (a layout it does
    not recognise, or bad input, whose precise error the whole-document decode gives), the file
    is decompressed into memory once; ``traceEvents`` is then decoded about 1 MB of JSON at a
    time, and each slice is reduced and dropped before the next is decoded.
    """
    p = Path(path)
    with _gc_paused():
        return _load(p)


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a trace is reduced.

    Reducing allocates ~10^5 container objects (event tuples, launch records) that all stay
    alive until the end, so the collector's passes over them would find nothing to free; they
    cost ~5-10 % of the load time. Nothing reduced here forms a cycle that needs the collector.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _load(p: Path) -> RankTrace:
    streamed = _load_streaming(p)
    if streamed is not None:
        return streamed
    raw = _read_bytes(p)
    outline: _TraceOutline | None
    try:
        outline = msgspec.json.decode(raw, type=_TraceOutline)
    except (msgspec.ValidationError, msgspec.DecodeError):
        outline = None  # the full decode below gives the precise error
    ranges = _event_chunks(outline.traceEvents) if outline is not None else None
    red: _Reducer | None = None
    if outline is not None and ranges is not None:
        red = _Reducer()
        view = memoryview(outline.traceEvents)
        try:
            for a, b in ranges:
                red.feed(_EVENTS_DECODER.decode(b"".join((b"[", view[a:b], b"]"))))
        except (msgspec.ValidationError, msgspec.DecodeError):
            red = None  # a cut fell inside an event or an event is malformed: decode it whole
        del view
    if red is None:
        trace = _decode(p, raw)
        if trace.traceEvents is None:
            raise TraceError(
                f"{p}: JSON has no 'traceEvents' list, so it is not a Kineto/Chrome trace; "
                "pass a torch.profiler trace file"
            )
        red = _Reducer()
        red.feed(trace.traceEvents)
        dist_raw, props_raw = trace.distributedInfo, trace.deviceProperties
        del trace
    else:
        assert outline is not None
        dist_raw, props_raw = outline.distributedInfo, outline.deviceProperties
    dist = _dist_info(dist_raw)
    props = _device_props(props_raw)
    del outline, dist_raw, props_raw, raw
    return red.finish(p, dist, props)
