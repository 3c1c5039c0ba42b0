"""Run an unmodified training script under automatic instrumentation (``mgprof analyze``).

``python -m mgprof.run.bootstrap SCRIPT [ARGS...]`` (each torchrun worker runs this) installs global
hooks, then runs SCRIPT as ``__main__``:

- an optimizer step-post hook marks step boundaries (the first optimizer seen is the clock, so
  several optimizers or gradient accumulation still give one step per update);
- the DataLoader iterator is timed (stalls) and its batches give the batch size;
- ``torch.distributed.destroy_process_group`` first lets the session send its record to rank 0
  (see ``mgprof.collect.hooks``);
- after ``MGPROF_WARMUP + MGPROF_STEPS`` steps the session ends and the script is stopped;
- under ``mgprof compare`` (``MGPROF_COMPARE=1``) the step limit also ends a script's own
  session, and with ``MGPROF_NOSYNC_STEPS=M`` the gradient-sync A/B
  (``mgprof.collect.wrapping.nosync``)
  runs 2M more steps before the script is stopped.

A script that opens its own ``mgprof.profile``/``profile_step`` session is not instrumented
twice. The script's exit code, output and traceback are its own.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

MEMORY_BUDGET_ENV = "MGPROF_MEMORY_BUDGET_MIB"
STEPS_ENV = "MGPROF_STEPS"
WARMUP_ENV = "MGPROF_WARMUP"
ACTIVE_ENV = "MGPROF_ACTIVE"
COMPARE_ENV = "MGPROF_COMPARE"
NOSYNC_STEPS_ENV = "MGPROF_NOSYNC_STEPS"


class StepLimitReached(SystemExit):
    """Raised from the optimizer hook once the requested steps are measured (exit code 0)."""


class AutoInstrument:
    """The automatic session's wiring: hooks in, session on demand, clean end."""

    def __init__(
        self,
        warmup: int,
        steps: int | None,
        active: int,
        limit_explicit: bool = False,
        ab: Any = None,
    ) -> None:
        self.warmup = warmup
        self.steps = steps
        self.active = active
        self.limit_explicit = limit_explicit
        """Apply the step limit to a script's own session too (``mgprof compare`` needs every
        strategy stopped after the same number of steps)."""
        self.ab = ab
        """The ``NoSyncAB`` to run after the measured steps, or None."""
        self.autowrap: Any = None
        """The ``AutoWrap`` watching for the trained model under dp/ddp, or None."""
        self.precision: Any = None
        """The ``PrecisionControl`` of ``--precision``, or None."""
        self.session: Any = None
        self.clock_optimizer: int | None = None
        self.updates = 0
        self._optimizers: dict[int, Any] = {}
        self._handles: list[Any] = []

    def install(self) -> None:
        import torch
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self._handles.append(register_optimizer_step_post_hook(self._on_optimizer_step))
        # Facts set before the first update (set_epoch, DDP arguments) need the hooks early.
        from mgprof.collect import hooks

        hooks.install(None)
        _ = torch

    def _ensure_session(self) -> tuple[Any, bool]:
        """The automatic session (created at the first update) and whether it is new."""
        from mgprof.collect.session.session import Session, active_session, explicit_session_started

        if explicit_session_started():
            return None, False
        current = active_session()
        if current is not None and not current.auto:
            return None, False
        if self.session is not None:
            return self.session, False
        skip = max(self.warmup - 1, 0)
        warm = 1 if self.warmup >= 1 else 0
        self.session = Session(auto=True, skip=skip, warmup=warm, active=self.active)
        self.session.start()  # step 0 runs from this update to the next
        return self.session, True

    def _on_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            self._on_update(optimizer)
        except StepLimitReached:
            raise  # the measured steps are done: the script is stopped on purpose
        except Exception as exc:  # fail open: the training goes on, unmeasured from here
            from mgprof.collect import failopen

            failopen.report("optimizer hook", exc)

    def _on_update(self, optimizer: Any) -> None:
        key = id(optimizer)
        self._optimizers.setdefault(key, optimizer)
        if self.clock_optimizer is None:
            self.clock_optimizer = key
        elif key != self.clock_optimizer:
            return
        self.updates += 1
        if self.precision is not None:
            self.precision.on_update()
        if self.updates == 1 and self.autowrap is not None:
            self.autowrap.on_first_update()
        if self.ab is not None and self.ab.active:
            if self.ab.on_update():
                raise StepLimitReached(0)
            return
        session, created = self._ensure_session()
        if session is None:
            # the script's own session; its first update is this hook's first, as in auto mode
            if (
                self.limit_explicit
                and self.steps is not None
                and self.updates > self.warmup + self.steps
            ):
                self._limit_reached()
            return
        if created:
            return
        session.auto_step()
        if self.steps is not None and session.steps_done >= self.warmup + self.steps:
            self.finish()
            self._limit_reached()

    def _limit_reached(self) -> None:
        """Measured steps done: run the A/B if asked (its steps are not recorded), then stop."""
        _pause_explicit()
        if self.ab is not None and self.ab.start(list(self._optimizers.values())):
            return
        raise StepLimitReached(0)

    def finish(self, error: str | None = None) -> None:
        if self.ab is not None and self.ab.active:
            self.ab.abandon()  # the script ended first: state back, partial times kept
        if self.session is not None and not self.session._closed:
            self.session.stop(error=error)


