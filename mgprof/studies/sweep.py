"""``mgprof sweep``: run a script at several batch sizes, one launch per trial, and find the
throughput sweet spot under a memory margin.

Each trial is a separate ``launch()`` (torchrun for DDP), so an out-of-memory trial cannot leave
fragmented or leaked memory to the next one. The script reads its batch size with
``mgprof.batch_size(default)``; with ``--global-batch`` it also reads
``mgprof.accumulation_steps()``. The search itself is ``mgprof.analyze.sweep.result.SweepPlanner``.

Memory per trial: on CUDA the caching allocator's peak reserved memory against the device total
(what a CUDA OOM is about). On CPU with a memory budget the worker's address space is capped at
"what it maps after importing torch + budget" (``mgprof.run.bootstrap``), so the budget is the
capacity and the memory used is the peak RSS growth over that moment: peak RSS minus the RSS of
a probe process that does what the bootstrap does before the cap (import torch, install hooks).

The result is a ``NoiseSweepResult``: with ``MGPROF_NOISE_SCALE=1`` every trial records the
gradient norms, and ``noise_scale`` pools them into B_simple beside the hardware knee, with the
batch that reaches a given loss soonest (``mgprof.analyze.run.noise_scale.sweep_noise_scale``).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from mgprof import rundir
from mgprof.analyze.run.noise_scale import (
    NoiseSweepResult,
    StepNoise,
    step_estimates,
    sweep_noise_scale,
)
from mgprof.analyze.step_samples import run_steps
from mgprof.analyze.sweep.planner import MAX_BATCH
from mgprof.analyze.sweep.result import (
    BATCH_NOT_APPLIED,
    DEFAULT_MARGIN,
    DEFAULT_RESOLUTION,
    RankTrial,
    SweepPlanner,
    SweepResult,
    Trial,
    batch_evidence,
    check_sweep_args,
    is_oom_error,
    summarize,
)
from mgprof.atomic import write_bytes_atomic
from mgprof.errors import UsageError
from mgprof.records import RunRecord
from mgprof.report.html.study.sweep_page import write_sweep_html
from mgprof.run.bootstrap import COMPARE_ENV

SWEEP_JSON = "sweep.json"
BATCH_SIZE_ENV = "MGPROF_BATCH_SIZE"
ACCUM_STEPS_ENV = "MGPROF_ACCUM_STEPS"
MEMORY_BUDGET_ENV = "MGPROF_MEMORY_BUDGET_MIB"

CPU_MEMORY_DEFINITION = (
    "peak RSS of the rank minus the RSS of a process that has imported torch and installed "
    "mgprof's hooks (the moment the address-space cap is set): memory the training added"
)
CUDA_MEMORY_DEFINITION = "peak memory reserved by PyTorch's CUDA caching allocator on the rank"

TrialCallback = Callable[[Trial], None]

MAX_BUDGET_MIB = 1 << 30
"""--memory-budget-mib at most: 1 PiB, the bound every size mgprof reads has."""


@dataclass(kw_only=True)
class SweepConfig:
    """A sweep's settings; validated in ``__post_init__`` so bad flags fail before any trial."""

    script: Path
    script_args: list[str] = field(default_factory=list)
    gpus: int = 1
    strategy: str | None = None
    batch_sizes: list[int] | None = None
    lo: int = 8
    hi: int = 4096
    steps: int = 5
    warmup: int = 2
    active: int = 3
    margin: float = DEFAULT_MARGIN
    resolution: float = DEFAULT_RESOLUTION
    memory_budget_mib: int | None = None
    global_batch: int | None = None
    until_oom: bool = False
    out: Path = Path(rundir.DEFAULT_ROOT)
    quiet: bool = True
    auto_wrap: bool = True
    memory: bool = False
    """Track memory in every trial (``--memory``)."""
    noise_scale: bool | None = None
    """Record the gradient norms behind the noise scale in every trial (``--noise-scale``)."""

    def __post_init__(self) -> None:
        try:
            check_sweep_args(self.lo, self.hi, self.batch_sizes, self.margin, self.resolution)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        budget = self.memory_budget_mib
        if budget is not None and not 1 <= budget <= MAX_BUDGET_MIB:
            raise UsageError(
                f"--memory-budget-mib must be from 1 to {MAX_BUDGET_MIB:,} (1 PiB), got {budget}"
            )
        if self.global_batch is not None:
            from mgprof.run.launcher import MAX_RANKS  # the launcher loads on use

            if not 1 <= self.global_batch <= MAX_BATCH * MAX_RANKS:
                raise UsageError(
                    f"--global-batch must be from 1 to {MAX_BATCH * MAX_RANKS:,}, "
                    f"got {self.global_batch}"
                )
            smallest = min(self.batch_sizes) if self.batch_sizes else self.lo
            if smallest * self.gpus > self.global_batch:
                raise UsageError(
                    f"--global-batch {self.global_batch} is smaller than one micro-batch of "
                    f"{smallest} on {self.gpus} device(s); raise it or lower the batch sizes"
                )


