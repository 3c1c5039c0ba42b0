"""Pass 1 of ``mgprof timeline``: what one rank's trace must tell before any event is written.

The scan decodes a few fields of every event (msgspec Structs, as the trace loader does) and
keeps, in compact arrays: the lanes (host threads and device streams) and their names, the
``ProfilerStep#N`` spans, each launch's correlation id and time, each device event's, the
collectives that serve as clock anchors, and the flow events (``ph`` s/t/f) with where they
bind. Nothing else is kept; the events themselves are read again when they are written.
"""

from __future__ import annotations

import math
import re
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from mgprof.analyze.timeline.anchors import CommSpan, anchors_of
from mgprof.analyze.timeline.clock import Anchor
from mgprof.analyze.timeline.events import (
    _MAX_TS_US,
    FLOW_PHASES,
    is_device_cat,
    lane_id,
    num,
)
from mgprof.analyze.timeline.read import GENERATOR, TraceMeta, read_events
from mgprof.analyze.tracefile.reduce import COMM_KERNEL_RE, rank_from_filename
from mgprof.analyze.tracefile.schema import _as_int, _as_str, _dist_info

__all__ = ["FLOW_KEY_ID_BITS", "Lane", "RankScan", "scan_trace"]

_LAUNCH_CATS = frozenset({"cuda_runtime", "runtime", "cuda_driver", "mtia_runtime"})
_HOST_COMM_PREFIXES = ("nccl:", "gloo:")
_KEY_TYPES = (int, str)


_COMM_NAMES: dict[str, bool] = {}


def _is_comm_kernel(name: str) -> bool:
    """DESIGN.md's communication kernel (nccl/rccl in the name), cached by name: a trace
    repeats a few hundred kernel names, whose case-blind search is not cheap."""
    known = _COMM_NAMES.get(name)
    if known is None:
        known = COMM_KERNEL_RE.search(name) is not None
        if len(_COMM_NAMES) < 65536:
            _COMM_NAMES[name] = known
    return known


class _Args(msgspec.Struct, gc=False):
    correlation: Any = None
    external_id: Any = msgspec.field(default=None, name="External id")
    external_id_lower: Any = msgspec.field(default=None, name="external id")
    collective: Any = msgspec.field(default=None, name="Collective name")
    pg_name: Any = msgspec.field(default=None, name="Process Group Name")
    seq: Any = msgspec.field(default=None, name="Seq")
    name: Any = None
    labels: Any = None


class _Event(msgspec.Struct, gc=False):
    ph: Any = None
    cat: Any = None
    name: Any = None
    ts: Any = None
    dur: Any = None
    pid: Any = None
    tid: Any = None
    id: Any = None
    args: _Args | None = None


DECODER = msgspec.json.Decoder(list[_Event])


@dataclass
class Lane:
    """A host thread or device stream of the rank (one track in the viewer)."""

    key: tuple[int | str, int | str]
    kind: str = "host"
    """``host``, ``device`` or ``other`` (the profiler's own spans, whose pid is a label)."""
    name: str | None = None


