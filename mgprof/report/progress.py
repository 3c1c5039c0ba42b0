"""Live displays (rich): what a launch runs and how far its workers are, and ranks analysed
while a job's traces are read."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import IO, Any

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

from mgprof.report.safe_text import printable

STRATEGY_NAMES = {
    "single": "one device",
    "dp": "DataParallel",
    "ddp": "DDP",
    "fsdp": "FSDP",
    "fsdp-noreshard": "FSDP without reshard",
}
_CLEAR_LINE = b"\r\x1b[2K"
BAR_WIDTH = 24
REDRAW_S = 0.1
"""The status line is drawn again at most this often (a script printing thousands of lines a
second gets its lines relayed, not a status line per line)."""


@dataclass(frozen=True)
class LaunchFacts:
    """What a launch runs, for its first line and its status line (``mgprof.run.launcher``)."""

    script: str
    strategy: str
    world_size: int
    nproc_per_node: int
    nnodes: int
    node_rank: int
    cuda: bool
    backend: str | None
    cpu_fallback_reason: str | None
    run_dir: str
    warmup: int
    steps: int | None
    """Measured steps after warm-up (``--steps``); None: the script runs to its own end."""
    active: int
    """Traced steps after warm-up (``--trace-steps``)."""
    label: str
    """The status line's name for this launch (the script, or a study's row)."""

    @property
    def expected_steps(self) -> int | None:
        """Steps after which mgprof stops the script (warm-up + measured), if it does."""
        return self.warmup + self.steps if self.steps is not None else None

    @property
    def traced_until(self) -> int | None:
        """Steps done when the trace is complete (warm-up + traced); None without a trace."""
        return self.warmup + self.active if self.active > 0 else None


def where(facts: LaunchFacts) -> str:
    """``DDP on 2 CPU ranks over gloo (no CUDA device visible)``, ``DDP on 4 GPUs (nccl)``."""
    strategy = STRATEGY_NAMES.get(facts.strategy, facts.strategy)
    nodes = f"{facts.nnodes} nodes x " if facts.nnodes > 1 else ""
    node = f", this is node {facts.node_rank}" if facts.nnodes > 1 else ""
    if facts.strategy == "single":
        device = "1 GPU" if facts.cuda else "the CPU (no CUDA device visible)"
        return f"on {device}"
    if facts.strategy == "dp":
        return f"under DataParallel over {facts.nproc_per_node} GPUs in one process"
    if facts.cuda:
        return f"under {strategy} on {nodes}{facts.nproc_per_node} GPUs ({facts.backend}){node}"
    return (
        f"under {strategy} on {nodes}{facts.nproc_per_node} CPU ranks over {facts.backend} "
        f"(no CUDA device visible){node}"
    )


def steps_plan(facts: LaunchFacts) -> str:
    """``2 warm-up + 3 traced steps, then the script runs to its end``."""
    traced = f"{facts.active} traced" if facts.active > 0 else "no trace"
    if facts.steps is not None:
        return f"{facts.warmup} warm-up + {facts.steps} measured steps ({traced}), then stop"
    if facts.active > 0:
        return f"{facts.warmup} warm-up + {traced} steps, then the script runs to its end"
    return f"{facts.warmup} warm-up steps, no trace, the script runs to its end"


def start_line(command: str, facts: LaunchFacts) -> str:
    """mgprof's first line: what runs, where, for how long, and where the run directory is."""
    return printable(
        f"mgprof {command}: running {facts.script} {where(facts)}; {steps_plan(facts)}; "
        f"run directory {facts.run_dir}"
    )


def study_line(command: str, script: str, what: str, devices: str, per_run: str, out: str) -> str:
    """A study's first line (``mgprof compare``, ``mgprof sweep``), before its first launch:
    ``mgprof compare: running train.py as single, ddp on 2 CPU ranks ...; results under DIR``."""
    return printable(
        f"mgprof {command}: running {script} {what} {devices}; {per_run}; results under {out}"
    )