def sweep(
    script: str | os.PathLike[str],
    gpus: int = 1,
    *,
    on_trial: TrialCallback | None = None,
    **options: Any,
) -> SweepResult:
    """Sweep ``script``'s batch size over ``gpus`` devices; see ``SweepConfig`` for options.

    Writes ``<out>/<UTC>-sweep-<stem>/sweep.json`` (after every trial, so an interrupted sweep
    keeps what it measured) beside each trial's run directory, and returns the result.
    """
    config = SweepConfig(script=Path(script), gpus=gpus, **options)
    return run_sweep(config, on_trial=on_trial)


def run_sweep(config: SweepConfig, on_trial: TrialCallback | None = None) -> SweepResult:
    """Run the trials; the result is a ``NoiseSweepResult`` (the noise scale beside the knee)."""
    from mgprof.run.launcher import LaunchConfig, plan

    base = LaunchConfig(
        script=config.script,
        script_args=list(config.script_args),
        gpus=config.gpus,
        strategy=config.strategy,
        steps=config.steps,
        warmup=config.warmup,
        active=config.active,
        out=config.out,
        auto_wrap=config.auto_wrap,
        memory=config.memory,
        noise_scale=config.noise_scale,
    )
    p = plan(base)
    if p.cuda and config.memory_budget_mib is not None:
        raise UsageError(
            "--memory-budget-mib caps a CPU process's address space and would break CUDA; "
            "on GPUs the device's own memory is the capacity"
        )
    hi = config.hi
    if config.global_batch is not None:
        hi = min(hi, config.global_batch // p.world_size)
    planner = SweepPlanner(
        config.lo,
        max(config.lo, hi),
        batch_sizes=config.batch_sizes,
        capacity_mib=float(config.memory_budget_mib) if config.memory_budget_mib else None,
        margin=config.margin,
        resolution=config.resolution,
        stop_on_plateau=not config.until_oom,
    )
    sweep_dir = rundir.new_run_dir(config.out, f"sweep-{config.script.stem}")
    baseline_mib = None
    if not p.cuda and config.memory_budget_mib is not None:
        baseline_mib = probe_baseline_rss_mib()
    capacity_source = (
        f"--memory-budget-mib {config.memory_budget_mib} (address-space cap per rank)"
        if config.memory_budget_mib is not None
        else None
    )
    header = SweepResult(
        script=str(config.script),
        sweep_dir=str(sweep_dir),
        created_utc=rundir.utc_iso(),
        mode="cli",
        device_kind="cuda" if p.cuda else "cpu",
        world_size=p.world_size,
        margin=config.margin,
        memory_definition=CUDA_MEMORY_DEFINITION if p.cuda else CPU_MEMORY_DEFINITION,
        fixed_global_batch=config.global_batch,
        capacity_mib=planner.capacity_mib,
        capacity_source=capacity_source,
    )
    result = header
    noise: dict[int, tuple[list[StepNoise], str | None]] = {}
    while (b := planner.next_size()) is not None:
        accum = 1
        if config.global_batch is not None:
            accum = max(1, config.global_batch // (b * p.world_size))
        launched = _run_trial(config, base, b, accum, sweep_dir)
        trial = trial_from_run(
            b, launched[1], launched[2], world_size=p.world_size, accumulation_steps=accum,
            baseline_rss_mib=baseline_mib, run_dir=os.path.relpath(launched[0], sweep_dir),
        )  # fmt: skip
        if planner.capacity_mib is None and p.cuda:
            planner.capacity_mib = cuda_capacity_mib(launched[1])
            if planner.capacity_mib is not None:
                capacity_source = "CUDA device total memory (smallest over ranks)"
        planner.record(trial)
        noise[b] = trial_noise(launched[1])
        result = _result(header, planner, capacity_source, noise)
        write_sweep(sweep_dir, result)
        if on_trial is not None:
            on_trial(trial)
        if len(planner.trials) == 1 and (trial.error or "").startswith(BATCH_NOT_APPLIED):
            # the next sizes would not apply either: stop before spending their trials
            raise UsageError(
                f"cannot sweep {config.script.name}: {trial.error} (trial kept in {sweep_dir})"
            )
    result = _result(header, planner, capacity_source, noise)
    write_sweep(sweep_dir, result)
    write_sweep_html(sweep_dir, result)  # the page at the end: sweep.json holds every trial
    return result


def trial_noise(run: RunRecord) -> tuple[list[StepNoise], str | None]:
    """A trial's per-step noise-scale estimates, or why it has none."""
    steps, inputs = step_estimates(run)
    if steps:
        return steps, None
    return [], "; ".join(inputs.reasons) or "no gradient norms recorded"


def _result(
    header: SweepResult,
    planner: SweepPlanner,
    capacity_source: str | None,
    noise: dict[int, tuple[list[StepNoise], str | None]] | None = None,
) -> NoiseSweepResult:
    summary = summarize(
        planner.trials, planner.capacity_mib, planner.margin, stop_reason=planner.stop_reason
    )
    # The answer's fields come from summarize; the run's facts from the header.
    answer = msgspec.structs.replace(
        summary,
        script=header.script,
        sweep_dir=header.sweep_dir,
        created_utc=header.created_utc,
        mode=header.mode,
        device_kind=header.device_kind,
        world_size=header.world_size,
        memory_definition=header.memory_definition,
        fixed_global_batch=header.fixed_global_batch,
        capacity_source=capacity_source,
        caveats=summary.caveats if header.fixed_global_batch is None else summary.caveats[:-1],
    )
    with_noise = NoiseSweepResult(**msgspec.structs.asdict(answer))
    # the hardware knee and B_simple side by side, and the batch that weighs both
    with_noise.noise_scale = sweep_noise_scale(answer, noise or {})
    return with_noise


def _run_trial(
    config: SweepConfig, base: Any, batch: int, accum: int, sweep_dir: Path
) -> tuple[Path, RunRecord, dict[str, Any]]:
    """One launch at ``batch`` in its own processes, then its analysis."""
    from mgprof.run.finish import finish_run
    from mgprof.run.launcher import launch

    # the step limit ends a session the script opened itself (a framework callback's) as it ends
    # the automatic one: without it such a trial ran the script's whole training
    env = {BATCH_SIZE_ENV: str(batch), COMPARE_ENV: "1"}
    if config.global_batch is not None:
        env[ACCUM_STEPS_ENV] = str(accum)
    if config.memory_budget_mib is not None:
        env[MEMORY_BUDGET_ENV] = str(config.memory_budget_mib)
        # glibc reserves 64 MiB of address space per thread arena: with one per thread the
        # cap would be spent on reservations, not on the training's memory.
        env["MALLOC_ARENA_MAX"] = "2"
    cfg = dataclasses.replace(
        base, extra_env=env, run_name=f"bs{batch}-{rundir.safe_stem(config.script.name)}",
        out=sweep_dir,
    )  # fmt: skip
    with _StderrTap() as tap:
        launched = launch(cfg)
    run = launched.run
    if run.error and not is_oom_error(run.error) and is_oom_error(tap.text()):
        # A rank that dies in the allocator may leave no record: its traceback on stderr is
        # then the only evidence that the trial ran out of memory.
        oom_line = next(line for line in reversed(tap.text().splitlines()) if is_oom_error(line))
        run = msgspec.structs.replace(run, error=f"{run.error}; stderr: {oom_line.strip()}")
    run, analysis = finish_run(launched.run_dir, run)
    if launched.stopped is not None:  # no further trial; sweep.json keeps the finished ones
        raise launched.stopped
    return launched.run_dir, run, analysis


class _StderrTap:
    """Keep the tail of what the workers write to stderr while passing it through.

    The launcher forwards the workers' stderr to ``sys.stderr.buffer``; swapping ``sys.stderr``
    for this tap during one launch lets the sweep read an out-of-memory traceback that no rank
    record holds.
    """

    KEEP_BYTES = 64 * 1024

    def __init__(self) -> None:
        self._real: Any = None
        self._tail = bytearray()

    def __enter__(self) -> _StderrTap:
        self._real = sys.stderr
        sys.stderr = self  # type: ignore[assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        sys.stderr = self._real

    @property
    def buffer(self) -> _StderrTap:
        return self

    def write(self, data: Any) -> int:
        raw = data.encode("utf-8", "replace") if isinstance(data, str) else bytes(data)
        self._tail += raw
        del self._tail[: -self.KEEP_BYTES]
        target = self._real.buffer if not isinstance(data, str) else self._real
        return int(target.write(data) or 0)

    def flush(self) -> None:
        self._real.flush()

    def text(self) -> str:
        return self._tail.decode("utf-8", "replace")


def probe_baseline_rss_mib() -> float:
    """Peak RSS (MiB) of a process that has done what the bootstrap does before the cap."""
    code = (
        "from mgprof.run.bootstrap import AutoInstrument\n"
        "AutoInstrument(0, None, 3).install()\n"
        "import torch\n"
        "from mgprof.collect.devices.memory import peak_rss_mib\n"
        "print(peak_rss_mib())\n"
    )
    env = dict(os.environ, OMP_NUM_THREADS="1", MALLOC_ARENA_MAX="2")
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    lines = [line for line in proc.stdout.splitlines() if line and not line.startswith("USDT:")]
    try:
        return float(lines[-1])
    except (IndexError, ValueError):
        raise UsageError(
            f"could not measure the baseline memory of a worker: {proc.stderr.strip()[-200:]}"
        ) from None


def cuda_capacity_mib(run: RunRecord) -> float | None:
    """Smallest device total memory over the ranks (the tightest device bounds the batch)."""
    totals = [r.memory.total_mib for r in run.ranks if r.memory is not None and r.memory.total_mib]
    return min(totals) if totals else None


def _first_line(text: str | None) -> str | None:
    return text.strip().splitlines()[0] if text and text.strip() else None


def trial_from_run(
    batch: int,
    run: RunRecord,
    analysis: dict[str, Any],
    *,
    world_size: int,
    accumulation_steps: int = 1,
    baseline_rss_mib: float | None = None,
    run_dir: str | None = None,
) -> Trial:
    """A trial's figures from its run record and analysis.

    Throughput is the job's samples per update over the mean untraced steady-state step
    (``mgprof.analyze.step_samples.run_steps``: the slowest rank at each step), and only for a
    trial
    whose batch was really applied: the size the ranks' steps recorded must equal the request
    (or, with nothing recorded, the script read it through ``mgprof.batch_size()``); otherwise
    the trial fails with the reason (``batch_evidence``).
    """
    by_rank = {a.get("rank"): a for a in analysis.get("ranks", []) if isinstance(a, dict)}
    ranks: list[RankTrial] = []
    errors = [r.error for r in run.ranks if r.error]
    if run.error:
        errors.append(run.error)
    for rec in sorted(run.ranks, key=lambda r: r.rank):
        fig = by_rank.get(rec.rank, {})
        step = (fig.get("step_time_ms") or {}).get("mean")
        comm = fig.get("comm") or {}
        rt = RankTrial(rank=rec.rank, step_time_ms=step, error=_first_line(rec.error))
        if step:
            rt.samples_per_s = batch * accumulation_steps / (step / 1000.0)
        rt.peak_memory_mib = _memory_used(rec, baseline_rss_mib)
        rt.comm_pct = comm.get("comm_pct")
        rt.exposed_comm_pct = comm.get("exposed_comm_pct")
        ranks.append(rt)
    status: Any = "ok"
    if any(is_oom_error(e) for e in errors):
        status = "oom"
    elif run.status != "complete" or run.exit_code not in (0, None):
        status = "failed"
    oom_text = next((e for e in errors if is_oom_error(e)), None)
    trial = Trial(
        batch_size=batch,
        status=status,
        world_size=world_size,
        accumulation_steps=accumulation_steps,
        global_batch=batch * world_size * accumulation_steps,
        ranks=ranks,
        error=_first_line(oom_text or (errors[0] if errors else None)),
        run_dir=run_dir,
    )
    observed, applied_by, problem = batch_evidence(run, batch, accumulation_steps)
    trial.observed_batch_size = observed
    trial.batch_applied_by = applied_by
    if status == "ok" and problem is not None:
        trial.status = "failed"
        trial.error = problem
        for rt in trial.ranks:
            rt.samples_per_s = None  # a rate of a batch that never ran is no figure
    if trial.status != "ok":
        return trial
    clean = run_steps(run)
    trial.step_times_ms = list(clean.clean_ms)
    trial.traced_step_ms = _mean_or_none(clean.traced_ms)
    trial.post_trace_step_ms = _mean_or_none(clean.post_trace_ms)
    trial.step_time_ms = _mean_or_none(clean.clean_ms)
    rates = [r.samples_per_s for r in ranks if r.samples_per_s is not None]
    if trial.step_time_ms and len(rates) == len(ranks) == world_size and ranks:
        trial.samples_per_s = trial.global_batch * 1000.0 / trial.step_time_ms
        trial.samples_per_s_per_device = trial.samples_per_s / world_size
    elif not clean.clean_ms:
        trial.note = "throughput not computed: no untraced steady-state step (raise --steps)"
    else:
        trial.note = "throughput not computed: not every rank reported a step time"
    mems = [r.peak_memory_mib for r in ranks if r.peak_memory_mib is not None]
    trial.peak_memory_mib = max(mems) if mems else None
    comms = [r.comm_pct for r in ranks if r.comm_pct is not None]
    exposed = [r.exposed_comm_pct for r in ranks if r.exposed_comm_pct is not None]
    trial.comm_pct = sum(comms) / len(comms) if comms else None
    trial.comm_pct_least_waiting = min(comms) if comms else None
    trial.exposed_comm_pct = sum(exposed) / len(exposed) if exposed else None
    return trial


def _mean_or_none(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _memory_used(rec: Any, baseline_rss_mib: float | None) -> float | None:
    mem = rec.memory
    if mem is None:
        return None
    if mem.kind == "cuda":
        return mem.peak_reserved_mib
    if baseline_rss_mib is None or mem.peak_rss_mib is None:
        return None
    return max(0.0, mem.peak_rss_mib - baseline_rss_mib)


_encoder = msgspec.json.Encoder()


def write_sweep(sweep_dir: Path, result: SweepResult) -> Path:
    """``sweep.json`` written atomically (temp file + rename)."""
    return write_bytes_atomic(
        sweep_dir / SWEEP_JSON, msgspec.json.format(_encoder.encode(result), indent=1)
    )


def read_sweep(path: str | os.PathLike[str]) -> NoiseSweepResult:
    """Load ``sweep.json`` (or the one inside a sweep directory); bad files are UsageErrors.
    A sweep.json written before the noise scale loads with ``noise_scale`` None."""
    p = Path(path)
    if p.is_dir():
        p = p / SWEEP_JSON
    from mgprof.safe_read import read_regular

    data = read_regular(p, hint="give a sweep directory")
    try:
        head = msgspec.json.decode(data)
    except RecursionError:
        raise UsageError(f"{p} is nested too deeply to be an mgprof sweep.json") from None
    except msgspec.DecodeError as exc:
        raise UsageError(f"{p} is not valid JSON ({exc})") from None
    version = head.get("schema_version") if isinstance(head, dict) else None
    if not isinstance(version, int) or version < 1:
        raise UsageError(f"{p} has no valid schema_version: not an mgprof sweep.json")
    from mgprof.analyze.sweep.result import SWEEP_SCHEMA_VERSION

    if version > SWEEP_SCHEMA_VERSION:
        raise UsageError(
            f"{p} has schema_version {version}, newer than this mgprof understands "
            f"({SWEEP_SCHEMA_VERSION}); upgrade with 'pip install -U mgprof'"
        )
    try:
        return msgspec.convert(head, NoiseSweepResult)
    except msgspec.ValidationError as exc:
        raise UsageError(f"{p} does not match the sweep.json schema: {exc}") from None
