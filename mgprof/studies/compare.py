"""``mgprof.compare``: run one script as single device, DataParallel and DDP, and compare.

(The module is ``comparison``, not ``compare``: a submodule named like the exported function
would replace ``mgprof.compare`` with the module as soon as it is imported.)

Each strategy runs through the normal launcher with the same warm-up and measured steps, so each
leaves a complete run directory; they sit inside one comparison directory whose
``comparison.json`` holds the table (``mgprof.analyze.compare.scaling``), links to the runs and the
verdict. Weak scaling (per-device batch fixed) is the default; ``global_batch=True`` keeps the
global batch fixed instead. The batch reaches the script through ``MGPROF_BATCH_SIZE``
(``mgprof.batch_size(default)``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import msgspec

from mgprof import rundir
from mgprof.analyze.compare.precision_rows import (
    LossSeries,
    compare_precisions,
    comparison_verdict,
    fill_precision_figures,
    run_losses,
)
from mgprof.analyze.compare.scaling import (
    COMPARISON_JSON,
    Comparison,
    NotApplicable,
    Row,
    add_round,
    add_speedups,
    analysis_rows,
    build_row,
    differences,
    encode_comparison,
    observed_mode,
    row_name,
    trial_batches,
)
from mgprof.analyze.compare.verdict import memory_tradeoff, verdict_parts
from mgprof.analyze.sweep.planner import MAX_BATCH
from mgprof.atomic import write_bytes_atomic
from mgprof.errors import UsageError
from mgprof.records import RunRecord
from mgprof.report.html.study.compare_page import write_comparison_html
from mgprof.run.launcher import MAX_STEPS, SHARDED, STRATEGIES, one_process_per_rank
from mgprof.run.machine_load import LoadMeter, MachineLoad

DEFAULT_STEPS = 10
DEFAULT_NOSYNC_STEPS = 6
DEFAULT_ROUNDS = 2
MAX_ROUNDS = 20


def _parse_list(
    text: str | Sequence[str], allowed: Sequence[str], flag: str, what: str, example: str
) -> list[str]:
    """A comma list of ``allowed`` names (any order, no repeats); UsageError naming the bad one."""
    items = [s.strip() for s in text.split(",")] if isinstance(text, str) else list(text)
    items = [s for s in items if s]
    if not items:
        raise UsageError(f"{flag} is empty; give e.g. {example}")
    for s in items:
        if s not in allowed:
            raise UsageError(f"{flag}: unknown {what} {s!r}; choose from {','.join(allowed)}")
    if len(set(items)) != len(items):
        raise UsageError(f"{flag} lists a {what} twice")
    return items


DEFAULT_STRATEGIES = ("single", "dp", "ddp")
"""What ``compare`` runs unless asked: FSDP rows (``fsdp``, ``fsdp-noreshard``) on request."""


def parse_strategies(text: str | Sequence[str]) -> list[str]:
    """``single,dp,ddp,fsdp`` (any order, no repeats) → list; UsageError naming the bad one."""
    return _parse_list(text, STRATEGIES, "--strategies", "strategy", "single,dp,ddp")


PRECISION_SEED = 1234
"""``MGPROF_SEED`` of every precision row: the rows start from the same weights and data."""


def parse_precisions(text: str | Sequence[str] | None) -> list[str] | None:
    """``fp32,bf16[,fp16]`` → list (None: no precision rows); UsageError naming the bad one."""
    from mgprof.collect.envknobs import PRECISIONS

    if text is None:
        return None
    return _parse_list(text, PRECISIONS, "--precision", "precision", "fp32,bf16")


def _script_has_amp(found: Any) -> bool:
    """The run's precision record shows the script's own autocast or GradScaler."""
    return isinstance(found, dict) and bool(
        found.get("script_autocast") or found.get("script_grad_scaler")
    )


def _validate(
    gpus: int,
    steps: int,
    warmup: int,
    batch_size: int | None,
    global_batch: bool,
    nosync_steps: int,
    rounds: int = DEFAULT_ROUNDS,
) -> None:
    if not 1 <= rounds <= MAX_ROUNDS:
        raise UsageError(f"--rounds must be between 1 and {MAX_ROUNDS}, got {rounds}")
    if gpus < 1:
        raise UsageError(f"--gpus must be at least 1, got {gpus}")
    if not 1 <= steps <= MAX_STEPS:
        raise UsageError(f"--steps must be from 1 to {MAX_STEPS:,}, got {steps}")
    if not 0 <= warmup <= MAX_STEPS:
        raise UsageError(f"--warmup must be from 0 to {MAX_STEPS:,}, got {warmup}")
    if not 0 <= nosync_steps <= MAX_NOSYNC_STEPS:
        raise UsageError(
            f"--nosync-steps must be from 0 to {MAX_NOSYNC_STEPS:,}, got {nosync_steps}"
        )
    if batch_size is not None and not 1 <= batch_size <= MAX_BATCH:
        raise UsageError(f"--batch-size must be from 1 to {MAX_BATCH:,}, got {batch_size}")
    if global_batch and batch_size is None:
        raise UsageError("--global-batch needs --batch-size B (the global batch to keep fixed)")


def _plan_all(
    script: Path, strategies: Sequence[str], gpus: int, out: Path
) -> tuple[list[str], list[NotApplicable], bool]:
    """Which strategies can run here; DataParallel without CUDA becomes a not-applicable row."""
    from mgprof.run.launcher import LaunchConfig, plan

    runnable: list[str] = []
    skipped: list[NotApplicable] = []
    cpu = False
    for strategy in strategies:
        n = 1 if strategy == "single" else gpus
        try:
            p = plan(LaunchConfig(script=script, gpus=n, strategy=strategy, out=out))
        except UsageError as exc:
            if strategy == "dp" or strategy in SHARDED:
                skipped.append(NotApplicable(strategy=strategy, reason=str(exc)))
                continue
            raise
        if strategy != "single" and gpus < 2:
            skipped.append(
                NotApplicable(strategy=strategy, reason=f"--gpus {gpus}: one device is 'single'")
            )
            continue
        cpu = cpu or not p.cuda
        runnable.append(strategy)
    return runnable, skipped, cpu


def compare(
    script: str | os.PathLike[str],
    gpus: int,
    strategies: str | Sequence[str] = DEFAULT_STRATEGIES,
    steps: int = DEFAULT_STEPS,
    warmup: int = 2,
    batch_size: int | None = None,
    global_batch: bool = False,
    out: str | os.PathLike[str] = rundir.DEFAULT_ROOT,
    script_args: Sequence[str] = (),
    nosync_steps: int = DEFAULT_NOSYNC_STEPS,
    trace_steps: int = 3,
    on_progress: Callable[[str, dict[int, int]], None] | None = None,
    auto_wrap: bool = True,
    memory: bool = False,
    noise_scale: bool | None = None,
    precisions: str | Sequence[str] | None = None,
    rounds: int = DEFAULT_ROUNDS,
) -> Comparison:
    """Run ``script`` under each strategy and return the comparison, also saved as
    ``<out>/<comparison_id>/comparison.json`` beside the strategies' run directories.

    ``batch_size``: per-device batch (weak scaling) or, with ``global_batch``, the global batch
    (strong scaling); None leaves the script's own batch. ``nosync_steps``: steps each with and
    without gradient sync in the DDP A/B (0 turns it off). ``rounds``: each row runs this many
    times, interleaved (single, ddp, single, ddp...), the first traced and the others not, and
    the speedups get 95 % intervals from all of them. ``precisions``: each strategy runs
    once per precision (``--precision fp32,bf16``), seeded alike, and each precision row is
    compared with its strategy's baseline row (``mgprof.analyze.compare.precision_rows``). Raises
    UsageError on bad input before anything runs.
    """
    script_path = Path(script)
    chosen = parse_strategies(strategies)
    wanted = parse_precisions(precisions)
    _validate(gpus, steps, warmup, batch_size, global_batch, nosync_steps, rounds)
    mode: Literal["weak", "strong"] = "strong" if global_batch else "weak"
    batches: dict[str, tuple[int, int]] | None = None
    if batch_size is not None:
        try:
            batches = trial_batches(mode, batch_size, gpus)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    if not script_path.exists():
        raise UsageError(f"script {script_path} not found; give the path to a Python file")
    if not script_path.is_file():
        raise UsageError(f"{script_path} is not a file; give the path to a Python script")
    out_path = Path(out)
    runnable, skipped, cpu = _plan_all(script_path, chosen, gpus, out_path)
    comp_dir = rundir.new_run_dir(out_path, f"compare-{script_path.stem}")
    comp = Comparison(
        comparison_id=comp_dir.name,
        created_utc=rundir.utc_iso(),
        script=str(script_path),
        script_args=list(script_args),
        mode=mode,
        batch_size=batch_size,
        gpus=gpus,
        steps=steps,
        warmup=warmup,
        nosync_steps=nosync_steps,
        cpu_fallback=cpu,
        cpu_note=(
            "no CUDA device visible: CPU ranks over gloo stand in for GPUs; the figures prove "
            "the method, not GPU speed"
            if cpu
            else None
        ),
        not_applicable=skipped,
        precisions=list(wanted or []),
        rounds=rounds,
    )
    threads_env, comp.cpu_threads_setting = thread_setting(runnable, gpus)
    if wanted and cpu:
        comp.cpu_note = (comp.cpu_note or "") + (
            "; precision rows use CPU autocast, whose speed says nothing about a GPU's tensor cores"
        )
    losses: dict[str, LossSeries] = {}
    order: list[str | None] = list(wanted) if wanted else [None]
    loads: dict[str, list[MachineLoad]] = {}
    for strategy in runnable:
        per_process = batches[strategy][0] if batches else None
        pending = list(order)
        while pending:
            precision = pending.pop(0)
            row, analysis, load = _run_one(
                comp_dir,
                script_path,
                strategy,
                gpus,
                steps=steps,
                warmup=warmup,
                trace_steps=trace_steps,
                per_process_batch=per_process,
                script_args=script_args,
                nosync_steps=nosync_steps,
                on_progress=on_progress,
                auto_wrap=auto_wrap,
                memory=memory,
                noise_scale=noise_scale,
                precision=precision,
                env=threads_env,
            )
            comp.rows.append(row)
            if load is not None:
                loads.setdefault(row_name(row), []).append(load)
            comp.runs[strategy if precision is None else f"{strategy} {precision}"] = row.run
            if precision is None:
                continue
            fill_precision_figures(row, precision, analysis)
            found = analysis.get("precision")
            losses[row.run] = run_losses(analysis)
            if "script" not in order and _script_has_amp(found):
                # the script brings its own autocast/GradScaler: its own setting is every
                # strategy's baseline row, run next here and first for the other strategies
                order.insert(0, "script")
                pending.insert(0, "script")
                comp.precisions = [str(p) for p in order]
    if wanted:
        comp.rows.sort(key=lambda r: (runnable.index(r.strategy), order.index(r.precision)))
    for k in range(2, rounds + 1):
        # later rounds: the same rows in the same order, untraced, so drift hits them alike
        for row in comp.rows:
            if row.status != "complete":
                continue
            run, name, load = _run_round(
                comp_dir,
                script_path,
                row,
                gpus,
                round_no=k,
                steps=steps,
                warmup=warmup,
                per_process_batch=batches[row.strategy][0] if batches else None,
                script_args=script_args,
                on_progress=on_progress,
                auto_wrap=auto_wrap,
                env=threads_env,
            )
            add_round(row, run, name)
            if load is not None:
                loads.setdefault(row_name(row), []).append(load)
    _against_attainable(comp, comp_dir, gpus)
    _note_loads(comp, loads)
    comp.intervals = add_speedups(comp.rows)
    observed, comp.mode_basis = observed_mode(comp.rows)
    if observed != "unknown" or batch_size is None:
        comp.mode = observed  # type: ignore[assignment]
    comp.differences = differences(comp.rows)
    args = (cpu, comp.mode, comp.intervals, comp.busy, comp.differences, rounds)
    if wanted:
        compare_precisions(comp.rows, losses, comp.intervals)
        parts, precision = comparison_verdict(comp.rows, *args)
    else:
        parts, precision = verdict_parts(comp.rows, *args), ""
    tradeoff = memory_tradeoff(comp.rows, comp.intervals)
    comp.answer = [parts.answer, *(line for line in (precision, tradeoff) if line)]
    comp.caveats = list(parts.caveats)
    comp.verdict = parts.line() + (f". {precision}" if precision else "")
    comp.verdict += f"; {tradeoff}" if tradeoff else ""
    write_bytes_atomic(comp_dir / COMPARISON_JSON, encode_comparison(comp))
    _write_markdown(comp_dir, comp)
    write_comparison_html(comp_dir, comp)
    _link_runs(comp_dir, comp)
    return comp


MAX_NOSYNC_STEPS = 10_000
"""Steps of the sync A/B at most: each side's median settles within tens of steps."""

