"""The profiling session behind ``mgprof.profile``, ``@mgprof.profile_step`` and ``mgprof.region``.

One ``Session`` per process times steps and regions, runs torch.profiler on a schedule, runs a
sampler thread, and at the end sends its ``RankRecord`` (and trace files) to rank 0, which writes
the run directory. Every part fails open: an error inside mgprof becomes one warning and a note
in the record, and the training goes on.

With no launcher around (``python train.py``, ``torchrun train.py``), rank 0 also writes the
report files (``mgprof.report.files``, run in a fresh process) and prints a few summary lines to
stderr, unless ``quiet=True`` or ``MGPROF_QUIET=1``. Under ``mgprof analyze`` the launcher does
both.
"""

from __future__ import annotations

import atexit
import os
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import msgspec
import torch

from mgprof import rundir
from mgprof.collect import hooks
from mgprof.collect.batchinfo import PendingFingerprint, batch_size_of, fingerprint
from mgprof.collect.distenv import RankInfo, gather_bytes_to_rank0, group_ready, rank_info
from mgprof.collect.failopen import FailOpen
from mgprof.collect.memory import collect_memory, reset_peaks
from mgprof.collect.progress import PROGRESS_ENV, ProgressFile
from mgprof.collect.step_timer import Clock, Mark
from mgprof.collect.torch_profiler import TraceConfig, TraceWriter, build_profiler
from mgprof.records import (
    DeviceInfo,
    RankRecord,
    RegionRecord,
    RunRecord,
    SamplerRecord,
    StepRecord,
)

CUDA_RESOLVE_EVERY = 64
"""On CUDA, finished steps are read in batches: every event query or elapsed-time read is a
driver call, and the step path should cost one event record, not five driver calls."""

FINGERPRINT_STEPS = 8
"""Only the first steps are fingerprinted: enough to see identical data across ranks."""

QUIET_ENV = "MGPROF_QUIET"
"""Set to 1 (or true/yes/on) to silence the end-of-session summary; the files are still written."""

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


class _RankPayload(msgspec.Struct):
    """What a rank sends to rank 0: its record and its trace files' bytes."""

    record: RankRecord
    traces: dict[str, bytes]


