"""Launch a script under mgprof: torchrun for DDP, one process for DataParallel or single.

Launching many processes is torchrun's job (``torch.distributed.run``): mgprof builds its command
line, passes multi-node flags straight through, shows progress from the workers' counters, and
afterwards completes the run directory (status, exit code, ranks that never reported), through
``finalize`` (``finalize.py``, re-exported here).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mgprof import rundir
from mgprof.collect.envknobs import (
    MEMORY_ENV,
    NOISE_SCALE_ENV,
    PRECISION_ENV,
    PRECISIONS,
    SEED_ENV,
)
from mgprof.collect.session.progress import PROGRESS_ENV, read_progress
from mgprof.errors import UsageError
from mgprof.records import RunRecord
from mgprof.run import entry
from mgprof.run.failures import shell_code, torchrun_log_lines
from mgprof.run.process_tree import (
    ProcessTree,
    Stopped,
    child_subreaper,
    ignore_stop_signals,
    signal_group,
    stop_signals,
)
from mgprof.run.ranklog import LOGS_DIR
from mgprof.run.relay import (
    LaunchObserver,
    RankLogNotes,
    RankOfPid,
    Tail,
    current_observer,
)
from mgprof.run.stragglers import StragglerWatch

if TYPE_CHECKING:
    from mgprof.report.progress import LaunchFacts

_FINALIZE_NAMES = (
    "LOG_TAIL_BYTES",
    "_exception",
    "_failure",
    "_log_exception",
    "_rank_error",
    "_rank_said",
    "finalize",
)
"""The end of a launch lives in finalize.py; its names stay reachable here, where the tests and
``launch()`` look them up (``launch()`` calls ``finalize`` through this module's namespace).
They load on first use: finalize pulls in the analysis schema and numpy (most of a second), and
mgprof's first line comes before anything needs them."""


def __getattr__(name: str) -> Any:
    if name in _FINALIZE_NAMES:
        from mgprof.run import finalize as _finalize_module

        value = getattr(_finalize_module, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


STRATEGIES = ("single", "dp", "ddp", "fsdp", "fsdp-noreshard")
SHARDED = ("fsdp", "fsdp-noreshard")
"""Auto-wrap under FSDP2 (``fully_shard`` per repeated block and on the root); ``-noreshard``
keeps the gathered parameters between forward and backward (``reshard_after_forward=False``,
ZeRO-2-like)."""


def one_process_per_rank(strategy: str) -> bool:
    """DDP and FSDP start one process per device (torchrun); single and DataParallel one."""
    return strategy == "ddp" or strategy in SHARDED


STDERR_TAIL_LINES = 40
STDOUT_TAIL_LINES = 5
AUTO_WRAP_ENV = "MGPROF_AUTO_WRAP"
"""Mirrors ``mgprof.collect.wrapping.autowrap.AUTO_WRAP_ENV`` (the launcher does not import
torch)."""
COLLECTIVE_TIMEOUT_ENV = "MGPROF_COLLECTIVE_TIMEOUT_S"
"""Seconds a collective may wait for its peers before the process group raises (workers'
``init_process_group`` timeout), so a rank stuck in a collective ends the run instead of hanging."""
DEFAULT_COLLECTIVE_TIMEOUT_S = 600.0
MIN_COLLECTIVE_TIMEOUT_S = 1.0
MAX_STEPS = 10_000_000
"""--steps and --warmup at most: far beyond any profiling run, and a bound, so no count a user
types reaches a C integer or a schedule unchecked."""
MAX_TRACE_STEPS = 1000


def _at_most(flag: str, value: int | None, high: int, what: str) -> None:
    if value is not None and value > high:
        raise UsageError(f"{flag} must be at most {high:,} {what}, got {value}")


MAX_COLLECTIVE_TIMEOUT_S = 7 * 24 * 3600.0
LOOPBACK_IFNAME = "lo"
MAX_RANKS = 65536
"""More ranks than any job has: a larger --gpus is a typo, refused before anything starts."""
CPU_RANKS_PER_CORE = 4
"""Default cap on CPU ranks (no CUDA): this many per core; ``--max-cpu-ranks`` overrides."""


STOP_GRACE_ENV = "MGPROF_STOP_GRACE_S"


def _env_seconds(name: str, default: float) -> float:
    try:
        value = float(os.environ.get(name, default))
    except ValueError:
        return default
    return value if 0 <= value < float("inf") else default


RDZV_BACKENDS = ("c10d", "static", "etcd", "etcd-v2")
"""torchrun's own rendezvous backends (``torch.distributed.elastic.rendezvous.registry``)."""


def rendezvous_backends() -> tuple[str, ...]:
    """The backends torchrun accepts: its own, and those a package registers under the
    ``torchrun.handlers`` entry point group (read without importing torch)."""
    from importlib.metadata import entry_points

    try:
        extra = tuple(ep.name for ep in entry_points(group="torchrun.handlers"))
    except Exception:  # a broken package's metadata: torchrun's own still apply
        extra = ()
    return RDZV_BACKENDS + tuple(name for name in extra if name not in RDZV_BACKENDS)


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
    script_stdout_to_stderr: bool = False
    """Forward the script's stdout to mgprof's stderr (``--format json|md``: stdout is the
    report's alone)."""
    stop_grace_s: float = field(default_factory=lambda: _env_seconds(STOP_GRACE_ENV, 20.0))
    """After a stop signal, how long the workers get to write their records before SIGKILL
    (``MGPROF_STOP_GRACE_S``)."""
    max_cpu_ranks: int | None = None
    """CPU ranks allowed without CUDA; None: ``CPU_RANKS_PER_CORE`` x this machine's cores."""
    memory: bool = False
    """Track memory in every rank (``--memory``): profiler memory events, allocator history."""
    noise_scale: bool | None = None
    """The gradient norms behind the noise scale: True at every sync (``--noise-scale``), False
    never (``--no-noise-scale``), None on a sample of a DDP model's syncs (the default)."""
    precision: str | None = None
    """fp32, bf16 or fp16: the trained module's forward runs under that autocast setting and
    the loss is recorded (``--precision``); None: the script's own."""
    seed: int | None = None
    """Seed every rank with ``seed + rank`` before the script runs (``compare --precision``)."""

    def __post_init__(self) -> None:
        if self.precision is not None and self.precision not in PRECISIONS:
            raise UsageError(
                f"--precision: unknown precision {self.precision!r}; choose from "
                + ",".join(PRECISIONS)
            )
        if not self.script.exists():
            raise UsageError(f"script {self.script} not found; give the path to a Python file")
        if not self.script.is_file():
            raise UsageError(f"{self.script} is not a file; give the path to a Python script")
        if self.gpus < 1:
            raise UsageError(f"--gpus must be at least 1, got {self.gpus}")
        if self.gpus > MAX_RANKS or self.nnodes > MAX_RANKS:
            raise UsageError(
                f"--gpus {self.gpus} x --nnodes {self.nnodes} is beyond any real job "
                f"(at most {MAX_RANKS} each); give the GPUs per node"
            )
        if self.max_cpu_ranks is not None and self.max_cpu_ranks < 1:
            raise UsageError(f"--max-cpu-ranks must be at least 1, got {self.max_cpu_ranks}")
        if self.steps is not None and self.steps < 1:
            raise UsageError(f"--steps must be at least 1, got {self.steps}")
        if self.warmup < 0:
            raise UsageError(f"--warmup must be 0 or more, got {self.warmup}")
        if self.active < 0:
            raise UsageError(f"--trace-steps must be 0 (no trace) or more, got {self.active}")
        _at_most("--max-cpu-ranks", self.max_cpu_ranks, MAX_RANKS, "ranks")
        _at_most("--steps", self.steps, MAX_STEPS, "optimizer steps")
        _at_most("--warmup", self.warmup, MAX_STEPS, "optimizer steps")
        _at_most(
            "--trace-steps",
            self.active,
            MAX_TRACE_STEPS,
            "traced steps (a trace grows "
            "with every step; trace a few and let the rest run untraced)",
        )
        if self.nnodes < 1 or not 0 <= self.node_rank < self.nnodes:
            raise UsageError(
                f"--node-rank {self.node_rank} is outside 0..{self.nnodes - 1} (--nnodes)"
            )
        if self.nnodes > 1 and not self.rdzv_endpoint:
            raise UsageError(
                "--nnodes > 1 needs --rdzv-endpoint HOST:PORT (the same on every node)"
            )
        backends = rendezvous_backends()
        if self.rdzv_backend not in backends:
            raise UsageError(
                f"--rdzv-backend {self.rdzv_backend!r} is not one torchrun knows; choose from "
                f"{', '.join(backends)}"
            )
        if self.strategy is not None and self.strategy not in STRATEGIES:
            raise UsageError(f"--strategy must be one of {', '.join(STRATEGIES)}")
        timeout = self.collective_timeout_s
        low, high = MIN_COLLECTIVE_TIMEOUT_S, MAX_COLLECTIVE_TIMEOUT_S
        if timeout is not None and not low <= timeout <= high:
            # c10d holds the timeout in milliseconds in a C int, and below a second it rounds to
            # a timeout that fails every collective: out of range, auto-wrap failed on every rank
            # and the ranks trained unsynchronised under a "complete" run
            raise UsageError(
                f"--collective-timeout must be between {low:g} and {high:g} seconds (7 days), "
                f"got {timeout:g}"
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
    """Visible CUDA devices, without creating a CUDA context in the launcher.

    A torch built without CUDA (or ROCm) sees none: that is read from its ``version.py``
    without importing torch (1-2 s, often more on a busy machine), so a CPU run's first line
    comes at once. Otherwise torch counts them (through NVML, not a CUDA context)."""
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    if torch_build_has_gpu() is False:
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def devices_in_words(gpus: int) -> str:
    """``on 2 CPU ranks over gloo (no CUDA device visible)``, ``on 4 of 8 visible GPUs``: what
    ``--gpus`` will run on, for a study's first line (its rows may use fewer)."""
    count = cuda_device_count()
    if count == 0:
        ranks = f"{gpus} CPU ranks over gloo" if gpus > 1 else "the CPU"
        return f"on {ranks} (no CUDA device visible)"
    return f"on {gpus} of {count} visible GPUs"


_BUILD_FIELD = re.compile(r"^(cuda|hip)\s*(?::[^=]*)?=\s*(.+?)\s*$", re.MULTILINE)


def torch_build_has_gpu() -> bool | None:
    """Whether the installed torch was built with CUDA or ROCm, read from ``torch/version.py``
    without importing torch; None when that cannot be told (torch then decides)."""
    import importlib.util

    if "torch" in sys.modules:
        return None  # loaded already: asking it costs nothing
    try:
        spec = importlib.util.find_spec("torch")
        folders = list(spec.submodule_search_locations or []) if spec is not None else []
        text = (Path(folders[0]) / "version.py").read_text() if folders else ""
    except (ImportError, OSError, ValueError, UnicodeDecodeError):
        return None
    fields = dict(_BUILD_FIELD.findall(text))
    if set(fields) != {"cuda", "hip"}:
        return None
    return any(value != "None" for value in fields.values())


def plan(config: LaunchConfig, device_count: int | None = None) -> Plan:
    """Decide strategy and devices; raise UsageError before anything starts if it cannot work."""
    count = cuda_device_count() if device_count is None else device_count
    strategy = config.strategy or ("ddp" if config.gpus > 1 or config.nnodes > 1 else "single")
    if strategy == "single" and config.gpus > 1:
        raise UsageError("--strategy single runs one device; use --gpus 1 or --strategy ddp|dp")
    if strategy == "dp" and config.nnodes > 1:
        raise UsageError("DataParallel runs in one process on one node; use --strategy ddp")
    if strategy in SHARDED and config.gpus * config.nnodes < 2:
        raise UsageError(
            f"--strategy {strategy} shards the model over ranks and needs at least 2; "
            "use --gpus 2 or more (or --strategy single)"
        )
    ranks = one_process_per_rank(strategy)
    if count == 0:
        if strategy == "dp":
            raise UsageError(
                "DataParallel needs CUDA GPUs and none is visible; on CPU use --strategy ddp "
                "(gloo ranks) or --strategy single"
            )
        cores = os.cpu_count() or 1
        cap = config.max_cpu_ranks or CPU_RANKS_PER_CORE * cores
        if ranks and config.gpus > cap:
            raise UsageError(
                f"--gpus {config.gpus} would start {config.gpus} CPU ranks (no CUDA device "
                f"visible) on {cores} core(s); at most {cap} are allowed: lower --gpus or "
                "raise --max-cpu-ranks"
            )
        return Plan(
            strategy=strategy,
            cuda=False,
            nproc_per_node=config.gpus if ranks else 1,
            world_size=config.gpus * config.nnodes if ranks else 1,
            backend="gloo" if ranks else None,
            cpu_fallback_reason=(
                f"no CUDA device visible: {config.gpus} CPU rank(s) over gloo stand in for GPUs; "
                "NVML and DataParallel figures do not apply"
                if ranks
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
        nproc_per_node=config.gpus if ranks else 1,
        world_size=config.gpus * config.nnodes if ranks else 1,
        backend="nccl" if ranks else None,
        cpu_fallback_reason=None,
    )


def worker_command(config: LaunchConfig, p: Plan) -> list[str]:
    """The command line: torchrun for DDP (multi-node flags passed through), else python.

    Both start through ``mgprof.run.entry`` (``python -c``): the working directory is not put
    on ``sys.path`` (it is not under ``python script.py``), and each process gets a parent-death
    signal so that nothing outlives mgprof.
    """
    boot = [*entry.python_command("bootstrap"), str(config.script), *config.script_args]
    if not one_process_per_rank(p.strategy):
        return boot
    cmd = [*entry.python_command("torchrun"), f"--nproc-per-node={p.nproc_per_node}"]
    if config.nnodes == 1 and not config.rdzv_endpoint:
        # --local-addr: the workers reach the store torchrun hosts on loopback by this address,
        # not by the host name (Debian and Ubuntu map it to 127.0.1.1, where nothing listens)
        cmd += ["--standalone", "--local-addr=127.0.0.1"]
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
    return [*cmd, "--no-python", *boot]


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
    if config.memory:
        env[MEMORY_ENV] = "1"
    if config.noise_scale is not None:
        env[NOISE_SCALE_ENV] = "1" if config.noise_scale else "0"
    if config.precision is not None:
        env[PRECISION_ENV] = config.precision
    if config.seed is not None:
        env[SEED_ENV] = str(config.seed)
    if one_process_per_rank(p.strategy):
        flight_recorder_env(env, run_dir)
    if one_process_per_rank(p.strategy) and config.nnodes == 1 and not config.rdzv_endpoint:
        # one node: nothing outside this machine needs to reach the rendezvous or gloo's pairs
        env[entry.LOOPBACK_ENV] = "1"
        env.setdefault("GLOO_SOCKET_IFNAME", LOOPBACK_IFNAME)
    if not one_process_per_rank(p.strategy):
        # One process, but torchrun-style scripts call init_process_group() from the
        # environment: give them torchrun's variables for a world of one.
        for key, value in single_rank_env().items():
            env.setdefault(key, value)
    # OMP_NUM_THREADS is the user's, or torchrun's rule (1 per rank when nproc > 1 and unset)
    env.update(config.extra_env)
    return env


def flight_recorder_env(env: dict[str, str], run_dir: Path) -> None:
    """When the user turned torch's flight recorder on (``TORCH_FR_BUFFER_SIZE`` or
    ``TORCH_NCCL_TRACE_BUFFER_SIZE``), have it dumped where the run's logs are: each process
    group records its collectives (name, sequence number, sizes) in a ring buffer, which a rank
    mgprof stops, or whose script fails, writes to ``logs/rank<N>.fr.json`` (bootstrap), so the
    failure summary can say which collective each rank entered last and who never arrived; on
    NCCL the watchdog also dumps it on a timeout (torch's pickle, for ``python -m
    torch.distributed.flight_recorder.fr_trace``). Not turned on by mgprof: it records a stack
    with every collective, measured +11-17 % per small gloo all-reduce
    (``benchmarks/bench_flight_recorder.py``), which would move the step times it reports."""
    if "TORCH_FR_BUFFER_SIZE" not in env and "TORCH_NCCL_TRACE_BUFFER_SIZE" not in env:
        return
    env.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
    env.setdefault("TORCH_FR_DUMP_TEMP_FILE", str((run_dir / "logs" / "nccl_fr_rank").resolve()))


def single_rank_env() -> dict[str, str]:
    """torchrun's environment for one process: rank 0 of 1 on a free local port, with the run
    id torchrun sets (Lightning reads it to know a launcher made the world: without it, a script
    asking for ``devices=2`` waited for a second rank until the group timed out; with it, it
    fails at once saying the world size is 1)."""
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
        "TORCHELASTIC_RUN_ID": f"mgprof-single-{port}",
    }


def threads_per_rank(p: Plan, env: dict[str, str]) -> int:
    """CPU threads each rank's operators will use: OMP_NUM_THREADS if set, else torchrun's
    rule (1 when it starts several processes), else torch's default (the cores)."""
    try:
        return max(1, int(env["OMP_NUM_THREADS"]))
    except (KeyError, ValueError):
        pass
    if one_process_per_rank(p.strategy) and p.nproc_per_node > 1:
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
    stopped: Stopped | None = None
    """The signal that stopped mgprof during the launch: a study (compare, sweep) raises it
    rather than launching its next run."""


ProgressCallback = Callable[[dict[int, int]], None]


def launch(
    config: LaunchConfig,
    on_progress: ProgressCallback | None = None,
    observer: LaunchObserver | None = None,
) -> LaunchResult:
    """Run the script under mgprof and complete its run directory. Returns the script's code.

    ``observer`` (default: the one ``mgprof.run.relay.observing`` set, so a study's launches
    report to the command's display) hears the plan before anything starts, the steps done, and
    every line of the script's output; torch's own noise is kept off the terminal either way
    (``mgprof.run.relay``).
    """
    observer = observer if observer is not None else current_observer()
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
    say: Callable[[str], None] = observer.message if observer is not None else _stderr_line
    if observer is not None:
        observer.started(launch_facts(config, p, run_dir))
    try:
        crowded = oversubscription_warning(p, env)
        if crowded:
            say(crowded)
        ran = _run_workers(config, p, run_dir, cmd, env, on_progress, observer)
    finally:
        if observer is not None:
            observer.ended()
    if ran.leftovers:
        say(f"mgprof: ended {ran.leftovers} process(es) the script left running after it exited")
    if on_progress is not None:
        on_progress(read_progress(run_dir / ".progress"))
    stopped = ran.stopped
    how = stopped.label if stopped is not None else None
    finalize = sys.modules[__name__].finalize  # through the namespace (loaded on first use)
    # a stop's exit code is 128 + the signal mgprof got, whatever its child made of the stop
    # (torchrun says 143 after SIGHUP, a killed tree 0 or -9): run.json records what mgprof exits
    code = 128 + stopped.signum if stopped is not None else ran.proc.returncode
    run = finalize(
        run_dir,
        initial,
        code,
        ran.err_tail.lines,
        how,
        [*ran.err_tail.torchrun, *torchrun_log_lines(run_dir)],
        straggler=ran.stragglers.note() if ran.stragglers is not None else None,
        lost=ran.err_tail.lost,
        steps_seen=ran.steps_seen,
    )
    exit_code = run.exit_code if run.exit_code is not None else shell_code(code)
    return LaunchResult(run_dir=run_dir, run=run, exit_code=exit_code, plan=p, stopped=stopped)


@dataclass
class Ran:
    """What ``_run_workers`` saw of the workers, for ``finalize``."""

    proc: subprocess.Popen[bytes]
    stopped: Stopped | None
    leftovers: int
    """Processes the script left running after it exited, ended by mgprof."""
    err_tail: Tail
    stragglers: StragglerWatch | None
    """The watch that stops a rank left running after another ended (torchrun runs only)."""
    steps_seen: dict[int, int]
    """The most steps each rank reported (its progress file, its closing line): the steps a run
    made even when its records were lost (a full disk)."""


def _run_workers(
    config: LaunchConfig,
    p: Plan,
    run_dir: Path,
    cmd: list[str],
    env: dict[str, str],
    on_progress: ProgressCallback | None,
    observer: LaunchObserver | None,
) -> Ran:
    """Start the workers, relay their output, report progress, and wait for them (or stop
    them on a signal)."""
    notes = RankLogNotes(run_dir)
    rank_of = RankOfPid(one_process=not one_process_per_rank(p.strategy))
    with stop_signals(), child_subreaper() as adopting:
        proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
        )
        tree = ProcessTree(proc.pid, adopting=adopting)
        script_out = sys.stderr if config.script_stdout_to_stderr else sys.stdout
        out_tail = Tail(
            proc.stdout,  # type: ignore[arg-type]
            script_out.buffer,
            STDOUT_TAIL_LINES,
            notes=notes,
            rank_of=rank_of,
            observer=observer,
        )
        err_tail = Tail(
            proc.stderr,  # type: ignore[arg-type]
            sys.stderr.buffer,
            STDERR_TAIL_LINES,
            notes=notes,
            rank_of=rank_of,
            observer=observer,
        )
        stragglers = None
        if one_process_per_rank(p.strategy):
            stragglers = StragglerWatch(
                proc.pid,
                run_dir,
                straggler_bound_s(config),
                rank_of,
                kill_after_s=config.stop_grace_s,
            )
        stopped: Stopped | None = None
        steps_seen: dict[int, int] = {}
        try:
            while proc.poll() is None:
                counts = read_progress(run_dir / ".progress")
                for rank, done in counts.items():
                    steps_seen[rank] = max(done, steps_seen.get(rank, 0))
                if on_progress is not None:
                    on_progress(counts)
                if observer is not None:
                    observer.progress(counts, *_ranks_begun_and_ended(run_dir))
                notes.flush()
                tree.scan(force=False)
                rank_of.learn(tree.seen)
                if stragglers is not None:
                    stragglers.poll()
                time.sleep(0.2)
        except Stopped as exc:
            stopped = exc
            _stop_tree(proc, tree, exc.forward, config.stop_grace_s)
        proc.wait()
        leftovers = tree.end_leftovers()
        out_tail.join()
        err_tail.join()
        notes.flush()
    counts = read_progress(run_dir / ".progress")
    for rank, done in counts.items():
        steps_seen[rank] = max(done, steps_seen.get(rank, 0))
    if observer is not None:
        observer.progress(counts, *_ranks_begun_and_ended(run_dir))
    for rank, done in err_tail.steps.items():
        steps_seen[rank] = max(done, steps_seen.get(rank, 0))
    return Ran(proc, stopped, leftovers, err_tail, stragglers, steps_seen)


def straggler_bound_s(config: LaunchConfig) -> float:
    """How long the other ranks may run on once one rank has ended: the patience a collective
    gets (``--collective-timeout``), since a rank with work left that involves its peers would
    have failed in a collective by then (``mgprof.run.stragglers``)."""
    timeout = config.collective_timeout_s
    return timeout if timeout is not None else DEFAULT_COLLECTIVE_TIMEOUT_S


def _ranks_begun_and_ended(run_dir: Path) -> tuple[int, int]:
    """Local ranks whose script has begun (their log exists) and ended (their record is
    written: ``rundir.mark_finished``), for the progress display."""
    counts = []
    where = ((run_dir / LOGS_DIR, "rank*.log"), (run_dir / rundir.FINISHED, "rank*"))
    for folder, pattern in where:
        try:
            counts.append(sum(1 for _ in folder.glob(pattern)))
        except OSError:
            counts.append(0)
    return counts[0], counts[1]


def _stderr_line(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def launch_facts(config: LaunchConfig, p: Plan, run_dir: Path) -> LaunchFacts:
    """What the launch runs, for the display's first line and status line."""
    from mgprof.report.progress import LaunchFacts

    label = config.run_name or config.script.name
    return LaunchFacts(
        script=str(config.script),
        strategy=p.strategy,
        world_size=p.world_size,
        nproc_per_node=p.nproc_per_node,
        nnodes=config.nnodes,
        node_rank=config.node_rank,
        cuda=p.cuda,
        backend=p.backend,
        cpu_fallback_reason=p.cpu_fallback_reason,
        run_dir=str(run_dir),
        warmup=config.warmup,
        steps=config.steps,
        active=config.active,
        label=label,
    )


def _stop_tree(proc: subprocess.Popen[bytes], tree: ProcessTree, sig: int, grace_s: float) -> None:
    """Pass the stop to the workers, then insist: nothing mgprof started outlives it.

    ``sig`` goes to the child's process group (torchrun forwards it to each worker and waits for
    them to write their records); after ``grace_s``, or at once on a second signal, every
    process of the tree still alive is SIGKILLed.
    """
    tree.scan()
    signal_group(proc.pid, sig)
    if proc.pid not in {p.pid for p in tree.alive()}:
        tree.signal_all(sig)  # the child is gone already: its orphans get the signal directly
    deadline = time.monotonic() + grace_s
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            tree.scan(force=False)
            time.sleep(0.1)
    except Stopped:
        pass  # a second signal: stop waiting
    ignore_stop_signals()
    if proc.poll() is None:
        tree.kill_all()
    proc.wait()
