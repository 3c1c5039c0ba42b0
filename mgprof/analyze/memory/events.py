"""Allocation curve, peak and the allocations live at the peak, per device, from the memory
events torch.profiler writes with ``profile_memory=True``.

Each allocation and free is an instant event named ``[memory]`` whose ``args`` hold ``Addr``,
``Bytes`` (negative for a free), ``Total Allocated``, ``Total Reserved``, ``Device Type`` (0 CPU,
1 CUDA) and ``Device Id``; the 2021 schema writes only ``Bytes`` and the device. Replaying
``Addr``/``Bytes`` in time order pairs each free with its allocation, so the blocks live at the
peak are known, and each is attributed to the innermost annotation (``record_function``,
``mgprof.region``) and the innermost operator running on its thread when it was allocated.

Pure analysis: numpy and msgspec, never torch. A trace file is opened with the loader's bounds
(:mod:`~mgprof.analyze.tracefile.load`: regular files only, size and gzip-ratio limits) and read
and decoded about 1 MB of JSON at a time into a few columns, so memory is bounded by those
columns, not by the file or its decoded events.
"""

from __future__ import annotations

import math
import os
import zlib
from array import array
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from mgprof.analyze.tracefile.gc_pause import gc_paused as _gc_paused
from mgprof.analyze.tracefile.reduce import (
    _ANNOTATION_PREFIXES,
    _MAX_DUR_US,
    _MAX_TS_US,
    _step_number,
)
from mgprof.analyze.tracefile.schema import Num, Text, _as_int, _TraceOutline
from mgprof.analyze.tracefile.stream import (
    _event_chunks,
    _open_trace,
    _read_bytes,
    event_slices,
    events_key,
)
from mgprof.errors import TraceError

__all__ = ["DEFINITIONS", "memory_timeline"]

MIB = float(1 << 20)
_DIGITS = 6
"""MiB and ms are rounded to 6 decimals (a byte, a nanosecond), the same way everywhere, so
that the curve's highest point equals ``peak_allocated_mib`` exactly."""
_INT64 = 1 << 63
_NO_ADDR = -_INT64
_MAX_STEPS = 10_000
_DEVICE_TYPES = {0: "cpu", 1: "cuda", 12: "xpu", 13: "mps", 20: "privateuse1"}
"""c10::DeviceType codes as torch.profiler writes them (ROCm reports its GPUs as CUDA)."""

DEFINITIONS = {
    "time_ms": "milliseconds since the trace's first timed event (metadata events excluded); "
    "trace_start_us is that event's ts as written in the trace",
    "curve": "one point per memory event of the device, in time order (ties in file order): "
    "the allocated total after it (basis total_allocated: the event's 'Total Allocated', which "
    "on CPU counts only what the profiler saw allocated; replayed: the running sum of the "
    "replay below, where events lack 'Total Allocated'; sum_of_bytes: the running sum of "
    "'Bytes' from 0 at the first event, where events carry no Addr either, as in 2021 traces); "
    "beyond max_points, the first and last points and the lowest and highest point of each of "
    "(max_points - 2) // 2 equal runs of events are kept, so the peak point is always kept",
    "peak_allocated_mib": "the highest point of the curve (its first occurrence); "
    "peak_time_ms its time",
    "peak_reserved_mib": "the highest 'Total Reserved' of the device's events",
    "peak_step": "N of the ProfilerStep#N span containing the peak time (the latest-starting "
    "one, on any thread)",
    "peak_region/peak_op": "the innermost annotation (user_annotation other than ProfilerStep#N: "
    "record_function, mgprof.region, Optimizer.step#...) and the innermost operator (cpu_op) on "
    "the peak event's thread whose [ts, ts + dur] contains it; null: none does. In 2021 "
    "traces regions are Operators too: only ProfilerStep#, Optimizer.step#, "
    "enumerate(DataLoader)# and DistributedDataParallel.forward are told apart as annotations",
    "replay": "events in time order; a positive Bytes allocates at Addr, a negative Bytes at "
    "an Addr allocated in the window frees that block; a free whose block was allocated before "
    "the trace window is counted in unknown_frees and otherwise ignored; an allocation at an "
    "Addr still live ends the earlier block there (its free was not recorded)",
    "replayed_peak_mib": "the highest running sum of the blocks allocated in the window and "
    "live (the replay); below peak_allocated_mib by what was allocated before the window",
    "live_at_peak": "the blocks allocated in the window and not yet freed at the peak event "
    "(that event included); mib their bytes, count their number; unattributed_mib = "
    "peak_allocated_mib - mib: memory allocated before the trace window, which has no site",
    "sites": "live blocks grouped by site = (region, op) at their allocation, as for peak_region/"
    "peak_op; mib, count, largest_mib per site; ordered by mib, the top ones; other_mib the rest",
    "growth": "the curve at the device's first and last memory events and the difference: "
    "compare with the process's RSS growth over the traced steps",
}