class _PendingStep:
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

    __slots__ = ("_session", "batch_size", "entered", "fp", "mark")

    def __init__(
        self, session: Session, mark: Mark, batch_size: int | None, fp: PendingFingerprint | None
    ) -> None:
        self._session = session
        self.mark = mark
        self.batch_size = batch_size
        self.fp = fp
        self.entered = False

    def __enter__(self) -> StepHandle:
        self.entered = True
        self._session._enter_step(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self._session._exit_step(self)


class _NullStep:
    """The step handle of a disabled session: does nothing, costs nothing."""

    def __enter__(self) -> _NullStep:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


_NULL_STEP = _NullStep()


class Session:
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
    ) -> None:
        self.trace_config = TraceConfig(
            skip=skip,
            warmup=warmup,
            active=active if trace else 0,
            record_shapes=record_shapes,
            profile_memory=profile_memory,
            with_flops=with_flops,
            with_stack=with_stack,
        )
        if sample_interval_s <= 0:
            raise ValueError(f"sample_interval_s must be > 0, got {sample_interval_s}")
        self.out = out
        self.name = name
        self.sample = sample
        self.sample_interval_s = sample_interval_s
        self.strategy = strategy
        self.auto = auto
        self.on_step = on_step
        self.quiet = quiet
        self.failopen = FailOpen()
        self.run_dir: Path | None = None
        self.record: RankRecord | None = None
        self.enabled = True
        self._running = False
        self._closed = False
        self._steps: list[_PendingStep] = []
        self._done_steps: list[StepRecord] = []
        self._regions: list[tuple[str, Mark, Mark]] = []
        self._region_totals: dict[str, list[float]] = {}
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
        self._trace_tmp: Path | None = None
        self._writer: TraceWriter | None = None
        self._cuda_indices: list[int] = []
        self._info: RankInfo | None = None
        self._clock = Clock(use_cuda=False)
        self._progress = ProgressFile(None, 0)
        self._auto_batch: int | None = None
        self._auto_fp: PendingFingerprint | None = None

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
            error = f"{exc_type.__name__ if exc_type else 'Error'}: {exc}"
        self.stop(error=error)

    def start(self) -> Session:
        """Begin timing, sampling and the trace schedule. Returns self."""
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
                    return self
            _active = self
        self._running = True
        self._info = rank_info()
        self._progress = ProgressFile(os.environ.get(PROGRESS_ENV), self._info.rank)
        with self.failopen.guard("device"):
            self._cuda_indices = _cuda_indices_in_use(self.strategy)
        self._clock = Clock(use_cuda=bool(self._cuda_indices))
        with self.failopen.guard("memory"):
            reset_peaks(self._cuda_indices)
        with self.failopen.guard("hooks"):
            hooks.install(self)
        if self.sample:
            with self.failopen.guard("sampler"):
                from mgprof.collect.sampler import start_sampler

                self._sampler = start_sampler(
                    self._cuda_indices or None, interval_s=self.sample_interval_s
                )
        with self.failopen.guard("profiler"):
            self._trace_tmp = Path(tempfile.mkdtemp(prefix="mgprof-traces-"))
            self._writer = TraceWriter(self._trace_tmp, self._info.worker_name)
        if self.auto:
            self._start_profiler(0)  # instrumentation marks steps by calls: the form is known
        self._boundary = self._clock.mark()
        return self

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
        if _active is self:
            _active = None

    # -- steps -----------------------------------------------------------------------------

    def step(self, batch: Any = None, *, batch_size: int | None = None) -> StepHandle | _NullStep:
        """Mark a step. Call it once per iteration (after the step, like torch.profiler's
        ``step()``), or use it as ``with prof.step(batch):`` around the iteration's body.

        The batch gives the batch size (leading dim of its first tensor) unless ``batch_size``
        is given, and a cheap fingerprint during the first steps.
        """
        if not self._running:
            return _NULL_STEP
        try:
            # the ``with`` form takes its mark on entry: no second event record per step
            mark = self._unset_mark if self._mode == "ctx" else self._clock.mark()
            size = batch_size if batch_size is not None else batch_size_of(batch)
            fp = None
            if batch is not None and self._step_index + len(self._steps) < FINGERPRINT_STEPS:
                fp = fingerprint(batch)
            handle = StepHandle(self, mark, size, fp)
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
            return _NULL_STEP

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
            self._close(handle.mark, self._clock.mark(), handle)

    def _close(self, start: Mark, end: Mark, handle: StepHandle) -> None:
        dl = self._dataloader_ms if self._dataloader_timed else None
        self._dataloader_ms, self._dataloader_timed = 0.0, False
        self._steps.append(
            _PendingStep(
                self._step_index + len(self._steps), start, end, handle.batch_size, handle.fp, dl
            )
        )
        self._boundary = end
        if self._profiler_live:
            with self.failopen.guard("profiler"):
                self._profiler.step()
                done = self._step_index + len(self._steps)
                if self._trace_window is not None and done >= self._trace_window[1]:
                    self._profiler_live = False
                    self._profiler.stop()  # window over: no profiler cost for the rest
        if not self._clock.use_cuda or len(self._steps) >= CUDA_RESOLVE_EVERY:
            self._resolve_ready()
        steps_done = self._step_index + len(self._steps)
        self._progress.update(steps_done)
        if self.on_step is not None:
            self.on_step(steps_done)

    def note_batch(self, batch: Any) -> None:
        """A batch seen by the DataLoader hook; the automatic session sums their sizes per step."""
        if not self.auto:
            return
        size = batch_size_of(batch)
        if size is not None:
            self._auto_batch = (self._auto_batch or 0) + size
        if self._auto_fp is None and self.steps_done < FINGERPRINT_STEPS:
            self._auto_fp = fingerprint(batch)

    def auto_step(self) -> None:
        """A step boundary found by instrumentation (an optimizer step): uses the batches seen."""
        size, self._auto_batch = self._auto_batch, None
        fp, self._auto_fp = self._auto_fp, None
        if not self._running:
            return
        try:
            mark = self._clock.mark()
            self._mode = "call"
            self._close(self._boundary_or(mark), mark, StepHandle(self, mark, size, fp))
        except Exception as exc:
            self.failopen.report("step", exc)

    def add_dataloader_wait(self, ms: float) -> None:
        """Time the loop waited for the next batch; charged to the step being built."""
        self._dataloader_ms += ms
        self._dataloader_timed = True

    @property
    def steps_done(self) -> int:
        return self._step_index + len(self._steps)

    def _resolve_ready(self, wait: bool = False) -> None:
        """Turn finished steps into records; on CUDA only those whose events have completed.

        Events on one stream complete in order, so one query of the newest pending step tells
        whether all of them can be read; otherwise they are read one by one up to the first
        unfinished.
        """
        keep: list[_PendingStep] = []
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

    # -- regions ---------------------------------------------------------------------------

    def add_region(self, name: str, start: Mark, end: Mark) -> None:
        self._regions.append((name, start, end))

    def _resolve_regions(self, wait: bool) -> None:
        keep = []
        for name, start, end in self._regions:
            if not wait and not (Clock.ready(start) and Clock.ready(end)):
                keep.append((name, start, end))
                continue
            ms = self._clock.elapsed_ms(start, end)
            self._clock.recycle(start)
            self._clock.recycle(end)
            tot = self._region_totals.setdefault(name, [0, 0.0, 0.0])
            tot[0] += 1
            tot[1] += ms
            tot[2] = max(tot[2], ms)
        self._regions = keep

    # -- the end ---------------------------------------------------------------------------

    def stop(self, error: str | None = None) -> RunRecord | None:
        """Finish: collect the record, send it to rank 0, write the run directory there (and,
        with no launcher around, the report files and a summary on stderr).

        Returns the ``RunRecord`` on the rank that wrote it, else None. Never raises.
        """
        global _active
        if self._closed or not self.enabled:
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
            sampler_record = SamplerRecord(
                kind="none",
                reason="sampling turned off" if not self.sample else "the sampler failed to start",
            )
            if self._sampler is not None:
                with self.failopen.guard("sampler"):
                    sampler_record = self._sampler.stop()
            with self.failopen.guard("hooks"):
                hooks.uninstall(self)
            self.record = self._build_record(sampler_record, error)
            run = self._deliver(self.record)
            if run is not None:
                run = self._report(run)
        except Exception as exc:  # the last line of defence: never break the training
            self.failopen.report("finalise", exc)
        finally:
            with _lock:
                if _active is self:
                    _active = None
        return run

    def _report(self, run: RunRecord) -> RunRecord:
        """Rank 0 wrote the run directory itself (no ``mgprof analyze`` launcher, which analyses
        and reports on its own): analyse it, write report.md and report.html (in a fresh
        process), print a summary unless quiet.

        Fails open like the rest: an error here is one warning; run.json stays as written.
        """
        if os.environ.get(rundir.RUN_DIR_ENV) or self.run_dir is None:
            return run
        if (self._info or rank_info()).rank != 0:
            return run
        if not (self.run_dir / rundir.RUN_JSON).exists():
            return run  # the writer failed (already one warning): nothing to report on
        analysis = None
        written: list[str] = []
        with self.failopen.guard("report"):
            written = _write_report_files(self.run_dir, run)
            from mgprof.records import read_run

            run = read_run(self.run_dir)  # as saved: with its analysis
            analysis = run.analysis
        if self.quiet or _quiet_env():
            return run
        with self.failopen.guard("summary"):
            from mgprof.report.summary_lines import summary_lines

            lines = summary_lines(run, analysis, self.run_dir, written)
            sys.stderr.write("".join(f"{line}\n" for line in lines))
            sys.stderr.flush()
        return run

    def _build_record(self, sampler: SamplerRecord, error: str | None) -> RankRecord:
        info = self._info or rank_info()
        memory = None
        with self.failopen.guard("memory"):
            memory = collect_memory(self._cuda_indices)
        regions = [
            RegionRecord(name=n, count=int(t[0]), total_ms=round(t[1], 6), max_ms=round(t[2], 6))
            for n, t in sorted(self._region_totals.items())
        ]
        strategy = self.strategy or os.environ.get("MGPROF_STRATEGY") or _guess_strategy(info)
        backend = None
        with self.failopen.guard("backend"):
            if torch.distributed.is_available() and torch.distributed.is_initialized():
                backend = str(torch.distributed.get_backend())
        return RankRecord(
            rank=info.rank,
            world_size=info.world_size,
            local_rank=info.local_rank,
            host=info.host,
            pid=os.getpid(),
            strategy=strategy,
            backend=backend,
            device=_device_info(self._cuda_indices),
            devices_used=max(1, len(self._cuda_indices)),
            steps=self._done_steps,
            step_form="auto" if self.auto else ("with" if self._mode == "ctx" else "call"),
            regions=regions,
            sampler=sampler,
            memory=memory,
            training=hooks.training_facts(),
            versions=_versions(),
            warnings=list(self.failopen.notes),
            error=error,
        )

    def _trace_files(self) -> dict[str, bytes]:
        files: dict[str, bytes] = {}
        if self._writer is None:
            return files
        for path in self._writer.written:
            with self.failopen.guard("traces"):
                files[path.name] = path.read_bytes()
        return files

    def _deliver(self, record: RankRecord) -> RunRecord | None:
        """Gather to rank 0 over the process group when there is one; else write directly."""
        traces = self._trace_files()
        payload = _RankPayload(record=record, traces=traces)
        if group_ready() and record.error is None:
            # a failing rank must not enter a collective its healthy peers will never join
            try:
                gathered = gather_bytes_to_rank0(msgspec.msgpack.encode(payload))
            except Exception as exc:
                self.failopen.report("gather", exc)
                record.warnings.append(self.failopen.notes[-1])
            else:
                self._cleanup_tmp()
                if gathered is None:
                    return None
                decoder = msgspec.msgpack.Decoder(_RankPayload)
                payloads = [decoder.decode(b) for b in gathered if b]
                return self._write_run([p.record for p in payloads], payloads)
        run_dir = self._resolve_run_dir()
        if record.world_size > 1 and rundir.RUN_DIR_ENV in os.environ:
            # the launcher merges partial records; this rank could not send its record
            self._write_traces(run_dir, traces, record)
            with self.failopen.guard("writer"):
                rundir.write_partial(run_dir, record)
            self._cleanup_tmp()
            return None
        run = self._write_run([record], [payload])
        self._cleanup_tmp()
        return run

    def _resolve_run_dir(self) -> Path:
        if self.run_dir is not None:
            return self.run_dir
        env = os.environ.get(rundir.RUN_DIR_ENV)
        if env:
            self.run_dir = Path(env)
            self.run_dir.mkdir(parents=True, exist_ok=True)
        else:
            stem = self.name or Path(sys.argv[0] or "python").stem or "python"
            info = self._info or rank_info()
            if info.rank > 0:  # no group carried this rank's record to rank 0: keep it apart
                stem = f"{stem}-rank{info.rank}"
            self.run_dir = rundir.new_run_dir(self.out or rundir.DEFAULT_ROOT, stem)
        return self.run_dir

    def _write_traces(self, run_dir: Path, traces: dict[str, bytes], record: RankRecord) -> None:
        from mgprof.atomic import write_bytes_atomic

        for name, data in traces.items():
            with self.failopen.guard("writer"):
                write_bytes_atomic(run_dir / rundir.TRACES / name, data)
                record.traces.append(f"{rundir.TRACES}/{name}")

    def _write_run(self, records: list[RankRecord], payloads: list[_RankPayload]) -> RunRecord:
        run_dir = self._resolve_run_dir()
        for rec, p in zip(records, payloads):
            self._write_traces(run_dir, p.traces, rec)
            with self.failopen.guard("samples"):
                from mgprof.collect.sampler import write_samples_csv

                if rec.sampler.devices:
                    write_samples_csv(rec.sampler, run_dir / rundir.SAMPLES / f"rank{rec.rank}.csv")
        info = self._info or rank_info()
        existing = None
        if (run_dir / rundir.RUN_JSON).exists():
            with self.failopen.guard("writer"):
                from mgprof.records import read_run

                existing = read_run(run_dir)
        base = existing or RunRecord(
            run_id=run_dir.name,
            created_utc=rundir.utc_iso(),
            script=sys.argv[0] or None,
            script_args=list(sys.argv[1:]),
            world_size=info.world_size,
            nnodes=info.nnodes,
            status="complete",
        )
        errors = [r.error for r in records if r.error]
        run = msgspec.structs.replace(
            base,
            strategy=records[0].strategy if records else base.strategy,
            backend=records[0].backend if records else base.backend,
            cpu_fallback=bool(records) and records[0].device.kind == "cpu",
            status="incomplete" if errors else base.status,
            error=errors[0] if errors else base.error,
        )
        run = rundir.merge_ranks(msgspec.structs.replace(run, ranks=[]), records)
        with self.failopen.guard("writer"):
            rundir.write_run(run_dir, run)
        return run

    def _cleanup_tmp(self) -> None:
        if self._trace_tmp is not None:
            import shutil

            shutil.rmtree(self._trace_tmp, ignore_errors=True)
            self._trace_tmp = None


