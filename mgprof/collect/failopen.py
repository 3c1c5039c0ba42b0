"""Fail open: an error inside mgprof becomes one warning and a note, never a crashed training."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager


class MgprofWarning(RuntimeWarning):
    """Something inside mgprof failed; the training went on without that part."""


class FailOpen:
    """Collects notes of failures; warns once per distinct part."""

    def __init__(self) -> None:
        self.notes: list[str] = []
        self._warned: set[str] = set()

    def report(self, part: str, exc: BaseException) -> None:
        note = f"{part}: {type(exc).__name__}: {exc}"
        self.notes.append(note)
        if part not in self._warned:
            self._warned.add(part)
            warnings.warn(f"mgprof {note} (training continues)", MgprofWarning, stacklevel=3)

    @contextmanager
    def guard(self, part: str) -> Iterator[None]:
        """Run a block; an ``Exception`` inside becomes a note (KeyboardInterrupt passes)."""
        try:
            yield
        except Exception as exc:
            self.report(part, exc)
