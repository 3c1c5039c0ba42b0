"""torch.profiler on a schedule, writing traces where TensorBoard's profiler plugin finds them.

Only ``active`` steps are traced (after ``skip`` untouched steps and ``warmup`` steps in which
the profiler runs but discards events), so the cost of tracing stays bounded however long the
training runs.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
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
    """on_trace_ready handler: export the Chrome trace, gzip it, move it into place.

    A trace that cannot be written (disk full, quota, file size limit) leaves no partial file
    behind and goes to ``on_error`` (the session reports it); the profiler and the training go
    on. Other errors propagate to the session's guard.
    """

    def __init__(
        self,
        trace_dir: Path,
        worker: str,
        on_error: Callable[[Path, OSError], None] | None = None,
    ) -> None:
        self.trace_dir = trace_dir
        self.worker = worker
        self.on_error = on_error
        self.written: list[Path] = []
        self.drop_steps_from: int | None = None
        """Set when the session ends inside the window: ``ProfilerStep#N`` from here are no steps
        (torch opens the next step span at each ``step()``, and ``stop()`` closes it)."""

    def __call__(self, prof: profile) -> None:
        self.trace_dir.mkdir(parents=True, exist_ok=True)
        target = trace_path(self.trace_dir, self.worker)
        if self.written:  # a second window (repeat) gets its own span suffix
            target = self.trace_dir / f"{self.worker}.{len(self.written)}.pt.trace.json.gz"
        raw = ""
        try:
            fd, raw = tempfile.mkstemp(suffix=".json", dir=self.trace_dir)
            os.close(fd)
            with _file_size_signal_ignored():
                prof.export_chrome_trace(raw)
                _check_export(raw)
                if self.drop_steps_from is not None:
                    _drop_steps_from(raw, self.drop_steps_from)
                tmp_gz = raw + ".gz"
                with open(raw, "rb") as src, gzip.open(tmp_gz, "wb", compresslevel=3) as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
            os.replace(tmp_gz, target)
        except OSError as exc:
            if self.on_error is None:
                raise
            error = exc
            if raw and os.path.exists(raw + ".tmp"):
                # torch (Kineto) writes <raw>.tmp and logs its own failure; Python then sees a
                # missing or empty <raw> at most: name the likely cause instead
                error = _export_error(raw + ".tmp")
            self.on_error(target, error)
            return
        finally:
            if raw:
                for leftover in (raw, raw + ".gz", raw + ".tmp"):
                    try:
                        os.unlink(leftover)
                    except OSError:
                        pass
        self.written.append(target)


def _check_export(raw: str) -> None:
    """torch reports a trace it could not write only in its own log line, and leaves the file
    empty or cut short: a JSON object's last byte is ``}``, so a cut one is told cheaply."""
    leftover = raw + ".tmp"
    if os.path.exists(leftover):
        raise _export_error(leftover)
    with open(raw, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        fh.seek(max(0, fh.tell() - 256))
        tail = fh.read().rstrip()
    if not tail.endswith(b"}"):
        raise _export_error(raw)


def _export_error(path: str) -> OSError:
    """The likely cause of a trace torch could not write: the file size limit, a full disk."""
    from mgprof.atomic import file_size_limit

    what = "torch could not write the trace file"
    try:
        size = os.path.getsize(path)
        limit = file_size_limit()
        if limit is not None and size >= limit:
            return OSError(errno.EFBIG, f"{what}: {os.strerror(errno.EFBIG)}")
        st = os.statvfs(os.path.dirname(path) or ".")
        if st.f_bavail * st.f_frsize < (1 << 20):
            return OSError(errno.ENOSPC, f"{what}: {os.strerror(errno.ENOSPC)}")
    except OSError:
        pass
    return OSError(errno.EIO, f"{what} (disk full, quota or file size limit?)")


@contextlib.contextmanager
def _file_size_signal_ignored() -> Iterator[None]:
    """Under a finite ``ulimit -f``, a write past it raises SIGXFSZ, whose default action kills
    the process: while torch writes the trace (in the main thread), the signal is ignored, so
    the write fails instead and the training goes on."""
    import signal
    import threading

    from mgprof.atomic import file_size_limit

    sig = getattr(signal, "SIGXFSZ", None)
    if (
        sig is None
        or file_size_limit() is None
        or threading.current_thread() is not threading.main_thread()
    ):
        yield
        return
    try:
        previous = signal.signal(sig, signal.SIG_IGN)
    except (ValueError, OSError):
        yield
        return
    try:
        yield
    finally:
        try:
            signal.signal(sig, previous)
        except (ValueError, OSError, TypeError):
            pass


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
