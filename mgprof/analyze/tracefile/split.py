"""One large trace read by two processes: this one reduces the first part of its events, a forked
child the rest, and the child's reducer is joined to this one's (:mod:`reducer_merge`).

Why: a job of many ranks keeps every core busy with one rank each, but ``mgprof trace`` on one
rank's trace would leave all cores but one idle, and reducing the events is pure Python, so
threads cannot share it. A fork is cheap (the modules are already imported) and the child needs
nothing from this process but the file's path.

Both processes read the file from its start (gzip cannot be entered in the middle) and cut the
event list into the same slices (the cut points depend on the bytes only); this process reduces
the slices that start before ``cut`` bytes of the list, the child the others and the tail (the
keys after the list). The child reads its slices before the cut only to find the time origin
(the first complete event), which both parts must share. The result is the RankTrace a single
reader would have produced, bit for bit (tests/test_trace_split.py).

Used only where it is safe and worth it: on Linux (fork without exec is unsafe on macOS), from a
process with no other thread (a thread holding a lock at the fork would leave it held in the
child), for traces of at least ``SPLIT_MIN_BYTES`` of JSON. Anything the split cannot read (a
cut inside a string, a malformed event, a size limit, a truncated file) returns None, and the
caller reads the file alone, which gives the precise error or the slower reading that copes.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
import zlib
from pathlib import Path

import msgspec

from mgprof.analyze.tracefile.merge import Unjoinable, absorb
from mgprof.analyze.tracefile.rank_trace import RankTrace
from mgprof.analyze.tracefile.reduce import _Reducer
from mgprof.analyze.tracefile.schema import _device_props, _dist_info, _TraceOutline
from mgprof.analyze.tracefile.stream import (
    _EVENTS_DECODER,
    _open_trace,
    event_slices,
    events_key,
    reduce_tail,
)
from mgprof.errors import TraceError
from mgprof.safe_read import open_regular

__all__ = ["SPLIT_MIN_BYTES", "can_split", "load_split"]

SPLIT_MIN_BYTES = 64 << 20
"""JSON bytes below which one process reads the trace. Measured on 2 cores: a wash or a loss
at 10-35 MB (the fork, the hand-over and two inflating threads cost what the second core
gives back), 17-37 % faster at 87-360 MB (docs/benchmarks-trace.md)."""
SPLIT_AT = 0.55
"""Share of the event list this process reduces: the child first reads through the rest."""
_FAILURES = (OSError, EOFError, zlib.error, msgspec.ValidationError, msgspec.DecodeError)


def can_split() -> bool:
    """Whether this process may fork a reader now (Linux, no other thread running)."""
    return sys.platform == "linux" and hasattr(os, "fork") and _threads_running() == 1


def _threads_running() -> int:
    return threading.active_count()


def json_size(path: Path) -> int:
    """The trace's JSON size: the file's, or for gzip its trailer's (the last member's size
    mod 2^32, so an estimate: it only places the cut). TraceError for what is not a regular
    file (a FIFO is refused, not opened)."""
    with open_regular(path, error=TraceError) as fh:
        size = os.fstat(fh.fileno()).st_size
        if fh.read(2) != b"\x1f\x8b" or size < 18:
            return size
        fh.seek(size - 4)
        return max(int.from_bytes(fh.read(4), "little"), size)


def load_split(path: Path, at: float = SPLIT_AT, min_bytes: int | None = None) -> RankTrace | None:
    """The trace at ``path`` reduced by this process and a forked child; None when the split
    does not apply (under ``min_bytes``, default ``SPLIT_MIN_BYTES``) or could not read the
    file (the caller then reads it alone)."""
    if not can_split():
        return None
    try:
        total = json_size(path)
    except (OSError, TraceError):
        return None
    if total < (SPLIT_MIN_BYTES if min_bytes is None else min_bytes):
        return None
    cut = int(total * at)
    read_end, write_end = os.pipe()
    try:
        pid = os.fork()
    except OSError:  # no process to spare (EAGAIN, ENOMEM): one reader then
        os.close(read_end)
        os.close(write_end)
        return None
    if pid == 0:  # the child: never returns into the caller's code
        os.close(read_end)
        _child(path, cut, write_end)
    os.close(write_end)
    mine = None
    reaped = False
    try:
        with os.fdopen(read_end, "rb") as fh:
            mine = _reduce_part(path, cut, later=False)
            if mine is not None:
                payload = fh.read()
                exit_status = os.waitpid(pid, 0)[1]
                reaped = True
    finally:
        if not reaped:  # this part failed (or was interrupted): the child's work is not needed
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    if mine is None or exit_status != 0:  # the child killed (for memory?) or it could not write
        return None
    try:
        # Only this pipe's other end, the child forked above, wrote these bytes: its own reducer.
        status, *got = pickle.loads(payload)
    except (EOFError, pickle.UnpicklingError):
        return None
    if status == "error":
        raise RuntimeError(f"the second reader of {path} failed: {got[0]}")
    if status != "ok":
        return None
    first = mine[0]
    later, dist, props = got
    try:
        absorb(first, later)
    except Unjoinable:
        return None
    return first.finish(path, _dist_info(msgspec.Raw(dist)), _device_props(msgspec.Raw(props)))


def _reduce_part(path: Path, cut: int, later: bool) -> tuple[_Reducer, bytes, bytes] | None:
    """The reducer of the event slices that start before ``cut`` bytes of the list, or with
    ``later`` of those from ``cut`` on and of the tail, with the raw ``distributedInfo`` and
    ``deviceProperties`` (empty for the first part); None where the file cannot be read so."""
    try:
        bounded = _open_trace(path)
        with bounded.raw, bounded.prefetched():
            found = events_key(path, bounded)
            if found is None:
                return None
            head_bytes, rest = found
            red = _Reducer()
            if later:
                red.flop_values = []
            offset = 0
            for raw in event_slices(bounded, rest, _same):
                if (offset >= cut) == later:  # a slice of this part
                    red.feed(_EVENTS_DECODER.decode(raw))
                elif not later:  # past the cut: the first part is done
                    return red, b"", b""
                elif red.base is None:  # before the cut, where the time origin may lie
                    red.find_base(_EVENTS_DECODER.decode(raw))
                offset += len(raw)
            if not later:
                return red, b"", b""
            head = msgspec.json.decode(head_bytes, type=_TraceOutline)
            dist, props = reduce_tail(red, head, rest)
            return red, bytes(dist), bytes(props)
    except (*_FAILURES, TraceError):
        return None


def _child(path: Path, cut: int, write_end: int) -> None:
    """Reduce the later part, send it down the pipe and leave without running any of the
    parent's exit code (atexit handlers, buffered output) or signal handlers: Ctrl-C or a
    stop ends the child at once, and the parent, told the same, stops as it would alone."""
    code = 1  # unless the payload is written whole: the parent then reads the file alone
    try:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        try:
            got = _reduce_part(path, cut, later=True)
            payload = pickle.dumps(("ok", *got) if got else ("none",), protocol=5)
        except (MemoryError, RecursionError):  # one reader then gives the precise error
            payload = pickle.dumps(("none",))
        except BaseException as exc:  # a bug: the parent raises it
            payload = pickle.dumps(("error", f"{type(exc).__name__}: {exc}"))
        with os.fdopen(write_end, "wb") as fh:
            fh.write(payload)
        code = 0
    finally:
        os._exit(code)


def _same(raw: bytes) -> bytes:
    return raw