@dataclass
class RankScan:
    """What pass 1 learned about one rank's trace."""

    path: Path
    rank: int | None = None
    rank_source: str = "unknown"
    world_size: int | None = None
    backend: str | None = None
    host: str | None = None
    base_us: float | None = None
    """``baseTimeNanoseconds`` in µs: event ``ts`` + base = time since the Unix epoch."""
    whole: bool = False
    """The file had to be read as one document (the second pass does the same)."""
    generated: bool = False
    """The file is a timeline ``mgprof timeline`` wrote, not a rank's trace."""
    ts_min: float | None = None
    lanes: list[Lane] = field(default_factory=list)
    process_labels: dict[int | str, str] = field(default_factory=dict)
    steps: list[tuple[int, float, float]] = field(default_factory=list)
    step_lane: int | None = None
    """The lane of the ``ProfilerStep#N`` spans: the training loop's thread."""
    launch_corr: array = field(default_factory=lambda: array("q"))
    launch_ts: array = field(default_factory=lambda: array("d"))
    launch_lane: array = field(default_factory=lambda: array("i"))
    dev_corr: array = field(default_factory=lambda: array("q"))
    dev_ts: array = field(default_factory=lambda: array("d"))
    dev_end: array = field(default_factory=lambda: array("d"))
    flow_key: array = field(default_factory=lambda: array("q"))
    flow_phase: array = field(default_factory=lambda: array("b"))
    flow_lane: array = field(default_factory=lambda: array("i"))
    flow_ts: array = field(default_factory=lambda: array("d"))
    short_lane: array = field(default_factory=lambda: array("i"))
    short_ts: array = field(default_factory=lambda: array("d"))
    flow_ids: dict[tuple[str, object], int] = field(default_factory=dict)
    """Flow (cat, id) -> key, for ids that are not small non-negative integers."""
    comm_kernels: list[CommSpan] = field(default_factory=list)
    host_comm: list[CommSpan] = field(default_factory=list)
    anchors: list[Anchor] = field(default_factory=list)
    _lane_index: dict[tuple[int | str, int | str], int] = field(default_factory=dict)
    _raw_index: dict[tuple[Any, Any], int] = field(default_factory=dict)
    """The same, keyed by pid and tid as the file writes them (skips normalising each)."""
    cats: dict[str, int] = field(default_factory=dict)
    """Flow category -> the code in the top bits of its flow keys."""

    def lane(self, pid: object, tid: object) -> int:
        if type(pid) in _KEY_TYPES and type(tid) in _KEY_TYPES:
            raw = (pid, tid)
            i = self._raw_index.get(raw)
            if i is None:
                i = self._raw_index[raw] = self._new_lane(pid, tid)
            return i
        return self._new_lane(pid, tid)

    def _new_lane(self, pid: object, tid: object) -> int:
        key = (lane_id(pid), lane_id(tid))
        i = self._lane_index.get(key)
        if i is None:
            i = self._lane_index[key] = len(self.lanes)
            self.lanes.append(Lane(key, "host" if isinstance(key[0], int) else "other"))
        return i

    @property
    def device_pids(self) -> list[int | str]:
        return sorted({ln.key[0] for ln in self.lanes if ln.kind == "device"}, key=str)

    def release(self) -> None:
        """Drop the per-event arrays once the rank is planned: what is left (lanes, names,
        anchors) is small, so that a job of many ranks is not held in memory at once."""
        for name in ("launch_corr", "dev_corr", "flow_key", "short_lane", "launch_lane",
                     "flow_lane"):  # fmt: skip
            setattr(self, name, array("q" if "corr" in name or "key" in name else "i"))
        for name in ("launch_ts", "dev_ts", "dev_end", "flow_ts", "short_ts"):
            setattr(self, name, array("d"))
        self.flow_phase = array("b")
        self.flow_ids = {}
        self.comm_kernels = []
        self.host_comm = []


_FLOW_CODE = {"s": 0, "t": 1, "f": 2}
FLOW_KEY_ID_BITS = _CAT_SHIFT = 40
"""A flow key is (interned cat) << 40 | id, for ids in [0, 2^40) (Kineto writes correlation
ids and small counters); other ids are interned above 2^62."""


def flow_key(scan: RankScan, cat: object, fid: object) -> int:
    """One integer per flow (cat, id) of the rank, so that the flows fit in flat arrays."""
    cat_s = str(cat) if cat is not None else ""
    code = scan.cats.setdefault(cat_s, len(scan.cats))
    n = _as_int(fid) if not isinstance(fid, float) else None
    if n is not None and 0 <= n < (1 << _CAT_SHIFT) and code < (1 << 20):
        return (code << _CAT_SHIFT) | n
    return scan.flow_ids.setdefault((cat_s, fid if isinstance(fid, (int, str)) else repr(fid)),
                                    (1 << 62) + len(scan.flow_ids))  # fmt: skip


class _Scanner:
    """Feeds decoded slices into a RankScan."""

    def __init__(self, path: Path, min_dur_us: float | None) -> None:
        self.scan = RankScan(path)
        self.min_dur = min_dur_us

    def feed(self, events: list[_Event]) -> None:
        s = self.scan
        lanes = s.lanes
        ts_min = s.ts_min if s.ts_min is not None else math.inf
        for ev in events:
            ph = ev.ph
            if ph == "M":
                self._metadata(ev)
                continue
            ts = num(ev.ts)
            if ts is None:
                continue
            ts_min = min(ts, ts_min)
            li = s.lane(ev.pid, ev.tid)
            lane = lanes[li]
            if ph in FLOW_PHASES:
                s.flow_key.append(flow_key(s, ev.cat, ev.id))
                s.flow_phase.append(_FLOW_CODE[ph])
                s.flow_lane.append(li)
                s.flow_ts.append(ts)
                continue
            if ph != "X":
                continue
            dur = num(ev.dur)
            if dur is None or dur < 0:
                continue
            if self.min_dur is not None and dur < self.min_dur:
                s.short_lane.append(li)
                s.short_ts.append(ts)
            cat = ev.cat.lower() if isinstance(ev.cat, str) else ""
            name = ev.name if isinstance(ev.name, str) else ""
            args = ev.args
            if is_device_cat(ev.cat):
                lane.kind = "device"
                corr = _as_int(args.correlation) if args is not None else None
                s.dev_corr.append(corr if corr is not None else -1)
                s.dev_ts.append(ts)
                s.dev_end.append(ts + dur)
                if cat == "kernel" and _is_comm_kernel(name):
                    s.comm_kernels.append(_span(li, ts, dur, name, args))
            elif cat in _LAUNCH_CATS:
                corr = _as_int(args.correlation) if args is not None else None
                if corr is not None:
                    s.launch_corr.append(corr)
                    s.launch_ts.append(ts)
                    s.launch_lane.append(li)
            elif name.startswith("ProfilerStep#"):
                tail = name[len("ProfilerStep#") :]
                if tail.isascii() and tail.isdigit() and len(tail) <= 18:
                    s.steps.append((int(tail), ts, ts + dur))
                    s.step_lane = li
            elif name.startswith(_HOST_COMM_PREFIXES) or name == "record_param_comms":
                s.host_comm.append(_span(li, ts, dur, name, args))
        s.ts_min = ts_min if ts_min != math.inf else None

    def _metadata(self, ev: _Event) -> None:
        args = ev.args
        if args is None:
            return
        s = self.scan
        if ev.name == "thread_name" and isinstance(args.name, str) and args.name.strip():
            lane = s.lanes[s.lane(ev.pid, ev.tid)]
            lane.name = _merge_names(lane.name, args.name.strip())
        elif ev.name == "process_labels" and isinstance(args.labels, str):
            s.process_labels[lane_id(ev.pid)] = args.labels.strip()


