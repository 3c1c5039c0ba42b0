"""What ``mgprof timeline`` does with each event of a rank, decided once between the passes.

From a rank's scan (:mod:`~mgprof.analyze.timeline.scan`) and its clock offset, a
:class:`RankPlan` holds: the rank's pid and one tid per lane, the shift that puts its ``ts`` on
the job's clock, and which events stay. Device events and flow events are decided here, in the
order the scan met them, so that the writing pass only looks the answer up by position:

- ``--steps A:B`` keeps host events that start inside [start of ``ProfilerStep#A``, end of
  ``ProfilerStep#B``] and device events whose launch (same correlation id) is in that span;
  a device event with no launch in the trace is kept when it starts inside the span of the
  device events kept by their launch.
- ``--min-dur US`` drops complete events (``ph`` X) shorter than US.
- A flow (``ph`` s/t/f, one arrow from a launch to its kernel, or forward to backward) is kept
  only when it has a start and an end and every end stays: an end stays when its time is kept
  and the slice it binds to (the one on its lane starting at its ``ts``, where Kineto puts it)
  is not dropped for ``--min-dur``. Flows Kineto wrote with one end only are left out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mgprof.analyze.timeline.events import lane_id
from mgprof.analyze.timeline.scan import FLOW_KEY_ID_BITS, RankScan
from mgprof.errors import UsageError

__all__ = ["TIDS_PER_RANK", "RankPlan", "StepRange", "parse_steps", "plan_rank", "set_origin"]

_STEPS_RE = re.compile(r"\s*(\d{1,18})?\s*(:)?\s*(\d{1,18})?\s*")
_KEY_TYPES = (int, str)
TIDS_PER_RANK = 10_000
"""tid = pid × this + lane: unique in the whole file (viewers key threads by tid alone)."""
_LAUNCH_FLOW_CATS = ("ac2g", "async")
"""Flow categories whose id is the correlation id of a launch and its device event."""


@dataclass(frozen=True)
class StepRange:
    """``ProfilerStep#first`` .. ``ProfilerStep#last``, both included; None: open."""

    first: int | None
    last: int | None

    def text(self) -> str:
        a = "" if self.first is None else str(self.first)
        b = "" if self.last is None else str(self.last)
        return a if self.first == self.last and a else f"{a}:{b}"

    def contains(self, number: int) -> bool:
        return (self.first is None or number >= self.first) and (
            self.last is None or number <= self.last
        )


def parse_steps(text: str) -> StepRange:
    """``A:B`` (inclusive: ProfilerStep#A to #B), ``A`` (one step), ``A:`` or ``:B``."""
    m = _STEPS_RE.fullmatch(text)
    hint = "give --steps A:B with ProfilerStep numbers, both included (e.g. 3:5), or one step"
    if m is None or (m.group(1) is None and m.group(3) is None):
        raise UsageError(f"--steps {text!r} is not a step range; {hint}")
    first = int(m.group(1)) if m.group(1) is not None else None
    last = int(m.group(3)) if m.group(3) is not None else None
    if m.group(2) is None:
        last = first
    if first is not None and last is not None and first > last:
        raise UsageError(f"--steps {text!r}: step {first} comes after step {last}; {hint}")
    return StepRange(first, last)


@dataclass
class RankPlan:
    """How each event of one rank is written (module docstring)."""

    lane_index: dict[tuple[int | str, int | str], int]
    device_lane: list[bool]
    order: list[int]
    """Lane indices in display order (host threads, device streams, the profiler's spans)."""
    rank: int = 0
    pid: int = 1
    shift_us: float = 0.0
    """Output ``ts`` = input ``ts`` − shift_us (the rank's offset and the file's origin)."""
    tids: list[int] = field(default_factory=list)
    window: tuple[float, float] | None = None
    dev_window: tuple[float, float] | None = None
    dev_keep: np.ndarray | None = None
    flow_keep: np.ndarray | None = None
    min_dur_us: float | None = None
    steps_found: list[int] = field(default_factory=list)
    first_us: float | None = None
    """The earliest ``ts`` this rank writes, on its own clock (None: it writes nothing)."""
    _raw: dict[tuple[Any, Any], int | None] = field(default_factory=dict)

    def lane_of(self, pid: object, tid: object) -> int | None:
        if type(pid) in _KEY_TYPES and type(tid) in _KEY_TYPES:
            raw = (pid, tid)
            if raw in self._raw:
                return self._raw[raw]
            found = self._raw[raw] = self.lane_index.get((lane_id(pid), lane_id(tid)))
            return found
        return self.lane_index.get((lane_id(pid), lane_id(tid)))

    def in_window(self, ts: float, lane: int) -> bool:
        win = self.dev_window if self.device_lane[lane] else self.window
        return win is None or win[0] <= ts <= win[1]

    def place(self, rank: int, offset_us: float) -> None:
        """Give the rank its pid, its tids and its clock offset (onto the reference rank)."""
        self.rank = rank
        self.pid = pid = rank + 1  # pid 0 is the idle task to some viewers
        self.tids = [0] * len(self.device_lane)
        for pos, li in enumerate(self.order):
            self.tids[li] = pid * TIDS_PER_RANK + min(pos, TIDS_PER_RANK - 2) + 1
        self.shift_us = -offset_us