# --- decoding -------------------------------------------------------------------------------


class _MemArgs(msgspec.Struct, gc=False):
    """The ``args`` of a ``[memory]`` event; every other event's args decode to all None."""

    addr: Num = msgspec.field(default=None, name="Addr")
    nbytes: Num = msgspec.field(default=None, name="Bytes")
    allocated: Num = msgspec.field(default=None, name="Total Allocated")
    reserved: Num = msgspec.field(default=None, name="Total Reserved")
    device_type: Num = msgspec.field(default=None, name="Device Type")
    device_id: Num = msgspec.field(default=None, name="Device Id")


class _Ev(msgspec.Struct, gc=False):
    ph: str | None = None
    cat: str | None = None
    name: str | None = None
    ts: Num = None
    dur: Num = None
    pid: Text = None
    tid: Text = None
    args: _MemArgs | None = None


class _MemTrace(msgspec.Struct):
    traceEvents: list[_Ev] | None = None


_DECODER = msgspec.json.Decoder(list[_Ev])
_KIND_ANNOTATION, _KIND_OP, _KIND_STEP, _KIND_NONE = 0, 1, 2, 3


def _span_kind(cat: str | None, name: str) -> int:
    """What a complete event is to the attribution: annotation, operator, step, or nothing."""
    c = cat.lower() if cat else "operator"  # no cat: a trace older than 2021's, as an Operator
    if name.startswith("ProfilerStep#"):
        return _KIND_STEP if c in ("user_annotation", "operator", "cpu_op") else _KIND_NONE
    if c == "user_annotation":
        return _KIND_ANNOTATION
    if c == "cpu_op":
        return _KIND_OP
    if c == "operator":  # 2021 schema: regions are Operators too; only known names tell them
        return _KIND_ANNOTATION if name.startswith(_ANNOTATION_PREFIXES) else _KIND_OP
    return _KIND_NONE


def _int64(v: Num) -> int | None:
    if type(v) is int:  # the common case, without _as_int's checks
        return v if -_INT64 <= v < _INT64 else None
    return _as_int(v)


def _addr(v: Num) -> int:
    """Addr as a signed 64-bit int (an address with the top bit set wraps); _NO_ADDR if none."""
    if type(v) is int and _INT64 <= v < 2 * _INT64:
        return v - 2 * _INT64
    n = _int64(v)
    return _NO_ADDR if n is None else n


def _total(v: Num) -> float:
    """A byte total as float; NaN when missing, negative or not finite."""
    if type(v) is int:
        return float(v) if 0 <= v < _INT64 else math.nan
    if type(v) is float:
        return v if 0 <= v < math.inf else math.nan
    return math.nan


