"""Per-rank summary of a CUDA caching-allocator snapshot, and the comparison across ranks.

The input is the dict ``torch.cuda.memory._snapshot()`` returns (saved as JSON by
``--memory``): ``segments`` (each with ``device``, ``address``, ``total_size``, ``stream``,
``segment_type`` and its ``blocks``: ``address``, ``size``, ``requested_size``, ``state``,
``frames``), ``device_traces`` (per device, the allocator's ring of ``alloc``,
``free_requested``, ``free_completed``, ``segment_alloc``, ``segment_free``, ``segment_map``,
``segment_unmap``, ``snapshot`` and ``oom`` entries with ``addr``, ``size``, ``stream``,
``frames``, ``time_us``; an ``oom`` has ``device_free`` for ``addr``) and
``allocator_settings``. Key names follow PyTorch's ``torch/csrc/cuda/memory_snapshot.cpp``
(``_memory_snapshot_pickled``), the ``_snapshot`` docstring in ``torch/cuda/memory.py`` and
``torch/utils/viz/MemoryViz.js`` (``annotate_snapshot``: older snapshots keep frames and
``real_size`` under a block's ``history``, lack block addresses, ``time_us`` and
``requested_size``). How the ring is replayed and its limits: :mod:`memory_replay`.

Pure analysis in plain Python (no torch, no numpy): it runs in ``mgprof report`` anywhere.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgspec

from mgprof.analyze.memory.replay import Block, Replay, replay
from mgprof.analyze.memory.replay import snapshot_int as _int
from mgprof.analyze.tracefile.gc_pause import gc_paused as _gc_paused
from mgprof.errors import UsageError
from mgprof.safe_read import read_regular, record_size_limit

__all__ = [
    "DeviceImbalance",
    "DevicePeak",
    "Fragmentation",
    "OomEvent",
    "SiteRow",
    "SnapshotSummary",
    "describe_device0_imbalance",
    "load_snapshot",
    "summarize_snapshot",
]

MIB = float(1 << 20)
SNAPSHOT_MAX_BYTES = 2 << 30
"""Largest snapshot file read (a 200k-entry ring with stacks is a few hundred MB of JSON)."""

_STACK_FRAMES = 3
_NO_STACK = "(no stack recorded)"
_BEFORE_RING = "(allocated before the trace window)"


# --- results --------------------------------------------------------------------------------


class SiteRow(msgspec.Struct, kw_only=True):
    """Live blocks grouped by where they were allocated."""

    site: str
    """``train.py:42 forward``: the innermost frame outside torch and the standard library;
    ``(no stack recorded)``; ``(allocated before the trace window)`` for blocks whose
    allocation the ring lost (their ``stack`` is then that of their free)."""
    file: str | None
    line: int | None
    function: str | None
    stack: list[str]
    """Up to 3 innermost user frames, innermost first, ``file:line function``."""
    mib: float
    count: int
    largest_mib: float


class Fragmentation(msgspec.Struct, kw_only=True):
    """Cache the allocator holds but no live block uses."""

    reserved_mib: float
    allocated_mib: float
    """Requested bytes of the live blocks (pending frees included)."""
    free_mib: float
    """reserved − allocated: cached free blocks plus rounding inside live blocks."""
    free_pct: float | None
    """free_mib as a percentage of reserved_mib; None when nothing is reserved."""
    largest_free_block_mib: float | None
    """The largest inactive block of the segments (known at snapshot time only)."""


class OomEvent(msgspec.Struct, kw_only=True):
    """The first ``oom`` entry of the ring: an allocation the allocator could not serve."""

    entry: int
    time_us: float | None
    step: int | None
    phase: str | None
    requested_mib: float
    device_free_mib: float | None
    """What CUDA reported free on the device at that moment."""
    allocated_mib: float
    reserved_mib: float
    top_sites: list[SiteRow]
    count: int
    """``oom`` entries in the ring."""


class DevicePeak(msgspec.Struct, kw_only=True):
    device: int
    peak_allocated_mib: float
    peak_reserved_mib: float
    entries: int


class SnapshotSummary(msgspec.Struct, kw_only=True):
    """One snapshot (one rank), figures for ``device``; ``devices`` has every device's peaks.

    Times are the trace's ``time_us`` (wall clock, µs); ``*_entry`` are indices into
    ``device_traces[device]``, −1 for the start of the ring (before its first entry).
    """

    device: int | None
    devices: list[DevicePeak]
    entries: int
    timed: bool
    """Whether the trace entries carry ``time_us`` (older PyTorch: no step/phase)."""
    peak_allocated_mib: float
    peak_entry: int | None
    peak_time_us: float | None
    peak_step: int | None
    peak_phase: str | None
    reserved_at_peak_mib: float
    pending_free_at_peak_mib: float
    """Part of the peak freed by the program but waiting on another stream."""
    peak_reserved_mib: float
    peak_reserved_entry: int | None
    peak_reserved_time_us: float | None
    baseline_allocated_mib: float
    """Live at the start of the ring (allocated before it)."""
    baseline_reserved_mib: float
    live_at_peak_count: int
    top_sites: list[SiteRow]
    site_count: int
    other_sites_mib: float
    fragmentation_at_peak: Fragmentation
    fragmentation_at_snapshot: Fragmentation
    device_total_mib: float | None
    headroom_mib: float | None
    """device_total_mib − peak_reserved_mib."""
    expandable_segments: bool | None
    oom: OomEvent | None
    notes: list[str]


class DeviceImbalance(msgspec.Struct, kw_only=True):
    """DataParallel's device 0 against the mean of the other devices of one process."""

    device0_mib: float
    others_mean_mib: float
    excess_mib: float
    excess_pct: float | None
    text: str | None
    """Set when device 0 holds more than the others' mean (whether that matters is the run
    comparison's call: ``mgprof.analyze.run.memory``)."""


