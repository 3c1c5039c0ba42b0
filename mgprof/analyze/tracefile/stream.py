"""A trace file's bytes, bounded, and its ``traceEvents`` list decoded in slices.

Shared by the readers of one trace (:mod:`~mgprof.analyze.tracefile.load`, which reads a trace
whole or streaming, and :mod:`~mgprof.analyze.tracefile.split`, which reads one with two
processes): the size and compression-ratio limits, the gzip reader, finding
``"traceEvents": [`` and cutting the list at ``}, {`` gaps. Input is untrusted; every failure is
one TraceError line (see :mod:`~mgprof.analyze.tracefile.load` for the limits).
"""

from __future__ import annotations

import gzip
import os
import queue
import re
import threading
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, BinaryIO, TypeVar, cast

import msgspec

from mgprof.analyze.tracefile.reduce import _Reducer
from mgprof.analyze.tracefile.schema import _Event, _Trace, _TraceOutline
from mgprof.errors import TraceError
from mgprof.safe_read import format_size, open_regular, parse_size

_T = TypeVar("_T")


MAX_TRACE_ENV = "MGPROF_MAX_TRACE_BYTES"
"""Environment variable: the largest trace (bytes after decompression, or ``4G``, ``512M``)."""
DEFAULT_MAX_TRACE_BYTES = 4 << 30
"""4 GiB of JSON: several times the largest per-rank Kineto traces seen (~1 GiB)."""
MAX_GZIP_RATIO = 100
"""Real Kineto traces compress 10-30x (29x for the largest fixture); zeros compress ~1000x."""
_RATIO_FLOOR = 64 << 20
"""Decompressed bytes before the ratio is checked: small files may compress as they like."""
_FLAG_HINT = f"pass --max-trace-size SIZE (e.g. 8G) or set {MAX_TRACE_ENV} to read it"


def trace_size_limit() -> tuple[int, bool]:
    """(largest trace in bytes, whether the user set it) from ``MGPROF_MAX_TRACE_BYTES``.

    A limit the user set also lifts the compression-ratio check: they asked for that size.
    """
    raw = os.environ.get(MAX_TRACE_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_TRACE_BYTES, False
    try:
        return parse_size(raw), True
    except ValueError as exc:
        raise TraceError(f"{MAX_TRACE_ENV}: {exc}; set it like 8G, 512M or a byte count") from None


class _Bounded:
    """A trace's byte stream (decompressed when gzipped) that stops at the size limits.

    Past ``limit`` bytes, or, for gzip without a user-set limit, past ``MAX_GZIP_RATIO`` times
    the compressed bytes consumed (once ``_RATIO_FLOOR`` bytes are out), a read raises
    TraceError: a decompression bomb costs a bounded amount of time and memory.
    """

    def __init__(self, path: Path, fh: BinaryIO) -> None:
        self.path = path
        self.raw = fh
        self.limit, explicit = trace_size_limit()
        self.total = 0
        self.size = size = os.fstat(fh.fileno()).st_size
        self.gzipped = fh.read(2) == b"\x1f\x8b"
        fh.seek(0)
        self.check_ratio = self.gzipped and not explicit
        if not self.gzipped and size > self.limit:
            raise TraceError(
                f"{path}: trace is {format_size(size)}, over the {format_size(self.limit)} "
                f"limit on trace size; {_FLAG_HINT}"
            )
        self.stream: IO[bytes] = cast(IO[bytes], gzip.GzipFile(fileobj=fh) if self.gzipped else fh)
        self._gunzip: _Gunzip | None = None

    @contextmanager
    def prefetched(self) -> Iterator[None]:
        """Reads inside the block come from a :class:`_Gunzip` thread (gzip files only)."""
        if not self.gzipped:
            yield
            return
        gunzip, stream = _Gunzip(self.raw, _READ_BYTES), self.stream
        self.stream, self._gunzip = cast(IO[bytes], gunzip), gunzip
        try:
            yield
        finally:
            gunzip.close()
            self.stream, self._gunzip = stream, None

    def read(self, n: int) -> bytes:
        block = self.stream.read(n)
        self.total += len(block)
        if self.total > self.limit:
            raise TraceError(
                f"{self.path}: gzip trace expands past the {format_size(self.limit)} limit on "
                f"trace size; {_FLAG_HINT}"
            )
        if self.check_ratio and self.total > _RATIO_FLOOR:
            packed = max(self._gunzip.packed if self._gunzip else self.raw.tell(), 1)
            if self.total > MAX_GZIP_RATIO * packed:
                raise TraceError(
                    f"{self.path}: gzip data expands more than {MAX_GZIP_RATIO}x "
                    f"({format_size(self.total)} from {format_size(packed)}), as a "
                    "decompression bomb does and a profiler trace does not; if it is a real "
                    f"trace, {_FLAG_HINT}"
                )
        return block


_GZ_READ = 4 << 20
"""Compressed bytes read at a time by :class:`_Gunzip` (big: few steps that need the GIL)."""
_GZ_AHEAD = 3
"""Decompressed blocks :class:`_Gunzip` may hold ready (each ``_READ_BYTES`` at most)."""


class _Gunzip:
    """A gzip file decompressed by a background thread, a few blocks ahead of its reader.

    Inflating and checking the CRC take about a third of the time of reading a gzipped trace,
    and zlib runs without the GIL: on a second core it overlaps the decoding of the blocks
    before. The thread reads the file in large pieces and hands out blocks of at most
    ``block`` bytes, so its own Python steps (the only time it needs the GIL) are few. A
    truncated or corrupt file raises (EOFError, zlib.error) in the reader, whose caller then
    reads the file again with :class:`gzip.GzipFile` for the precise error. ``packed`` is the
    compressed bytes that produced the blocks read so far (for the compression-ratio check).
    """

    def __init__(self, fh: BinaryIO, block: int) -> None:
        self.packed = 0
        self._queue: queue.Queue[tuple[bytes, int] | BaseException] = queue.Queue(_GZ_AHEAD)
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(
            target=self._run, args=(fh, block), name="mgprof-gunzip", daemon=True
        )
        self._thread.start()

    def _put(self, item: tuple[bytes, int] | BaseException) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, fh: BinaryIO, block: int) -> None:
        try:
            member = zlib.decompressobj(wbits=31)
            fed = 0
            pending = b""
            while not self._stop.is_set():
                if not pending:
                    pending = fh.read(_GZ_READ)
                    fed += len(pending)
                    if not pending:
                        if not member.eof:
                            raise EOFError("compressed file ended before the end of its stream")
                        self._put((b"", fed))
                        return
                if member.eof:  # another member follows (gzip files may be concatenated)
                    member = zlib.decompressobj(wbits=31)
                out = member.decompress(pending, block)
                pending = member.unconsumed_tail or member.unused_data
                if out and not self._put((out, fed - len(pending))):
                    return
        except BaseException as exc:  # raised again in the reader's thread
            self._put(exc)

    def read(self, _n: int = -1) -> bytes:
        if self._done:
            return b""
        item = self._queue.get()
        if isinstance(item, BaseException):
            self._done = True
            raise item
        block, self.packed = item
        self._done = not block
        return block

    def close(self) -> None:
        """Stop the thread (it may be blocked handing out a block) and wait for it."""
        self._stop.set()
        while self._thread.is_alive():
            try:
                self._queue.get(timeout=0.05)
            except queue.Empty:
                pass
        self._thread.join()


