"""What both framework callbacks share: the session's lifetime, open regions, batch sizes.

Only mgprof's public API is used (``mgprof.profile``, ``Session.step``, ``mgprof.region``), so a
callback behaves exactly as a script that profiles itself would: under ``mgprof analyze`` its
session takes over from the automatic one, and under the framework's own launcher rank 0 writes
the run directory with the records the other ranks send it.
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any

import mgprof

NOT_ENDED = "training did not end: the framework never called the callback's end hook"

# Set by mgprof's launcher in every worker's environment (``mgprof analyze``, ``compare``,
# ``sweep``): the warm-up steps before measuring and the steps traced (``--warmup``,
# ``--trace-steps``).
_WARMUP_ENV = "MGPROF_WARMUP"
_ACTIVE_ENV = "MGPROF_ACTIVE"
_SCHEDULE = ("skip", "warmup", "active", "trace")


def launcher_schedule(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` with the trace schedule mgprof's launcher asked for, unless they set one.

    Under ``mgprof compare`` and ``sweep`` a row's figures come from its untraced steady-state
    steps, after ``--warmup`` and the ``--trace-steps`` window; a callback keeping its own
    default schedule (skip 1, warm-up 1, 3 traced) traced 4 of 6 steps of a ``--steps 4`` row,
    and the step writing the trace took the rest, so no row measured any throughput. The
    schedule is the automatic session's: ``--warmup W`` skips W-1 steps and warms the profiler
    up on one. Options the callback was given explicitly win.
    """
    merged = dict(options)
    if any(key in merged for key in _SCHEDULE):
        return merged
    warmup = _env_count(_WARMUP_ENV)
    active = _env_count(_ACTIVE_ENV)
    if warmup is None and active is None:
        return merged
    if warmup is not None:
        merged["skip"] = max(warmup - 1, 0)
        merged["warmup"] = 1 if warmup >= 1 else 0
    if active is not None:
        merged["active"] = active
    return merged


def _env_count(name: str) -> int | None:
    """A count of steps from the environment; None when unset or not a count (fail open)."""
    try:
        value = int(os.environ.get(name, "").strip())
    except ValueError:
        return None
    return value if value >= 0 else None


def leading_dim(batch: Any) -> int | None:
    """Leading dimension of the first tensor in a batch (a tensor, a sequence, a mapping or an
    object with tensor attributes such as a ``BatchEncoding``), None when there is none."""
    found = _first_tensor(batch, depth=0)
    if found is None or found.dim() == 0:
        return None
    size = int(found.shape[0])
    return size if size > 0 else None


def _first_tensor(batch: Any, depth: int) -> Any:
    import torch

    if isinstance(batch, torch.Tensor):
        return batch
    if depth > 4 or batch is None or isinstance(batch, (str, bytes)):
        return None
    if isinstance(batch, Mapping):
        values: Any = batch.values()
    elif isinstance(batch, (list, tuple)):
        values = batch
    else:
        return None
    for value in values:
        found = _first_tensor(value, depth + 1)
        if found is not None:
            return found
    return None


def exception_error(exception: BaseException) -> str | None:
    """The error a session that ends on ``exception`` records; None for a clean exit.

    ``SystemExit`` with code 0 or None ends a training on purpose: ``mgprof compare`` and
    ``sweep`` stop the script with one once the measured steps are done, and a framework that
    catches every exception (Lightning's ``on_exception``) would otherwise mark each of their runs
    incomplete. Other codes read as the launcher writes them.
    """
    if isinstance(exception, SystemExit):
        code = exception.code
        return None if code in (None, 0) else f"exited with code {code}"
    try:
        return f"{type(exception).__name__}: {exception}"
    except Exception:  # the user's exception must propagate, not one from its __str__
        return f"{type(exception).__name__}: (its message could not be read)"


class Profiled:
    """One framework run's session plus the regions a callback opened and has not closed.

    Regions are opened in one framework hook and closed in a later one, so each is kept as its
    entered context manager; they close innermost first, and whatever is still open when a step
    ends or the session stops is closed then. Every call fails open: an error here is one
    warning (through the session) and the training goes on.
    """

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.options = launcher_schedule(options)
        mgprof.profile(**self.options)  # bad options raise where the callback is made
        self.session: Any = None
        self.run_dir: Any = None
        self._open: list[tuple[str, AbstractContextManager[None]]] = []
        self._atexit = False

    @property
    def running(self) -> bool:
        return self.session is not None and bool(getattr(self.session, "_running", False))

    def start(self) -> None:
        if self.session is not None:
            return
        self.session = mgprof.profile(**self.options).start()
        if not self._atexit:
            atexit.register(self._at_exit)
            self._atexit = True

    def step(self, batch: Any = None, batch_size: int | None = None) -> None:
        self.close_regions()
        if self.session is None:
            return
        if batch_size is not None and batch_size < 1:
            batch_size = None
        self.session.step(batch=batch, batch_size=batch_size)

    def open_region(self, name: str) -> None:
        """Open region ``name`` (closing any open region of the same name first)."""
        if not self.running:
            return
        if any(open_name == name for open_name, _ in self._open):
            self.close_region(name)
        try:
            cm = mgprof.region(name)
            cm.__enter__()
        except Exception as exc:
            self._warn("region", exc)
            return
        self._open.append((name, cm))

    def close_region(self, name: str) -> None:
        """Close region ``name`` and every region opened inside it."""
        names = [open_name for open_name, _ in self._open]
        if name not in names:
            return
        keep = names.index(name)
        while len(self._open) > keep:
            _, cm = self._open.pop()
            try:
                cm.__exit__(None, None, None)
            except Exception as exc:
                self._warn("region", exc)

    def close_regions(self) -> None:
        if self._open:
            self.close_region(self._open[0][0])

    def stop(self, error: str | None = None) -> None:
        self.close_regions()
        session, self.session = self.session, None
        if session is None:
            return
        session.stop(error=error)
        self.run_dir = session.run_dir

    def _at_exit(self) -> None:
        if self.session is not None:
            self.stop(error=NOT_ENDED)

    def _warn(self, part: str, exc: BaseException) -> None:
        session = self.session
        if session is not None:
            session.failopen.report(part, exc)


class HoldsProfiled:
    """What every integration shows of its session: the session while it runs and the run
    directory it wrote (``_profiled`` is the integration's ``Profiled``)."""

    _profiled: Profiled

    @property
    def session(self) -> Any:
        """The mgprof session while training runs (None before and after)."""
        return self._profiled.session

    @property
    def run_dir(self) -> Any:
        """The run directory rank 0 wrote (None on the other ranks and before the end)."""
        return self._profiled.run_dir