# --- reading the snapshot -------------------------------------------------------------------


def _mib(nbytes: float) -> float:
    return round(nbytes / MIB, 6)


def _num(v: Any) -> float | None:
    return float(v) if type(v) in (int, float) else None


class _Segments:
    """One device's segments at snapshot time."""

    def __init__(self) -> None:
        self.reserved = 0
        self.live: dict[int, Block] = {}
        self.largest_free = 0


def _block_extra(b: Mapping[str, Any]) -> tuple[Any, int | None]:
    """Frames and requested bytes of a block, in the current format or the older one that
    keeps them under ``history`` (memory_viz's ``_block_extra``)."""
    frames, req = b.get("frames"), _int(b.get("requested_size"))
    history = b.get("history")
    if "frames" not in b and isinstance(history, list) and history:
        first = history[0] if isinstance(history[0], Mapping) else {}
        frames = first.get("frames")
        req = req if req is not None else _int(first.get("real_size"))
    return frames, req if req is not None else _int(b.get("size"))


def _segments(snapshot: Mapping[str, Any]) -> dict[int, _Segments]:
    out: dict[int, _Segments] = {}
    segments = snapshot.get("segments")
    for seg in segments if isinstance(segments, list) else ():
        if not isinstance(seg, Mapping):
            continue
        dev = _int(seg.get("device"))
        s = out.setdefault(dev if dev is not None else 0, _Segments())
        s.reserved += _int(seg.get("total_size")) or 0
        addr = _int(seg.get("address")) or 0
        blocks = seg.get("blocks")
        for b in blocks if isinstance(blocks, list) else ():
            if not isinstance(b, Mapping):
                continue
            size = _int(b.get("size")) or 0
            baddr = _int(b.get("address"))
            baddr = addr if baddr is None else baddr
            addr = baddr + size  # older snapshots give no block address: blocks are in order
            state = b.get("state")
            if state == "inactive":
                s.largest_free = max(s.largest_free, size)
            elif isinstance(state, str) and state.startswith("active"):
                # active_allocated; active_pending_free (docstring: active_awaiting_free)
                frames, req = _block_extra(b)
                s.live[baddr] = (req if req is not None else size, frames, False)
    return out


