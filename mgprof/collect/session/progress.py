"""Steps-done counters that the launcher reads to draw its progress display.

Each rank rewrites a tiny file at most every ``interval_s``; the launcher polls the folder.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from pathlib import Path

PROGRESS_ENV = "MGPROF_PROGRESS_DIR"


class ProgressFile:
    """Throttled writer of ``<dir>/rank<N>`` holding the number of steps done.

    A count that arrives within ``interval_s`` of the last write is written when the interval is
    over (one timer thread at a time) or at exit, so the launcher's display never stays behind
    a burst of fast steps."""

    def __init__(self, folder: str | None, rank: int, interval_s: float = 0.25) -> None:
        self.path = Path(folder) / f"rank{rank}" if folder else None
        self.interval_s = interval_s
        self._last = 0.0
        self._pending: int | None = None
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()
        self._pid = os.getpid()
        """A forked child (DataLoader worker) writes nothing: its copy of the lock may be held."""
        if self.path is not None:
            atexit.register(self.flush)

    def update(self, steps: int, force: bool = False) -> None:
        if self.path is None or os.getpid() != self._pid:
            return
        now = time.monotonic()
        with self._lock:
            wait = self.interval_s - (now - self._last)
            if force or wait <= 0:
                self._write(steps, now)
                return
            self._pending = steps
            if self._timer is None:
                self._timer = threading.Timer(wait, self.flush)
                self._timer.daemon = True
                self._timer.start()

    def flush(self) -> None:
        """Write the count held back by the throttle, if any."""
        if os.getpid() != self._pid:
            return
        with self._lock:
            self._timer = None
            if self._pending is not None and self.path is not None:
                self._write(self._pending, time.monotonic())

    def _write(self, steps: int, now: float) -> None:
        self._pending = None
        self._last = now
        if self.path is None:
            return
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
