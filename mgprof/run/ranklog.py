"""Each rank's own output, kept in ``<run>/logs/rank<N>.log`` (bounded), for after the run.

``mgprof analyze`` forwards every worker's output to one terminal, where a rank's traceback
scrolls away under the other ranks' lines and torchrun's summary. Each worker (started by
``mgprof.run.bootstrap``) therefore tees its ``sys.stdout`` and ``sys.stderr`` into its own file,
both streams interleaved as they were written:

- **Bounded.** The file keeps the first ``HEAD_BYTES`` (1 MiB) and the last ``TAIL_BYTES``
  (1 MiB) of the output, with one ``[… N bytes cut …]`` line between them, so a script that
  prints gigabytes never fills the disk. While the rank runs (or after it was SIGKILLed) the
  file may hold up to one more MiB of tail: it is trimmed each time the tail reaches twice its
  size, and once more at exit.
- **Written as it comes.** Each complete line reaches the file at once (no buffer to lose when
  the rank is killed), like the unbuffered output the launcher asks of its workers.
- **Python level.** What goes through ``sys.stdout``/``sys.stderr`` (prints, warnings, logging
  to the console, tracebacks) is kept; output written straight to file descriptors 1 and 2 by
  C/C++ code (NCCL, gloo) is not, and still reaches the terminal as before. The exception is
  the noise the launcher keeps off the terminal (torch's ``USDT:`` profiler lines, torchrun's
  ``OMP_NUM_THREADS`` banner, ``mgprof.run.relay``): it appends those lines here, which is why
  the file is opened for appending.
- **Fail open.** Any error of the log (disk full, folder gone) turns the log off; the script's
  output and behaviour never change. A forked child (DataLoader worker) does not write to it.

Importable without torch.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from pathlib import Path
from typing import IO, Any

from mgprof.atomic import current_umask

LOGS_DIR = "logs"
RANK_ENV = "RANK"
RUN_DIR_ENV = "MGPROF_RUN_DIR"
"""Mirrors ``mgprof.rundir.RUN_DIR_ENV`` (kept here so a worker needs nothing else)."""
HEAD_BYTES = 1024 * 1024
TAIL_BYTES = 1024 * 1024
_PENDING_MAX = 64 * 1024
"""A partial line longer than this is written anyway (a progress bar without newlines)."""


def log_path(run_dir: str | os.PathLike[str], rank: int) -> Path:
    return Path(run_dir) / LOGS_DIR / f"rank{rank}.log"


def cut_marker(cut: int) -> bytes:
    return f"\n[… {cut} bytes cut …]\n".encode()


class BoundedLog:
    """A file that keeps the first ``head_bytes`` and the last ``tail_bytes`` written to it.

    ``write`` never raises: the first error switches the log off (``broken``).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        head_bytes: int = HEAD_BYTES,
        tail_bytes: int = TAIL_BYTES,
    ) -> None:
        self.path = Path(path)
        self.head_bytes = max(0, head_bytes)
        self.tail_bytes = max(1, tail_bytes)
        self.cut = 0
        """Bytes dropped between the head and the tail so far."""
        self.broken = False
        self._head = bytearray()
        self._tail = bytearray()
        self._pending = bytearray()
        """Bytes written but not yet in the file (the current partial line)."""
        self._lock = threading.RLock()
        """Reentrant: a signal handler that prints while a write holds it must not deadlock."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # O_APPEND: the launcher appends the lines it keeps off the terminal (torch's profiler
        # lines, torchrun's banner) to this file while the rank writes it
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o666)
        self._fh: IO[bytes] | None = open(fd, "ab", buffering=0)  # noqa: SIM115

    def write(self, data: bytes) -> None:
        if self.broken or not data:
            return
        with self._lock:
            try:
                self._pending += data
                if b"\n" in data or len(self._pending) >= _PENDING_MAX:
                    self._commit()
            except Exception:
                self._break()

    def flush(self) -> None:
        if self.broken:
            return
        with self._lock:
            try:
                self._commit()
            except Exception:
                self._break()

    def sync(self) -> None:
        """Everything into the file, the tail trimmed to ``tail_bytes`` (at exit)."""
        if self.broken:
            return
        with self._lock:
            try:
                self._commit()
                if len(self._tail) > self.tail_bytes:
                    self._rewrite(self.tail_bytes)
            except Exception:
                self._break()

    def detach(self) -> None:
        """In a forked child: stop writing, and never flush the parent's pending bytes."""
        self.broken = True
        self._pending = bytearray()
        self._fh = None  # drops the child's copy of the descriptor only

    def contents(self) -> bytes:
        """What the file holds once synced (head, marker, tail)."""
        with self._lock:
            self._commit()
            return self._body(self.tail_bytes)

    # -- internals (called with the lock held) ---------------------------------------------------

    def _commit(self) -> None:
        """Account for the pending bytes and put them in the file.

        The file is head + marker + tail and bytes are only ever appended at its end (the
        marker comes with a rewrite), so the pending bytes are exactly what the file lacks.
        """
        data, self._pending = self._pending, bytearray()
        if not data:
            return
        room = self.head_bytes - len(self._head)
        if room > 0:
            self._head += data[:room]
            self._tail += data[room:]
        else:
            self._tail += data
        if len(self._tail) > 2 * self.tail_bytes:
            self._rewrite(self.tail_bytes)
        elif self._fh is not None:
            _write_all(self._fh, data)

    def _body(self, keep: int | None) -> bytes:
        cut = self.cut
        tail = bytes(self._tail)
        if keep is not None and len(tail) > keep:
            cut += len(tail) - keep
            tail = tail[-keep:]
        marker = cut_marker(cut) if cut else b""
        return bytes(self._head) + marker + tail

    def _rewrite(self, keep: int) -> None:
        """Replace the file by head + marker + the last ``keep`` bytes (temp file + rename)."""
        drop = len(self._tail) - keep
        if drop > 0:
            self.cut += drop
            del self._tail[:drop]
        if self._fh is None:
            return
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        with open(tmp, "wb") as fh:
            fh.write(self._body(None))  # buffered: writes everything or raises
        os.chmod(tmp, 0o666 & ~current_umask())
        os.replace(tmp, self.path)
        old, self._fh = self._fh, open(self.path, "ab", buffering=0)  # noqa: SIM115
        with contextlib.suppress(OSError):
            old.close()

    def _break(self) -> None:
        self.broken = True
        self._pending = bytearray()
        fh, self._fh = self._fh, None
        if fh is not None:
            with contextlib.suppress(Exception):
                fh.close()


