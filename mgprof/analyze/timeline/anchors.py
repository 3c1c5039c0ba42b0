"""The clock anchors of one rank: its collective calls, with type, process group and Seq.

On a GPU trace an anchor is a communication kernel; its type comes from the kernel's own
``Collective name`` arg, else from the ``nccl:*`` op that launched it (same ``External id``, else
the op around its CPU-side launch: an all-to-all runs as SendRecv kernels), else from the kernel
name; its process group and Seq from the kernel, else from the ``record_param_comms`` span
around the launch. On a CPU-only trace an anchor is a ``gloo:*`` op. Its step is the
``ProfilerStep#N`` its launch (or the op itself) falls in, which keeps calls of different steps
from being matched when a trace lost one. Which anchors mark a shared moment, and how, is
:mod:`~mgprof.analyze.timeline.clock`'s part.
"""

from __future__ import annotations

import bisect
from array import array
from dataclasses import dataclass
from typing import Protocol

from mgprof.analyze.timeline.clock import Anchor
from mgprof.analyze.trace.comm_types import collective_type

__all__ = ["CommSpan", "anchors_of"]

_LOOK_BACK = 64


@dataclass
class CommSpan:
    """A communication kernel or a host communication op (``nccl:*``, ``gloo:*``,
    ``record_param_comms``) as the scan met it."""

    lane: int
    start: float
    end: float
    name: str
    ext: int | None
    corr: int | None
    collective: str | None
    pg: str | None
    seq: str | None


class ScanFacts(Protocol):
    """What anchoring reads of a rank's scan (``timeline.scan.RankScan`` has it): the steps,
    the communication spans and the launches' correlation ids, lanes and times."""

    steps: list[tuple[int, float, float]]
    comm_kernels: list[CommSpan]
    host_comm: list[CommSpan]
    launch_corr: array
    launch_lane: array
    launch_ts: array


def anchors_of(scan: ScanFacts) -> list[Anchor]:
    """Every collective call of the rank as an anchor (module docstring)."""
    steps = scan.steps

    def step_at(ts: float | None) -> int | None:
        if ts is None:
            return None
        for number, start, end in steps:
            if start <= ts <= end:
                return number
        return None

    if scan.comm_kernels:
        launches = _launch_index(scan)
        ops = [c for c in scan.host_comm if c.name.startswith("nccl:")]
        by_ext = {op.ext: op for op in ops if op.ext is not None}
        op_spans = _Spans(ops)
        params = _Spans([c for c in scan.host_comm if c.name == "record_param_comms"])
        out = []
        for k in scan.comm_kernels:
            launch = launches.get(k.corr) if k.corr is not None else None
            op = by_ext.get(k.ext) if k.ext is not None and k.ext != k.corr else None
            if op is None and launch is not None:
                op = op_spans.around(*launch)
            info = k if k.collective or k.seq else None
            if info is None and launch is not None:
                info = params.around(*launch)
            named = (info.collective if info else None) or (op.name if op else None) or k.name
            out.append(
                Anchor(
                    kind="device",
                    type=collective_type(str(named)),
                    pg=info.pg if info else None,
                    seq=info.seq if info else None,
                    step=step_at(launch[1] if launch else k.start),
                    start_us=k.start,
                    end_us=k.end,
                )
            )
        return out
    gloo = [c for c in scan.host_comm if c.name.startswith("gloo:")]
    return [
        Anchor("host", collective_type(c.name), c.pg, c.seq, step_at(c.start), c.start, c.end)
        for c in gloo
    ]


def _launch_index(scan: ScanFacts) -> dict[int, tuple[int, float]]:
    """Correlation id -> (lane, ts) of the launches of communication kernels only."""
    wanted = {k.corr for k in scan.comm_kernels if k.corr is not None}
    return {
        c: (scan.launch_lane[i], scan.launch_ts[i])
        for i, c in enumerate(scan.launch_corr)
        if c in wanted
    }


class _Spans:
    """Spans by lane, sorted by start, for finding the one around a launch."""

    def __init__(self, spans: list[CommSpan]) -> None:
        self.by_lane: dict[int, tuple[list[float], list[CommSpan]]] = {}
        for sp in sorted(spans, key=lambda x: x.start):
            starts, found = self.by_lane.setdefault(sp.lane, ([], []))
            starts.append(sp.start)
            found.append(sp)

    def around(self, lane: int, ts: float) -> CommSpan | None:
        """The innermost span on ``lane`` enclosing ``ts``: the latest start whose end covers
        it (a few steps back at most: spans around a launch are nested, and short)."""
        starts, found = self.by_lane.get(lane, ([], []))
        j = bisect.bisect_right(starts, ts) - 1
        for k in range(j, max(j - _LOOK_BACK, -1), -1):
            if found[k].end >= ts:
                return found[k]
        return None
