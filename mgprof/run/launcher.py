"""Launch a script under mgprof: torchrun for DDP, one process for DataParallel or single.

Launching many processes is torchrun's job (``torch.distributed.run``): mgprof builds its command
line, passes multi-node flags straight through, shows progress from the workers' counters, and
afterwards completes the run directory (status, exit code, ranks that never reported).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import msgspec

from mgprof import rundir
from mgprof.collect.progress import PROGRESS_ENV, read_progress
from mgprof.errors import UsageError
from mgprof.records import RankExit, RunRecord, read_run
from mgprof.report.failure_summary import (
    NO_STEP,
    TRACEBACK_HEAD,
    exception_text,
    first_failure,
)
from mgprof.run.failures import (
    collective_of,
    describe_exit,
    describe_exits,
    is_torchrun_line,
    last_meaningful,
    parse_torchrun_failures,
    signal_name,
)
from mgprof.run.ranklog import LOGS_DIR

STRATEGIES = ("single", "dp", "ddp")
STDERR_TAIL_LINES = 40
AUTO_WRAP_ENV = "MGPROF_AUTO_WRAP"
"""Mirrors ``mgprof.collect.autowrap.AUTO_WRAP_ENV`` (the launcher does not import torch)."""
COLLECTIVE_TIMEOUT_ENV = "MGPROF_COLLECTIVE_TIMEOUT_S"
"""Seconds a collective may wait for its peers before the process group raises (workers'
``init_process_group`` timeout), so a rank stuck in a collective ends the run instead of hanging."""
DEFAULT_COLLECTIVE_TIMEOUT_S = 600.0
TORCHRUN_LINES_KEPT = 4000


@dataclass(kw_only=True)
class LaunchConfig:
    """What to run and how; validated in ``__post_init__`` so bad flags fail before any run."""

    script: Path
    script_args: list[str] = field(default_factory=list)
    gpus: int = 1
    strategy: str | None = None
    steps: int | None = None
    warmup: int = 2
    active: int = 3
    out: Path = Path(rundir.DEFAULT_ROOT)
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    rdzv_backend: str = "c10d"
    extra_env: dict[str, str] = field(default_factory=dict)
    run_name: str | None = None
    collective_timeout_s: float | None = DEFAULT_COLLECTIVE_TIMEOUT_S
    auto_wrap: bool = True
    """Under dp/ddp, wrap the trained model when the script does not (``--no-auto-wrap``)."""

    def __post_init__(self) -> None:
        if not self.script.exists():
            raise UsageError(f"script {self.script} not found; give the path to a Python file")
        if not self.script.is_file():
            raise UsageError(f"{self.script} is not a file; give the path to a Python script")
        if self.gpus < 1:
            raise UsageError(f"--gpus must be at least 1, got {self.gpus}")
        if self.steps is not None and self.steps < 1:
            raise UsageError(f"--steps must be at least 1, got {self.steps}")
        if self.warmup < 0:
            raise UsageError(f"--warmup must be 0 or more, got {self.warmup}")
        if self.active < 1:
            raise UsageError(f"--trace-steps must be at least 1, got {self.active}")
        if self.nnodes < 1 or not 0 <= self.node_rank < self.nnodes:
            raise UsageError(
                f"--node-rank {self.node_rank} is outside 0..{self.nnodes - 1} (--nnodes)"
            )
        if self.nnodes > 1 and not self.rdzv_endpoint:
            raise UsageError(
                "--nnodes > 1 needs --rdzv-endpoint HOST:PORT (the same on every node)"
            )
        if self.strategy is not None and self.strategy not in STRATEGIES:
            raise UsageError(f"--strategy must be one of {', '.join(STRATEGIES)}")
        timeout = self.collective_timeout_s
        if timeout is not None and not 0 < timeout < float("inf"):
            raise UsageError(
                f"--collective-timeout must be a number of seconds above 0, got {timeout}"
            )


@dataclass
class Plan:
    """The resolved launch: strategy, device kind, processes per node, and why."""

    strategy: str
    cuda: bool
    nproc_per_node: int
    world_size: int
    backend: str | None
    cpu_fallback_reason: str | None


def cuda_device_count() -> int:
    """Visible CUDA devices, without creating a CUDA context in the launcher."""
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def plan(config: LaunchConfig, device_count: int | None = None) -> Plan:
    """Decide strategy and devices; raise UsageError before anything starts if it cannot work."""
    count = cuda_device_count() if device_count is None else device_count
    strategy = config.strategy or ("ddp" if config.gpus > 1 or config.nnodes > 1 else "single")
    if strategy == "single" and config.gpus > 1:
        raise UsageError("--strategy single runs one device; use --gpus 1 or --strategy ddp|dp")
    if strategy == "dp" and config.nnodes > 1:
        raise UsageError("DataParallel runs in one process on one node; use --strategy ddp")
    if count == 0:
        if strategy == "dp":
            raise UsageError(
                "DataParallel needs CUDA GPUs and none is visible; on CPU use --strategy ddp "
                "(gloo ranks) or --strategy single"
            )
        return Plan(
            strategy=strategy,
            cuda=False,
            nproc_per_node=config.gpus if strategy == "ddp" else 1,
            world_size=config.gpus * config.nnodes if strategy == "ddp" else 1,
            backend="gloo" if strategy == "ddp" else None,
            cpu_fallback_reason=(
                f"no CUDA device visible: {config.gpus} CPU rank(s) over gloo stand in for GPUs; "
                "NVML and DataParallel figures do not apply"
                if strategy == "ddp"
                else "no CUDA device visible: running on the CPU"
            ),
        )
    if count < config.gpus:
        raise UsageError(
            f"--gpus {config.gpus} asked for, but only {count} CUDA device(s) are visible "
            "(check CUDA_VISIBLE_DEVICES or lower --gpus)"
        )
    return Plan(
        strategy=strategy,
        cuda=True,
        nproc_per_node=config.gpus if strategy == "ddp" else 1,
        world_size=config.gpus * config.nnodes if strategy == "ddp" else 1,
        backend="nccl" if strategy == "ddp" else None,
        cpu_fallback_reason=None,
    )


def worker_command(config: LaunchConfig, p: Plan) -> list[str]:
    """The command line: torchrun for DDP (multi-node flags passed through), else python."""
    boot = ["-m", "mgprof.run.bootstrap", str(config.script), *config.script_args]
    if p.strategy != "ddp":
        return [sys.executable, *boot]
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={p.nproc_per_node}"]
    if config.nnodes == 1 and not config.rdzv_endpoint:
        cmd.append("--standalone")
    else:
        cmd += [
            f"--nnodes={config.nnodes}",
            f"--node-rank={config.node_rank}",
            f"--rdzv-endpoint={config.rdzv_endpoint}",
            f"--rdzv-backend={config.rdzv_backend}",
        ]
        if config.rdzv_backend == "static":
            host, _, port = (config.rdzv_endpoint or "").rpartition(":")
            cmd += [f"--master-addr={host}", f"--master-port={port}"]
    return [*cmd, *boot]


def worker_env(config: LaunchConfig, p: Plan, run_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            rundir.RUN_DIR_ENV: str(run_dir.resolve()),
            PROGRESS_ENV: str((run_dir / ".progress").resolve()),
            "MGPROF_STRATEGY": p.strategy,
            "MGPROF_GPUS": str(config.gpus),
            "MGPROF_WARMUP": str(config.warmup),
            "MGPROF_ACTIVE": str(config.active),
            "MGPROF_NNODES": str(config.nnodes),
            "PYTHONUNBUFFERED": "1",
        }
    )
    if config.steps is not None:
        env["MGPROF_STEPS"] = str(config.steps)
    if config.collective_timeout_s is not None:
        env[COLLECTIVE_TIMEOUT_ENV] = f"{config.collective_timeout_s:g}"
    if not config.auto_wrap:
        env[AUTO_WRAP_ENV] = "0"
    if p.strategy != "ddp":
        # One process, but torchrun-style scripts call init_process_group() from the
        # environment: give them torchrun's variables for a world of one.
        for key, value in single_rank_env().items():
            env.setdefault(key, value)
    # OMP_NUM_THREADS is the user's, or torchrun's rule (1 per rank when nproc > 1 and unset)
    env.update(config.extra_env)
    return env


def single_rank_env() -> dict[str, str]:
    """torchrun's environment for one process: rank 0 of 1 on a free local port."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1",
        "GROUP_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }


