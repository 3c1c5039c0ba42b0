"""What reaches the terminal from a launch's workers, and what is kept off it.

The workers' stdout and stderr come back to the launcher through two pipes (torchrun passes its
children's streams through). Each line is relayed to the terminal as it comes, except torch's
own noise, which says nothing about the training and pushes the script's lines out of view:

- ``USDT:… SyncActivityProfilerHandler.cpp:52] profiler_start`` / ``profiler_stop`` (and the
  ``STAGE:`` lines older Kineto builds print), written by the profiler straight to the process's
  file descriptor, so the rank's own log (``ranklog``, Python level) never sees them;
- torchrun's banner about ``OMP_NUM_THREADS`` (four ``torch/distributed/run.py:NNN]`` lines, a
  row of asterisks above and below), printed before any rank starts.

Such a line goes into the rank log it belongs to instead (``logs/rank<N>.log``: a profiler line
names its process, whose ``RANK`` the launcher reads; torchrun's banner concerns every rank and
goes into each log). A relayed line goes through the launch's observer when there is one (a
progress display that owns the terminal's last line prints it above), else straight to the
stream.

The streams are read in chunks of ``READ_BYTES``, never a whole line at once: a line longer than
``LINE_BYTES_SHOWN`` (a script printing a gigabyte without a newline) is relayed as its first
``LINE_BYTES_SHOWN`` bytes, the rest of it up to its newline is dropped, and a note of mgprof's
says how much was not shown; the rank's own log keeps the start and end of it, bounded
(``ranklog``). A carriage return inside an overlong line (a progress bar redrawn in place) ends a
piece that is relayed whole, so such a bar still shows. mgprof's memory for a stream stays at a
few chunks and lines, whatever the script prints.

Importable without torch.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import IO, Any, Protocol

from mgprof.run.failures import is_torchrun_line
from mgprof.run.ranklog import LOGS_DIR

TORCHRUN_LINES_KEPT = 4000
LOST_LINES_KEPT = 100
_SAVE_FAILED = "mgprof writer: "
"""How a rank's line about a file it could not save begins (``collect.session.delivery``)."""
READ_BYTES = 64 * 1024
LINE_BYTES_SHOWN = 64 * 1024
"""A line of the script's output longer than this is cut for the terminal, with a note."""
TAIL_LINE_CHARS = 4096
"""Characters of a line kept in the tail and torchrun's lines (the run's error reads them)."""
LINE_BYTES_KEPT = 4096
"""A noise line longer than this is cut before it goes into a log."""
RANK_LINES_KEPT = 2000
"""Noise lines kept per rank (and for every rank) before the rest are dropped."""

_PROFILER_LINE = re.compile(rb"^(?:USDT|STAGE):\S+ \S+ (\d+):\d+ ")
"""Kineto's own lines: ``USDT:2026-12-02 06:09:19 19965:19965 File.cpp:52] profiler_start``
(date, time, pid:tid); the pid says which rank printed it."""
_PROFILER_PREFIX = (b"USDT:", b"STAGE:")
_TORCHRUN_LOG = re.compile(rb"^[IWEF]\d{4} [\d:.]+ \d+ \S*torch/distributed/run\.py:\d+\] ?(.*)$")
_OMP_BANNER_TEXT = re.compile(rb"^(?:|\*{5,}|Setting OMP_NUM_THREADS environment variable .*)$")


_STEPS_LINE = re.compile(rb"^mgprof: rank (\d+) made (\d+) optimizer step\(s\)$")
"""``mgprof.run.bootstrap.STEPS_LINE``: the steps a rank made, its last line for the launcher."""


def noise_kind(raw: bytes) -> str | None:
    """``profiler`` for Kineto's lines, ``banner`` for torchrun's OMP_NUM_THREADS banner,
    ``steps`` for a rank's closing count of steps (``mgprof.run.bootstrap``), None for
    everything else (the script's output, real warnings and errors)."""
    line = raw.rstrip(b"\r\n")
    if line.startswith(_PROFILER_PREFIX):
        return "profiler"
    if _STEPS_LINE.match(line):
        return "steps"
    found = _TORCHRUN_LOG.match(line)
    if found and _OMP_BANNER_TEXT.match(found.group(1).rstrip()):
        return "banner"
    return None