def _report_command(run_dir: Path) -> list[str]:
    return [sys.executable, "-m", "mgprof.report.files", str(run_dir)]


def _write_report_files(run_dir: Path, run: RunRecord) -> list[str]:
    """Analysis into run.json, report.md and report.html, written by ``mgprof.report.files`` in a
    fresh Python process (why: that module's docstring); the names of the report files written.

    In the unusual interpreter with no ``sys.executable`` (embedded), it runs in this process.
    """
    if not sys.executable:
        from mgprof.report.files import write_report_files

        return [p.name for p in write_report_files(run_dir, run).written]
    import subprocess

    env = dict(os.environ)
    # appended, not prepended: an mgprof source tree only put on sys.path is found too
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), root) if p)
    proc = subprocess.run(
        _report_command(run_dir.resolve()),
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        errors="replace",
        check=False,
    )
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        raise RuntimeError(
            "report files not written: " + (lines[-1] if lines else f"exit code {proc.returncode}")
        )
    return [line for line in proc.stdout.splitlines() if line]


def _quiet_env() -> bool:
    return os.environ.get(QUIET_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


def _guess_strategy(info: RankInfo) -> str:
    return "ddp" if info.world_size > 1 else "single"


def _cuda_indices_in_use(strategy: str | None) -> list[int]:
    """CUDA devices this process drives: all of them under DataParallel, else its own."""
    if not torch.cuda.is_available():
        return []
    from mgprof.collect.wrap import devices_in_use

    return devices_in_use(strategy)


def _device_info(cuda_indices: list[int]) -> DeviceInfo:
    if not cuda_indices:
        import platform

        return DeviceInfo(kind="cpu", name=platform.processor() or platform.machine())
    idx = cuda_indices[0]
    props = torch.cuda.get_device_properties(idx)
    uuid = getattr(props, "uuid", None)
    return DeviceInfo(
        kind="cuda",
        index=idx,
        name=props.name,
        total_memory_mib=round(props.total_memory / (1024 * 1024), 3),
        uuid=f"GPU-{uuid}" if uuid is not None and not str(uuid).startswith("GPU-") else uuid,
        pci_bus_id=_pci_bus_id(props),
        capability=f"{props.major}.{props.minor}",
    )


def _pci_bus_id(props: Any) -> str | None:
    try:
        return f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    except AttributeError:
        return None


def _versions() -> dict[str, str | None]:
    try:
        from mgprof.collect.environment import versions

        return {k: None if v is None else str(v) for k, v in versions().items()}
    except Exception:
        import platform

        from mgprof import __version__

        return {
            "mgprof": __version__,
            "python": platform.python_version(),
            "torch": str(torch.__version__),
            "cuda": None if torch.version.cuda is None else str(torch.version.cuda),
        }


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
