"""``torch.compile`` in a trace: how much of each step ran inside compiled graphs, and how
often the compiled code was entered.

Dynamo marks each compiled frame's run with a ``Torch-Compiled Region: i/j`` host op (frame
``i``, its ``j``-th compilation: ``j > 0`` means the frame was recompiled), and AOTAutograd
runs a graph's backward as ``CompiledFunctionBackward`` on autograd's thread. The share of the
step inside them (their union over the step windows, forward and backward) says how much of
the training the compiler sees; more regions than frames per step, or regions nested in
regions, are graph breaks dynamo resumed from (each break starts a frame of its own).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import msgspec

from mgprof.analyze.tracefile.rank_trace import RankTrace

__all__ = ["DEFINITIONS", "CompiledRegions", "compiled_regions"]

_REGION = re.compile(r"Torch-Compiled Region: (\d+)/(\d+)")
_BACKWARD = "CompiledFunctionBackward"

DEFINITIONS = {
    "compiled.compiled_pct": (
        "union of Torch-Compiled Region and CompiledFunctionBackward host spans / the steps' "
        "windows x 100: the share of each step inside torch.compile's graphs"
    ),
    "compiled.regions_per_step": (
        "top-level Torch-Compiled Region spans per traced step (one per compiled frame run; "
        "more than the model's frames means graph breaks)"
    ),
}


class CompiledRegions(msgspec.Struct, kw_only=True):
    """One rank's compiled code in its traced steps (None for a trace without any)."""

    frames: list[str]
    """Distinct ``i/j`` region ids (frame / compilation), sorted."""
    recompiled_frames: int
    """Frames seen with a compilation index above 0: dynamo compiled them again."""
    regions: int
    """Top-level region spans in the window (a region inside another is counted in
    ``nested``)."""
    nested: int
    steps: int
    """Traced steps the figures cover (1 when the trace has no ProfilerStep spans)."""
    regions_per_step: float
    forward_us: float
    """Union of the region spans in the steps."""
    backward_us: float
    """Union of the ``CompiledFunctionBackward`` spans in the steps."""
    window_us: float
    compiled_pct: float | None
    """Union of both / the windows × 100 (None when the window is empty)."""


def _union(spans: Iterable[tuple[float, float]], lo: float, hi: float) -> float:
    total, end = 0.0, lo
    for s, e in sorted((max(s, lo), min(e, hi)) for s, e in spans):
        if e <= s or e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


def compiled_regions(rt: RankTrace) -> CompiledRegions | None:
    """The compiled regions of ``rt``'s traced steps, or None when it has none."""
    ops = rt.host_ops
    if ops is None or not ops.names:
        return None
    region_ids = {i: m.groups() for i, n in enumerate(ops.names) if (m := _REGION.fullmatch(n))}
    backward_ids = {i for i, n in enumerate(ops.names) if n == _BACKWARD}
    if not region_ids:
        return None
    regions: list[tuple[float, float, str]] = []
    backward: list[tuple[float, float]] = []
    for row in range(ops.size):
        name = int(ops.name[row])
        if name in region_ids:
            frame, attempt = region_ids[name]
            regions.append((float(ops.start[row]), float(ops.end[row]), f"{frame}/{attempt}"))
        elif name in backward_ids:
            backward.append((float(ops.start[row]), float(ops.end[row])))
    if rt.steps:
        windows = [(s.start, s.end) for s in rt.steps]
    elif rt.cpu_window_all is not None:
        windows = [rt.cpu_window_all]
    else:
        return None
    regions.sort()
    top: list[tuple[float, float]] = []
    nested = 0
    for s, e, _ in regions:
        if top and s < top[-1][1] and e <= top[-1][1]:
            nested += 1
        else:
            top.append((s, e))
    seen = sorted({r[2] for r in regions}, key=lambda t: tuple(int(x) for x in t.split("/")))
    in_steps = [(s, e) for s, e in top if any(s < hi and e > lo for lo, hi in windows)]
    forward = sum(_union(top, lo, hi) for lo, hi in windows)
    back = sum(_union(backward, lo, hi) for lo, hi in windows)
    both = sum(_union([*top, *backward], lo, hi) for lo, hi in windows)
    window = sum(hi - lo for lo, hi in windows)
    return CompiledRegions(
        frames=seen,
        recompiled_frames=len({f.split("/")[0] for f in seen if not f.endswith("/0")}),
        regions=len(in_steps),
        nested=nested,
        steps=len(windows),
        regions_per_step=len(in_steps) / len(windows),
        forward_us=forward,
        backward_us=back,
        window_us=window,
        compiled_pct=100.0 * both / window if window > 0 else None,
    )