THREADS_ENV = "OMP_NUM_THREADS"


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask, e.g. a container or taskset limit)."""
    getaffinity = getattr(os, "sched_getaffinity", None)
    if getaffinity is not None:
        try:
            return max(1, len(getaffinity(0)))
        except OSError:
            pass
    return max(1, os.cpu_count() or 1)


def thread_setting(runnable: Sequence[str], gpus: int) -> tuple[dict[str, str], str]:
    """The ``OMP_NUM_THREADS`` every row runs with, and the setting in words.

    torchrun gives each of several ranks one thread when the variable is unset, while a single
    process takes every core: the single row then ran with N times the threads of each DDP
    rank, and the "speedup" measured threads, not the strategy (31x on a CPU machine). Unless
    the user set it, every row gets the same threads per process: the usable cores divided by
    the most processes any row starts.
    """
    user = os.environ.get(THREADS_ENV)
    if user:
        return {}, f"{THREADS_ENV}={user} for every row (set by you)"
    processes = max((gpus if one_process_per_rank(s) else 1 for s in runnable), default=1)
    cores = usable_cores()
    threads = max(1, cores // processes)
    why = (
        f"{cores} usable cores / {processes} processes in the largest row, the same for "
        "every row so the rows differ by strategy only"
    )
    return {THREADS_ENV: str(threads)}, f"{THREADS_ENV}={threads} for every row ({why})"


def _note_loads(comp: Comparison, loads: dict[str, list[MachineLoad]]) -> None:
    """Each row's worst round of other processes' load and steal; the busy ones in words."""
    for row in comp.rows:
        found = loads.get(row_name(row), [])
        if not found:
            continue
        row.other_load_cores = max(m.other_cores for m in found)
        steals = [m.steal_pct for m in found if m.steal_pct is not None]
        row.steal_pct = max(steals) if steals else None
        busy = [text for m in found if (text := m.busy()) is not None]
        if busy:
            comp.busy.append(f"{row_name(row)}: {busy[0]}")


PROBE_OPS = ("all_reduce", "all_gather", "reduce_scatter")
MAX_PROBE_BYTES = 256 * 1024 * 1024


def _against_attainable(comp: Comparison, comp_dir: Path, gpus: int) -> None:
    """Measure this machine's bus bandwidth at the DDP row's message sizes (the bandwidth
    probe, right after the row) and give the row's busbw as a share of it. A probe that fails
    leaves a note, never a failed comparison."""
    from mgprof.analyze.trace.bandwidth import against_baseline
    from mgprof.records import read_run

    row = next((r for r in comp.rows if r.strategy == "ddp"), None)
    if row is None or row.grad_sync == "independent":
        return
    try:
        analysis = read_run(comp_dir / row.run).analysis or {}
    except Exception:
        return
    summaries = (((analysis.get("traces") or {}).get("ranks") or {}).get("0")) or []
    collectives = [
        c
        for summary in summaries
        if isinstance(summary, dict)
        for c in summary.get("collectives") or []
        if isinstance(c, dict) and c.get("type") in PROBE_OPS and c.get("busbw_gbps")
    ]
    sizes = sorted(
        {min(int(c["bytes"] / c["count"]), MAX_PROBE_BYTES) for c in collectives if c["count"]}
    )
    if not sizes:
        return
    from mgprof.errors import UsageError
    from mgprof.run.bandwidth_probe import run_probe

    try:
        comp.bandwidth = run_probe(gpus, sizes[-3:], iters=5, timeout_s=300)
    except UsageError as exc:
        row.notes.append(f"bandwidth baseline not measured: {exc}")
        return
    found = against_baseline(collectives, comp.bandwidth)
    if not found:
        return
    top = max(found, key=lambda a: a.busbw_gbps * a.mean_call_bytes)
    row.busbw_pct_of_attainable = top.pct_of_attainable
    row.notes.append(
        f"{top.type} busbw {top.busbw_gbps:.3g} GB/s = {top.pct_of_attainable:.0f} % of the "
        f"{top.attainable_busbw_gbps:.3g} GB/s this machine reached at {top.mean_call_bytes:,} B "
        "(bandwidth probe, nccl-tests' busbw)"
    )


def _link_runs(comp_dir: Path, comp: Comparison) -> None:
    """Each strategy's run.json gets the table under ``analysis["comparison"]`` (and its HTML
    report is re-rendered) so a single run's report shows where it stands among the others."""
    from mgprof.analyze.findings import evaluate_findings
    from mgprof.records import read_run
    from mgprof.run.finish import write_html_report

    table = analysis_rows(comp)
    for name in comp.runs.values():
        run_dir = comp_dir / name
        run = read_run(run_dir)
        analysis = {**(run.analysis or {}), "comparison": table}
        # advice that cites the measured rows (AMP, DDP over DataParallel or FSDP) sees them
        analysis["findings"] = evaluate_findings(run, analysis)
        run = msgspec.structs.replace(run, analysis=analysis)
        rundir.write_run(run_dir, run)
        write_html_report(run_dir, run, analysis)


