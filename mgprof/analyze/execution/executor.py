"""Where per-rank work runs: in this process, in local worker processes, or on a Dask cluster.

Every executor runs one module-level function over a list of argument tuples and hands each
result back as soon as it is ready, in any order (so progress and cache writes follow the work).
A task whose worker died, or that a cluster stopped answering for, comes back as a
:class:`TaskLost` with the reason: one bad rank never hangs the job nor takes the others down.
An exception raised by the function itself is a bug and propagates, whatever the executor.

Past one machine the work goes to Dask (``distributed``), an existing engine that schedules,
restarts dead workers and retries their tasks; mgprof adds no pool of its own. Dask is imported
only when a Dask executor is used (``pip install 'mgprof[dask]'``).
"""

from __future__ import annotations

import os
import queue
import time
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol

__all__ = [
    "DASK_ENV",
    "DaskExecutor",
    "ProcessExecutor",
    "RankExecutor",
    "TaskLost",
    "make_executor",
]

DASK_ENV = "MGPROF_DASK_SCHEDULER"
MAX_WORKERS = 4096
"""Local worker processes at most (``--workers``): more than any machine has cores, and a bound
on what a typed number can ask the operating system for."""
"""Environment variable: the address of a Dask scheduler to send per-rank work to."""

_DIED = (
    "the worker process died while analysing this file (killed for memory?); analyse it alone "
    "with --workers 1 to see why"
)


@dataclass(frozen=True)
class TaskLost:
    """A task that never returned: its worker died or the cluster stopped answering."""

    reason: str


OnDone = Callable[[int, Any], None]
"""Called with (index of the task, its result or a TaskLost), in the caller's thread."""


class RankExecutor(Protocol):
    """Runs ``fn(*args)`` for every tuple of ``tasks``; calls ``on_done`` as each finishes."""

    description: str
    """Where the work runs, in words (for progress lines)."""

    def map_unordered(
        self, fn: Callable[..., Any], tasks: Sequence[tuple[Any, ...]], on_done: OnDone
    ) -> None: ...

    def close(self) -> None: ...


class _Closing:
    def __enter__(self) -> Any:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Nothing to release (overridden where there is)."""


class ProcessExecutor(_Closing):
    """Local worker processes, each holding one task at a time; ``workers=1``: this process.

    At most ``workers + 1`` tasks are in flight, so when a worker dies (the pool then fails
    every task it holds) few tasks are suspect: each suspect runs again alone in a fresh
    process, and only the one that kills its worker again is lost.
    """

    def __init__(self, workers: int | None = None) -> None:
        self.workers = max(1, workers if workers is not None else (os.cpu_count() or 1))
        self.description = (
            "this process" if self.workers == 1 else f"{self.workers} local processes"
        )

    def map_unordered(
        self, fn: Callable[..., Any], tasks: Sequence[tuple[Any, ...]], on_done: OnDone
    ) -> None:
        n = min(len(tasks), self.workers)
        if n <= 1:
            for i, args in enumerate(tasks):
                on_done(i, fn(*args))
            return
        todo = deque(range(len(tasks)))
        while todo:
            for i in self._round(fn, tasks, todo, n, on_done):
                on_done(i, self._alone(fn, tasks[i]))

    @staticmethod
    def _round(
        fn: Callable[..., Any],
        tasks: Sequence[tuple[Any, ...]],
        todo: deque[int],
        n: int,
        on_done: OnDone,
    ) -> list[int]:
        """Run tasks from ``todo`` in one pool until it is empty or the pool breaks; return the
        tasks that were in flight when it broke."""
        # imported here: a single trace (run in this process) needs no pool, and the imports
        # are a tenth of `mgprof trace`'s start-up
        from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
        from concurrent.futures.process import BrokenProcessPool

        pool = ProcessPoolExecutor(max_workers=n)
        running: dict[Future[Any], int] = {}
        try:
            while todo or running:
                while todo and len(running) <= n:
                    i = todo.popleft()
                    running[pool.submit(fn, *tasks[i])] = i
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                if any(isinstance(f.exception(), BrokenProcessPool) for f in done):
                    wait(running)  # a broken pool fails all it holds at once
                    suspects = []
                    for f, i in running.items():
                        if isinstance(f.exception(), BrokenProcessPool):
                            suspects.append(i)
                        else:
                            on_done(i, f.result())
                    return sorted(suspects)
                for f in done:
                    on_done(running.pop(f), f.result())
            return []
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    @staticmethod
    def _alone(fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        from concurrent.futures import ProcessPoolExecutor
        from concurrent.futures.process import BrokenProcessPool

        with ProcessPoolExecutor(max_workers=1) as pool:
            try:
                return pool.submit(fn, *args).result()
            except BrokenProcessPool:
                return TaskLost(_DIED)


class DaskExecutor(_Closing):
    """Tasks on a Dask cluster (``distributed``): each sends a file path and gets back the
    small result; the workers read the files themselves, from storage they share.

    Dask retries a task whose worker died on another worker and gives up after
    ``distributed.scheduler.allowed-failures`` deaths (``KilledWorker``): that task is lost.
    When no task finishes for ``stall_timeout_s`` (every worker gone, a scheduler that stopped
    answering, a file on a hung mount), the unfinished tasks are lost and cancelled; when the
    scheduler goes away, so are the tasks whose results had not come back. While the client is
    open, distributed's own log is kept in ``log_lines`` instead of the terminal
    (``dask_client``).
    """

    def __init__(
        self, address: str, *, stall_timeout_s: float = 600.0, connect_timeout_s: float = 30.0
    ) -> None:
        self.address = address
        self.stall_timeout_s = stall_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.description = f"Dask at {address}"
        self._client: Any = None
        self._kept: Any = None
        self._quiet = ExitStack()

    @property
    def log_lines(self) -> list[str]:
        """distributed's log while this executor held its client, one line a record."""
        return list(self._kept.lines) if self._kept is not None else []

    def _connect(self) -> Any:
        if self._client is not None:
            return self._client
        from mgprof.analyze.execution.dask_client import KeptLog, connect, kept_off_the_terminal

        self._kept = KeptLog()
        self._quiet.enter_context(kept_off_the_terminal(self._kept))
        try:
            self._client = connect(self.address, self.connect_timeout_s)
        except BaseException:
            self._quiet.close()
            raise
        return self._client

    def map_unordered(
        self, fn: Callable[..., Any], tasks: Sequence[tuple[Any, ...]], on_done: OnDone
    ) -> None:
        if not tasks:
            return
        client = self._connect()
        finished: queue.Queue[Any] = queue.Queue()
        import uuid  # imports platform: only a Dask job needs it

        job = uuid.uuid4().hex[:8]
        pending: dict[str, tuple[int, Any]] = {}
        for i, args in enumerate(tasks):
            future = client.submit(fn, *args, key=f"mgprof-rank-{job}-{i}", pure=False)
            pending[future.key] = (i, future)
            future.add_done_callback(finished.put)
        last = time.monotonic()
        try:
            while pending:
                try:
                    future = finished.get(timeout=min(5.0, self.stall_timeout_s))
                except queue.Empty:
                    if time.monotonic() - last > self.stall_timeout_s:
                        break
                    continue
                item = pending.pop(future.key, None)
                if item is None:
                    continue
                last = time.monotonic()
                on_done(item[0], _outcome(future, self.address))
                del item, future  # drop the result on the cluster as soon as it is read
        finally:
            if pending:
                _quietly(client.cancel, [f for _, f in pending.values()])
        lost = TaskLost(
            f"no result from the Dask cluster at {self.address} for {self.stall_timeout_s:g} s "
            "(workers gone, stuck or unable to read the file?)"
        )
        for i, _ in sorted(pending.values(), key=lambda item: item[0]):
            on_done(i, lost)

    def close(self) -> None:
        try:
            if self._client is not None:
                client, self._client = self._client, None
                _quietly(client.close)
        finally:
            self._quiet.close()  # distributed's handlers back, once its client is gone


