"""Achieved against attainable: a job's collective bus bandwidth as a share of this machine's.

The baseline is what ``mgprof doctor --bandwidth`` measured (``mgprof.run.bandwidth_probe``):
rows of op, bytes, group size and busbw. For a collective type of a job, the attainable busbw
is the baseline's for the same op and group size at the job's mean message size, interpolated
linearly in log(size) between the two measured sizes around it (the nearest end outside the
measured range, which the result says). Both sides use nccl-tests' busbw, so the share is
comparable across ops and group sizes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec


class Attainable(msgspec.Struct):
    """One collective type of a job beside the machine's baseline."""

    type: str
    mean_call_bytes: int
    busbw_gbps: float
    attainable_busbw_gbps: float
    pct_of_attainable: float
    note: str | None = None
    """Set when the job's message size lies outside the measured sizes (nearest size used)."""


def attainable_busbw(
    baseline: Mapping[str, Any], op: str, nbytes: float, group_size: int | None
) -> tuple[float, str | None] | None:
    """The baseline's busbw for ``op`` at ``nbytes`` (and ``group_size`` when known), or None."""
    rows = [
        r
        for r in baseline.get("rows", [])
        if isinstance(r, Mapping)
        and r.get("op") == op
        and isinstance(r.get("busbw_gbps"), (int, float))
        and isinstance(r.get("bytes"), int)
        and r["bytes"] > 0
        and (group_size is None or r.get("group_size") == group_size)
    ]
    if not rows or nbytes <= 0:
        return None
    rows.sort(key=lambda r: r["bytes"])
    sizes = [float(r["bytes"]) for r in rows]
    values = [float(r["busbw_gbps"]) for r in rows]
    if nbytes <= sizes[0] or nbytes >= sizes[-1]:
        end = 0 if nbytes <= sizes[0] else -1
        exact = math.isclose(nbytes, sizes[end], rel_tol=0.01)
        note = None if exact else f"outside the measured sizes: the {int(sizes[end])} B figure"
        return values[end], note
    x = math.log(nbytes)
    for (s0, v0), (s1, v1) in zip(zip(sizes, values), zip(sizes[1:], values[1:]), strict=False):
        if s0 <= nbytes <= s1:
            t = (x - math.log(s0)) / (math.log(s1) - math.log(s0))
            return v0 + t * (v1 - v0), None
    return None


def against_baseline(
    collectives: Sequence[Mapping[str, Any]], baseline: Mapping[str, Any]
) -> list[Attainable]:
    """Each collective type with a busbw, beside the attainable busbw at its message size."""
    out = []
    for c in collectives:
        busbw, nbytes, count = c.get("busbw_gbps"), c.get("bytes"), c.get("count")
        if not isinstance(busbw, (int, float)) or not isinstance(nbytes, int) or not count:
            continue
        mean = nbytes / count
        group = c.get("group_size") if isinstance(c.get("group_size"), int) else None
        found = attainable_busbw(baseline, str(c.get("type")), mean, group)
        if found is None or found[0] <= 0:
            continue
        value, note = found
        out.append(
            Attainable(
                type=str(c.get("type")),
                mean_call_bytes=int(mean),
                busbw_gbps=float(busbw),
                attainable_busbw_gbps=value,
                pct_of_attainable=100.0 * float(busbw) / value,
                note=note,
            )
        )
    return out