class _Columns:
    """Memory events, spans and steps reduced to flat columns while the events stream by."""

    def __init__(self) -> None:
        self.first_ts = math.inf
        self.skipped = 0
        self.m_ts, self.m_bytes, self.m_addr = array("d"), array("q"), array("q")
        self.m_alloc, self.m_resv = array("d"), array("d")
        self.m_dev, self.m_thread = array("i"), array("i")
        self.s_start, self.s_end = array("d"), array("d")
        self.s_thread, self.s_kind, self.s_name = array("i"), array("b"), array("i")
        self.steps: list[tuple[int, float, float]] = []
        self.devices: dict[tuple[int, int], int] = {}
        self.names: dict[str, int] = {}
        self._threads: dict[tuple[str, str], int] = {}
        self._raw_threads: dict[tuple[Text, Text], int] = {}
        self._raw_devices: dict[tuple[Num, Num], int] = {}
        self._kinds: dict[tuple[str | None, str], int] = {}

    def _thread(self, pid: Text, tid: Text) -> int:
        key = (pid, tid)
        ix = self._raw_threads.get(key)
        if ix is None:  # 2021 traces write one thread's tid as 25738 and as "25738"
            norm = (str(pid), str(tid))
            ix = self._raw_threads[key] = self._threads.setdefault(norm, len(self._threads))
        return ix

    def feed(self, events: Iterable[_Ev]) -> None:
        first = self.first_ts
        for e in events:
            ts = e.ts
            if ts is None or e.ph == "M" or not -_MAX_TS_US < ts < _MAX_TS_US:
                continue
            if ts < first:
                first = ts
            name = e.name
            if name == "[memory]":
                self._memory(e, ts)
            elif name is not None and e.ph == "X":
                self._span(e, name, ts)
        self.first_ts = first

    def _device(self, kind: Num, ix: Num) -> int:
        dev = self._raw_devices.get((kind, ix))
        if dev is None:
            key = (_as_int(kind) or 0, _as_int(ix) or 0)
            if key[0] == 0:
                key = (0, 0)  # the CPU's Device Id is -1 in one torch version, 0 in another
            dev = self._raw_devices[(kind, ix)] = self.devices.setdefault(key, len(self.devices))
        return dev

    def _memory(self, e: _Ev, ts: float) -> None:
        a = e.args
        nbytes = _int64(a.nbytes) if a is not None else None
        if a is None or nbytes is None:
            self.skipped += 1
            return
        self.m_ts.append(ts)
        self.m_bytes.append(nbytes)
        self.m_addr.append(_addr(a.addr))
        self.m_alloc.append(_total(a.allocated))
        self.m_resv.append(_total(a.reserved))
        self.m_dev.append(self._device(a.device_type, a.device_id))
        self.m_thread.append(self._thread(e.pid, e.tid))

    def _span(self, e: _Ev, name: str, ts: float) -> None:
        dur = e.dur
        if dur is None or not 0 <= dur < _MAX_DUR_US:
            return
        kind = self._kinds.get((e.cat, name))
        if kind is None:
            kind = self._kinds[(e.cat, name)] = _span_kind(e.cat, name)
        if kind == _KIND_STEP:
            step = _step_number(name)
            if step is not None and len(self.steps) < _MAX_STEPS:
                self.steps.append((step, ts, ts + dur))
        elif kind != _KIND_NONE:
            self.s_start.append(ts)
            self.s_end.append(ts + dur)
            self.s_thread.append(self._thread(e.pid, e.tid))
            self.s_kind.append(kind)
            self.s_name.append(self.names.setdefault(name, len(self.names)))


def _stream_file(path: Path) -> _Columns | None:
    """Reduce the events while the file is read, ~1 MB of JSON at a time, cut at ``}, {``
    gaps as load_trace cuts them (a cut inside a string fails to decode); None where that does
    not work, and the whole-document path decides. Neither the file nor its events are held."""
    cols = _Columns()
    stream = _open_trace(path)
    with stream.raw:
        try:
            found = events_key(path, stream)
            if found is None:
                return None
            head, rest = found
            msgspec.json.decode(head, type=_TraceOutline)  # the start of a JSON object
            for events in event_slices(stream, rest, _DECODER.decode):
                cols.feed(events)
            tail = msgspec.json.decode(b'{"traceEvents": [' + rest, type=_MemTrace)
        except (
            OSError,
            EOFError,
            zlib.error,
            msgspec.ValidationError,
            msgspec.DecodeError,
            TraceError,  # not an object: the whole-document path gives the precise line
        ):
            return None
    cols.feed(tail.traceEvents or [])
    return cols


