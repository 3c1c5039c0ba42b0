"""A step from the handle ``Session.step`` returns to its ``StepRecord``, and a region from its
marks to its totals.

Split from ``session.py``, which keeps where steps begin and end (the call and ``with`` forms, the
automatic steps) and the session's lifecycle. Here: ``StepHandle`` (a boundary when called, a
timed block in ``with``), ``NullStep`` (the handle of a disabled session), ``PendingStep`` (a
closed step whose CUDA events may not have completed yet) and ``StepRecordsMixin``, the part of
``Session`` that reads closed steps and regions into records once their marks can be read.
"""

from __future__ import annotations

from typing import Protocol

from mgprof.collect.batchinfo import PendingFingerprint
from mgprof.collect.session.region_stats import RegionStats
from mgprof.collect.session.step_timer import Clock, Mark
from mgprof.records import StepRecord


class _Reporter(Protocol):
    def report(self, part: str, exc: BaseException) -> None: ...


class StepOwner(Protocol):
    """What a step handle needs of its session (``Session`` is one): where a ``with`` step
    begins and ends, and where a failure inside mgprof is reported."""

    @property
    def failopen(self) -> _Reporter: ...

    def _enter_step(self, handle: StepHandle) -> None: ...

    def _exit_step(self, handle: StepHandle) -> None: ...


class PendingStep:
    __slots__ = ("batch_size", "dataloader_ms", "end", "fp", "index", "start")

    def __init__(
        self,
        index: int,
        start: Mark,
        end: Mark,
        batch_size: int | None,
        fp: PendingFingerprint | None,
        dataloader_ms: float | None,
    ) -> None:
        self.index, self.start, self.end = index, start, end
        self.batch_size, self.fp, self.dataloader_ms = batch_size, fp, dataloader_ms


class StepHandle:
    """Returned by ``Session.step``: a boundary when called, a timed block when used in ``with``."""

    __slots__ = ("_session", "batch_size", "entered", "fp", "mark", "syncs")

    def __init__(
        self,
        session: StepOwner,
        mark: Mark,
        batch_size: int | None,
        fp: PendingFingerprint | None,
        syncs: int = 0,
    ) -> None:
        self._session = session
        self.mark = mark
        self.batch_size = batch_size
        self.fp = fp
        self.entered = False
        self.syncs = syncs
        """Gradient syncs finished at this step's end boundary (``collect.noise_scale``): the
        step owns those after the previous step's."""

    def __enter__(self) -> StepHandle:
        self.entered = True
        try:
            self._session._enter_step(self)
        except Exception as exc:  # fail open: the step's body runs whatever mgprof does
            self._session.failopen.report("step", exc)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._session._exit_step(self)
        except Exception as err:  # never replaces, or adds to, the body's own exception
            self._session.failopen.report("step", err)


class NullStep:
    """The step handle of a disabled session: does nothing, costs nothing."""

    def __enter__(self) -> NullStep:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


NULL_STEP = NullStep()


class StepRecordsMixin:
    """``Session``'s reading of closed steps and regions into records. On CUDA a mark's time is
    read only once its event has completed, so the training loop never waits for mgprof. The
    attributes declared below are the session's, set in ``Session.__init__``."""

    _steps: list[PendingStep]
    _done_steps: list[StepRecord]
    _step_index: int
    _regions: list[tuple[tuple[str, ...], Mark, Mark]]
    _region_stats: RegionStats
    _mode: str | None
    _clock: Clock
    _trace_window: tuple[int, int] | None

    def _resolve_ready(self, wait: bool = False) -> None:
        """Turn finished steps into records; on CUDA only those whose events have completed.

        Events on one stream complete in order, so one query of the newest pending step tells
        whether all of them can be read; otherwise they are read one by one up to the first
        unfinished.
        """
        keep: list[PendingStep] = []
        all_ready = wait or (bool(self._steps) and Clock.ready(self._steps[-1].end))
        for i, s in enumerate(self._steps):
            if not all_ready and not (Clock.ready(s.end) and Clock.ready(s.start)):
                keep = self._steps[i:]
                break
            traced = self._is_traced(s.index)
            self._done_steps.append(
                StepRecord(
                    index=s.index,
                    duration_ms=round(self._clock.elapsed_ms(s.start, s.end), 6),
                    batch_size=s.batch_size,
                    fingerprint=s.fp.resolve() if s.fp is not None else None,
                    traced=traced,
                    dataloader_ms=None if s.dataloader_ms is None else round(s.dataloader_ms, 6),
                )
            )
            self._clock.recycle(s.start)  # the previous step, its only other user, is done
            if self._mode == "ctx":  # entry and exit marks belong to this step alone
                self._clock.recycle(s.end)
        self._step_index += len(self._steps) - len(keep)
        self._steps = keep
        if len(self._regions) > 256 or wait:
            self._resolve_regions(wait)

    def _is_traced(self, index: int) -> bool:
        window = self._trace_window
        return window is not None and window[0] <= index < window[1]

    def add_region(self, path: tuple[str, ...], start: Mark, end: Mark) -> None:
        """A closed region; ``path`` is the enclosing regions' names, outermost first, then its
        own."""
        self._regions.append((path, start, end))

    def _resolve_regions(self, wait: bool) -> None:
        keep = []
        for path, start, end in self._regions:
            if not wait and not (Clock.ready(start) and Clock.ready(end)):
                keep.append((path, start, end))
                continue
            ms = self._clock.elapsed_ms(start, end)
            self._clock.recycle(start)
            self._clock.recycle(end)
            self._region_stats.add(path, ms)
        self._regions = keep