def clock_text(seconds: float) -> str:
    """``0:01:05``: elapsed or remaining time, as rich's progress columns write it."""
    whole = max(0, round(seconds))
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


@dataclass
class StepStatus:
    """Where a launch stands, in words and a bar (pure: the display draws it)."""

    done: int
    """Steps done by the slowest local rank (0 for a rank that has not reported yet)."""
    total: int | None
    """What the bar counts up to (None: no bar)."""
    detail: str


def step_status(
    facts: LaunchFacts,
    steps: dict[int, int],
    elapsed_s: float,
    rate: float | None,
    started: int = 0,
    finished: int = 0,
) -> StepStatus:
    """The status line's figures from the ranks' step counters; ``rate`` is steps per second
    since the first step (None before two counts), for the time left; ``started`` and
    ``finished`` count the local ranks whose script has begun (their log exists) and ended
    (their record is written)."""
    ranks = max(facts.nproc_per_node, 1)
    counts = list(steps.values()) + [0] * max(0, ranks - len(steps))
    done, most = min(counts), max(counts)
    clock = clock_text(elapsed_s)
    of = f"{min(finished, ranks)}/{ranks} ranks" if ranks > 1 else "the script"
    if finished:
        total = facts.expected_steps or (done if done else None)
        return StepStatus(
            done, total, f"{done} steps · {of} ended, records written · exiting · {clock}"
        )
    if most == 0:
        if started == 0:
            what = f"{ranks} ranks" if ranks > 1 else "the script"
            return StepStatus(0, None, f"starting {what} · {clock}")
        running = f"{min(started, ranks)}/{ranks} ranks running" if ranks > 1 else "running"
        return StepStatus(0, None, f"{running} the script, waiting for the first step · {clock}")
    spread = f" (ranks at {done}-{most})" if most != done else ""
    expected, traced = facts.expected_steps, facts.traced_until
    if expected is not None:
        if done >= expected:
            return StepStatus(done, expected, f"{done}/{expected} steps{spread} · ending · {clock}")
        left = f" · about {clock_text((expected - done) / rate)} left" if rate else ""
        return StepStatus(done, expected, f"{done}/{expected} steps{spread}{left} · {clock}")
    if traced is not None and done < traced:
        left = f" · about {clock_text((traced - done) / rate)} left" if rate else ""
        return StepStatus(
            done,
            traced,
            f"{done}/{traced} steps to trace{spread}{left}, then the script runs on · {clock}",
        )
    trace = "trace done, " if traced is not None else ""
    runs = f"{trace}the script runs to its end"
    return StepStatus(done, None, f"{done} steps{spread} · {runs} · {clock}")


