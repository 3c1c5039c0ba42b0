"""How busy the machine was while a run of ours ran: other processes' CPU time and steal time.

A comparison measured on a machine that something else is using says more about that something
than about the strategies (``mgprof compare`` gave 5.99x on a busy machine and 0.62x on a quiet
one for the same command). Around each launch this reads the machine's CPU time
(``/proc/stat`` through psutil) and the CPU time of this process and of every process it waited
for (``RUSAGE_CHILDREN``: torchrun reaps its workers and the DataLoader workers are reaped by
theirs, so the whole launch tree is counted). What the machine spent beyond that went to other
processes; steal time is CPU a hypervisor gave to another guest.
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass

import psutil

BUSY_OTHER_CORES = 0.5
"""Other processes' CPU use, in cores, from which a row counts as measured on a busy machine."""
BUSY_STEAL_PCT = 5.0
"""Steal time, percent of the machine's cores, from which a row counts as measured while the
hypervisor gave the cores to someone else."""


@dataclass
class MachineLoad:
    """What the machine did besides our launch, over ``wall_s`` seconds."""

    wall_s: float
    other_cores: float
    """Mean cores of CPU time used by other processes (never below 0)."""
    steal_pct: float | None
    """Percent of the machine's core-seconds stolen; None where the kernel does not say."""

    def busy(self) -> str | None:
        """The load in words when it can have moved a measurement, else None."""
        parts = []
        if self.other_cores >= BUSY_OTHER_CORES:
            parts.append(f"other processes used {self.other_cores:.1f} cores")
        if self.steal_pct is not None and self.steal_pct >= BUSY_STEAL_PCT:
            parts.append(f"{self.steal_pct:.0f} % of the CPU time was stolen by the hypervisor")
        return ", ".join(parts) if parts else None


def _ours() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _machine() -> tuple[float, float | None]:
    """(busy CPU seconds of the whole machine, steal seconds or None)."""
    t = psutil.cpu_times()
    idle = t.idle + getattr(t, "iowait", 0.0)
    steal = getattr(t, "steal", None)
    total = sum(t)
    # guest time is already counted in user time on Linux
    total -= getattr(t, "guest", 0.0) + getattr(t, "guest_nice", 0.0)
    return total - idle - (steal or 0.0), steal


class LoadMeter:
    """``start()`` before a launch, ``stop()`` after it has been waited for."""

    def __init__(self) -> None:
        self._t0 = 0.0
        self._busy0 = 0.0
        self._steal0: float | None = None
        self._ours0 = 0.0

    def start(self) -> LoadMeter:
        self._t0 = time.monotonic()
        self._busy0, self._steal0 = _machine()
        self._ours0 = _ours()
        return self

    def stop(self) -> MachineLoad | None:
        """The load since ``start``; None when it cannot be read (never raises)."""
        try:
            wall = time.monotonic() - self._t0
            busy, steal = _machine()
            ours = _ours() - self._ours0
        except Exception:  # an unreadable /proc: no load figure, never a failed comparison
            return None
        if wall <= 0:
            return None
        other = max(0.0, (busy - self._busy0) - ours) / wall
        cores = os.cpu_count() or 1
        steal_pct = None
        if steal is not None and self._steal0 is not None:
            steal_pct = 100.0 * max(0.0, steal - self._steal0) / (wall * cores)
        return MachineLoad(wall_s=wall, other_cores=other, steal_pct=steal_pct)