def _open_trace(path: Path) -> _Bounded:
    hint = (
        "pass it as a trace folder"
        if path.is_dir()
        else "pass an existing trace file (.json or .json.gz) or a folder of them"
    )
    fh = open_regular(path, error=TraceError, hint=hint)
    try:
        return _Bounded(path, fh)
    except BaseException:
        fh.close()
        raise


def _read_bytes(path: Path) -> bytes:
    """The whole (decompressed) file, within the size limits."""
    bounded = _open_trace(path)
    with bounded.raw:
        try:
            if bounded.gzipped:
                raw = b"".join(iter(lambda: bounded.read(_READ_BYTES), b""))
            else:
                # read(n) allocates n bytes at once: ask for what is there (+1 to see growth)
                raw = bounded.raw.read(min(bounded.size, bounded.limit) + 1)
                bounded.total = len(raw)
                if bounded.total > bounded.limit:
                    raise TraceError(
                        f"{path}: trace grew past the {format_size(bounded.limit)} limit on "
                        f"trace size while it was read; {_FLAG_HINT}"
                    )
        except (EOFError, zlib.error) as exc:
            raise TraceError(
                f"{path}: gzip data is truncated or corrupt ({exc}); copy the file again"
            ) from None
        except OSError as exc:
            if bounded.gzipped and exc.errno is None:  # gzip.BadGzipFile and kin
                raise TraceError(
                    f"{path}: gzip data is truncated or corrupt ({exc}); copy the file again"
                ) from None
            raise TraceError(f"{path}: cannot read ({exc.strerror}); check permissions") from None
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
_KEY_SEARCH_BYTES = 64 << 20
"""How far into a file ``"traceEvents": [`` is looked for (torch.profiler writes it within the
first few KiB); past it, the whole-document decode decides (within the trace size limit)."""
_WHITESPACE = b" \t\r\n"
_GAP_LOOKBACK = 64
"""Bytes searched again for a ``}, {`` gap after a failed search (a gap cut by the end of the
data); one with more whitespace inside is missed, which only makes a slice longer."""