def _run_one(
    comp_dir: Path,
    script: Path,
    strategy: str,
    gpus: int,
    *,
    steps: int,
    warmup: int,
    trace_steps: int,
    per_process_batch: int | None,
    script_args: Sequence[str],
    nosync_steps: int,
    on_progress: Callable[[str, dict[int, int]], None] | None,
    auto_wrap: bool = True,
    memory: bool = False,
    noise_scale: bool | None = None,
    precision: str | None = None,
    env: dict[str, str] | None = None,
) -> tuple[Row, dict[str, Any], MachineLoad | None]:
    """Launch one strategy (at one precision) into the comparison directory, analyse it, make
    its row; the row, the run's analysis and the machine's load while it ran."""
    from mgprof.collect.wrapping.nosync import read_result
    from mgprof.run.launcher import LaunchConfig

    env = {"MGPROF_COMPARE": "1", **(env or {})}
    if per_process_batch is not None:
        env["MGPROF_BATCH_SIZE"] = str(per_process_batch)
    if strategy == "ddp" and nosync_steps > 0:
        env["MGPROF_NOSYNC_STEPS"] = str(nosync_steps)
    config = LaunchConfig(
        script=script,
        script_args=list(script_args),
        gpus=1 if strategy == "single" else gpus,
        strategy=strategy,
        steps=steps,
        warmup=warmup,
        active=trace_steps,
        out=comp_dir,
        extra_env=env,
        run_name=f"{strategy}-{script.stem}" if precision is None else f"{strategy}-{precision}",
        auto_wrap=auto_wrap,
        memory=memory,
        noise_scale=noise_scale,
        precision=precision,
        seed=PRECISION_SEED if precision is not None else None,
    )
    label = strategy if precision is None else f"{strategy} {precision}"
    result, run, analysis, load = _launch_measured(config, label, on_progress)
    ab: Any = None
    if strategy == "ddp" and nosync_steps > 0:
        found = read_result(result.run_dir, 0)
        ab = None if found is None else {f: getattr(found, f) for f in found.__struct_fields__}
    row = build_row(
        strategy,
        run,
        analysis,
        result.run_dir.name,
        per_process_batch,
        ab,
        ab_asked=nosync_steps > 0,
    )
    return row, analysis, load


