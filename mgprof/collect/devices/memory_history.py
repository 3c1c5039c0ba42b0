"""Allocator history per rank (``--memory``): where CUDA memory went, and what held it at an OOM.

On CUDA, PyTorch's caching allocator records every allocation and free with its Python stack
(``torch.cuda.memory._record_memory_history``) into a bounded ring. mgprof turns it on at the
session start, takes one snapshot when the traced steps end (then turns it off: no cost for the
rest of the run) and one from an out-of-memory observer at the moment an allocation fails. A
snapshot is saved as JSON, never pickle (a pickle is code when loaded). The OOM itself is never
caught: the script's exception and exit code stay what they were.

Steps and regions are marked on the host wall clock in µs, the clock of the allocator's trace
entries, so the analysis can name the step and region of the peak.
"""

from __future__ import annotations

import os
import time
from typing import Any

import msgspec
import torch

from mgprof.collect.failopen import FailOpen

MAX_ENTRIES_ENV = "MGPROF_MEMORY_MAX_ENTRIES"
MAX_ENTRIES = 200_000
"""Allocator events kept (about 100 MB of snapshot with stacks at most): enough for the traced
steps of a large model, bounded for a long one."""
MAX_MARKS = 20_000
"""Region marks kept: beyond this a training loop with many tiny regions would grow memory."""


def wall_us() -> float:
    return time.time_ns() / 1000.0


class MemoryHistory:
    """The allocator history of this process's CUDA devices and its snapshots (bytes of JSON)."""

    def __init__(self, failopen: FailOpen) -> None:
        self.failopen = failopen
        self.recording = False
        self.snapshots: dict[str, bytes] = {}
        self.oom = False
        self.step_marks: list[tuple[int, float, float]] = []
        self.phase_marks: list[tuple[str, float, float]] = []
        self._step_start = wall_us()

    def start(self) -> None:
        entries = int(os.environ.get(MAX_ENTRIES_ENV) or MAX_ENTRIES)
        torch.cuda.memory._record_memory_history(
            enabled="all", context="all", stacks="python", max_entries=entries
        )
        self.recording = True
        with self.failopen.guard("memory observer"):
            attach = torch._C._cuda_attach_out_of_memory_observer  # type: ignore[attr-defined]
            attach(self._on_oom)

    def step_ended(self, index: int) -> None:
        now = wall_us()
        if self.recording:
            self.step_marks.append((index, self._step_start, now))
        self._step_start = now

    def region(self, path: tuple[str, ...], start_us: float) -> None:
        if self.recording and len(self.phase_marks) < MAX_MARKS:
            self.phase_marks.append((" / ".join(path), start_us, wall_us()))

    def snapshot(self, reason: str) -> None:
        """Keep a snapshot (``window``: the traced steps ended; ``oom``); stop recording after
        the window's."""
        if not self.recording:
            return
        with self.failopen.guard("memory snapshot"):
            self.snapshots[reason] = _encode(torch.cuda.memory._snapshot())
        if reason != "oom":
            self.stop()

    def stop(self) -> None:
        if self.recording:
            self.recording = False
            with self.failopen.guard("memory history"):
                torch.cuda.memory._record_memory_history(enabled=None)

    def _on_oom(self, device: int, alloc: int, device_alloc: int, device_free: int) -> None:
        """Called by the allocator when an allocation fails, before the OutOfMemoryError is
        raised: the snapshot shows what held the memory. Must never raise."""
        try:
            self.oom = True
            if "oom" not in self.snapshots:
                self.snapshot("oom")
        except Exception as exc:
            self.failopen.report("memory observer", exc)


def _encode(snapshot: Any) -> bytes:
    """JSON of a snapshot; anything msgspec cannot encode (an enum, a tuple key) as its string."""
    return msgspec.json.encode(snapshot, enc_hook=str)
