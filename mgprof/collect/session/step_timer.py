"""Step and region timing that never stalls the device queue.

On CUDA, boundaries are CUDA events recorded on the current stream (asynchronous); their elapsed
times are read once the events have completed, so the training loop never synchronises for
mgprof. On CPU, ``time.perf_counter`` is exact and cheap.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch


class Mark:
    """A point on the timeline: host time always, plus a CUDA event when timing the device."""

    __slots__ = ("event", "host_s")

    def __init__(self, host_s: float, event: Any = None) -> None:
        self.host_s = host_s
        self.event = event


class Clock:
    """Makes marks; ``elapsed_ms`` measures between two of them on the device when it can."""

    def __init__(self, use_cuda: bool, now: Callable[[], float] = time.perf_counter) -> None:
        self.use_cuda = use_cuda and torch.cuda.is_available()
        self._now = now
        self._pool: list[Any] = []

    def mark(self) -> Mark:
        event = None
        if self.use_cuda:
            # a pooled event skips cudaEventCreate: recording is then one driver call
            event = self._pool.pop() if self._pool else torch.cuda.Event(enable_timing=True)
            event.record()
        return Mark(self._now(), event)

    def recycle(self, mark: Mark) -> None:
        """Give a read mark's event back for reuse; the mark must not be read again."""
        if mark.event is not None and len(self._pool) < 1024:
            self._pool.append(mark.event)
            mark.event = None

    def elapsed_ms(self, start: Mark, end: Mark) -> float:
        """Device time between two marks (waits for ``end`` if needed), else host time."""
        if start.event is not None and end.event is not None:
            end.event.synchronize()
            return float(start.event.elapsed_time(end.event))
        return (end.host_s - start.host_s) * 1000.0

    @staticmethod
    def ready(mark: Mark) -> bool:
        """True when the mark's time can be read without waiting."""
        return mark.event is None or bool(mark.event.query())
