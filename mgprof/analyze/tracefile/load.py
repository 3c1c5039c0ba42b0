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
placed on a timeline: it is skipped and counted in :attr:`RankTrace.skipped_device_events`; so
is any event whose ``ts``/``dur`` is beyond what a profiler writes (|ts| ≥ 1e18 us, dur ≥ 1e15
us), counted in the trace's notes, so that no figure overflows to inf.

Input is untrusted: only regular files are opened (a FIFO or ``/dev/zero`` is refused, see
:mod:`mgprof.safe_read`); a trace may expand to ``MGPROF_MAX_TRACE_BYTES`` (default 4 GiB; the
``--max-trace-size`` flag sets it), and gzip data that expands more than ``MAX_GZIP_RATIO`` times
is refused once 64 MiB are out, unless the user set the limit; ``"traceEvents": [`` is looked
for in the first 64 MiB only. Every failure, deep nesting and running out of memory included,
is one TraceError line.

This module reads the file and decodes ``traceEvents`` in bounded slices; the decoded fields are
in :mod:`~mgprof.analyze.tracefile.schema`, their reduction in
:mod:`~mgprof.analyze.tracefile.reduce`,
GEMM/conv FLOP estimates in :mod:`~mgprof.analyze.tracefile.flop_estimate` and the result type in
:mod:`~mgprof.analyze.tracefile.rank_trace`. The names other modules use are re-exported here.
"""

from __future__ import annotations

import re
import zlib
from pathlib import Path

import msgspec

from mgprof.analyze.tracefile.flop_estimate import (
    FLOPS_ESTIMATED,
    PREC_FP32,
    PREC_FP64,
    PREC_REDUCED,
    estimate_flops,
)
from mgprof.analyze.tracefile.gc_pause import gc_paused as _gc_paused
from mgprof.analyze.tracefile.rank_trace import (
    KIND_COMM,
    KIND_COMPUTE,
    KIND_MEMCPY,
    KIND_MEMSET,
    CommArgs,
    CpuCommOp,
    RankTrace,
    Step,
)
from mgprof.analyze.tracefile.reduce import COMM_KERNEL_RE, _Reducer, rank_from_filename
from mgprof.analyze.tracefile.schema import (
    _device_props,
    _dist_info,
    _TraceOutline,
    dtype_bytes,
)
from mgprof.analyze.tracefile.stream import (
    _EVENTS_DECODER,
    DEFAULT_MAX_TRACE_BYTES,
    MAX_GZIP_RATIO,
    MAX_TRACE_ENV,
    _decode,
    _event_chunks,
    _open_trace,
    _read_bytes,
    _stream_events,
    trace_size_limit,
)
from mgprof.errors import TraceError

__all__ = [
    "COMM_KERNEL_RE",
    "DEFAULT_MAX_TRACE_BYTES",
    "FLOPS_ESTIMATED",
    "KIND_COMM",
    "KIND_COMPUTE",
    "KIND_MEMCPY",
    "KIND_MEMSET",
    "MAX_GZIP_RATIO",
    "MAX_TRACE_ENV",
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
    "trace_size_limit",
]


def _load_streaming(p: Path) -> RankTrace | None:
    """``load_trace`` reading the file in pieces; None where the in-memory path must decide.

    Errors that no decode can change (not a regular file, over a size limit, not starting with
    ``{``) are raised here as TraceError.
    """
    bounded = _open_trace(p)
    with bounded.raw, bounded.prefetched():
        try:
            got = _stream_events(p, bounded)
        except (OSError, EOFError, zlib.error, msgspec.ValidationError, msgspec.DecodeError):
            return None
    if got is None:
        return None
    red, dist_raw, props_raw = got
    return red.finish(p, _dist_info(dist_raw), _device_props(props_raw))


def load_trace(path: str | Path, processes: int = 1) -> RankTrace:
    """Read, decode and reduce one rank's trace; raise :class:`TraceError` on bad input.

    The file is read and decoded in pieces (``_stream_events``), so neither the whole file nor
    all its decoded events are in memory at once. Where that does not apply (a layout it does
    not recognise, or bad input, whose precise error the whole-document decode gives), the file
    is decompressed into memory once; ``traceEvents`` is then decoded about 1 MB of JSON at a
    time, and each slice is reduced and dropped before the next is decoded. With
    ``processes`` ≥ 2, a large trace may be read by this process and a forked one, each
    reducing part of it (:mod:`~mgprof.analyze.tracefile.split`); the result is the same.
    """
    p = Path(path)
    try:
        with _gc_paused():
            if processes >= 2:
                from mgprof.analyze.tracefile.split import load_split

                split = load_split(p)
                if split is not None:
                    return split
            return _load(p)
    except RecursionError:
        raise TraceError(
            f"{p}: JSON is nested too deeply (about 1000 levels or more), as no profiler trace "
            "is; pass a torch.profiler trace file"
        ) from None
    except MemoryError:
        raise TraceError(
            f"{p}: ran out of memory while loading the trace; free memory, or pass "
            "--workers 1 so that one trace is loaded at a time"
        ) from None


_LONE_SURROGATE = re.compile(
    rb"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
    rb"|(?<![0-9a-fA-F]{2})(?<!\\u[dD][89abAB])\\u[dD][c-fC-F][0-9a-fA-F]{2}"
)
"""A ``\\uD800``-``\\uDFFF`` escape that is not half of a pair: valid JSON, but no string can
hold it, so the decoder refuses the whole trace."""


def _escape_lone_surrogates(raw: bytes) -> bytes:
    """``raw`` with each lone surrogate escape written as its text (``\\ud800`` shows as
    ``\ud800``): one odd kernel name must not refuse the trace (the fallback path only: the
    streaming decode of a trace without one never comes here)."""
    if b"\\u" not in raw:
        return raw
    return _LONE_SURROGATE.sub(lambda m: b"\\" + m.group(0), raw)


def _load(p: Path) -> RankTrace:
    streamed = _load_streaming(p)
    if streamed is not None:
        return streamed
    raw = _escape_lone_surrogates(_read_bytes(p))
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