def _traces(snapshot: Mapping[str, Any]) -> list[list[Mapping[str, Any]]]:
    traces = snapshot.get("device_traces")
    if not isinstance(traces, list):
        return []
    return [_entries(t) if isinstance(t, list) else [] for t in traces]


def _entries(trace: list[Any]) -> list[Mapping[str, Any]]:
    """The trace itself when every entry is a dict (no copy of a 100k-entry list), else its
    mappings."""
    if all(type(e) is dict for e in trace):
        return trace
    return [e for e in trace if isinstance(e, Mapping)]


def load_snapshot(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A snapshot file as a dict: JSON (as ``--memory`` writes it) or msgpack, never pickle."""
    hint = "pass a snapshot --memory saved (memory/rank<N>.*.json)"
    data = read_regular(path, limit=max(record_size_limit(), SNAPSHOT_MAX_BYTES), hint=hint)
    try:
        if data[:64].lstrip()[:1] in (b"{", b"["):
            obj = msgspec.json.decode(data)
        else:
            obj = msgspec.msgpack.decode(data)
    except (msgspec.DecodeError, MemoryError, RecursionError) as exc:
        msg = str(exc).replace("\n", " ")
        raise UsageError(f"{path}: not a readable allocator snapshot ({msg}); {hint}") from None
    if isinstance(obj, list):  # the oldest format: segments only
        obj = {"segments": obj}
    if not isinstance(obj, dict) or not ("segments" in obj or "device_traces" in obj):
        raise UsageError(f"{path}: no 'segments' or 'device_traces': not a snapshot; {hint}")
    return obj


# --- frames and sites -----------------------------------------------------------------------

_TORCH_PARTS = frozenset(
    ("nn", "autograd", "optim", "utils", "distributed", "cuda", "amp", "fx", "jit", "nested")
)
_TORCH_FILES = frozenset(("functional.py", "overrides.py", "random.py", "serialization.py"))
_STDLIB = re.compile(r"python3(\.\d+)?t?$")
_internal_cache: dict[str, bool] = {}


def _in_torch(parts: list[str], k: int) -> bool:
    """parts[k] is torch's package folder: installed, or a source checkout's."""
    if parts[k] != "torch":
        return False
    nxt = parts[k + 1]
    return (
        (k > 0 and parts[k - 1] in ("site-packages", "dist-packages"))
        or nxt.startswith("_")
        or nxt in _TORCH_PARTS
        or nxt in _TORCH_FILES
    )


def _in_stdlib(parts: list[str], k: int) -> bool:
    """parts[k] is Python's library folder (lib/python3.11, Windows' Lib), outside its
    site-packages."""
    library = parts[k] == "Lib" or (
        k > 0 and parts[k - 1] in ("lib", "lib64") and bool(_STDLIB.match(parts[k]))
    )
    return library and not any(p in ("site-packages", "dist-packages") for p in parts[k + 1 :])


def _is_internal(filename: str) -> bool:
    """Frames that are not the user's: torch itself (installed, or a source checkout), the
    standard library, C++ frames (``stacks="all"``) and ``<frozen ...>`` code."""
    hit = _internal_cache.get(filename)
    if hit is not None:
        return hit
    parts = filename.replace("\\", "/").split("/")
    internal = (
        not filename.endswith(".py")
        or filename.startswith("<")
        or any(_in_torch(parts, k) or _in_stdlib(parts, k) for k in range(len(parts) - 1))
    )
    if len(_internal_cache) < 100_000:
        _internal_cache[filename] = internal
    return internal


def _frame(f: Any) -> tuple[str, int, str] | None:
    if not isinstance(f, Mapping):
        return None
    name, line = f.get("filename"), _int(f.get("line"))
    return (str(name), line or 0, str(f.get("name") or "?")) if name is not None else None


def _short(frame: tuple[str, int, str]) -> str:
    filename, line, name = frame
    parts = filename.replace("\\", "/").rsplit("/", 2)
    shown = "/".join(parts[-2:]) if parts[-1] in ("__init__.py", "__main__.py") else parts[-1]
    return f"{shown}:{line} {name}"


def _site_key(frames: Any) -> tuple[tuple[str, int, str], ...]:
    """The first 3 user frames of a stack (innermost first); its innermost frame when it has
    no user frame; () without a stack."""
    if type(frames) is not list or not frames:
        return ()
    out: list[tuple[str, int, str]] = []
    cache = _internal_cache
    for f in frames:
        # the common case (a dict with a str filename) without _frame's checks
        name = f.get("filename") if type(f) is dict else None
        internal = cache.get(name) if type(name) is str else None
        if internal is None:
            fr = _frame(f)
            if fr is None or _is_internal(fr[0]):
                continue
        elif internal:
            continue
        else:
            fr = _frame(f)
        if fr is not None:
            out.append(fr)
            if len(out) == _STACK_FRAMES:
                break
    if out:
        return tuple(out)
    first = next((fr for fr in map(_frame, frames) if fr is not None), None)
    return (first,) if first is not None else ()


def _site_table(blocks: Iterable[Block], top: int) -> tuple[list[SiteRow], int, float]:
    """Blocks grouped by site and short stack: top rows by bytes, group count, the rest's MiB."""
    groups: dict[tuple[bool, tuple[tuple[str, int, str], ...]], list[int]] = {}
    for size, frames, before in blocks:
        key = (before, _site_key(frames))
        g = groups.get(key)
        if g is None:
            groups[key] = [size, 1, size]
        else:
            g[0] += size
            g[1] += 1
            if size > g[2]:
                g[2] = size
    rows: list[tuple[int, int, str, SiteRow]] = []
    for (before, stack), (total, count, largest) in groups.items():
        first = stack[0] if stack and not before else None
        site = _BEFORE_RING if before else (_short(stack[0]) if stack else _NO_STACK)
        row = SiteRow(
            site=site,
            file=first[0] if first else None,
            line=first[1] if first else None,
            function=first[2] if first else None,
            stack=[_short(f) for f in stack],
            mib=_mib(total),
            count=count,
            largest_mib=_mib(largest),
        )
        rows.append((total, count, site + "\n" + "\n".join(row.stack), row))
    rows.sort(key=lambda r: (-r[0], -r[1], r[2]))
    rest = sum(r[0] for r in rows[top:])
    return [r[3] for r in rows[:top]], len(rows), _mib(rest)


