"""GPU idle time by cause, and kernel launch delay: the two questions after "busy X %".

Idle time breakdown (HTA's ``get_idle_time_breakdown`` definitions, per stream): for each
device event after the first on its stream, the gap since the previous event ended is

- *host wait* when the event's CPU-side launch came after the previous event ended (the GPU
  waited for the host to enqueue work),
- *kernel wait* when it did not and the gap is shorter than ``consecutive_kernel_delay_us``
  (the fixed cost of running back-to-back kernels),
- *other* otherwise (cross-stream synchronisation, events, launch delays).

Events without a CPU launch in the trace (no matching correlation) are never host wait. Gaps are
summed over streams, as HTA does, so the total can exceed the window's idle time when several
streams idle at once.

Launch delay = device start − CPU-side launch start, per device event with a launch: how long
work sat in the queue. Large values mean the host runs far ahead (good); near-zero values with
host wait mean the host is the bottleneck.
"""

from __future__ import annotations

import msgspec
import numpy as np

from mgprof.analyze.stats import percentile_of_sorted
from mgprof.analyze.tracefile.rank_trace import RankTrace

CONSECUTIVE_KERNEL_DELAY_US = 30.0
"""The gap below which an idle gap between launched kernels is kernel wait: HTA's
``consecutive_kernel_delay=30``. HTA's documentation calls it 30 ns, but its code compares the
30 with the trace's timestamps, which are microseconds in the HTA releases mgprof is checked
against, so its effective threshold is 30 µs; with 0.03 (this module's old value) kernel wait
was 0 on every real trace, and HTA reproduced that only when given 0.03 itself."""


class IdleBreakdown(msgspec.Struct):
    """Idle gaps between consecutive device events on each stream, by cause (µs)."""

    host_wait_us: float
    kernel_wait_us: float
    other_us: float
    streams: int
    threshold_us: float = CONSECUTIVE_KERNEL_DELAY_US


class LaunchDelay(msgspec.Struct):
    """Device start − CPU launch start over the events that have a launch (µs)."""

    events: int
    mean_us: float
    p50_us: float
    p95_us: float
    max_us: float


def _launch_ts(rt: RankTrace) -> np.ndarray:
    """Per device row, its CPU-side launch time, or NaN."""
    out = np.full(rt.dev_start.size, np.nan)
    if rt.launch_corr.size == 0 or rt.dev_corr.size == 0:
        return out
    pos = np.clip(np.searchsorted(rt.launch_corr, rt.dev_corr), 0, rt.launch_corr.size - 1)
    hit = (rt.launch_corr[pos] == rt.dev_corr) & (rt.dev_corr >= 0)
    out[hit] = rt.launch_ts[pos[hit]]
    return out


def idle_breakdown(
    rt: RankTrace, threshold_us: float = CONSECUTIVE_KERNEL_DELAY_US
) -> IdleBreakdown | None:
    """The idle breakdown of a trace with device events, else None."""
    if rt.dev_start.size < 2 or rt.dev_stream.size != rt.dev_start.size:
        return None
    launch = _launch_ts(rt)
    host = kernel = other = 0.0
    # return_counts: np.unique's plain form imports numpy.ma (10 ms of a CLI's start) to ask
    # whether the array is masked
    streams = np.unique(rt.dev_stream, return_counts=True)[0]
    for stream in streams.tolist():
        rows = np.flatnonzero(rt.dev_stream == stream)
        order = rows[np.argsort(rt.dev_start[rows], kind="stable")]
        if order.size < 2:
            continue
        prev_end = np.maximum.accumulate(rt.dev_end[order])[:-1]
        start = rt.dev_start[order][1:]
        gap = start - prev_end
        idle = gap > 0
        launched = launch[order][1:]
        is_host = idle & (launched > prev_end)  # NaN compares False: no launch, no host wait
        is_kernel = idle & ~is_host & (gap < threshold_us)
        is_other = idle & ~is_host & ~is_kernel
        host += float(gap[is_host].sum())
        kernel += float(gap[is_kernel].sum())
        other += float(gap[is_other].sum())
    return IdleBreakdown(host, kernel, other, int(streams.size), threshold_us)


def launch_delay(rt: RankTrace) -> LaunchDelay | None:
    """Queueing delay of launched device events, else None."""
    launch = _launch_ts(rt)
    ok = ~np.isnan(launch)
    if not ok.any():
        return None
    delay = rt.dev_start[ok] - launch[ok]
    ordered = np.sort(delay)
    return LaunchDelay(
        events=int(delay.size),
        mean_us=float(delay.mean()),
        p50_us=percentile_of_sorted(ordered, 50),
        p95_us=percentile_of_sorted(ordered, 95),
        max_us=float(ordered[-1]),
    )