def profiler_pid(raw: bytes) -> int | None:
    """The process id a Kineto line names (None when the line has none)."""
    found = _PROFILER_LINE.match(raw)
    return int(found.group(1)) if found else None


_PROFILER_START = re.compile(rb"(?:USDT|STAGE):\d{4}-\d\d-\d\d ")
_PROFILER_INSIDE = re.compile(
    rb"(?:USDT|STAGE):\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \d+:\d+ [\w.]+:\d+\] "
    rb"(?:Completed Stage: (?:Warm Up|Collection|Post Processing)|\S+)"
)


def split_noise(raw: bytes) -> tuple[list[tuple[str, bytes]], bytes]:
    """The noise in one line read from a worker's stream, and what is left for the terminal.

    Ranks share the stream, and the C++ logger writes a line's text and its newline apart, so
    two ranks' profiler lines can arrive as one (``…profiler_stopUSDT:… profiler_stop``) and one
    can land inside a line of the script's: a line that starts as Kineto's is noise whole, cut
    where each of its lines starts (each names its own process); elsewhere in a line, only the
    complete Kineto line is taken out."""
    kind = noise_kind(raw)
    if kind in ("banner", "steps"):
        return [(kind, raw)], b""
    if kind == "profiler":
        cuts = [m.start() for m in _PROFILER_START.finditer(raw)] or [0]
        cuts = [0, *[c for c in cuts if c > 0]]
        ends = [*cuts[1:], len(raw)]
        return [("profiler", raw[a:b]) for a, b in zip(cuts, ends, strict=True)], b""
    found = list(_PROFILER_INSIDE.finditer(raw))
    if not found:
        return [], raw
    rest, at = bytearray(), 0
    for match in found:
        rest += raw[at : match.start()]
        at = match.end()
    rest += raw[at:]
    return [("profiler", m.group()) for m in found], bytes(rest)


def bounded_lines(src: Any, limit: int = LINE_BYTES_SHOWN) -> Iterator[tuple[bytes, int]]:
    """The lines of ``src`` as ``(line, 0)``, none longer than ``limit`` bytes, read in chunks.

    A longer line comes as its first ``limit`` bytes with ``-1`` (the cut starts), then, when
    its newline (or the end of the stream) comes, ``(b"", dropped)``: the bytes left out. Before
    that, a carriage return within the first ``limit`` bytes ends a piece of its own (a progress
    bar drawn again and again on one line is not a line too long). Memory: ``limit`` plus one
    chunk."""
    read = src.read1 if hasattr(src, "read1") else src.read
    buf = bytearray()
    dropping = -1  # bytes of the current overlong line dropped so far; -1: none being dropped
    while True:
        chunk = read(READ_BYTES)
        if not chunk:
            break
        if dropping >= 0:
            end = chunk.find(b"\n")
            if end < 0:
                dropping += len(chunk)
                continue
            yield b"", dropping + end
            dropping = -1
            chunk = chunk[end + 1 :]
        buf += chunk
        while True:
            end = buf.find(b"\n", 0, limit)
            if end >= 0:
                yield bytes(buf[: end + 1]), 0
                del buf[: end + 1]
                continue
            if len(buf) < limit:
                break
            back = buf.rfind(b"\r", 0, limit)
            if back >= 0:
                yield bytes(buf[: back + 1]), 0
                del buf[: back + 1]
                continue
            yield bytes(buf[:limit]), -1
            del buf[:limit]
            end = buf.find(b"\n")
            if end >= 0:
                yield b"", end
                del buf[: end + 1]
                continue
            dropping = len(buf)
            buf.clear()
            break
    if dropping >= 0:
        yield b"", dropping
    if buf:
        yield bytes(buf), 0


def cut_note(dropped: int, limit: int = LINE_BYTES_SHOWN) -> bytes:
    """mgprof's line under a line it cut for the terminal."""
    return (
        f"mgprof: [the line above was longer than {limit // 1024} KiB: its other {dropped} "
        "bytes are not shown; the rank's log (logs/rank<N>.log) keeps its start and end]\n"
    ).encode()


