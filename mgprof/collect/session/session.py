"""The profiling session behind ``mgprof.profile``, ``@mgprof.profile_step`` and ``mgprof.region``.

One ``Session`` per process times steps and regions, runs torch.profiler on a schedule, runs a
sampler thread, and at the end sends its ``RankRecord`` (and trace files) to rank 0, which writes
the run directory. Every part fails open: an error inside mgprof becomes one warning and a note
in the record, and the training goes on.

With no launcher around (``python train.py``, ``torchrun train.py``), rank 0 also writes the
report files (``mgprof.report.files``, run in a fresh process) and prints a few summary lines to
stderr, unless ``quiet=True`` or ``MGPROF_QUIET=1``. Under ``mgprof analyze`` the launcher does
both.

This module keeps the session's lifecycle and where its steps begin and end; the rest sits
beside it: ``steps`` (what ``step`` returns, and reading closed steps and regions into records),
``delivery`` (the record, the gather to rank 0 and the run directory), both mixed into
``Session``; ``inline_report`` (the report step) and ``device_facts`` (devices and versions).
"""

from __future__ import annotations

import atexit
import math
import os
import threading
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import torch

from mgprof.analyze.sweep.trials import is_oom_error
from mgprof.collect import hooks
from mgprof.collect import noise_scale as _noise
from mgprof.collect.batchinfo import (
    PendingFingerprint,
    batch_size_of,
    fingerprint,
    forward_samples,
)
from mgprof.collect.devices.device_facts import cuda_indices_in_use as _cuda_indices_in_use
from mgprof.collect.devices.memory import collect_memory, reset_peaks
from mgprof.collect.devices.memory_history import MemoryHistory
from mgprof.collect.distenv import RankInfo, env_rank_info, rank_info
from mgprof.collect.envknobs import MEMORY_ENV
from mgprof.collect.failopen import FailOpen
from mgprof.collect.session import step_timer
from mgprof.collect.session.delivery import DeliveryMixin
from mgprof.collect.session.inline_report import QUIET_ENV as QUIET_ENV
from mgprof.collect.session.inline_report import report_command as _report_command
from mgprof.collect.session.inline_report import report_run
from mgprof.collect.session.progress import PROGRESS_ENV, ProgressFile
from mgprof.collect.session.region_stats import RegionStats
from mgprof.collect.session.staging import Staging, open_staging
from mgprof.collect.session.step_timer import Clock, Mark
from mgprof.collect.session.steps import (
    NULL_STEP,
    NullStep,
    PendingStep,
    StepHandle,
    StepRecordsMixin,
)
from mgprof.collect.torch_profiler import TraceConfig, TraceWriter, build_profiler
from mgprof.collect.wrapping import precision as _precision
from mgprof.records import MemoryRecord, RankRecord, RunRecord, SamplerRecord, StepRecord

# Tests replace ``_cuda_indices_in_use``, ``collect_memory``, ``Clock`` (what the session's clock
# is made from) and ``_report_command`` on this module, so the session calls them by these names.

CUDA_RESOLVE_EVERY = 64
"""On CUDA, finished steps are read in batches: every event query or elapsed-time read is a
driver call, and the step path should cost one event record, not five driver calls."""

FINGERPRINT_STEPS = 8
"""Only the first steps are fingerprinted: enough to see identical data across ranks."""

_lock = threading.Lock()
_active: Session | None = None
_explicit_started = False
"""True once the script opened its own session: automatic instrumentation then stays out."""


def active_session() -> Session | None:
    """The session running in this process, if any."""
    return _active


def _stop_active_session() -> None:
    session = _active
    if session is not None:
        session.stop()


hooks.set_before_destroy(_stop_active_session)


def explicit_session_started() -> bool:
    """Whether the script itself used ``mgprof.profile``/``profile_step`` in this process."""
    return _explicit_started


