"""The launcher's live display: steps done per rank while the workers run (rich)."""

from __future__ import annotations

import sys
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


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
