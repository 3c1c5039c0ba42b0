"""Steps-done counters that the launcher reads to draw its progress display.

Each rank rewrites a tiny file at most every ``interval_s``; the launcher polls the folder.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

PROGRESS_ENV = "MGPROF_PROGRESS_DIR"


class ProgressFile:
    """Throttled writer of ``<dir>/rank<N>`` holding the number of steps done."""

    def __init__(self, folder: str | None, rank: int, interval_s: float = 0.25) -> None:
        self.path = Path(folder) / f"rank{rank}" if folder else None
        self.interval_s = interval_s
        self._last = 0.0

    def update(self, steps: int, force: bool = False) -> None:
        if self.path is None:
            return
        now = time.monotonic()
        if not force and now - self._last < self.interval_s:
            return
        self._last = now
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(str(steps))
            os.replace(tmp, self.path)
        except OSError:
            self.path = None  # progress is cosmetic: stop trying, never disturb training


def read_progress(folder: Path) -> dict[int, int]:
    """Steps done per rank, from whatever progress files exist."""
    out: dict[int, int] = {}
    if not folder.is_dir():
        return out
    for path in folder.glob("rank*"):
        if path.suffix == ".tmp":
            continue
        try:
            out[int(path.name[4:])] = int(path.read_text() or 0)
        except (OSError, ValueError):
            continue
    return out
