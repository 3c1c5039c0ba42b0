"""Fail open: an error inside mgprof becomes one warning and a note, never a crashed training.

Every report ends as a line on stderr: a ``MgprofWarning`` where the warning filters show it,
else (a script run with ``-W ignore``, or ``-W error``, which would turn mgprof's warning into an
exception in the training) the same line written to stderr directly. Reporting itself never
raises.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any


class MgprofWarning(RuntimeWarning):
    """Something inside mgprof failed; the training went on without that part."""


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
"""mgprof's own folder: a warning points at the first line outside it (the user's)."""


def _internal(filename: str) -> bool:
    """mgprof's own code, or what sits between it and the user's (contextlib, runpy, torch
    calling a hook mgprof installed)."""
    if filename.startswith(_PACKAGE) or filename.endswith(("contextlib.py", "runpy.py")):
        return True
    torch = sys.modules.get("torch")
    torch_file = getattr(torch, "__file__", None)
    return bool(torch_file) and filename.startswith(os.path.dirname(str(torch_file)) + os.sep)


def _user_depth(default: int) -> int:
    """How many frames above :func:`emit_line` the user's line is that led into mgprof
    (``with mgprof.profile(...)``, ``prof.step(...)``); ``default`` when no such frame is on
    the stack (an ``atexit`` handler)."""
    try:
        frame: FrameType | None = sys._getframe(2)  # emit_line's caller: depth 1
        depth = 1
        while frame is not None and _internal(frame.f_code.co_filename):
            frame = frame.f_back
            depth += 1
        return depth if frame is not None else default
    except Exception:
        return default


def emit_line(text: str, stacklevel: int = 2) -> None:
    """Show ``text`` once on stderr: as a ``MgprofWarning`` (pointing at the user's line that
    led into mgprof) when the filters let it through, else written directly. Never raises (not
    even under ``-W error``)."""
    shown = False
    stacklevel = _user_depth(stacklevel)
    try:
        original = warnings.showwarning

        def spy(*args: Any, **kwargs: Any) -> None:
            nonlocal shown
            shown = True
            original(*args, **kwargs)

        warnings.showwarning = spy
        try:
            warnings.warn(text, MgprofWarning, stacklevel=stacklevel + 1)
        finally:
            if warnings.showwarning is spy:
                warnings.showwarning = original
    except Exception:  # -W error (or a broken showwarning): the line goes out directly
        shown = False
    if not shown:
        try:
            sys.stderr.write(text + "\n")
            sys.stderr.flush()
        except Exception:
            pass


class FailOpen:
    """Collects notes of failures; warns once per distinct part."""

    NOTES_PER_PART = 10
    """A part that fails on every batch (a hook) notes its first failures, not millions."""

    def __init__(self) -> None:
        self.notes: list[str] = []
        self._warned: set[str] = set()
        self._counts: dict[str, int] = {}

    def report(
        self,
        part: str,
        exc: BaseException,
        *,
        message: str | None = None,
        loud: bool = False,
    ) -> None:
        """Note a failure of ``part`` and say so on stderr (once per part unless ``loud``).

        ``message`` replaces the exception's text (the note keeps the exception's type);
        ``loud`` reports that lose measurements are shown every time. Never raises.
        """
        try:
            detail = message if message is not None else str(exc)
        except Exception:  # an exception whose __str__ fails
            detail = "(no message)"
        note = f"{part}: {type(exc).__name__}: {detail}"
        count = self._counts[part] = self._counts.get(part, 0) + 1
        if loud or count <= self.NOTES_PER_PART:
            self.notes.append(note)
        elif count == self.NOTES_PER_PART + 1:
            self.notes.append(f"{part}: failed again; further failures are not noted")
        if not loud and part in self._warned:
            return
        self._warned.add(part)
        suffix = "" if message is not None else " (training continues)"
        emit_line(f"mgprof {note}{suffix}", stacklevel=3)

    def note(self, text: str) -> None:
        """A fact for the record that needs no warning (e.g. where traces were staged)."""
        self.notes.append(text)

    @contextmanager
    def guard(self, part: str) -> Iterator[None]:
        """Run a block; an ``Exception`` inside becomes a note (KeyboardInterrupt passes)."""
        try:
            yield
        except Exception as exc:
            self.report(part, exc)


_process = FailOpen()
"""Failures outside any session (``mgprof.batch_size`` before a session started, a hook with no
session to route to): warned once per part like a session's."""


def current() -> FailOpen:
    """The running session's ``FailOpen`` (its notes reach the record), else the process's."""
    session_module = sys.modules.get("mgprof.collect.session.session")
    try:
        session = session_module.active_session() if session_module is not None else None
    except Exception:
        session = None
    failopen = getattr(session, "failopen", None)
    return failopen if isinstance(failopen, FailOpen) else _process


def report(part: str, exc: BaseException) -> None:
    """Report a failure of code that runs outside a session's guards. Never raises."""
    try:
        current().report(part, exc)
    except Exception:
        pass


@contextmanager
def guarded(part: str) -> Iterator[None]:
    """:meth:`FailOpen.guard` for code with no session at hand (hooks, ``mgprof.wrap``)."""
    try:
        yield
    except Exception as exc:
        report(part, exc)