def _not_an_object(path: Path, first: int) -> TraceError:
    if first == ord("["):
        why = "not a Kineto/Chrome trace (top level is not a JSON object)"
        return TraceError(f"{path}: {why}; pass a torch.profiler trace file")
    return TraceError(
        f"{path}: not valid JSON (starts with byte 0x{first:02x}, not '{{'); the file may be "
        "corrupt or not a trace, export it again"
    )


def events_key(path: Path, stream: _Bounded) -> tuple[bytes, bytearray] | None:
    """Read ``stream`` up to and past ``"traceEvents": [`` (looked for in the first
    ``_KEY_SEARCH_BYTES``): the head closed as ``...[]}`` (decode it to check it is the start of
    a top-level object and read the keys before the list), and the bytes after the key; None
    when the key is not found there. A file that does not start with ``{`` is refused at once
    (TraceError), whatever its size. Shared by every reader that streams a trace."""
    buf = bytearray()
    first_checked = False
    while True:
        block = stream.read(_READ_BYTES)
        if not block:
            return None
        searched = max(0, len(buf) - 32)
        buf += block
        if not first_checked:
            stripped = block.lstrip(_WHITESPACE)  # the blocks before were all whitespace
            if stripped:
                if stripped[0] != ord("{"):
                    raise _not_an_object(path, stripped[0])
                first_checked = True
        m = _EVENTS_KEY_RE.search(buf, searched)
        if m is not None:
            break
        if len(buf) > _KEY_SEARCH_BYTES:
            return None
    head = bytes(buf[: m.end()]) + b"]}"
    del buf[: m.end()]
    return head, buf


def event_slices(stream: _Bounded, rest: bytearray, decode: Callable[[bytes], _T]) -> Iterator[_T]:
    """``decode`` of each slice of about ``_CHUNK_BYTES`` of the event list, read from
    ``stream`` after ``rest`` (the bytes after the key, from :func:`events_key`), cut at
    ``}, {`` gaps and passed as ``[...]``. A cut inside a string or a nested value makes that
    slice fail to decode: ``decode``'s error propagates and the caller decides. When the stream
    ends, ``rest`` holds the bytes after the last cut: the last events and the keys after the
    list, for the caller to decode as ``{"traceEvents": [`` + rest."""
    scan = 0  # no gap starts in rest[:scan]: a search that failed resumes there (linear time)
    while True:
        block = stream.read(_READ_BYTES)
        if block:
            rest += block
        pos = 0
        with memoryview(rest) as view:
            while len(rest) - pos > _CHUNK_BYTES:
                gap = _EVENT_GAP_RE.search(rest, max(pos + _CHUNK_BYTES, scan))
                if gap is None:
                    scan = max(len(rest) - _GAP_LOOKBACK, 0)
                    break
                # One copy per slice: the join reads the bytes through the view.
                yield decode(b"".join((b"[", view[pos : gap.start() + 1], b"]")))
                pos = gap.end() - 1
        if pos:
            del rest[:pos]  # the bytes after the last cut (less than a slice, or gapless)
            scan = max(scan - pos, 0)
        if not block:
            return


def _stream_events(
    path: Path, stream: _Bounded
) -> tuple[_Reducer, msgspec.Raw, msgspec.Raw] | None:
    """Reduce ``traceEvents`` while reading ``stream``; None when the layout is not recognised.

    The head (up to ``"traceEvents": [``, looked for in the first ``_KEY_SEARCH_BYTES``) is
    checked to be the start of a top-level object by decoding it closed as ``...[]}``; events
    are then decoded in slices of about 1 MB cut at ``}, {`` gaps (a cut inside a string or
    nested value makes the slice fail to decode), and the rest of the file, which holds the last
    events and the keys after the list, is decoded as a document of its own. Neither the whole
    file nor all decoded events are held at once. A file that does not start with ``{`` is
    refused at once (TraceError), whatever its size.
    """
    found = events_key(path, stream)
    if found is None:
        return None
    head_bytes, rest = found
    head = msgspec.json.decode(head_bytes, type=_TraceOutline)
    red = _Reducer()
    for events in event_slices(stream, rest, _EVENTS_DECODER.decode):
        red.feed(events)
    dist, props = reduce_tail(red, head, rest)
    return red, dist, props


def reduce_tail(
    red: _Reducer, head: _TraceOutline, rest: bytearray
) -> tuple[msgspec.Raw, msgspec.Raw]:
    """Feed the events left after the last slice (``rest``, from :func:`event_slices`) and
    return the trace's ``distributedInfo`` and ``deviceProperties`` (after the list, where
    torch.profiler writes them, else from the ``head`` before it)."""
    tail = msgspec.json.decode(b"".join((b'{"traceEvents": [', rest)), type=_Trace)
    red.feed(tail.traceEvents or [])
    dist = tail.distributedInfo if len(tail.distributedInfo) else head.distributedInfo
    props = tail.deviceProperties if len(tail.deviceProperties) else head.deviceProperties
    return dist, props