class LaunchDisplay:
    """mgprof's own lines and a status line for a launch (``mgprof.run.relay.LaunchObserver``).

    - ``started``: the first line (what runs, where, the run directory), or a study's own
      first line at its first launch;
    - on a terminal (stderr), a status line that owns the last line: the launch's name, a bar
      of steps done against those expected (``--steps``, or the trace's warm-up + traced steps)
      with the time left, and the time since the start; the script's output is printed above
      it as it comes (``relay``), and the line is cleared when the workers are gone;
    - not on a terminal (a pipe, a CI log): the first line only, no animation;
    - ``enabled`` False (``--quiet``): neither, only warnings (``message``).

    Thread-safe: the launcher relays the workers' stdout and stderr from two threads.
    """

    def __init__(
        self,
        command: str,
        enabled: bool = True,
        first_line: Callable[[LaunchFacts], str] | None = None,
        stream: IO[str] | None = None,
        live: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``first_line``: a study's first line, printed at its first launch (after the study
        has checked its arguments) instead of each launch's own; ``stream``: mgprof's own lines
        and the status line (default: stderr now, so a study that swaps ``sys.stderr`` for one
        launch does not catch the status line); ``live`` forces the status line on or off
        (default: when ``stream`` is a terminal)."""
        self.command = command
        self.enabled = enabled
        self.first_line = first_line
        self._announced = False
        self._stream: IO[str] = stream if stream is not None else sys.stderr
        self._console = Console(file=self._stream)
        self._encoding = getattr(self._stream, "encoding", None) or "utf-8"
        """What the terminal takes: a bar or a name it cannot show comes out as ``?``."""
        terminal = self._console.is_terminal if live is None else live
        self.live = enabled and terminal
        self._clock = clock
        self._lock = threading.RLock()
        self._facts: LaunchFacts | None = None
        self._steps: dict[int, int] = {}
        self._started = self._finished = 0
        self._t0 = clock()
        self._spinner: Any = None
        self._first: tuple[float, int] | None = None
        self._drawn = b""
        self._drawn_at = float("-inf")

    def __enter__(self) -> LaunchDisplay:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.ended()

    # -- the launcher's side (LaunchObserver) --------------------------------------------------

    def started(self, facts: LaunchFacts) -> None:
        with self._lock:
            self._facts = facts
            self._steps = {}
            self._started = self._finished = 0
            self._t0 = self._clock()
            self._first = None
            first = self.first_line
            if self.enabled and first is None:
                self._line(start_line(self.command, facts))
            elif self.enabled and first is not None and not self._announced:
                self._line(first(facts))
            self._announced = True
            self._redraw(force=True)

    def progress(self, steps: dict[int, int], started: int = 0, finished: int = 0) -> None:
        with self._lock:
            self._steps = dict(steps)
            self._started, self._finished = started, finished
            if self._first is None and steps and min(steps.values()) > 0:
                self._first = (self._clock(), min(steps.values()))
            self._redraw()

    def relay(self, data: bytes, dest: IO[bytes]) -> None:
        with self._lock:
            if not self._drawn:
                dest.write(data)
                dest.flush()
                return
            self._write(_CLEAR_LINE)
            dest.write(data if data.endswith(b"\n") else data + b"\n")
            dest.flush()
            self._write(self._drawn)

    def message(self, text: str) -> None:
        with self._lock:
            self._line(text)

    def ended(self) -> None:
        with self._lock:
            if self._drawn:
                self._write(_CLEAR_LINE)
            self._drawn = b""
            self._facts = None

    # -- mgprof's own lines ---------------------------------------------------------------------

    def line(self, text: str) -> None:
        """A line of mgprof's own (a study's progress), above the status line; nothing when
        disabled (``--quiet``)."""
        if self.enabled:
            with self._lock:
                self._line(text)

    def _line(self, text: str) -> None:
        drawn = self._drawn
        if drawn:
            self._write(_CLEAR_LINE)
        self._write((text + "\n").encode(self._encoding, "replace"))
        if drawn:
            self._write(drawn)

    def _write(self, data: bytes) -> None:
        try:
            self._stream.flush()
            target = getattr(self._stream, "buffer", None)
            if target is not None:
                target.write(data)
                target.flush()
            else:
                self._stream.write(data.decode("utf-8", "replace"))
                self._stream.flush()
        except (OSError, ValueError):
            pass  # the terminal went away: the run goes on

    def _redraw(self, force: bool = False) -> None:
        if not self.live or self._facts is None:
            return
        now = self._clock()
        if not force and now - self._drawn_at < REDRAW_S:
            return
        self._drawn_at = now
        rendered = self.status_bytes()
        self._write(_CLEAR_LINE + rendered)
        self._drawn = _CLEAR_LINE + rendered

    def status_bytes(self) -> bytes:
        """The status line as the terminal gets it (styles included, one line, no newline)."""
        facts = self._facts
        if facts is None:
            return b""
        now = self._clock()
        rate = None
        if self._first is not None and self._steps:
            t1, d1 = self._first
            done = min(self._steps.values())
            if done > d1 and now > t1:
                rate = (done - d1) / (now - t1)
        status = step_status(
            facts, self._steps, now - self._t0, rate, self._started, self._finished
        )
        line = Text()
        line.append(printable(facts.label), style="bold")
        line.append(" ")
        if status.total:
            filled = round(BAR_WIDTH * min(status.done, status.total) / status.total)
            style = "bar.finished" if status.done >= status.total else "bar.complete"
            line.append("━" * filled, style=style)
            line.append("━" * (BAR_WIDTH - filled), style="bar.back")
        else:
            if self._spinner is None:
                from rich.spinner import Spinner

                self._spinner = Spinner("dots")
            frame = self._spinner.render(now)
            line.append_text(frame if isinstance(frame, Text) else Text(str(frame)))
        line.append(" " + status.detail)
        width = max(10, self._console.width - 1)
        line.truncate(width, overflow="ellipsis")
        with self._console.capture() as capture:
            self._console.print(line, no_wrap=True, crop=True, end="", highlight=False)
        return capture.get().split("\n", 1)[0].encode(self._encoding, "replace")


class RankProgress:
    """Ranks done / total and MB/s while a job's traces are analysed (``analyze_job``'s
    ``progress``), on stderr. Drawn only for analyses that last (from half a second on), and
    only when stdout and stderr are both terminals: piped output and CI logs stay clean."""

    def __init__(
        self,
        console: Console | None = None,
        clock: Callable[[], float] = time.monotonic,
        delay_s: float = 0.5,
    ) -> None:
        """``console`` None: draw nothing. ``clock`` is injectable for tests."""
        self._console = console
        self._clock = clock
        self._delay_s = delay_s
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._label = ""
        self._where = ""
        self._total = 0
        self._t0 = 0.0
        self._done = 0
        self._cached = 0
        self._read = 0

    @classmethod
    def on_terminal(cls) -> RankProgress:
        """Enabled when stdout and stderr are terminals, silent otherwise."""
        console = Console(file=sys.stderr)
        live = console.is_terminal and sys.stdout.isatty()
        return cls(console if live else None)

    def start(self, label: str, ranks: int, nbytes: int, where: str) -> None:
        # a folder or address is the user's text: no terminal control characters, no markup
        self._label, self._where, self._total = printable(label), printable(where), ranks
        self._t0 = self._clock()
        self._done = self._cached = self._read = 0

    def advance(self, nbytes: int, cached: bool) -> None:
        self._done += 1
        if cached:
            self._cached += 1
        else:
            self._read += nbytes
        if self._console is None:
            return
        if self._progress is None:
            if self._clock() - self._t0 < self._delay_s or self._done >= self._total:
                return
            self._progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("ranks {task.fields[detail]}"),
                TimeElapsedColumn(),
                console=self._console,
                transient=True,
                auto_refresh=False,  # no drawing thread: the analysis may fork worker processes
                redirect_stdout=False,
                redirect_stderr=False,
            )
            self._progress.start()
            self._task = self._progress.add_task(escape(self._label), total=self._total, detail="")
        assert self._task is not None
        self._progress.update(self._task, completed=self._done, detail=escape(self.detail()))
        self._progress.refresh()

    def detail(self) -> str:
        """``· 142 MB/s · 12 from cache · on 2 local processes``: the rate counts the files
        analysed, not those whose summaries came from the cache."""
        elapsed = self._clock() - self._t0
        parts = []
        if self._read and elapsed > 0:
            parts.append(f"{self._read / 1e6 / elapsed:.0f} MB/s")
        if self._cached:
            parts.append(f"{self._cached} from cache")
        parts.append(f"on {self._where}")
        return "· " + " · ".join(parts)

    def finish(self) -> None:
        if self._progress is None or self._console is None:
            return
        self._progress.stop()
        self._progress = None
        elapsed = self._clock() - self._t0
        self._console.print(
            f"{self._label}: {self._done} ranks in {elapsed:.1f} s {self.detail()}",
            highlight=False,
            markup=False,
        )
