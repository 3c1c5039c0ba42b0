"""The in-code surfaces: ``profile`` (context manager), ``profile_step`` (decorator), ``region``."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar, overload

from torch.profiler import record_function

from mgprof.collect import failopen
from mgprof.collect.devices.memory_history import wall_us
from mgprof.collect.session.session import Session, active_session, lazy_session
from mgprof.collect.session.steps import NULL_STEP

F = TypeVar("F", bound=Callable[..., Any])


def profile(**kwargs: Any) -> Session:
    """Profile a training loop: ``with mgprof.profile(out="mgprof-runs") as prof:``.

    Call ``prof.step(batch=...)`` once per iteration (or use ``with prof.step(batch):``).
    Options: ``out`` (parent folder of run directories), ``name``, ``skip``/``warmup``/``active``
    (the trace schedule, in steps), ``trace``, ``sample``, ``sample_interval_s``,
    ``record_shapes``, ``profile_memory``, ``with_flops``, ``with_stack``, ``strategy``,
    ``quiet``.

    At the end, rank 0 writes the run directory with report.md and report.html and prints a few
    summary lines to stderr (``quiet=True`` or ``MGPROF_QUIET=1`` silences them; under
    ``mgprof analyze`` the launcher reports instead).
    """
    return Session(**kwargs)


@overload
def profile_step(fn: F) -> F: ...
@overload
def profile_step(fn: None = None, **kwargs: Any) -> Callable[[F], F]: ...


def profile_step(fn: Callable[..., Any] | None = None, **kwargs: Any) -> Any:
    """Decorate a step function: each call is one profiled step.

    The session opens on the first call and closes when the process exits. The batch size
    comes from the first tensor among the arguments (or ``batch_arg="name"`` picks one).
    Takes the options of :func:`profile` (``@mgprof.profile_step(quiet=True)``, ...).
    """
    batch_arg = kwargs.pop("batch_arg", None)
    Session(**kwargs)  # bad options raise here, where the script is decorated, not mid-training

    def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(f)
        def wrapper(*args: Any, **kw: Any) -> Any:
            step: Any = NULL_STEP
            try:
                session = lazy_session(**kwargs)
                batch = kw.get(batch_arg) if batch_arg else (args, kw)
                step = session.step(batch=batch)
            except Exception as exc:  # fail open: the step runs unprofiled
                failopen.report("profile_step", exc)
            with step:
                return f(*args, **kw)

        return wrapper

    return decorate(fn) if fn is not None else decorate


_open_regions = threading.local()
"""Names of the regions open on this thread, outermost first: a region's nesting path."""


def _region_stack() -> list[str]:
    stack = getattr(_open_regions, "stack", None)
    if stack is None:
        stack = _open_regions.stack = []
    return stack


@contextmanager
def region(name: str) -> Iterator[None]:
    """A named region: shows in traces (record_function) and in the report's region timings.

    Regions nest: one opened inside another is reported under it (``forward / attention``).
    A name that is not a non-empty string is misuse: one short ValueError at the ``with``.
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"mgprof.region(name): name must be a non-empty string, got {name!r:.40}")
    session = active_session()
    start = None
    path: tuple[str, ...] = ()
    stack: list[str] | None = None
    depth = 0
    wall: float | None = None
    if session is not None and session._running:
        try:
            stack = _region_stack()
            depth = len(stack)
            path = (*stack, str(name))
            stack.append(str(name))
            start = session._clock.mark()
            if session._memory is not None and session._memory.recording:
                wall = wall_us()
        except Exception as exc:  # fail open: the block runs, untimed
            session.failopen.report("region", exc)
    try:
        with record_function(name):
            yield
    finally:
        if stack is not None:
            del stack[depth:]  # also drops what an inner region left open by a bad exit
        if session is not None and start is not None:
            try:
                session.add_region(path, start, session._clock.mark())
                if wall is not None and session._memory is not None:
                    session._memory.region(path, wall)
            except Exception as exc:
                session.failopen.report("region", exc)