# --- steps and phases -----------------------------------------------------------------------


def _step_at(marks: Sequence[tuple[int, float, float]], t: float | None) -> int | None:
    """The step whose [start, end] holds ``t``; the latest-starting one where several do."""
    if t is None:
        return None
    best: tuple[float, int] | None = None
    for mark in marks:
        try:
            step, start, end = int(mark[0]), float(mark[1]), float(mark[2])
        except (TypeError, ValueError, IndexError):
            continue
        if start <= t <= end and (best is None or start >= best[0]):
            best = (start, step)
    return best[1] if best else None


def _phase_at(marks: Sequence[tuple[str, float, float]], t: float | None) -> str | None:
    """The innermost phase holding ``t``: latest start, then earliest end."""
    if t is None:
        return None
    best: tuple[float, float, str] | None = None
    for mark in marks:
        try:
            name, start, end = str(mark[0]), float(mark[1]), float(mark[2])
        except (TypeError, ValueError, IndexError):
            continue
        if start <= t <= end and (
            best is None or start > best[0] or (start == best[0] and end < best[1])
        ):
            best = (start, end, name)
    return best[2] if best else None


# --- the summary ----------------------------------------------------------------------------


def _time(entries: Sequence[Mapping[str, Any]], index: int | None) -> float | None:
    """``time_us`` of an entry; of the first entry for the start of the ring (−1)."""
    if index is None or not entries:
        return None
    return _num(entries[max(index, 0)].get("time_us"))