def _write_all(fh: IO[bytes], data: bytes | bytearray) -> None:
    n = fh.write(data)
    if n == len(data):
        return
    view = memoryview(data)[n or 0 :]
    while view:  # a short write (signal, nearly full disk): the rest, or an error
        n = fh.write(view)
        if not n:
            raise OSError("log write made no progress")
        view = view[n:]


class Tee:
    """A text stream that also writes what it is given into a ``BoundedLog``.

    Everything else (``encoding``, ``isatty``, ``fileno``, ``buffer``...) is the original's.
    """

    def __init__(self, stream: Any, log: BoundedLog) -> None:
        self._mgprof_stream = stream
        self._mgprof_log = log

    def write(self, text: Any) -> Any:
        if isinstance(text, str):
            try:
                self._mgprof_log.write(text.encode("utf-8", "replace"))
            except Exception:  # fail open (BoundedLog.write itself never raises)
                pass
        return self._mgprof_stream.write(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self._mgprof_log.flush()
        self._mgprof_stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._mgprof_stream, name)


_active: BoundedLog | None = None


def start(run_dir: str | os.PathLike[str] | None = None, rank: int | None = None) -> Path | None:
    """Tee this process's ``sys.stdout``/``sys.stderr`` into ``<run_dir>/logs/rank<N>.log``.

    ``run_dir`` defaults to ``$MGPROF_RUN_DIR`` (nothing happens without one), ``rank`` to
    ``$RANK`` (else 0). Returns the log's path, or None when no log was started. Raises only
    what creating the file raises; callers treat that as "no log" (fail open).
    """
    global _active
    if _active is not None:
        return _active.path
    folder = run_dir if run_dir is not None else os.environ.get(RUN_DIR_ENV)
    if not folder:
        return None
    if rank is None:
        try:
            rank = int(os.environ.get(RANK_ENV, "0"))
        except ValueError:
            rank = 0
    log = BoundedLog(log_path(folder, rank))
    if sys.stdout is not None:  # None (no console): print() stays a no-op
        sys.stdout = Tee(sys.stdout, log)
    if sys.stderr is not None:
        sys.stderr = Tee(sys.stderr, log)
    atexit.register(log.sync)
    os.register_at_fork(after_in_child=log.detach)
    _active = log
    return log.path


def flush() -> None:
    """Everything written so far into the file (never raises)."""
    if _active is not None:
        _active.flush()