def threads_per_rank(p: Plan, env: dict[str, str]) -> int:
    """CPU threads each rank's operators will use: OMP_NUM_THREADS if set, else torchrun's
    rule (1 when it starts several processes), else torch's default (the cores)."""
    try:
        return max(1, int(env["OMP_NUM_THREADS"]))
    except (KeyError, ValueError):
        pass
    if p.strategy == "ddp" and p.nproc_per_node > 1:
        return 1
    return os.cpu_count() or 1


def oversubscription_warning(p: Plan, env: dict[str, str]) -> str | None:
    """A line when ranks x threads exceed this machine's cores (CPU runs only: the step times
    would measure contention, not the training)."""
    if p.cuda:
        return None
    threads = threads_per_rank(p, env)
    cores = os.cpu_count() or 1
    if p.nproc_per_node * threads <= cores:
        return None
    return (
        f"mgprof: warning: {p.nproc_per_node} rank(s) x {threads} CPU thread(s) exceed the "
        f"{cores} core(s) here; step times include contention (set OMP_NUM_THREADS lower)"
    )


@dataclass
class LaunchResult:
    run_dir: Path
    run: RunRecord
    exit_code: int
    plan: Plan


ProgressCallback = Callable[[dict[int, int]], None]


class _Tail:
    """Forward a child's stream to ours, keeping its last lines for the run record."""

    def __init__(self, src: IO[bytes], dst: IO[bytes], keep: int) -> None:
        self.lines: list[str] = []
        self.torchrun: list[str] = []
        """torchrun's failure-summary lines, kept however long the rest of the output is."""
        self._keep = keep
        self._thread = threading.Thread(target=self._pump, args=(src, dst), daemon=True)
        self._thread.start()

    def _pump(self, src: IO[bytes], dst: IO[bytes]) -> None:
        for raw in iter(src.readline, b""):
            try:
                dst.write(raw)
                dst.flush()
            except (OSError, ValueError):
                pass
            line = raw.decode("utf-8", "replace").rstrip()
            if line and not line.startswith("USDT:"):
                self.lines.append(line)
                del self.lines[: -self._keep]
                if is_torchrun_line(line) and len(self.torchrun) < TORCHRUN_LINES_KEPT:
                    self.torchrun.append(line)

    def join(self) -> None:
        self._thread.join(timeout=5)