def _active_steps() -> int:
    """Traced steps (``--trace-steps``; 0 traces none); 3 when the launcher did not say."""
    found = _env_int(ACTIVE_ENV)
    return 3 if found is None else max(found, 0)


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else None


def limit_address_space(budget_mib: int) -> int:
    """Cap this process's address space at what it maps now plus ``budget_mib``.

    Used by ``mgprof sweep`` on CPU so that a too-large batch genuinely fails to allocate
    (MemoryError) inside the trial process, as a CUDA OOM would on a GPU. Relative to the
    current size because importing torch alone maps gigabytes of address space.
    Returns the limit in bytes.
    """
    import resource

    with open("/proc/self/statm") as fh:
        pages = int(fh.read().split()[0])
    limit = pages * os.sysconf("SC_PAGE_SIZE") + budget_mib * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return limit


def _sigterm(signum: int, frame: Any) -> None:
    if os.getpid() != _MAIN_PID:  # a process the script forked: not a rank, mgprof stays out
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    _dump_stacks()
    _dump_flight_recorder()
    raise SystemExit(128 + signum)


_MAIN_PID = os.getpid()
"""The rank's own process: a child the script forks inherits the handlers and returns through
``main``, and must neither write the rank's record nor mark it finished."""


def _stack_path() -> Path | None:
    from mgprof.rundir import RUN_DIR_ENV

    run_dir = os.environ.get(RUN_DIR_ENV)
    if not run_dir:
        return None
    return Path(run_dir) / "logs" / f"rank{int(os.environ.get('RANK', '0') or 0)}.stack"


def _dump_stacks() -> None:
    """Every thread's Python stack into ``logs/rank<N>.stack`` when mgprof stops the rank (a
    hung collective's peers are stopped this way): the failure summary then says where each
    rank was waiting."""
    import faulthandler

    path = _stack_path()
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", encoding="utf-8") as fh:
            faulthandler.dump_traceback(fh, all_threads=True)
    except Exception:  # fail open: the rank stops as asked, without its stack
        pass


def _dump_flight_recorder() -> None:
    """The collectives torch's flight recorder kept on this rank into ``logs/rank<N>.fr.json``
    (only when the script made a process group): the failure summary reads which collective
    each rank entered last. Called when mgprof stops the rank and when its script fails."""
    dist = sys.modules.get("torch.distributed")
    path = _stack_path()
    if dist is None or path is None:
        return
    try:
        if not dist.is_available() or not dist.is_initialized():
            return
        from torch._C import _distributed_c10d as c10d

        dump = getattr(c10d, "_dump_fr_trace_json", None)  # torch >= 2.6
        if dump is None:
            return
        data = dump(True, True)  # JSON, as bytes
        path.with_suffix(".fr.json").write_bytes(
            data if isinstance(data, bytes) else str(data).encode("utf-8")
        )
    except Exception:  # fail open: an older torch, or no recorder
        pass