class LaunchObserver(Protocol):
    """What a launch tells the display that watches it (``mgprof.report.progress``)."""

    def started(self, facts: Any) -> None:
        """The plan is made and the run directory exists (``LaunchFacts``); nothing runs yet."""

    def progress(self, steps: dict[int, int], started: int = 0, finished: int = 0) -> None:
        """Steps done per local rank, a few times a second while the workers run; ``started``
        and ``finished``: local ranks whose script has begun (their log exists) and ended (their
        record is written)."""

    def relay(self, data: bytes, dest: IO[bytes]) -> None:
        """One line of the script's output, for ``dest`` (its stdout or stderr)."""

    def message(self, text: str) -> None:
        """A line of mgprof's own (a warning) during the launch, for stderr."""

    def ended(self) -> None:
        """The workers are gone: whatever the display draws is cleared."""


_observer: ContextVar[LaunchObserver | None] = ContextVar("mgprof_launch_observer", default=None)


@contextlib.contextmanager
def observing(observer: LaunchObserver | None) -> Iterator[None]:
    """Every ``launch()`` inside (those a study makes included) reports to ``observer``."""
    token = _observer.set(observer)
    try:
        yield
    finally:
        _observer.reset(token)


def current_observer() -> LaunchObserver | None:
    return _observer.get()


class RankLogNotes:
    """Noise lines kept off the terminal, appended to the rank logs they belong to.

    A rank's log is created by the rank itself when it starts (``ranklog.start``, opened for
    appending): lines for a rank whose log does not exist yet wait here, and torchrun's banner
    (printed before any rank starts) goes into each log as it appears. A log that never appears
    gets nothing (no file is made for a rank that never started). Never raises: a log that
    cannot be written loses the line, and the run goes on.
    """

    def __init__(self, run_dir: Path) -> None:
        self._dir = Path(run_dir) / LOGS_DIR
        self._lock = threading.Lock()
        self._pending: dict[int, list[bytes]] = {}
        self._every: list[bytes] = []
        self._every_sent: dict[str, int] = {}

    def add(self, rank: int | None, raw: bytes) -> None:
        """``raw`` for ``rank``'s log, or for every rank's (None)."""
        line = raw.rstrip(b"\r\n")[:LINE_BYTES_KEPT] + b"\n"
        with self._lock:
            if rank is None:
                if len(self._every) < RANK_LINES_KEPT:
                    self._every.append(line)
            else:
                pending = self._pending.setdefault(rank, [])
                if len(pending) < RANK_LINES_KEPT:
                    pending.append(line)
            self._flush_locked()

    def flush(self) -> None:
        with self._lock:
            self._flush_locked()

    def _flush_locked(self) -> None:
        for rank, lines in list(self._pending.items()):
            if lines and _append(self._dir / f"rank{rank}.log", lines):
                self._pending[rank] = []
        if not self._every:
            return
        try:
            logs = sorted(self._dir.glob("rank*.log"))
        except OSError:
            return
        for path in logs:
            sent = self._every_sent.get(path.name, 0)
            if sent < len(self._every) and _append(path, self._every[sent:]):
                self._every_sent[path.name] = len(self._every)


def _append(path: Path, lines: list[bytes]) -> bool:
    """Append to an existing log (True), or leave it alone when it does not exist (False)."""
    try:
        # O_APPEND, as the rank's own log writer: neither overwrites the other's lines
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)  # never creates the file
    except FileNotFoundError:
        return False
    except OSError:
        return True  # unwritable: the lines are dropped, the run goes on
    try:
        with open(fd, "ab", buffering=0) as fh:
            fh.write(b"".join(lines))
        return True
    except FileNotFoundError:
        return False
    except OSError:
        return True  # unwritable: the lines are dropped, the run goes on