def launch(config: LaunchConfig, on_progress: ProgressCallback | None = None) -> LaunchResult:
    """Run the script under mgprof and complete its run directory. Returns the script's code."""
    p = plan(config)
    run_dir = rundir.new_run_dir(config.out, config.run_name or config.script.stem)
    initial = RunRecord(
        run_id=run_dir.name,
        created_utc=rundir.utc_iso(),
        script=str(config.script),
        script_args=list(config.script_args),
        strategy=p.strategy,
        world_size=p.world_size,
        nnodes=config.nnodes,
        backend=p.backend,
        cpu_fallback=not p.cuda,
        cpu_fallback_reason=p.cpu_fallback_reason,
        status="running",
    )
    try:
        rundir.write_run(run_dir, initial)
    except OSError as exc:
        raise UsageError(
            f"cannot write {run_dir / rundir.RUN_JSON}: {exc.strerror}; pass a writable --out"
        ) from None
    cmd = worker_command(config, p)
    env = worker_env(config, p, run_dir)
    crowded = oversubscription_warning(p, env)
    if crowded:
        print(crowded, file=sys.stderr)
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    out_tail = _Tail(proc.stdout, sys.stdout.buffer, 5)  # type: ignore[arg-type]
    err_tail = _Tail(proc.stderr, sys.stderr.buffer, STDERR_TAIL_LINES)  # type: ignore[arg-type]
    interrupted = False
    try:
        while proc.poll() is None:
            if on_progress is not None:
                on_progress(read_progress(run_dir / ".progress"))
            time.sleep(0.2)
    except KeyboardInterrupt:
        interrupted = True
        _stop_group(proc, signal.SIGINT)
    out_tail.join()
    err_tail.join()
    code = proc.wait()
    if on_progress is not None:
        on_progress(read_progress(run_dir / ".progress"))
    run = finalize(run_dir, initial, code, err_tail.lines, interrupted, err_tail.torchrun)
    return LaunchResult(
        run_dir=run_dir, run=run, exit_code=130 if interrupted else shell_code(code), plan=p
    )