def _quietly(call: Callable[..., Any], *args: Any) -> None:
    """A call to a client whose scheduler may be gone: its failure changes nothing left to do."""
    try:
        call(*args)
    except (OSError, TimeoutError, RuntimeError):
        pass


_CONNECTION_LOST = (OSError, TimeoutError, RuntimeError)
"""What fetching a result raises when the scheduler went away (distributed's
``CommClosedError`` is an OSError); a task cancelled meanwhile raises a CancelledError, asyncio's
or (distributed's ``FutureCancelledError``) concurrent.futures'."""


def _outcome(future: Any, address: str) -> Any:
    """A finished Dask future's result; TaskLost for a task the cluster gave up on, or whose
    result could not be fetched because the scheduler went away."""
    from asyncio import CancelledError as TaskCancelled
    from concurrent.futures import CancelledError

    from distributed.scheduler import KilledWorker

    gone = TaskLost(
        f"the Dask scheduler at {address} went away before this file's result came back "
        "(stopped or restarted?)"
    )
    try:
        if future.status == "finished":
            return future.result()
        if future.status != "error":
            if future.status in ("cancelled", "lost"):
                return gone
            return TaskLost(f"the Dask cluster did not finish the task ({future.status})")
        exc = future.exception()
    except (*_CONNECTION_LOST, CancelledError, TaskCancelled):
        return gone
    except Exception:
        # a finished task's result is data already computed: failing to fetch it while the
        # client has lost its scheduler (the future's state reset or cancelled meanwhile) is
        # the scheduler's going, not a bug to show
        if future.status != "finished" or getattr(future.client, "status", None) != "running":
            return gone
        raise
    if isinstance(exc, KilledWorker):
        return TaskLost(
            "Dask workers died while analysing this file, every time it was retried (killed "
            "for memory?)"
        )
    if isinstance(exc, ImportError):
        return TaskLost(
            f"the Dask worker cannot run mgprof ({exc}); install the same mgprof on every worker"
        )
    raise exc


def make_executor(workers: int | None = None, dask: str | None = None) -> RankExecutor:
    """The executor a command asked for: ``dask`` (an address), else ``workers`` local
    processes, else ``$MGPROF_DASK_SCHEDULER`` when set, else one process per CPU."""
    if not dask and workers is None:
        dask = os.environ.get(DASK_ENV, "").strip() or None
    if dask:
        return DaskExecutor(dask)
    return ProcessExecutor(workers)
