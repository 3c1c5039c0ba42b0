"""Pass 2 of ``mgprof timeline``: every rank's events, shifted onto one clock, into one file.

Events are read again slice by slice (:mod:`~mgprof.analyze.timeline.read`) with every field
of the Trace Event Format (``args`` as raw JSON, never parsed), so that what a viewer uses
(``args``, ``bp``, ``s``, ``cname``...) passes through as it was; only ``ts``, ``pid``, ``tid``
and a flow's ``id`` are rewritten, and a rank's events keep the order their file had.

The output is written to a temporary file beside the target and renamed over it at the end, as
:mod:`mgprof.atomic` does for small files: a reader never sees half a timeline, and a failure
leaves no file behind.
"""

from __future__ import annotations

import errno
import gzip
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from mgprof import atomic
from mgprof.analyze.timeline.events import FLOW_PHASES, is_device_cat, num
from mgprof.analyze.timeline.plan import TIDS_PER_RANK, RankPlan
from mgprof.analyze.timeline.read import read_events
from mgprof.analyze.timeline.scan import RankScan
from mgprof.atomic import current_umask, file_size_limit

__all__ = ["EventCounts", "TimelineFile", "write_rank"]


class _Event(msgspec.Struct, omit_defaults=True, gc=False):
    """Every field of the Trace Event Format, ``args`` kept as its raw JSON: an event passes
    through as it was (a key outside the format, which no viewer reads, is not carried)."""

    ph: Any = UNSET
    cat: Any = UNSET
    name: Any = UNSET
    pid: Any = UNSET
    tid: Any = UNSET
    ts: Any = UNSET
    dur: Any = UNSET
    tts: Any = UNSET
    tdur: Any = UNSET
    id: Any = UNSET
    id2: Any = UNSET
    scope: Any = UNSET
    bp: Any = UNSET
    s: Any = UNSET
    cname: Any = UNSET
    bind_id: Any = UNSET
    flow_in: Any = UNSET
    flow_out: Any = UNSET
    use_async_tts: Any = UNSET
    sf: Any = UNSET
    stack: Any = UNSET
    esf: Any = UNSET
    estack: Any = UNSET
    args: msgspec.Raw | UnsetType = UNSET


_DECODER = msgspec.json.Decoder(list[_Event])
_ENCODER = msgspec.json.Encoder()
_GZIP_LEVEL = 6
"""zlib level 6: within a few % of level 9's size at about a third of its time."""


class EventCounts(msgspec.Struct):
    """What happened to one rank's events (metadata events are replaced by the timeline's)."""

    read: int = 0
    written: int = 0
    dropped_steps: int = 0
    dropped_min_dur: int = 0
    flows_dropped: int = 0
    invalid: int = 0
    """Events without a usable ``ts`` (or a complete event without a usable ``dur``)."""
    metadata_replaced: int = 0


class _Sink:
    """The temp file's descriptor as a binary stream, every byte through ``mgprof.atomic``'s
    one write call (where tests simulate a full disk), with the file size limit checked first:
    a write past it raises SIGXFSZ, which would kill the process."""

    def __init__(self, fd: int, path: Path) -> None:
        self.fd = fd
        self.path = path
        self.limit = file_size_limit()
        self.written = 0
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> int:
        n = memoryview(data).nbytes
        if self.limit is not None and self.written + n > self.limit:
            raise OSError(errno.EFBIG, os.strerror(errno.EFBIG), str(self.path))
        atomic._write_all(self.fd, data)
        self.written += n
        return n

    def tell(self) -> int:
        return self.written

    def flush(self) -> None:
        pass

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            os.close(self.fd)