def shell_code(code: int) -> int:
    """A ``Popen`` return code as a shell reports it: killed by signal N (``-N``) is 128+N."""
    return 128 - code if code < 0 else code


def _stop_group(proc: subprocess.Popen[bytes], sig: int, grace_s: float = 20.0) -> None:
    """Pass Ctrl-C to the workers, then insist: the launcher never hangs on a stuck rank.

    A second Ctrl-C while the workers finish their records ends the wait at once (SIGKILL).
    """
    try:
        os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=grace_s)
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    except ProcessLookupError:
        pass


def finalize(
    run_dir: Path,
    initial: RunRecord,
    code: int,
    stderr_tail: list[str],
    interrupted: bool,
    torchrun_lines: list[str] | None = None,
) -> RunRecord:
    """Merge what the ranks left (gathered run.json or per-rank partials) and set the status.

    In a multi-node job the ranks send their records to rank 0, which may live on any node
    (c10d rendezvous assigns ranks by arrival): a node without rank 0 expects an empty run here,
    and only its exit code decides.
    """
    try:
        run = read_run(run_dir)
    except UsageError:
        run = initial
    run = msgspec.structs.replace(run, world_size=initial.world_size)
    run = rundir.merge_ranks(run, rundir.read_partials(run_dir))
    satellite = initial.nnodes > 1 and not any(r.rank == 0 for r in run.ranks)
    rank_errors = [_rank_error(r.rank, r.error) for r in run.ranks if r.error]
    exits = parse_torchrun_failures(torchrun_lines or [], single_node=initial.nnodes == 1)
    # exit code 0 and no rank reported: the script never reached an optimizer step (it resumed
    # from a finished checkpoint, had no data...); no failure, and no "missing ranks" either
    nothing = code == 0 and not interrupted and not satellite and not run.ranks
    error = None
    if interrupted:
        error = "interrupted (Ctrl-C)"
    elif code != 0:
        errors = {r.rank: r.error for r in run.ranks if r.error}
        error = _failure(code, exits, stderr_tail, errors, run_dir, initial.world_size)
    elif rank_errors:
        error = rank_errors[0]
    elif nothing:
        error = f"{NO_STEP} (exit code 0)"
        run = msgspec.structs.replace(run, missing_ranks=[])
    if run.missing_ranks and not satellite and not interrupted:
        missing = f"no record from rank(s) {', '.join(map(str, run.missing_ranks))}"
        error = missing if error is None else f"{error}; {missing}"
    status = "complete" if error is None else "incomplete"
    run = msgspec.structs.replace(
        run,
        status=status,
        error=error,
        exit_code=code,
        strategy=initial.strategy,
        world_size=initial.world_size,
        nnodes=initial.nnodes,
        backend=run.backend or initial.backend,
        cpu_fallback=initial.cpu_fallback,
        cpu_fallback_reason=initial.cpu_fallback_reason,
        script=initial.script,
        script_args=initial.script_args,
        rank_exits=exits,
    )
    try:
        rundir.write_run(run_dir, run)
    except OSError as exc:  # the folder went away or read-only mid-run: the script's result stands
        print(
            f"mgprof: error: cannot write {run_dir / rundir.RUN_JSON}: {exc.strerror}; "
            "the run's record is lost, the script's own outputs and exit code are not",
            file=sys.stderr,
        )
    return run