def _run_round(
    comp_dir: Path,
    script: Path,
    row: Row,
    gpus: int,
    *,
    round_no: int,
    steps: int,
    warmup: int,
    per_process_batch: int | None,
    script_args: Sequence[str],
    on_progress: Callable[[str, dict[int, int]], None] | None,
    auto_wrap: bool,
    env: dict[str, str],
) -> tuple[RunRecord, str, MachineLoad | None]:
    """A later round of ``row``: the same launch without a trace, the A/B or memory tracking
    (nothing there would change its step times); the run, its directory name and the load."""
    from mgprof.run.launcher import LaunchConfig

    extra = {"MGPROF_COMPARE": "1", **env}
    if per_process_batch is not None:
        extra["MGPROF_BATCH_SIZE"] = str(per_process_batch)
    stem = script.stem if row.precision is None else row.precision
    config = LaunchConfig(
        script=script,
        script_args=list(script_args),
        gpus=1 if row.strategy == "single" else gpus,
        strategy=row.strategy,
        steps=steps,
        warmup=warmup,
        active=0,
        out=comp_dir,
        extra_env=extra,
        run_name=f"{row.strategy}-{stem}-round{round_no}",
        auto_wrap=auto_wrap,
        precision=row.precision,
        seed=PRECISION_SEED if row.precision is not None else None,
    )
    label = f"{row_name(row)} (round {round_no})"
    result, run, _, load = _launch_measured(config, label, on_progress)
    return run, result.run_dir.name, load


def _launch_measured(
    config: Any, label: str, on_progress: Callable[[str, dict[int, int]], None] | None
) -> tuple[Any, RunRecord, dict[str, Any], MachineLoad | None]:
    """Launch one run of a row with its progress labelled and the machine's load measured
    around it; the launch result, its finished record and analysis, and the load. Ctrl-C or
    SIGTERM during it is raised, so no further run is launched."""
    from mgprof.run.finish import finish_run
    from mgprof.run.launcher import launch

    callback = None
    if on_progress is not None:

        def callback(counts: dict[int, int]) -> None:
            on_progress(label, counts)

    meter = LoadMeter().start()
    result = launch(config, on_progress=callback)
    load = meter.stop()
    run, analysis = finish_run(result.run_dir, result.run)
    if result.stopped is not None:
        raise result.stopped
    return result, run, analysis, load


def _write_markdown(comp_dir: Path, comp: Comparison) -> None:
    from mgprof.atomic import write_text_atomic
    from mgprof.report.compare_view import comparison_to_markdown

    write_text_atomic(comp_dir / "report.md", comparison_to_markdown(comp))