def _load_file(path: Path) -> _Columns:
    """Stream the trace; where that fails, read it whole (within the loader's limits) and
    decode ``traceEvents`` in ~1 MB slices, or whole for the precise error."""
    streamed = _stream_file(path)
    if streamed is not None:
        return streamed
    raw = _read_bytes(path)
    cols = _Columns()
    try:
        outline = msgspec.json.decode(raw, type=_TraceOutline)
        ranges = _event_chunks(outline.traceEvents)
    except (msgspec.ValidationError, msgspec.DecodeError):
        ranges = None
    if ranges is not None:
        view = memoryview(outline.traceEvents)
        try:
            for a, b in ranges:
                cols.feed(_DECODER.decode(b"".join((b"[", view[a:b], b"]"))))
            return cols
        except (msgspec.ValidationError, msgspec.DecodeError):
            cols = _Columns()  # a cut fell inside an event, or one is malformed: decode whole
        finally:
            view.release()
    try:
        trace = msgspec.json.decode(raw, type=_MemTrace)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        msg = str(exc).replace("\n", " ")
        raise TraceError(
            f"{path}: not a readable Kineto/Chrome trace ({msg}); export it again from "
            "torch.profiler"
        ) from None
    if trace.traceEvents is None:
        raise TraceError(f"{path}: JSON has no 'traceEvents' list; pass a torch.profiler trace")
    cols.feed(trace.traceEvents)
    return cols


def _load_events(events: Sequence[Any]) -> _Columns:
    """Already-parsed events (dicts as ``json.load`` gives them); a malformed one is skipped."""
    cols = _Columns()
    step = 10_000
    for i in range(0, len(events), step):
        chunk = events[i : i + step]
        try:
            cols.feed(msgspec.convert(chunk, list[_Ev]))
        except msgspec.ValidationError:
            for e in chunk:
                try:
                    cols.feed([msgspec.convert(e, _Ev)])
                except msgspec.ValidationError:
                    cols.skipped += 1
    return cols


def _columns(source: str | os.PathLike[str] | Sequence[Any] | Mapping[str, Any]) -> _Columns:
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        try:
            with _gc_paused():
                return _load_file(path)
        except RecursionError:
            raise TraceError(f"{path}: JSON is nested too deeply to be a trace") from None
        except MemoryError:
            raise TraceError(f"{path}: ran out of memory while reading the trace") from None
    if isinstance(source, Mapping):
        source = source.get("traceEvents") or []
    if not isinstance(source, Sequence):
        raise TypeError("pass a trace path, a parsed trace dict or a list of its events")
    return _load_events(source)


# --- attribution ----------------------------------------------------------------------------


def _parents(thread: np.ndarray, end: np.ndarray) -> np.ndarray:
    """In (thread, start, longer first) order, each span's parent: the closest earlier span of
    its thread that ends no earlier (−1: none). Pointer jumping: every span between cand[i] and
    i ends before i does, so when cand[i] does too, i may jump to cand[cand[i]]."""
    n = end.size
    cand = np.arange(-1, n - 1, dtype=np.int64)
    if n:
        cand[np.flatnonzero(np.r_[True, thread[1:] != thread[:-1]])] = -1
    todo = np.flatnonzero(cand >= 0)
    while todo.size:
        todo = todo[end[cand[todo]] < end[todo]]
        cand[todo] = cand[cand[todo]]
        todo = todo[cand[todo] >= 0]
    return cand