def _order(scan: RankScan) -> list[int]:
    def rank_of(i: int) -> tuple[int, int, str, str]:
        lane = scan.lanes[i]
        group = {"host": 0, "device": 1}.get(lane.kind, 2)
        main = 0 if i == scan.step_lane else 1
        return (group, main, str(lane.key[0]).zfill(12), str(lane.key[1]).zfill(12))

    return sorted(range(len(scan.lanes)), key=rank_of)


def _device_keep(
    scan: RankScan, window: tuple[float, float]
) -> tuple[np.ndarray, tuple[float, float]]:
    """Which device events stay for the step window, and the span of those kept."""
    lc = np.frombuffer(scan.launch_corr, dtype=np.int64)
    lt = np.frombuffer(scan.launch_ts, dtype=np.float64)
    dc = np.frombuffer(scan.dev_corr, dtype=np.int64)
    dt = np.frombuffer(scan.dev_ts, dtype=np.float64)
    in_win = np.unique(lc[(lt >= window[0]) & (lt <= window[1])])
    launched = np.isin(dc, lc) & (dc >= 0)
    keep = launched & np.isin(dc, in_win)
    if keep.any():
        ends = np.frombuffer(scan.dev_end, dtype=np.float64)
        span = (float(dt[keep].min()), float(ends[keep].max()))
    else:
        span = window
    orphan = ~launched
    keep |= orphan & (dt >= span[0]) & (dt <= span[1])
    return keep, span


def _flow_keep(plan: RankPlan, scan: RankScan) -> np.ndarray | None:
    keys = np.frombuffer(scan.flow_key, dtype=np.int64)
    if keys.size == 0:
        return None
    phase = np.frombuffer(scan.flow_phase, dtype=np.int8)
    lanes = np.frombuffer(scan.flow_lane, dtype=np.int32)
    ts = np.frombuffer(scan.flow_ts, dtype=np.float64)
    ok = np.ones(keys.size, dtype=bool)
    if plan.window is not None:
        device = np.asarray(plan.device_lane, dtype=bool)[lanes]
        lo, hi = plan.window
        dlo, dhi = plan.dev_window or plan.window
        ok = np.where(device, (ts >= dlo) & (ts <= dhi), (ts >= lo) & (ts <= hi))
        launch_codes = [code for cat, code in scan.cats.items() if cat in _LAUNCH_FLOW_CATS]
        if launch_codes and plan.dev_keep is not None:
            small = keys < (1 << 62)
            codes = np.where(small, keys >> FLOW_KEY_ID_BITS, -1)
            ids = keys & ((1 << FLOW_KEY_ID_BITS) - 1)
            by_launch = device & np.isin(codes, launch_codes)
            dev_corr = np.frombuffer(scan.dev_corr, dtype=np.int64)
            kept_corr = dev_corr[plan.dev_keep]
            ok = np.where(by_launch, np.isin(ids, kept_corr), ok)
    if plan.min_dur_us is not None and len(scan.short_ts):
        short_lane = np.frombuffer(scan.short_lane, dtype=np.int32)
        short_ts = np.frombuffer(scan.short_ts, dtype=np.float64)
        for li in np.unique(short_lane):
            here = lanes == li
            if here.any():
                ok[here] &= ~np.isin(ts[here], short_ts[short_lane == li])
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    _uniq, starts, inverse = np.unique(sorted_keys, return_index=True, return_inverse=True)
    ph = phase[order]
    group_ok = np.logical_and.reduceat(ok[order], starts)
    group_ok &= np.logical_or.reduceat(ph == 0, starts)
    group_ok &= np.logical_or.reduceat(ph == 2, starts)
    keep = np.empty(keys.size, dtype=bool)
    keep[order] = group_ok[inverse]
    return keep


def plan_rank(scan: RankScan, steps: StepRange | None, min_dur_us: float | None) -> RankPlan:
    """Decide what stays of one rank (module docstring); :meth:`RankPlan.place` gives it its
    pid and clock once every rank is known. Needs the scan's arrays, which can go after."""
    plan = RankPlan(
        lane_index=dict(scan._lane_index),
        device_lane=[lane.kind == "device" for lane in scan.lanes],
        order=_order(scan),
        min_dur_us=min_dur_us,
    )
    plan.first_us = scan.ts_min
    if steps is not None:
        chosen = [s for s in scan.steps if steps.contains(s[0])]
        plan.steps_found = sorted({s[0] for s in chosen})
        if chosen:
            plan.window = (min(s[1] for s in chosen), max(s[2] for s in chosen))
        else:
            plan.window = (np.inf, -np.inf)  # nothing of this rank is in the steps
        plan.dev_keep, plan.dev_window = _device_keep(scan, plan.window)
        starts = [plan.window[0]] if chosen else []
        if plan.dev_keep.any():
            dev_ts = np.frombuffer(scan.dev_ts, dtype=np.float64)
            starts.append(float(dev_ts[plan.dev_keep].min()))
        plan.first_us = min(starts) if starts else None
    plan.flow_keep = _flow_keep(plan, scan)
    if plan.flow_keep is not None and plan.flow_keep.all():
        plan.flow_keep = None
    return plan


def set_origin(plans: list[RankPlan]) -> float:
    """Shift every rank so that the earliest kept event of the job is at ``ts`` 0 (after
    :meth:`RankPlan.place`); returns the origin on the reference rank's clock (its ``ts``
    that became 0)."""
    firsts = [p.first_us - p.shift_us for p in plans if p.first_us is not None]
    origin = min(firsts) if firsts else 0.0
    for p in plans:
        p.shift_us += origin
    return origin
