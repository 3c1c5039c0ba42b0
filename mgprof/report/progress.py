"""Live displays (rich): steps done per rank while a run's workers run, and ranks analysed while
a job's traces are read."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from types import TracebackType

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

from mgprof.report.safe_text import printable


class LaunchProgress:
    """One progress row per rank, fed with ``{rank: steps_done}``; silent when disabled or when
    stderr is not a terminal (CI logs stay clean)."""

    def __init__(self, enabled: bool = True, total: int | None = None) -> None:
        console = Console(file=sys.stderr)
        self.enabled = enabled and console.is_terminal
        self.total = total
        self._tasks: dict[int, object] = {}
        self._progress = Progress(
            TextColumn("[bold]rank {task.fields[rank]}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("steps"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
            redirect_stdout=True,
            redirect_stderr=True,
        )

    def __enter__(self) -> LaunchProgress:
        if self.enabled:
            self._progress.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.enabled:
            self._progress.stop()

    def update(self, steps: dict[int, int]) -> None:
        if not self.enabled:
            return
        for rank in sorted(steps):
            if rank not in self._tasks:
                self._tasks[rank] = self._progress.add_task("", total=self.total, rank=rank)
            self._progress.update(self._tasks[rank], completed=steps[rank])  # type: ignore[arg-type]


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