class _Nest:
    """Spans of one kind, to find the innermost one containing a (thread, time) point."""

    def __init__(self, thread: np.ndarray, start: np.ndarray, end: np.ndarray, name: np.ndarray):
        order = np.lexsort((-end, start, thread))
        self.thread, self.start = thread[order], start[order]
        self.end, self.name = end[order], name[order]
        self.parent = _parents(self.thread, self.end)

    def innermost(self, thread: np.ndarray, ts: np.ndarray) -> np.ndarray:
        """Name index of the innermost span containing each point (−1: none).

        The latest-starting span that starts no later than the point is tried first, then its
        ancestors: the first that ends no earlier than the point is the latest-starting span
        that contains it (the innermost, where spans nest).
        """
        if not self.name.size:
            return np.full(ts.size, -1, dtype=np.int64)
        # binary search, all points at once, for the first span of the point's thread that
        # starts after it: [lo, hi) is the thread's run of spans
        lo = np.searchsorted(self.thread, thread, side="left")
        a, b = lo, np.searchsorted(self.thread, thread, side="right")
        last = self.start.size - 1
        while True:
            active = a < b
            if not active.any():
                break
            mid = (a + b) // 2
            right = active & (self.start[np.minimum(mid, last)] <= ts)
            a = np.where(right, mid + 1, a)
            b = np.where(active & ~right, mid, b)
        cand = np.where(a > lo, a - 1, -1)
        todo = np.flatnonzero(cand >= 0)
        while todo.size:
            todo = todo[self.end[cand[todo]] < ts[todo]]
            cand[todo] = self.parent[cand[todo]]
            todo = todo[cand[todo] >= 0]
        return np.where(cand >= 0, self.name[np.maximum(cand, 0)], -1)