class TimelineFile:
    """The output, written as a stream into a temp file and renamed into place on commit."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.gzipped = path.name.endswith(".gz")
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        self.tmp = Path(tmp)
        self.raw = _Sink(fd, path)
        self.fh: Any = self.raw
        self.events = 0
        try:
            if self.gzipped:  # writes the gzip header at once
                self.fh = gzip.GzipFile(
                    fileobj=self.raw, mode="wb", compresslevel=_GZIP_LEVEL, mtime=0
                )
            self.write(b'{"traceEvents":[\n')
        except BaseException:
            self.abort()
            raise

    def write(self, data: bytes) -> None:
        self.fh.write(data)

    def add(self, events: list[Any]) -> None:
        if not events:
            return
        body = _ENCODER.encode(events)[1:-1]
        self.write(b",\n" + body if self.events else body)
        self.events += len(events)

    def commit(self, tail: dict[str, Any]) -> Path:
        self.write(b'\n],"displayTimeUnit":"ms","otherData":' + _ENCODER.encode(tail) + b"}\n")
        if self.fh is not self.raw:
            self.fh.close()  # the gzip trailer; the descriptor stays open
        os.fsync(self.raw.fd)
        self.raw.close()
        os.chmod(self.tmp, 0o666 & ~current_umask())
        os.replace(self.tmp, self.path)
        return self.path

    def abort(self) -> None:
        for fh in (self.fh, self.raw):
            try:
                fh.close()
            except (OSError, ValueError, EOFError):
                pass
        try:
            os.unlink(self.tmp)
        except OSError:
            pass


class _RankWriter:
    """Rewrites one rank's decoded slices (the module docstring's rules, the plan's answers)."""

    def __init__(self, plan: RankPlan, out: TimelineFile) -> None:
        self.plan = plan
        self.out = out
        self.counts = EventCounts()
        self.lane_events = [0] * len(plan.tids)
        self.dev_i = 0
        self.flow_i = 0
        self.flow_ids: dict[tuple[str, str], int] = {}

    def flow_id(self, cat: object, fid: object) -> int:
        """A flow id unique to this rank (ranks number their flows alike): pid × 2^32 + id
        for ids below 2^31, else a number counted above 2^31 (every id stays below 2^53,
        exact in the JavaScript numbers viewers use)."""
        base = self.plan.pid << 32
        if isinstance(fid, int) and not isinstance(fid, bool) and 0 <= fid < (1 << 31):
            return base + fid
        key = (str(cat), repr(fid))
        n = self.flow_ids.setdefault(key, len(self.flow_ids))
        return base + (1 << 31) + n % (1 << 31)

    def feed(self, events: list[_Event]) -> None:
        plan, c = self.plan, self.counts
        lane_of, shift, tids = plan.lane_of, plan.shift_us, plan.tids
        kept: list[_Event] = []
        for ev in events:
            ph = ev.ph
            if ph == "M":
                c.metadata_replaced += 1
                continue
            c.read += 1
            ts = num(ev.ts)
            lane = lane_of(ev.pid, ev.tid) if ts is not None else None
            if ts is None or lane is None:
                c.invalid += 1
                continue
            if ph in FLOW_PHASES:
                i, self.flow_i = self.flow_i, self.flow_i + 1
                if plan.flow_keep is not None and not plan.flow_keep[i]:
                    c.flows_dropped += 1
                    continue
                ev.id = self.flow_id(ev.cat, ev.id)
            elif ph == "X":
                dur = num(ev.dur)
                if dur is None or dur < 0:
                    c.invalid += 1
                    continue
                if is_device_cat(ev.cat):
                    i, self.dev_i = self.dev_i, self.dev_i + 1
                    in_steps = plan.dev_keep is None or bool(plan.dev_keep[i])
                else:
                    in_steps = plan.window is None or plan.in_window(ts, lane)
                if not in_steps:
                    c.dropped_steps += 1
                    continue
                if plan.min_dur_us is not None and dur < plan.min_dur_us:
                    c.dropped_min_dur += 1
                    continue
            elif plan.window is not None and (ph in ("B", "E") or not plan.in_window(ts, lane)):
                c.dropped_steps += 1  # B/E pairs cannot be cut by time without unbalancing
                continue
            elif ph in ("i", "I") and ev.s == "g":
                ev.s = "p"  # one rank's global marker would cut across every rank
            # clamped: the earliest event can land a float error below the origin (-0.001)
            ev.ts = max(round(ts - shift, 3), 0.0) + 0.0
            ev.pid = plan.pid
            ev.tid = tids[lane]
            self.lane_events[lane] += 1
            kept.append(ev)
        c.written += len(kept)
        self.out.add(kept)


def metadata_events(
    plan: RankPlan,
    scan: RankScan,
    process_name: str,
    labels: str | None,
    lane_events: list[int],
) -> list[dict[str, Any]]:
    """The rank's process and thread names and sort order (Chrome's ``ph: M`` events), for
    every lane that has events in the output."""
    first_tid = plan.pid * TIDS_PER_RANK
    out: list[dict[str, Any]] = [
        _meta("process_name", plan.pid, first_tid, {"name": process_name}),
        _meta("process_sort_index", plan.pid, first_tid, {"sort_index": plan.rank}),
    ]
    if labels:
        out.append(_meta("process_labels", plan.pid, first_tid, {"labels": labels}))
    for pos, li in enumerate(plan.order):
        if not lane_events[li]:
            continue
        tid = plan.tids[li]
        out.append(_meta("thread_name", plan.pid, tid, {"name": lane_name(scan, li)}))
        out.append(_meta("thread_sort_index", plan.pid, tid, {"sort_index": pos}))
    return out


def _meta(name: str, pid: int, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"ph": "M", "name": name, "pid": pid, "tid": tid, "ts": 0, "args": args}


def lane_name(scan: RankScan, li: int) -> str:
    """``thread 8653 (python3)``, ``GPU 0 · stream 7``, ``PyTorch Profiler``."""
    lane = scan.lanes[li]
    pid, tid = lane.key
    if lane.kind == "device":
        device = scan.process_labels.get(pid) or f"device {pid}"
        stream = lane.name or (tid if isinstance(tid, str) else f"stream {tid}")
        return f"{device} · {stream}"
    if lane.kind == "other":
        return lane.name or str(tid or pid or "profiler")
    return lane.name or f"thread {tid}"


def write_rank(scan: RankScan, plan: RankPlan, out: TimelineFile) -> tuple[EventCounts, list[int]]:
    """Pass 2 over one rank: its events into ``out``; what was kept, dropped, per lane."""
    writers: list[_RankWriter] = []

    def start() -> Callable[[list[Any]], None]:
        writers[:] = [_RankWriter(plan, out)]
        return writers[0].feed

    read_events(scan.path, _DECODER, start, whole=scan.whole, restart_ok=False)
    return writers[0].counts, writers[0].lane_events