class Tail:
    """Relay a child's stream line by line (``bounded_lines``: an overlong line cut, with a
    note), keep its last lines for the run record, and keep torch's noise off the terminal (into
    the rank logs)."""

    def __init__(
        self,
        src: IO[bytes],
        dst: IO[bytes],
        keep: int,
        notes: RankLogNotes | None = None,
        rank_of: Callable[[int], int | None] | None = None,
        observer: LaunchObserver | None = None,
    ) -> None:
        self.lines: list[str] = []
        self.torchrun: list[str] = []
        """torchrun's failure-summary lines, kept however long the rest of the output is."""
        self.hidden = 0
        """Noise lines kept off the terminal."""
        self.steps: dict[int, int] = {}
        """Steps each rank said it made as it ended (``bootstrap.STEPS_LINE``)."""
        self.lost: list[str] = []
        """The ranks' own lines about records they could not save (a full disk): the run's
        error quotes them however much output came after."""
        self._keep = keep
        self._notes = notes
        self._rank_of = rank_of
        self._observer = observer
        self._thread = threading.Thread(target=self._pump, args=(src, dst), daemon=True)
        self._thread.start()

    def _pump(self, src: IO[bytes], dst: IO[bytes]) -> None:
        # newlines of noise lines that arrived merged with another line: they come later, on
        # their own, and are not relayed either
        owed = 0
        for raw, cut in bounded_lines(src):
            if cut:
                self._relay(raw + b"\n" if cut < 0 else cut_note(cut), dst)
                if cut < 0:
                    self._remember(raw)
                continue
            if owed and not raw.strip(b"\r\n"):
                owed -= 1
                continue
            noise, rest = split_noise(raw)
            for kind, text in noise:
                self.hidden += 1
                self._keep_noise(kind, text)
            left = bool(rest.strip(b"\r\n"))
            if noise and raw.endswith(b"\n"):  # one newline came, each part needs its own
                owed += len(noise) + int(left) - 1
            if noise and not left:
                continue
            self._relay(rest, dst)
            self._remember(rest)

    def _relay(self, raw: bytes, dst: IO[bytes]) -> None:
        try:
            if self._observer is not None:
                self._observer.relay(raw, dst)
            else:
                dst.write(raw)
                dst.flush()
        except (OSError, ValueError):
            pass

    def _remember(self, raw: bytes) -> None:
        """The line into the tail (and torchrun's lines), cut to ``TAIL_LINE_CHARS``."""
        line = raw[: TAIL_LINE_CHARS * 4].decode("utf-8", "replace").rstrip()[:TAIL_LINE_CHARS]
        if line:
            self.lines.append(line)
            del self.lines[: -self._keep]
            if is_torchrun_line(line) and len(self.torchrun) < TORCHRUN_LINES_KEPT:
                self.torchrun.append(line)
            if _SAVE_FAILED in line and len(self.lost) < LOST_LINES_KEPT:
                self.lost.append(line)

    def _keep_noise(self, kind: str, raw: bytes) -> None:
        rank = None
        if kind == "steps" and (said := _STEPS_LINE.match(raw.rstrip(b"\r\n"))):
            rank = int(said.group(1))
            self.steps[rank] = max(int(said.group(2)), self.steps.get(rank, 0))
        if self._notes is None:
            return
        pid = profiler_pid(raw) if kind == "profiler" else None
        if pid is not None and self._rank_of is not None:
            rank = self._rank_of(pid)
        self._notes.add(rank, raw)

    def join(self) -> None:
        self._thread.join(timeout=5)


class RankOfPid:
    """The ``RANK`` a worker process runs as, read from its environment (cached); a process
    mgprof started alone (single, DataParallel) is rank 0.

    The launcher ``learn``s the processes of its tree as it finds them, so that a line read
    after its process has ended (a busy machine, a short script) still finds its rank; a process
    never seen goes into every rank's log."""

    def __init__(self, one_process: bool) -> None:
        self._one = one_process
        self._known: dict[int, int | None] = {}
        self._lock = threading.Lock()

    def learn(self, pids: Iterable[int]) -> None:
        if self._one:
            return
        for pid in pids:
            with self._lock:
                if pid in self._known:
                    continue  # a process's environment does not change
            rank = _rank_in_environment(pid)
            with self._lock:
                if self._known.get(pid) is None:
                    self._known[pid] = rank

    def __call__(self, pid: int) -> int | None:
        if self._one:
            return 0
        with self._lock:
            if self._known.get(pid) is not None:
                return self._known[pid]
        rank = _rank_in_environment(pid)
        with self._lock:
            if rank is not None:
                self._known[pid] = rank
            return self._known.get(pid)


def _rank_in_environment(pid: int) -> int | None:
    try:
        import psutil

        value = psutil.Process(pid).environ().get("RANK")
        return int(value) if value is not None else None
    except Exception:  # gone, not ours, or no such facility here: every rank's log then
        return None