def _rank_error(rank: int, error: str) -> str:
    """``rank 0: RuntimeError: ... Timed out ... (in all_reduce)``: the exception (or the first
    line), and the collective the traceback failed in, since gloo's and NCCL's messages rarely
    name it."""
    return f"rank {rank}: {_exception(error)}"


def _exception(error: str) -> str:
    """``ValueError: bad batch (in all_reduce)`` from a rank's error text (its first line when
    it holds no traceback), with the collective it failed in, if any."""
    text = (exception_text(error) or error.strip().splitlines()[0]) if error.strip() else "?"
    collective = collective_of(error)
    return f"{text} (in {collective})" if collective else text


LOG_TAIL_BYTES = 64 * 1024
"""How much of the end of a rank's log is searched for its traceback."""


def _log_exception(log: Path) -> str | None:
    """The exception a rank's log ends with (a rank that failed before recording anything)."""
    try:
        with open(log, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - LOG_TAIL_BYTES))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return None
    start = text.rfind(TRACEBACK_HEAD)
    if start < 0 or exception_text(text[start:]) is None:
        return None
    return _exception(text[start:])  # the last traceback only: its collective, its exception


def _rank_said(
    rank: int, exit_code: int, errors: dict[int, str], run_dir: Path
) -> tuple[str | None, Path | None]:
    """What one rank died of (from its record, else from its log) and its log, if there."""
    log = run_dir / LOGS_DIR / f"rank{rank}.log"
    try:
        log_there = log.is_file()
    except OSError:
        log_there = False
    said = errors.get(rank)
    if said and exception_text(said):
        return _exception(said), log if log_there else None
    # no traceback recorded: the log's last one, unless a signal ended the rank (a traceback in
    # its log would then be an older, handled one)
    if log_there and 0 < exit_code < 128:
        found = _log_exception(log)
        if found:
            return found, log
    return None, log if log_there else None


def _failure(
    code: int,
    exits: list[RankExit],
    stderr_tail: list[str],
    errors: dict[int, str],
    run_dir: Path,
    world_size: int = 1,
) -> str:
    """One line on a failed launch: which rank failed first, of what, and where its log is::

        script exited with code 1: rank 1 failed first: ValueError: bad batch shape
        (log: runs/.../logs/rank1.log); then rank 0 exited with code 143 (SIGTERM)

    The first rank is torchrun's root cause unless that rank died of a peer's failure
    (``first_failure``); its exception comes from its record, else from its log.
    """
    if code < 0:
        head = f"script was killed by {signal_name(code) or f'signal {-code}'} (exit code {code})"
    else:
        head = f"script exited with code {code}"
    rank_lines = [f"rank {r}: {_exception(e)}" for r, e in sorted(errors.items())]
    timeouts = [e for e in rank_lines if "timed out" in e.lower() or "timeout" in e.lower()]
    hint = " (a rank stopped answering; raise --collective-timeout if it was only slow)"
    first = first_failure(exits, errors) if exits else None
    if first is not None and first.rank is not None:
        said, log = _rank_said(first.rank, first.exit_code, errors, run_dir)
        detail = f"rank {first.rank} failed first: {said}" if said else describe_exit(first)
        if log is not None:
            detail += f" (log: {log})"
        rest = [describe_exit(e) for e in exits if e is not first]
        if rest:
            detail += f"; then {', '.join(rest)}"
        if not said:
            others = timeouts or [e for e in rank_lines if "(in " in e]
            if others:
                detail += f"; {others[0]}"
        return f"{head}: {detail}{hint if timeouts else ''}"
    if exits:  # multi-node: torchrun named local ranks only
        detail = describe_exits(exits)
        said_list = timeouts or [e for e in rank_lines if "(in " in e]
        if said_list:
            detail += f"; {said_list[0]}"
        return f"{head}: {detail}{hint if timeouts else ''}"
    if world_size == 1:  # one process: rank 0 is the script
        said, log = _rank_said(0, code, errors, run_dir)
        if said:
            return f"{head}: {said}" + (f" (log: {log})" if log is not None else "")
    last = last_meaningful(stderr_tail)
    return f"{head}: {last}" if last else head