class Session(StepRecordsMixin, DeliveryMixin):
    """One process's profiling session. Use :func:`mgprof.profile` to make one."""

    def __init__(
        self,
        *,
        out: str | os.PathLike[str] | None = None,
        name: str | None = None,
        skip: int = 1,
        warmup: int = 1,
        active: int = 3,
        trace: bool = True,
        sample: bool = True,
        sample_interval_s: float = 0.1,
        record_shapes: bool = True,
        profile_memory: bool = False,
        with_flops: bool = True,
        with_stack: bool = False,
        strategy: str | None = None,
        auto: bool = False,
        on_step: Callable[[int], None] | None = None,
        quiet: bool = False,
        memory: bool | None = None,
    ) -> None:
        self.memory = memory if memory is not None else os.environ.get(MEMORY_ENV) == "1"
        """Memory tracking (``--memory``): profiler memory events in the traced steps, and on
        CUDA the allocator's history with snapshots."""
        self.trace_config = TraceConfig(
            skip=skip,
            warmup=warmup,
            active=active if trace else 0,
            record_shapes=record_shapes,
            profile_memory=profile_memory or self.memory,
            with_flops=with_flops,
            with_stack=with_stack,
        )
        if not isinstance(sample_interval_s, (int, float)) or not (
            math.isfinite(sample_interval_s) and sample_interval_s > 0
        ):
            raise ValueError(
                f"sample_interval_s must be a number of seconds above 0, got {sample_interval_s!r}"
            )
        self.out = out
        self.name = name
        self.sample = sample
        self.sample_interval_s = sample_interval_s
        self.strategy = strategy
        self.auto = auto
        self.on_step = on_step
        self.quiet = quiet
        self.failopen = FailOpen()
        self._pid = os.getpid()
        """The process that made the session: a child the script forks never writes its record."""
        self.run_dir: Path | None = None
        self.record: RankRecord | None = None
        self.enabled = True
        self._running = False
        self._closed = False
        self._steps: list[PendingStep] = []
        self._done_steps: list[StepRecord] = []
        self._regions: list[tuple[tuple[str, ...], Mark, Mark]] = []
        self._region_stats: RegionStats  # made below, where a failure turns the session off
        self._mode: str | None = None
        self._pending_first: StepHandle | None = None
        self._boundary: Mark | None = None
        self._step_index = 0
        self._dataloader_ms = 0.0
        self._dataloader_timed = False
        self._profiler: Any = None
        self._profiler_live = False
        self._unset_mark = Mark(0.0)
        """Placeholder mark of a ``with`` step until it is entered."""
        self._trace_window: tuple[int, int] | None = None
        """Steps [first, end) that torch.profiler records, once it has started."""
        self._sampler: Any = None
        self._staging: Staging | None = None
        self._writer: TraceWriter | None = None
        self._cuda_indices: list[int] = []
        self._info: RankInfo | None = None
        self._clock: Any = None
        self._progress: Any = None
        self._auto_batch: int | None = None
        self._auto_fp: PendingFingerprint | None = None
        self._untrained_samples = 0
        self._memory: MemoryHistory | None = None
        try:  # fail open: a part that cannot be made turns the session off, not the training
            self._region_stats = RegionStats()
            self._clock = Clock(use_cuda=False)
            self._progress = ProgressFile(None, 0)
        except Exception as exc:
            self.enabled = False
            self.failopen.report("profile", exc)

    # -- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> Session:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        error = None
        if exc is not None and not isinstance(exc, (SystemExit, GeneratorExit)):
            name = exc_type.__name__ if exc_type else "Error"
            try:
                error = f"{name}: {exc}"
            except Exception:  # the user's exception must propagate, not one from its __str__
                error = f"{name}: (its message could not be read)"
        self.stop(error=error)

    def start(self) -> Session:
        """Begin timing, sampling and the trace schedule. Returns self. Never raises: a part that
        cannot start is one warning and a note, and the training goes on without it."""
        if not self.enabled:  # a part could not be made: the training runs unmeasured
            return self
        try:
            self._start()
        except Exception as exc:  # the last line of defence: never break the training
            self.failopen.report("start", exc)
        return self

    def _start(self) -> None:
        global _active, _explicit_started
        with _lock:
            if not self.auto:
                _explicit_started = True
            if _active is not None and _active is not self:
                if _active.auto and not self.auto:
                    _active.abandon()  # the script profiles itself: the automatic session yields
                else:
                    self.enabled = False
                    self.failopen.report(
                        "profile", RuntimeError("another mgprof session is already running")
                    )
                    return
            _active = self
        self._running = True
        if self.auto:  # forwards before the first update belong to no step
            forward_samples.take()
        self._info = env_rank_info()
        with self.failopen.guard("rank"):
            self._info = rank_info()
        with self.failopen.guard("progress"):
            self._progress = ProgressFile(os.environ.get(PROGRESS_ENV), self._info.rank)
        with self.failopen.guard("device"):
            self._cuda_indices = _cuda_indices_in_use(self.strategy)
        with self.failopen.guard("timing"):
            self._clock = Clock(use_cuda=bool(self._cuda_indices))
        with self.failopen.guard("memory"):
            reset_peaks(self._cuda_indices)
        if self.memory and self._cuda_indices:
            with self.failopen.guard("memory history"):
                history = MemoryHistory(self.failopen)
                history.start()
                self._memory = history
        with self.failopen.guard("hooks"):
            hooks.install(self)
        with self.failopen.guard("noise scale"):
            _noise.recorder.session_started(self._info.world_size)
        if self.sample:
            with self.failopen.guard("sampler"):
                from mgprof.collect.devices.sampler import start_sampler

                self._sampler = start_sampler(
                    self._cuda_indices or None, interval_s=self.sample_interval_s
                )
        with self.failopen.guard("staging"):
            self._staging, why = open_staging(self._info.rank, self.out)
            if why is not None:
                self.failopen.note(f"staging: {why}")
        if self._staging is not None and self.trace_config.active > 0:
            with self.failopen.guard("profiler"):
                self._writer = TraceWriter(
                    self._staging.path, self._info.worker_name, on_error=self._trace_not_saved
                )
        if self.auto:
            self._start_profiler(0)  # instrumentation marks steps by calls: the form is known
        try:
            self._boundary = self._clock.mark()
        except Exception as exc:  # a device clock that fails: time on the host instead
            self.failopen.report("timing", exc)
            self._clock = step_timer.Clock(use_cuda=False)  # the plain one, whatever ``Clock`` is
            self._boundary = self._clock.mark()

    def _trace_not_saved(self, path: Path, exc: OSError) -> None:
        """The trace writer could not write this rank's trace (disk full, ...)."""
        rank = self._info.rank if self._info is not None else 0
        self._save_failed(
            f"rank {rank}'s trace",
            path,
            exc,
            "this rank's trace is lost; its other measurements are kept",
        )

    def _start_profiler(self, done: int) -> None:
        """Start torch.profiler once the step form is known, ``done`` steps into the run.

        Until the form is known the first step cannot be told from the second (a call at the end
        of iteration 0, or the start of a ``with`` block?), so the profiler waits and the schedule
        joins its schedule at step ``done``; steps before the start are never traced.
        """
        cfg = self.trace_config
        first, end = cfg.skip + cfg.warmup, cfg.skip + cfg.warmup + cfg.active
        start_at = max(first, done)
        if cfg.active == 0 or self._writer is None or end <= start_at:
            return
        with self.failopen.guard("profiler"):
            self._profiler = build_profiler(cfg, self._writer, use_cuda=bool(self._cuda_indices))
            if self._profiler is not None:
                # join the schedule where the run is, so ProfilerStep#N is the record's step N
                self._profiler.step_num = done
                self._profiler.current_action = self._profiler.schedule(done)
                self._profiler.start()
                self._profiler_live = True
                self._trace_window = (start_at, end)

    def abandon(self) -> None:
        """Stop without writing anything: another session took over this process."""
        global _active
        self._running = False
        self._closed = True
        with self.failopen.guard("profiler"):
            if self._profiler_live:
                self._profiler_live = False
                self._profiler.stop()
        with self.failopen.guard("sampler"):
            if self._sampler is not None:
                self._sampler.stop()
        with self.failopen.guard("hooks"):
            hooks.uninstall(self)
        self._cleanup_tmp()
        if _active is self:
            _active = None

    # -- steps -----------------------------------------------------------------------------

    def step(self, batch: Any = None, *, batch_size: int | None = None) -> StepHandle | NullStep:
        """Mark a step. Call it once per iteration (after the step, like torch.profiler's
        ``step()``), or use it as ``with prof.step(batch):`` around the iteration's body.

        The batch gives the batch size (leading dim of its first tensor) unless ``batch_size``
        is given, and a cheap fingerprint during the first steps.
        """
        if batch_size is not None:
            check_batch_size(batch_size)  # misuse: one short error at the call, every time
        if not self._running:
            return NULL_STEP
        try:
            # the ``with`` form takes its mark on entry: no second event record per step
            mark = self._unset_mark if self._mode == "ctx" else self._clock.mark()
            size = batch_size if batch_size is not None else batch_size_of(batch)
            fp = None
            if batch is not None and self._step_index + len(self._steps) < FINGERPRINT_STEPS:
                fp = fingerprint(batch)
            handle = StepHandle(self, mark, size, fp, _noise.recorder.mark())
            if self._mode == "call":
                self._close(self._boundary_or(mark), mark, handle)
            elif self._mode is None:
                if self._pending_first is None:
                    self._pending_first = handle
                else:  # a second call with no ``with`` in between: the call form
                    self._mode = "call"
                    first, self._pending_first = self._pending_first, None
                    self._close(self._boundary_or(first.mark), first.mark, first)
                    self._close(first.mark, mark, handle)
                    self._start_profiler(self.steps_done)
            return handle
        except Exception as exc:
            self.failopen.report("step", exc)
            return NULL_STEP

    def _boundary_or(self, mark: Mark) -> Mark:
        return self._boundary if self._boundary is not None else mark

    def _enter_step(self, handle: StepHandle) -> None:
        if self._mode is None:
            self._mode = "ctx"
            self._pending_first = None
            self._start_profiler(self.steps_done)
        with self.failopen.guard("step"):
            handle.mark = self._clock.mark()

    def _exit_step(self, handle: StepHandle) -> None:
        if self._mode != "ctx" or not self._running:
            return
        with self.failopen.guard("step"):
            handle.syncs = _noise.recorder.mark()
            self._close(handle.mark, self._clock.mark(), handle)

    def _close(self, start: Mark, end: Mark, handle: StepHandle) -> None:
        dl = self._dataloader_ms if self._dataloader_timed else None
        self._dataloader_ms, self._dataloader_timed = 0.0, False
        self._steps.append(
            PendingStep(
                self._step_index + len(self._steps), start, end, handle.batch_size, handle.fp, dl
            )
        )
        self._boundary = end
        with self.failopen.guard("noise scale"):
            _noise.recorder.step_closed(self._steps[-1].index, handle.batch_size, handle.syncs)
        if self._memory is not None:
            with self.failopen.guard("memory history"):
                self._memory.step_ended(self._step_index + len(self._steps) - 1)
        if self._profiler_live:
            with self.failopen.guard("profiler"):
                self._profiler.step()
                done = self._step_index + len(self._steps)
                if self._trace_window is not None and done >= self._trace_window[1]:
                    self._profiler_live = False
                    self._profiler.stop()  # window over: no profiler cost for the rest
                    if self._memory is not None:
                        self._memory.snapshot("window")
        if not self._clock.use_cuda or len(self._steps) >= CUDA_RESOLVE_EVERY:
            self._resolve_ready()
        steps_done = self._step_index + len(self._steps)
        self._progress.update(steps_done)
        if self.on_step is not None:
            self.on_step(steps_done)

    def note_batch(self, batch: Any) -> None:
        """A batch seen by the DataLoader hook; the automatic session sums their sizes per step
        (the step's batch when the trained module's own inputs were not seen)."""
        if not self.auto:
            return
        size = batch_size_of(batch)
        if size is not None:
            self._auto_batch = (self._auto_batch or 0) + size
        if self._auto_fp is None and self.steps_done < FINGERPRINT_STEPS:
            self._auto_fp = fingerprint(batch)

    def auto_step(self) -> None:
        """A step boundary found by instrumentation (an optimizer step). The step's batch is what
        the trained module was called with since the last boundary (``forward_samples``); only
        when auto-wrap's route saw no call, the batches the DataLoader yielded."""
        fetched, self._auto_batch = self._auto_batch, None
        trained = forward_samples.take()
        fp, self._auto_fp = self._auto_fp, None
        if not self._running:
            return
        with self.failopen.guard("batch"):
            self._note_batch_source(trained, fetched)
        size = trained if trained is not None else fetched
        try:
            mark = self._clock.mark()
            self._mode = "call"
            handle = StepHandle(self, mark, size, fp, _noise.recorder.mark())
            self._close(self._boundary_or(mark), mark, handle)
        except Exception as exc:
            self.failopen.report("step", exc)

    def _note_batch_source(self, trained: int | None, fetched: int | None) -> None:
        """Which count gave the step's batch, and samples the DataLoader yielded that the model
        was never called with (a peek at the loader), for the record's training facts."""
        if trained is not None:
            hooks.note_fact("batch_source", "forward")
            if fetched is not None and fetched > trained:
                self._untrained_samples += fetched - trained
                hooks.note_fact("untrained_samples", self._untrained_samples)
        elif fetched is not None:
            hooks.note_fact("batch_source", "dataloader")

    def add_dataloader_wait(self, ms: float) -> None:
        """Time the loop waited for the next batch; charged to the step being built."""
        self._dataloader_ms += ms
        self._dataloader_timed = True

    @property
    def steps_done(self) -> int:
        return self._step_index + len(self._steps)

    # -- the end ---------------------------------------------------------------------------

    def _memory_facts(self, memory: MemoryRecord, error: str | None) -> None:
        """What memory tracking adds to the record: the marks, and whether this rank ran out
        of memory (the observer saw it on CUDA; the script's MemoryError on CPU)."""
        memory.tracked = True
        history = self._memory
        failed = is_oom_error(error)
        memory.oom = failed or (history is not None and history.oom)
        if history is not None:
            memory.step_marks = list(history.step_marks)
            memory.phase_marks = list(history.phase_marks)

    def stop(self, error: str | None = None) -> RunRecord | None:
        """Finish: collect the record, send it to rank 0, write the run directory there (and,
        with no launcher around, the report files and a summary on stderr).

        Returns the ``RunRecord`` on the rank that wrote it, else None. Never raises.
        """
        global _active
        if self._closed or not self.enabled or os.getpid() != self._pid:
            return None
        self._closed = True
        self._running = False
        run: RunRecord | None = None
        try:
            if self._mode is None and self._pending_first is not None:
                first, self._pending_first = self._pending_first, None
                self._close(self._boundary_or(first.mark), first.mark, first)
            with self.failopen.guard("profiler"):
                if self._profiler_live:
                    self._profiler_live = False
                    if self._writer is not None:  # torch opened ProfilerStep#N for no step
                        self._writer.drop_steps_from = self.steps_done
                    self._profiler.stop()
            with self.failopen.guard("timing"):
                if self._cuda_indices:
                    torch.cuda.synchronize()
                self._resolve_ready(wait=True)
            if self._memory is not None:  # no traced window ended (trace off, or a short run)
                self._memory.snapshot("window")
            sampler_record = SamplerRecord(
                kind="none",
                reason="sampling turned off" if not self.sample else "the sampler failed to start",
            )
            if self._sampler is not None:
                with self.failopen.guard("sampler"):
                    sampler_record = self._sampler.stop()
            with self.failopen.guard("hooks"):
                hooks.uninstall(self)
            memory: MemoryRecord | None = None
            with self.failopen.guard("memory"):
                memory = collect_memory(self._cuda_indices)
                if self.memory:
                    self._memory_facts(memory, error)
            self.record = self._build_record(sampler_record, memory, error)
            with self.failopen.guard("precision"):
                self.record.training.precision = _precision.snapshot()
            with self.failopen.guard("noise scale"):
                self.record.noise_scale = _noise.recorder.session_stopped(
                    self.record.world_size, self.record.training.ddp_sync_forwards
                )
            run = self._deliver(self.record)
            if run is not None:
                run = report_run(
                    self.run_dir,
                    run,
                    info=self._info,
                    quiet=self.quiet,
                    failopen=self.failopen,
                    command=_report_command,
                )
        except Exception as exc:  # the last line of defence: never break the training
            self.failopen.report("finalise", exc)
        finally:
            self._cleanup_tmp()  # every way out, KeyboardInterrupt included: no staging left
            with _lock:
                if _active is self:
                    _active = None
        return run


MAX_BATCH_SIZE = 1 << 40
"""No step trains more samples than this: a larger ``batch_size`` is a mistake, not a batch."""


def check_batch_size(value: Any) -> None:
    """``prof.step(batch_size=...)``: a whole number of samples from 1 to ``MAX_BATCH_SIZE``,
    else ValueError (a string, 1.5, -5 or 10**40 once wrote a run.json that report refused, a
    negative throughput or a 45-digit one)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(
            f"mgprof: batch_size must be a whole number of samples, got {type(value).__name__} "
            f"{str(value)[:40]!r}"
        )
    if not 1 <= value <= MAX_BATCH_SIZE:
        raise ValueError(f"mgprof: batch_size must be between 1 and 2**40, got {str(value)[:40]}")


# -- module-level conveniences ---------------------------------------------------------------

_lazy: Session | None = None


def lazy_session(**kwargs: Any) -> Session:
    """The session opened by ``@profile_step``: created on first use, closed at exit."""
    global _lazy
    if _lazy is None or _lazy._closed:
        current = active_session()
        if current is not None and not current.auto:
            return current
        _lazy = Session(**kwargs).start()
        atexit.register(_lazy.stop)
    return _lazy
