"""torch.profiler on a schedule, writing traces where TensorBoard's profiler plugin finds them.

Only ``active`` steps are traced (after ``skip`` untouched steps and ``warmup`` steps in which
the profiler runs but discards events), so the cost of tracing stays bounded however long the
training runs.
"""

from __future__ import annotations

import gzip
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule


@dataclass(kw_only=True)
class TraceConfig:
    """What to trace. ``active=0`` turns tracing off (``TraceConfig.build`` then returns None)."""

    skip: int = 1
    warmup: int = 1
    active: int = 3
    record_shapes: bool = True
    profile_memory: bool = False
    with_flops: bool = True
    with_stack: bool = False

    def __post_init__(self) -> None:
        for name in ("skip", "warmup", "active"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")

    @property
    def last_traced_step(self) -> int:
        """Index (0-based) of the last step inside the trace window."""
        return self.skip + self.warmup + self.active - 1


def trace_path(trace_dir: Path, worker: str) -> Path:
    """``<dir>/<worker>.pt.trace.json.gz``: the plugin's WORKER_PATTERN without a span suffix."""
    return trace_dir / f"{worker}.pt.trace.json.gz"


class TraceWriter:
    """on_trace_ready handler: export the Chrome trace, gzip it, move it into place."""

    def __init__(self, trace_dir: Path, worker: str) -> None:
        self.trace_dir = trace_dir
        self.worker = worker
        self.written: list[Path] = []
        self.drop_steps_from: int | None = None
        """Set when the session ends inside the window: ``ProfilerStep#N`` from here are no steps
        (torch opens the next step span at each ``step()``, and ``stop()`` closes it)."""

    def __call__(self, prof: profile) -> None:
        self.trace_dir.mkdir(parents=True, exist_ok=True)
        target = trace_path(self.trace_dir, self.worker)
        if self.written:  # a second window (repeat) gets its own span suffix
            target = self.trace_dir / f"{self.worker}.{len(self.written)}.pt.trace.json.gz"
        fd, raw = tempfile.mkstemp(suffix=".json", dir=self.trace_dir)
        os.close(fd)
        try:
            prof.export_chrome_trace(raw)
            if self.drop_steps_from is not None:
                _drop_steps_from(raw, self.drop_steps_from)
            tmp_gz = raw + ".gz"
            with open(raw, "rb") as src, gzip.open(tmp_gz, "wb", compresslevel=3) as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            os.replace(tmp_gz, target)
        finally:
            for leftover in (raw, raw + ".gz"):
                if os.path.exists(leftover):
                    os.unlink(leftover)
        self.written.append(target)


def _drop_steps_from(path: str, first: int) -> None:
    """Remove ``ProfilerStep#N`` spans with N >= first (the span torch opened after the last
    real step), so a CPU trace's window, the union of step spans, covers only real steps."""
    import msgspec

    def opened_late(ev: object) -> bool:
        name = ev.get("name") if isinstance(ev, dict) else None
        if not isinstance(name, str) or not name.startswith("ProfilerStep#"):
            return False
        number = name[len("ProfilerStep#") :]
        return number.isdigit() and int(number) >= first

    with open(path, "rb") as src:
        trace = msgspec.json.decode(src.read())
    trace["traceEvents"] = [ev for ev in trace.get("traceEvents", []) if not opened_late(ev)]
    with open(path, "wb") as dst:
        dst.write(msgspec.json.encode(trace))


def build_profiler(config: TraceConfig, writer: TraceWriter, use_cuda: bool) -> profile | None:
    """A started-later torch.profiler.profile, or None when tracing is off."""
    if config.active == 0:
        return None
    activities = [ProfilerActivity.CPU]
    if use_cuda and torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    return profile(
        activities=activities,
        schedule=schedule(
            skip_first=config.skip, wait=0, warmup=config.warmup, active=config.active, repeat=1
        ),
        on_trace_ready=writer,
        record_shapes=config.record_shapes,
        profile_memory=config.profile_memory,
        with_flops=config.with_flops,
        with_stack=config.with_stack,
    )