def _in_forked_child() -> bool:
    return os.getpid() != _MAIN_PID


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print("usage: python -m mgprof.run.bootstrap SCRIPT [ARGS...]", file=sys.stderr)
        return 2
    _start_rank_log()
    script = Path(args[0])
    auto = AutoInstrument(
        warmup=_env_int(WARMUP_ENV) or 0,
        steps=_env_int(STEPS_ENV),
        active=_active_steps(),
        limit_explicit=os.environ.get(COMPARE_ENV) == "1",
        ab=_nosync_ab(),
    )
    try:
        auto.install()
    except Exception as exc:  # fail open: the script runs uninstrumented
        print(f"mgprof: instrumentation disabled: {type(exc).__name__}: {exc}", file=sys.stderr)
    try:
        auto.precision = _install_precision(auto)
    except Exception as exc:  # fail open: the script trains in its own precision, unrecorded
        print(f"mgprof: --precision disabled: {type(exc).__name__}: {exc}", file=sys.stderr)
    try:
        auto.autowrap = _install_autowrap(auto.precision)
    except Exception as exc:  # fail open: the script runs as it is, and the report says so
        print(f"mgprof: auto-wrap disabled: {type(exc).__name__}: {exc}", file=sys.stderr)
    try:
        from mgprof.collect.wrapping import loader_batch

        loader_batch.install()
    except Exception as exc:  # fail open: the trial's observed batch shows what happened
        print(f"mgprof: batch size override disabled: {type(exc).__name__}: {exc}", file=sys.stderr)
    signal.signal(signal.SIGTERM, _sigterm)
    budget = _env_int(MEMORY_BUDGET_ENV)
    if budget is not None:
        import torch  # noqa: F401  (mapped before the cap: the budget is for the training)

        limit_address_space(budget)
    sys.argv = [str(script), *args[1:]]
    sys.path.insert(0, str(script.resolve().parent))
    try:
        return _run_script(auto, script)
    finally:
        if not _in_forked_child():
            _say_steps(auto)


def _run_script(auto: AutoInstrument, script: Path) -> int:
    """The script as ``__main__``; this rank recorded and marked finished however it ends."""
    try:
        runpy.run_path(str(script), run_name="__main__")
        if _in_forked_child():  # the script's own child ended: nothing of mgprof's to finish
            return 0
    except StepLimitReached:
        auto.finish()
        if auto.limit_explicit:
            _finish_explicit(None)  # a paused session of the script's own: record it now
        _release_autowrap_group()
        _mark_finished()
        return 0
    except SystemExit as exc:
        if _in_forked_child():
            raise
        return _exited(auto, exc)
    except BaseException as exc:
        if _in_forked_child():
            raise
        _dump_flight_recorder()
        return _failed(auto, exc)
    auto.finish()
    _release_autowrap_group()
    _mark_finished()
    return 0


STEPS_LINE = "mgprof: rank {rank} made {steps} optimizer step(s)"
"""The line each rank ends with for the launcher (``mgprof.run.relay`` keeps it off the
terminal): the steps a rank made, told even when its record could not be saved (a full disk
takes the progress files and the record alike)."""


def _say_steps(auto: AutoInstrument) -> None:
    """``STEPS_LINE`` on the process's own stderr (not the rank's log: the launcher puts it
    there), only under mgprof's launcher (which sets the progress folder)."""
    try:
        from mgprof.collect.session.progress import PROGRESS_ENV

        stream = sys.__stderr__
        if not os.environ.get(PROGRESS_ENV) or stream is None:
            return
        rank = int(os.environ.get("RANK", "0") or 0)
        stream.write(STEPS_LINE.format(rank=rank, steps=auto.updates) + "\n")
        stream.flush()
    except Exception:  # fail open: the run's record says the same when it was saved
        pass


def _exited(auto: Any, exc: SystemExit) -> int:
    """The script (or a SIGTERM) raised SystemExit: record this rank, then exit with its code."""
    # a second SIGTERM while the record is written must not cut it off: torchrun still
    # SIGKILLs this rank after its grace period, so nothing can hang
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    code = exc.code
    failed = code not in (None, 0)
    auto.finish(error=f"exited with code {code}" if failed else None)
    _finish_explicit(f"exited with code {code}" if failed else None)
    if not failed:
        _release_autowrap_group()
        _mark_finished()
    raise exc


def _failed(auto: Any, exc: BaseException) -> int:
    """The script raised: record this rank with the exception, print it, exit 1 (130: ^C)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    auto.finish(error=text.strip().splitlines()[-1] + "\n" + text)
    _finish_explicit(text)
    traceback.print_exception(type(exc), exc, exc.__traceback__)
    _flush_rank_log()
    return 130 if isinstance(exc, KeyboardInterrupt) else 1


def _mark_finished() -> None:
    """``<run>/.finished/rank<N>``: this rank's script returned and its record is written, so a
    crash after this point (interpreter teardown) is not the training's (``run.finalize``)."""
    try:
        from mgprof.collect.session.progress import PROGRESS_ENV
        from mgprof.rundir import RUN_DIR_ENV, mark_finished

        run_dir = os.environ.get(RUN_DIR_ENV)
        if run_dir and os.environ.get(PROGRESS_ENV):  # only mgprof's launcher reads the marks
            mark_finished(Path(run_dir), int(os.environ.get("RANK", "0") or 0))
    except Exception:  # fail open: without the mark a teardown crash reads as a failure
        pass