def _fragmentation(reserved: int, allocated: int, largest_free: int | None) -> Fragmentation:
    free = reserved - allocated
    return Fragmentation(
        reserved_mib=_mib(reserved),
        allocated_mib=_mib(allocated),
        free_mib=_mib(free),
        free_pct=round(100.0 * free / reserved, 3) if reserved > 0 else None,
        largest_free_block_mib=_mib(largest_free) if largest_free is not None else None,
    )


def _notes(r: Replay, timed: bool) -> list[str]:
    notes: list[str] = []
    if not r.n:
        notes.append(
            "no allocator history for this device: the figures are the state at snapshot "
            "time, not the peak (record with enabled='all')"
        )
    elif not timed:
        notes.append("trace entries carry no time_us (older PyTorch): no step or phase")
    before = len(r.kept) + len(r.freed_at)
    if before:
        notes.append(
            f"{before} blocks ({_mib(r.baseline_allocated):,.1f} MiB) were allocated before "
            "the trace window: still live at snapshot time (their stack is from the snapshot, "
            "when recorded) or freed in the window (their stack is that of the free)"
        )
    if r.stale_blocks:
        notes.append(
            f"{r.stale_blocks} blocks allocated in the trace are not in the snapshot: their "
            "free is missing from the trace (history switched off and on?); they count as "
            "live until their address is reused"
        )
    if r.reserved_mismatch:
        notes.append(
            f"the trace frees {_mib(r.reserved_mismatch):,.1f} MiB of segments more than it "
            "and the snapshot hold: reserved figures are a lower bound"
        )
    if r.skipped:
        notes.append(f"{r.skipped} trace entries without a usable addr or size were skipped")
    return notes


def _oom(
    r: Replay,
    step_marks: Sequence[tuple[int, float, float]],
    phase_marks: Sequence[tuple[str, float, float]],
    top: int,
) -> OomEvent | None:
    if r.oom_index is None:
        return None
    e = r.entries[r.oom_index]
    t = _num(e.get("time_us"))
    free = _num(e.get("device_free"))
    sites, _, _ = _site_table(r.live_at(r.oom_index), top)
    return OomEvent(
        entry=r.oom_index,
        time_us=t,
        step=_step_at(step_marks, t),
        phase=_phase_at(phase_marks, t),
        requested_mib=_mib(_int(e.get("size")) or 0),
        device_free_mib=_mib(free) if free is not None else None,
        allocated_mib=_mib(r.allocated_at_oom),
        reserved_mib=_mib(r.reserved_at_oom),
        top_sites=sites,
        count=r.oom_count,
    )


def _expandable(snapshot: Mapping[str, Any]) -> bool | None:
    settings = snapshot.get("allocator_settings")
    value = settings.get("expandable_segments") if isinstance(settings, Mapping) else None
    return value if isinstance(value, bool) else None


def summarize_snapshot(
    snapshot: Mapping[str, Any],
    *,
    step_marks: Sequence[tuple[int, float, float]] = (),
    phase_marks: Sequence[tuple[str, float, float]] = (),
    device_total_mib: float | None = None,
    top: int = 10,
    device: int | None = None,
) -> SnapshotSummary:
    """Peak allocated and reserved, the step and phase of the peak, the sites live at it,
    fragmentation, and the OOM if one is in the trace, for one device of a snapshot.

    ``step_marks`` are (step, start_us, end_us) and ``phase_marks`` (name, start_us, end_us)
    on the trace's wall clock (µs). ``device``: the CUDA device to describe; by default the
    one with the highest peak reserved. Linear in the trace entries.
    """
    if not isinstance(snapshot, Mapping):
        if isinstance(snapshot, list):  # the oldest format: segments only
            snapshot = {"segments": snapshot}
        else:
            raise TypeError("pass the dict torch.cuda.memory._snapshot() returns")
    if top < 0:
        raise ValueError("top must be ≥ 0")
    with _gc_paused():
        return _summarize(snapshot, step_marks, phase_marks, device_total_mib, top, device)