_THREAD_NAME_RE = re.compile(r"(thread \S+) \((.*)\)")


def _merge_names(old: str | None, new: str) -> str:
    """One name for a thread Kineto named twice (it records a thread's name more than once,
    e.g. ``thread 8657 (python3)`` and ``thread 8657 (pt_gloo_runloop)``; neither is
    reliably the later): ``thread 8657 (python3, pt_gloo_runloop)``."""
    if old is None or old == new:
        return new
    a, b = _THREAD_NAME_RE.fullmatch(old), _THREAD_NAME_RE.fullmatch(new)
    if a and b and a.group(1) == b.group(1):
        labels = a.group(2).split(", ")
        return old if b.group(2) in labels else f"{a.group(1)} ({', '.join([*labels, b.group(2)])})"
    return old if new in old.split(" / ") else f"{old} / {new}"


def _span(lane: int, ts: float, dur: float, name: str, args: _Args | None) -> CommSpan:
    a = args or _Args()
    ext = _as_int(a.external_id)
    return CommSpan(
        lane=lane,
        start=ts,
        end=ts + dur,
        name=name,
        ext=ext if ext is not None else _as_int(a.external_id_lower),
        corr=_as_int(a.correlation),
        collective=_as_str(a.collective) if isinstance(a.collective, (str, int)) else None,
        pg=_as_str(a.pg_name) if isinstance(a.pg_name, (str, int)) else None,
        seq=_as_str(a.seq) if isinstance(a.seq, (str, int)) else None,
    )


def _finish(scan: RankScan, meta: TraceMeta) -> None:
    dist = _dist_info(meta.distributedInfo)
    rank = _as_int(dist.rank) if dist else None
    scan.rank_source = "distributedInfo"
    if rank is None:
        rank = rank_from_filename(scan.path)
        scan.rank_source = "file name" if rank is not None else "unknown"
    scan.rank = rank
    scan.world_size = _as_int(dist.world_size) if dist else None
    scan.backend = _as_str(dist.backend) if dist and isinstance(dist.backend, str) else None
    scan.host = meta.host_name if isinstance(meta.host_name, str) else None
    scan.base_us = _base_us(meta.baseTimeNanoseconds)
    scan.generated = bool(meta.otherData and meta.otherData.generator == GENERATOR)
    for lane in scan.lanes:
        label = scan.process_labels.get(lane.key[0], "")
        if lane.kind == "host" and label.upper().startswith("GPU"):
            lane.kind = "device"  # a stream with only flows or instants on it is still a stream
    scan.steps.sort()
    scan.anchors = anchors_of(scan)


def _base_us(base_ns: object) -> float | None:
    """``baseTimeNanoseconds`` in µs; None when absent, zero or not a number (then the
    events' ``ts`` are taken to be on the clock as they are: older traces write Unix µs)."""
    if isinstance(base_ns, bool) or not isinstance(base_ns, (int, float)) or not base_ns:
        return None
    value = base_ns / 1000
    return float(value) if math.isfinite(value) and abs(value) < _MAX_TS_US else None


def scan_trace(path: Path, min_dur_us: float | None = None) -> RankScan:
    """Pass 1 over one rank's trace (TraceError, one line, when it cannot be read)."""
    holder: list[_Scanner] = []

    def start() -> Callable[[list[Any]], None]:
        holder[:] = [_Scanner(path, min_dur_us)]
        return holder[0].feed

    meta, whole = read_events(path, DECODER, start)
    scan = holder[0].scan
    scan.whole = whole
    _finish(scan, meta)
    return scan