class _Sites:
    """Region and operator at a (thread, time) point, from the trace's spans."""

    def __init__(self, cols: _Columns) -> None:
        kind = np.frombuffer(cols.s_kind, dtype=np.int8)
        thread = np.frombuffer(cols.s_thread, dtype=np.int32).astype(np.int64)
        start, end = np.frombuffer(cols.s_start), np.frombuffer(cols.s_end)
        name = np.frombuffer(cols.s_name, dtype=np.int32).astype(np.int64)
        self.nests = [
            _Nest(thread[m], start[m], end[m], name[m])
            for m in (kind == _KIND_ANNOTATION, kind == _KIND_OP)
        ]
        self.names = list(cols.names)

    def at(self, thread: np.ndarray, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        region, op = (n.innermost(thread, ts) for n in self.nests)
        return region, op

    def name(self, ix: int) -> str | None:
        return self.names[ix] if ix >= 0 else None


# --- per device -----------------------------------------------------------------------------


def _mib(nbytes: float) -> float:
    return round(float(nbytes) / MIB, _DIGITS)


def _replay(addr: list[int], nbytes: list[int]) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Pair frees with allocations: (each event's change to the live bytes, each allocation's
    end position (n: live to the end), frees of unknown blocks, their bytes)."""
    n = len(addr)
    delta = [0] * n
    end = [n] * n
    live: dict[int, int] = {}
    unknown = unknown_bytes = 0
    for i, (a, b) in enumerate(zip(addr, nbytes)):
        if a == _NO_ADDR or b == 0:
            continue
        if b > 0:
            prev = live.get(a)
            if prev is not None:  # its free was not recorded: it ends where the Addr is reused
                end[prev] = i
                delta[i] -= nbytes[prev]
            live[a] = i
            delta[i] += b
            continue
        j = live.pop(a, None)
        if j is None:
            unknown += 1
            unknown_bytes -= b
        else:
            end[j] = i
            delta[i] = -nbytes[j]
    return (
        np.asarray(delta, dtype=np.float64),
        np.asarray(end, dtype=np.int64),
        unknown,
        unknown_bytes,
    )


def _downsample(y: np.ndarray, max_points: int) -> np.ndarray:
    """Indices to keep: all, or the ends and each run's lowest and highest point."""
    n = y.size
    if n <= max_points:
        return np.arange(n)
    runs = (max_points - 2) // 2
    edges = np.linspace(0, n, runs + 1).astype(np.int64)
    keep = [0, n - 1]
    for a, b in zip(edges[:-1].tolist(), edges[1:].tolist()):
        seg = y[a:b]
        keep += [a + int(seg.argmin()), a + int(seg.argmax())]
    return np.unique(np.asarray(keep, dtype=np.int64))


def _site_table(
    sites: _Sites, region: np.ndarray, op: np.ndarray, nbytes: np.ndarray, top: int
) -> tuple[list[dict[str, Any]], int, float]:
    """Live blocks grouped by (region, op): the top rows by bytes, the group count, the rest."""
    if not nbytes.size:
        return [], 0, 0.0
    keys = np.stack([region, op], axis=1)
    uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    total = np.bincount(inverse, weights=nbytes)
    count = np.bincount(inverse)
    largest = np.zeros(len(uniq))
    np.maximum.at(largest, inverse, nbytes)
    named = [(sites.name(int(r)), sites.name(int(o))) for r, o in uniq.tolist()]
    # ties (equal bytes and counts) in name order, so that the table does not depend on the
    # order the names first appear in the trace
    order = sorted(
        range(len(uniq)),
        key=lambda g: (-total[g], -count[g], named[g][0] or "", named[g][1] or ""),
    )
    rows = [
        {
            "region": named[g][0],
            "op": named[g][1],
            "mib": _mib(total[g]),
            "count": int(count[g]),
            "largest_mib": _mib(largest[g]),
        }
        for g in order[:top]
    ]
    return rows, len(uniq), _mib(total[order[top:]].sum()) if len(order) > top else 0.0


def _step_at(steps: list[tuple[int, float, float]], ts: float) -> int | None:
    inside = [(s, n) for n, s, e in steps if s <= ts <= e]
    return max(inside)[1] if inside else None


class _Device:
    """One device's memory events in time order, and the figures from them."""

    def __init__(self, cols: _Columns, rows: np.ndarray, origin: float) -> None:
        ts = np.frombuffer(cols.m_ts)[rows]
        order = np.argsort(ts, kind="stable")
        rows = rows[order]
        self.ts = ts[order]
        self.origin = origin
        self.nbytes = np.frombuffer(cols.m_bytes, dtype=np.int64)[rows]
        self.addr = np.frombuffer(cols.m_addr, dtype=np.int64)[rows]
        self.alloc = np.frombuffer(cols.m_alloc)[rows]
        self.resv = np.frombuffer(cols.m_resv)[rows]
        self.thread = np.frombuffer(cols.m_thread, dtype=np.int32)[rows].astype(np.int64)

    def ms(self, ts: float) -> float:
        return round((ts - self.origin) / 1e3, _DIGITS)

    def figures(
        self, sites: _Sites, steps: list[tuple[int, float, float]], top: int, max_points: int
    ) -> dict[str, Any]:
        na: dict[str, str] = {}
        has_addr = bool((self.addr != _NO_ADDR).any())
        delta, end, unknown, unknown_bytes = _replay(self.addr.tolist(), self.nbytes.tolist())
        replayed = np.cumsum(delta)
        if not np.isnan(self.alloc).any():
            basis, y = "total_allocated", self.alloc
        elif has_addr:
            basis, y = "replayed", replayed
        else:
            basis, y = "sum_of_bytes", np.cumsum(self.nbytes.astype(np.float64))
        p = int(np.argmax(y))
        out: dict[str, Any] = {
            "events": int(self.ts.size),
            "allocations": int((self.nbytes > 0).sum()),
            "frees": int((self.nbytes < 0).sum()),
            "curve": {"basis": basis, **self._curve(y, max_points)},
            **self._peak(sites, steps, p, float(y[p]), na),
            "peak_reserved_mib": self._reserved(na),
            "replayed_peak_mib": _mib(replayed.max()) if has_addr else None,
            "live_at_peak": self._live(sites, end, p, float(y[p]), top) if has_addr else None,
            "unknown_frees": {"count": unknown, "mib": _mib(unknown_bytes)},
            "growth": {
                "first_allocated_mib": _mib(y[0]),
                "last_allocated_mib": _mib(y[-1]),
                "growth_mib": _mib(y[-1] - y[0]),
                "first_time_ms": self.ms(float(self.ts[0])),
                "last_time_ms": self.ms(float(self.ts[-1])),
            },
        }
        if not has_addr:
            why = "the memory events carry no Addr (2021 trace schema): frees cannot be paired"
            na["replayed_peak_mib"] = na["live_at_peak"] = why
        out["not_applicable"] = na
        return out

    def _curve(self, y: np.ndarray, max_points: int) -> dict[str, Any]:
        keep = _downsample(y, max_points)
        return {
            "time_ms": [self.ms(t) for t in self.ts[keep].tolist()],
            "allocated_mib": [_mib(v) for v in y[keep].tolist()],
            "downsampled": bool(keep.size < y.size),
        }

    def _peak(
        self,
        sites: _Sites,
        steps: list[tuple[int, float, float]],
        p: int,
        peak: float,
        na: dict[str, str],
    ) -> dict[str, Any]:
        ts = float(self.ts[p])
        region, op = sites.at(self.thread[[p]], self.ts[[p]])
        step = _step_at(steps, ts)
        if not steps:
            na["peak_step"] = "the trace has no ProfilerStep#N spans"
        elif step is None:
            na["peak_step"] = "the peak lies outside every ProfilerStep#N span"
        return {
            "peak_allocated_mib": _mib(peak),
            "peak_time_ms": self.ms(ts),
            "peak_step": step,
            "peak_region": sites.name(int(region[0])),
            "peak_op": sites.name(int(op[0])),
        }

    def _reserved(self, na: dict[str, str]) -> float | None:
        resv = self.resv[~np.isnan(self.resv)]
        if not resv.size:
            na["peak_reserved_mib"] = "the memory events carry no 'Total Reserved'"
        elif resv.max() == 0:
            na["peak_reserved_mib"] = "'Total Reserved' is 0 throughout: nothing is cached (CPU)"
        else:
            return _mib(resv.max())
        return None

    def _live(
        self, sites: _Sites, end: np.ndarray, p: int, peak: float, top: int
    ) -> dict[str, Any]:
        idx = np.arange(self.ts.size)
        live = np.flatnonzero((idx <= p) & (end > p) & (self.nbytes > 0) & (self.addr != _NO_ADDR))
        nbytes = self.nbytes[live].astype(np.float64)
        region, op = sites.at(self.thread[live], self.ts[live])
        rows, groups, other = _site_table(sites, region, op, nbytes, top)
        total = float(nbytes.sum())
        return {
            "mib": _mib(total),
            "count": int(live.size),
            "unattributed_mib": _mib(peak - total),
            "site_count": groups,
            "sites": rows,
            "other_mib": other,
        }


def _device_name(key: tuple[int, int]) -> str:
    kind, ix = key
    if kind == 0:
        return "cpu"
    return f"{_DEVICE_TYPES.get(kind, f'device{kind}')}:{ix}"


def memory_timeline(
    path_or_events: str | os.PathLike[str] | Sequence[Any] | Mapping[str, Any],
    *,
    top: int = 10,
    max_points: int = 2000,
) -> dict[str, Any] | None:
    """Per device (``cpu``, ``cuda:0``...): the allocation curve, its peak (time, step, region,
    operator), peak reserved, the live blocks at the peak grouped by site, and growth over the
    window; None when the trace holds no memory events (``profile_memory`` was off).

    ``path_or_events``: a trace file (``.json`` / ``.json.gz``), a parsed trace dict, or its list
    of events. Plain JSON data out, with ``definitions``; a figure that cannot be computed is
    null with its reason in ``not_applicable``. Raises TraceError for an unreadable file.
    """
    if top < 0 or max_points < 4:
        raise ValueError(f"top must be ≥ 0 and max_points ≥ 4 (got {top}, {max_points})")
    cols = _columns(path_or_events)
    if not cols.m_ts:
        return None
    origin = cols.first_ts
    sites = _Sites(cols)
    steps = sorted(cols.steps, key=lambda s: (s[1], s[0]))
    dev = np.frombuffer(cols.m_dev, dtype=np.int32)
    devices = {}
    for key, ix in sorted(cols.devices.items()):
        rows = np.flatnonzero(dev == ix)
        devices[_device_name(key)] = _Device(cols, rows, origin).figures(
            sites, steps, top, max_points
        )
    na = {} if steps else {"steps": "the trace has no ProfilerStep#N spans"}
    return {
        "trace_start_us": origin,
        "events": len(cols.m_ts),
        "skipped_events": cols.skipped,
        "devices": devices,
        "steps": [
            {
                "step": n,
                "start_ms": round((s - origin) / 1e3, _DIGITS),
                "end_ms": round((e - origin) / 1e3, _DIGITS),
            }
            for n, s, e in steps
        ],
        "definitions": dict(DEFINITIONS),
        "not_applicable": na,
    }