def _summarize(
    snapshot: Mapping[str, Any],
    step_marks: Sequence[tuple[int, float, float]],
    phase_marks: Sequence[tuple[str, float, float]],
    device_total_mib: float | None,
    top: int,
    device: int | None,
) -> SnapshotSummary:
    segments = _segments(snapshot)
    traces = _traces(snapshot)
    devices = sorted(set(segments) | {d for d, t in enumerate(traces) if t})
    replays: dict[int, Replay] = {}
    for d in devices:
        segs = segments.setdefault(d, _Segments())
        entries = traces[d] if d < len(traces) else []
        replays[d] = replay(entries, segs.live, segs.reserved)
    if device is None and replays:
        device = max(devices, key=lambda d: (replays[d].peak_reserved, -d))
    r = replays.get(device) if device is not None else None
    if r is None:
        r = replay([], {}, 0)
    segs = segments.get(device, _Segments()) if device is not None else _Segments()
    ring = r.entries
    timed = bool(ring) and any(_num(e.get("time_us")) is not None for e in ring[:1000])
    peak_entry = r.peak_index if ring else None
    t = _time(ring, peak_entry)
    live = r.live_at(r.peak_index)
    sites, site_count, other = _site_table(live, top)
    allocated_end = sum(b[0] for b in segs.live.values())
    return SnapshotSummary(
        device=device,
        devices=[
            DevicePeak(
                device=d,
                peak_allocated_mib=_mib(replays[d].peak_allocated),
                peak_reserved_mib=_mib(replays[d].peak_reserved),
                entries=replays[d].n,
            )
            for d in devices
        ],
        entries=r.n,
        timed=timed,
        peak_allocated_mib=_mib(r.peak_allocated),
        peak_entry=peak_entry,
        peak_time_us=t,
        peak_step=_step_at(step_marks, t),
        peak_phase=_phase_at(phase_marks, t),
        reserved_at_peak_mib=_mib(r.reserved_at_peak),
        pending_free_at_peak_mib=_mib(r.pending_at_peak),
        peak_reserved_mib=_mib(r.peak_reserved),
        peak_reserved_entry=r.peak_reserved_index if ring else None,
        peak_reserved_time_us=_time(ring, r.peak_reserved_index if ring else None),
        baseline_allocated_mib=_mib(r.baseline_allocated),
        baseline_reserved_mib=_mib(r.baseline_reserved),
        live_at_peak_count=len(live),
        top_sites=sites,
        site_count=site_count,
        other_sites_mib=other,
        fragmentation_at_peak=_fragmentation(r.reserved_at_peak, r.peak_allocated, None),
        fragmentation_at_snapshot=_fragmentation(segs.reserved, allocated_end, segs.largest_free),
        device_total_mib=device_total_mib,
        headroom_mib=(
            round(device_total_mib - _mib(r.peak_reserved), 6)
            if device_total_mib is not None
            else None
        ),
        expandable_segments=_expandable(snapshot),
        oom=_oom(r, step_marks, phase_marks, top),
        notes=_notes(r, timed),
    )


# --- across devices -------------------------------------------------------------------------


def describe_device0_imbalance(device_peaks_mib: Mapping[int, float]) -> DeviceImbalance | None:
    """Device 0's peak against the mean of the other devices of one process (DataParallel);
    None with fewer than two devices or without device 0."""
    if 0 not in device_peaks_mib or len(device_peaks_mib) < 2:
        return None
    first = float(device_peaks_mib[0])
    rest = [float(v) for d, v in device_peaks_mib.items() if d != 0]
    mean = sum(rest) / len(rest)
    excess = first - mean
    text = None
    if excess > 0:
        text = (
            f"device 0 peaks {excess:,.0f} MiB higher than the mean of the other devices: "
            "DataParallel gathers outputs and keeps the master copy on device 0"
        )
    return DeviceImbalance(
        device0_mib=first,
        others_mean_mib=round(mean, 6),
        excess_mib=round(excess, 6),
        excess_pct=round(100.0 * excess / mean, 3) if mean > 0 else None,
        text=text,
    )