def _release_autowrap_group() -> None:
    """Destroy the process group auto-wrap created (after the session has delivered its record
    over it): the script never destroys a group it did not make, and a gloo group still alive at
    interpreter exit can abort the rank ("terminate called without an active exception")."""
    try:
        from mgprof.collect.hooks import process_group_by_mgprof

        if not process_group_by_mgprof():
            return
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception as exc:  # fail open: the script's result stands
        print(f"mgprof: could not release the process group: {exc}", file=sys.stderr)


def _start_rank_log() -> None:
    """Tee this rank's output into ``<run>/logs/rank<N>.log`` (``mgprof.run.ranklog``)."""
    try:
        from mgprof.run import ranklog

        ranklog.start()
    except Exception as exc:  # fail open: the output still reaches the terminal
        print(f"mgprof: per-rank log disabled: {type(exc).__name__}: {exc}", file=sys.stderr)


def _flush_rank_log() -> None:
    """The traceback just printed into the rank's log now, before the process ends."""
    try:
        from mgprof.run import ranklog

        ranklog.flush()
    except Exception:  # fail open
        pass


def _install_precision(auto: AutoInstrument) -> Any:
    """``--precision``: seed the run (``mgprof compare``), then start the control
    (``mgprof.collect.wrapping.precision``); None when no precision was asked for."""
    from mgprof.collect.wrapping import precision

    precision.seed_from_env()
    control = precision.install()
    if control is not None:
        control.on_skipped_update = lambda opt: auto._on_optimizer_step(opt, (), {})
    return control


def _install_autowrap(precision: Any = None) -> Any:
    """Watch for the trained model (``mgprof.collect.wrapping.autowrap``): under dp/ddp/fsdp so
    a script that does not wrap it still synchronises its gradients, under ``--precision`` to run
    it in that precision, and under every strategy to count the samples each step trains."""
    from mgprof.collect.wrapping.autowrap import AutoWrap, enabled

    strategy = os.environ.get("MGPROF_STRATEGY") or "single"
    wrapping = strategy in ("ddp", "dp", "fsdp", "fsdp-noreshard")
    wrap = wrapping and enabled()
    from mgprof.collect import hooks

    if wrapping and not enabled():
        hooks.note_fact("auto_wrap", None)
    import torch

    if wrap and strategy != "dp" and torch.cuda.is_available():
        # a script that says torch.device("cuda") then lands on this rank's own device
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
    # found under every strategy: its calls give each step's trained batch (batchinfo)
    autowrap = AutoWrap(
        strategy, note=hooks.note_fact, precision=precision, wrap=wrap, observe=True
    )
    if precision is not None:
        precision._optimizers = autowrap.optimizers
    autowrap.install()
    return autowrap


def _nosync_ab() -> Any:
    """The gradient-sync A/B when ``mgprof compare`` asked for one (``MGPROF_NOSYNC_STEPS``)."""
    steps = _env_int(NOSYNC_STEPS_ENV)
    if not steps or steps < 1:
        return None
    from mgprof import rundir
    from mgprof.collect.wrapping.nosync import NoSyncAB

    run_dir = os.environ.get(rundir.RUN_DIR_ENV)
    return NoSyncAB(steps, Path(run_dir) if run_dir else None)


def _pause_explicit() -> None:
    """Stop a script's own session from recording more steps, without closing it yet.

    Closing it here would let ``@profile_step`` open a fresh session on its next call; paused,
    its later steps and regions are no-ops and it is closed (and delivered) when the script is
    stopped.
    """
    from mgprof.collect.session.session import active_session

    current = active_session()
    if current is not None and not current.auto:
        current._running = False


def _finish_explicit(error: str | None) -> None:
    """A script's own session still open when it fails: close it with the error noted."""
    from mgprof.collect.session.session import active_session

    current = active_session()
    if current is not None and not current.auto:
        current.stop(error=error)


if __name__ == "__main__":
    sys.exit(main())
