"""A rank still running long after another rank ended is stopped, and the run says which.

torchrun waits for every worker, and a worker that ended with code 0 is no failure to it: when
rank 1 sleeps (or spins) after its training loop with no collective left, rank 0 finishes, its
record gather times out after ``--collective-timeout`` and it exits, and torchrun then waits for
rank 1 for ever: no report, run.json ``running``. Once any rank's process has ended (or marked
its script finished, ``rundir.mark_finished``), the others get the same patience a collective
gets, ``--collective-timeout`` seconds, to end; a rank still running after that is sent SIGTERM
(it writes its record and a stack dump of where it was, as when mgprof is stopped), SIGKILL
after the stop grace, and finalize names it (``StragglerWatch.note``).

Only for runs with one process per rank under torchrun (its direct children are the ranks);
importable without torch.
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from mgprof import rundir
from mgprof.run.process_tree import send_each

POLL_EVERY_S = 1.0
KILL_AFTER_TERM_S = 20.0
"""Default wait between the SIGTERM and the SIGKILL of a straggler (the launcher passes its
stop grace)."""


class StragglerWatch:
    """Watches the ranks (torchrun's children) of one launch; ``poll`` about once a second."""

    def __init__(
        self,
        root: int,
        run_dir: Path,
        bound_s: float,
        rank_of: Callable[[int], int | None],
        kill_after_s: float = KILL_AFTER_TERM_S,
    ) -> None:
        self.root = root
        self.run_dir = Path(run_dir)
        self.bound_s = bound_s
        self.kill_after_s = kill_after_s
        self._rank_of = rank_of
        self._ranks: dict[int, psutil.Process] = {}
        """rank -> its process, learned while it runs."""
        self.first_ended: int | None = None
        """The rank that ended first (None: none yet, or it ended before it was seen)."""
        self._ended_at: float | None = None
        self.stopped: list[int] = []
        """Ranks mgprof stopped because they outlived the bound."""
        self._term_at: float | None = None
        self._killed = False
        self._last_poll = float("-inf")

    def poll(self, now: float | None = None) -> None:
        """Learn the ranks, notice the first to end, stop the late ones (at most once a
        second: it lists processes and a folder)."""
        now = time.monotonic() if now is None else now
        if now - self._last_poll < POLL_EVERY_S:
            return
        self._last_poll = now
        self._learn()
        alive = self._alive()
        if self._ended_at is None:
            ended = sorted(set(self._ranks) - set(alive)) or sorted(self._finished() & set(alive))
            if ended and alive and set(alive) - set(ended):
                self.first_ended, self._ended_at = ended[0], now
            return
        if self._term_at is None:
            if now - self._ended_at < self.bound_s:
                return
            late = sorted(r for r in alive if r != self.first_ended)
            if not late:
                return
            self.stopped = late
            self._term_at = now
            send_each([alive[r] for r in late], signal.SIGTERM)
            return
        if not self._killed and now - self._term_at >= self.kill_after_s:
            self._killed = True
            send_each([p for r, p in alive.items() if r in self.stopped], signal.SIGKILL)

    def note(self) -> str | None:
        """The run's error for ranks that had to be stopped, or None."""
        if not self.stopped:
            return None
        who = ", ".join(map(str, self.stopped))
        plural = "s" if len(self.stopped) > 1 else ""
        return (
            f"rank{plural} {who} did not end within {self.bound_s:g} s after rank "
            f"{self.first_ended} had ended (the --collective-timeout) and mgprof stopped "
            f"{'them' if plural else 'it'}: a rank left running after its peers finished, with "
            "no collective left to fail"
        )

    def _learn(self) -> None:
        try:
            children = psutil.Process(self.root).children()
        except psutil.Error:
            return
        known = {p.pid for p in self._ranks.values()}
        for child in children:
            if child.pid in known:
                continue
            rank = self._rank_of(child.pid)
            if rank is not None and rank not in self._ranks:
                self._ranks[rank] = child

    def _alive(self) -> dict[int, psutil.Process]:
        out = {}
        for rank, proc in self._ranks.items():
            try:
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    out[rank] = proc
            except psutil.Error:
                pass
        return out

    def _finished(self) -> set[int]:
        """Ranks that marked their script finished (the marks stay for finalize)."""
        try:
            names = [p.name for p in (self.run_dir / rundir.FINISHED).glob("rank*")]
        except OSError:
            return set()
        return {int(m.group(1)) for n in names if (m := re.fullmatch(r"rank(\d+)", n))}
