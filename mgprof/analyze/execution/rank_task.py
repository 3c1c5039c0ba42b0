"""One rank's trace analysis as a task any executor can run: plain values in, bytes out.

The same function runs in this process, in a local worker process and on a Dask worker, so the
summary cannot depend on where it was computed. It takes the file's absolute path (a remote
worker has another working directory) and the path as the user gave it, which is what the
summary and its error messages show; it returns the summary as msgpack, which travels and goes
into the cache without being encoded again.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import msgspec

from mgprof.analyze.execution.engine_id import engine_id
from mgprof.errors import UsageError

__all__ = ["RankOutcome", "analyze_rank", "size_limit_setting"]

_LIMIT_ENV = "MGPROF_MAX_TRACE_BYTES"
"""The loader's size limit (``mgprof.analyze.tracefile.load.MAX_TRACE_ENV``); named here so that the
client can read it without importing the loader."""


class RankOutcome(msgspec.Struct, frozen=True):
    """What a task returns: the summary (msgpack of a ``RankTraceSummary``), or why the file
    could not be analysed (the loader's one-line message)."""

    summary: bytes | None = None
    error: str | None = None


def size_limit_setting() -> str | None:
    """The size-limit setting of this process (``--max-trace-size`` puts it in the
    environment), sent with each task: a remote worker does not share the client's."""
    return os.environ.get(_LIMIT_ENV)


class _LimitGate:
    """Lets tasks run under the size limit their client asked for.

    Dask runs tasks in threads of one worker process, and threads share ``os.environ``: a task
    that needs another setting than the tasks running now waits until they have finished.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._running = 0

    @contextmanager
    def holding(self, value: str | None) -> Iterator[None]:
        with self._cond:
            while self._running and os.environ.get(_LIMIT_ENV) != value:
                self._cond.wait()
            if os.environ.get(_LIMIT_ENV) != value:
                if value is None:
                    os.environ.pop(_LIMIT_ENV, None)
                else:
                    os.environ[_LIMIT_ENV] = value
            self._running += 1
        try:
            yield
        finally:
            with self._cond:
                self._running -= 1
                self._cond.notify_all()


_GATE = _LimitGate()
_ENCODER = msgspec.msgpack.Encoder()


def analyze_rank(
    path: str, display: str, top: int, size_limit: str | None, engine: str, processes: int = 1
) -> RankOutcome:
    """Analyse the trace at ``path`` (absolute) as :func:`analyze_trace_file` would analyse
    ``display`` (the path as given); ``engine`` is the client's :func:`engine_id`, so a worker
    running other mgprof code says so instead of returning other figures. ``processes``: how
    many processes may read the one trace (2+ only where the job is this one rank)."""
    here = engine_id()
    if engine != here:
        return RankOutcome(
            error=f"{display}: the worker that took this file runs another mgprof build "
            f"(engine {here[:12]}, the client's is {engine[:12]}); install the same mgprof "
            "version on every worker"
        )
    from mgprof.analyze.trace.summary import analyze_trace_file

    with _GATE.holding(size_limit):
        try:
            summary = analyze_trace_file(path, top, processes)
        except UsageError as exc:
            return RankOutcome(error=str(exc).replace(path, display))
    if summary.source != display:
        summary.source = display
    return RankOutcome(summary=_ENCODER.encode(summary))
