"""Single vs DataParallel vs DDP vs FSDP, measured: the rows of ``mgprof compare``.

Pure: each strategy's ``RunRecord`` and analysis dict (plus its A/B result) in, a ``Comparison``
out. A row's step time and throughput come from its untraced steady-state steps, pooled over
its rounds (``mgprof.analyze.step_samples``). Speedup is throughput(strategy) /
throughput(single) — samples per second, so weak and strong scaling are judged by the same rule
(with a fixed global batch it equals the step-time ratio) — and scaling efficiency is speedup /
devices. Which scaling the rows show is read off the batches they trained, not assumed. The
verdict over these rows is ``mgprof.analyze.compare.verdict``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import msgspec

from mgprof.analyze.readers import num as _num
from mgprof.analyze.run.grad_sync import INDEPENDENT_LABEL
from mgprof.analyze.run.precision import LossCheck
from mgprof.analyze.step_samples import Interval, RowSamples, rate_intervals, run_steps
from mgprof.errors import RunRecordError
from mgprof.records import RunRecord
from mgprof.safe_read import read_regular

RANKED = ("ddp", "fsdp", "fsdp-noreshard")
"""Strategies with one process per device (torchrun ranks); mirrors the launcher's."""

COMPARISON_VERSION = 2
COMPARISON_JSON = "comparison.json"

DEFINITIONS: dict[str, str] = {
    "step_time_ms": (
        "mean over the row's untraced steady-state steps, pooled over its rounds, of the "
        "slowest rank's time at each step (a DDP step ends when every rank is done); the first "
        "step of each run, the profiler's warm-up and traced steps and the step after them "
        "(trace export) are left out and reported apart"
    ),
    "samples_per_s": (
        "samples per step (summed over ranks: the trained module's inputs, else the batches "
        "the DataLoader yielded) * 1000 / step_time_ms"
    ),
    "speedup": (
        "samples_per_s(strategy) / samples_per_s(single), with a 95 % cluster-bootstrap "
        "interval (rounds drawn with replacement, then steps within each drawn round)"
    ),
    "efficiency_pct": "100 * speedup / devices",
    "exposed_comm_pct": (
        "mean over ranks of 100 * exposed communication / trace window, from the traces"
    ),
    "ab_comm_pct": (
        "100 * (median step with gradient sync - median step without) / median step with sync, "
        "from the A/B on rank 0 (sync switched off via DDP's comm hook, state restored after)"
    ),
    "peak_mem_mib": (
        "per device: peak memory allocated by PyTorch on CUDA (DataParallel: every GPU it "
        "drives), peak resident set size of each rank's process on CPU"
    ),
}


class Row(msgspec.Struct, kw_only=True):
    """One measured strategy. Figures that could not be measured are None, with ``notes``."""

    strategy: str
    devices: int
    run: str
    """The strategy's run directory, relative to the comparison directory."""
    status: str
    batch_per_device: int | None = None
    global_batch: int | None = None
    batch_controlled: bool = False
    step_time_ms: float | None = None
    samples_per_s: float | None = None
    speedup: float | None = None
    efficiency_pct: float | None = None
    exposed_comm_pct: float | None = None
    comm_pct: float | None = None
    ab_sync_ms: float | None = None
    ab_nosync_ms: float | None = None
    ab_comm_pct: float | None = None
    peak_mem_kind: str | None = None
    peak_mem_mib: list[float | None] = msgspec.field(default_factory=list)
    params_mib: float | None = None
    grads_mib: float | None = None
    optimizer_mib: float | None = None
    """Parameters, gradients and optimizer state held per rank after the first update (the
    most any rank held; a sharded rank's own part: ``TrainingFacts.model_state``)."""
    state_sharded: bool = False
    """The parameters were FSDP shards (DTensor): the three figures above are one rank's part."""
    comm_mib_per_step: float | None = None
    """Bytes rank 0's collectives moved per traced step (the message sizes the trace records)."""
    busbw_pct_of_attainable: float | None = None
    """Rank 0's largest collective type's busbw as a share of this machine's, measured by the
    bandwidth probe at the job's message size right after the row ran (DDP rows)."""
    grad_sync: str | None = None
    """The run's gradient-sync verdict (``mgprof.analyze.run.grad_sync``): a row whose ranks
    trained independent replicas gets no throughput, speedup or efficiency."""
    precision: str | None = None
    """``--precision`` of this row (fp32, bf16, fp16, or ``script``: the script's own setting,
    loss recorded); None when the comparison has no precision rows."""
    precision_setting: str | None = None
    """What ran, in words (``mgprof.analyze.run.precision.setting_label``)."""
    precision_baseline: str | None = None
    """The precision row of the same strategy the next figures are relative to."""
    precision_speedup: float | None = None
    """samples/s ÷ the baseline precision row's (step-time ratio when there is no throughput)."""
    precision_speedup_low: float | None = None
    precision_speedup_high: float | None = None
    """95 % interval of ``precision_speedup``."""
    peak_mem_change_pct: float | None = None
    """Mean peak memory per device against the baseline precision row's."""
    reduced_gemm_pct: float | None = None
    """Share of the innermost GEMM/conv ops' host time with bf16/fp16/fp8/int8 operands
    (trace ``gemm_precision``, mean over ranks)."""
    tensor_core_pct: float | None = None
    """GPU: tensor-core kernel time as a share of GEMM kernel time (tensor-core + FP32 GEMM,
    trace ``tensor_cores``, summed over ranks)."""
    mfu_pct: float | None = None
    loss_check: LossCheck | None = None
    """The loss per update against the baseline precision row's (``loss_check``)."""
    cpu_threads: int | None = None
    """Intra-op CPU threads per process (the most any rank had): CPU rows compare fairly only
    when it matches."""
    notes: list[str] = msgspec.field(default_factory=list)
    rounds_run: list[str] = msgspec.field(default_factory=list)
    """Run directories of the row's later rounds (untraced), relative to the comparison."""
    round_step_ms: list[list[float]] = msgspec.field(default_factory=list)
    """Per round, the untraced steady-state step times behind ``step_time_ms``."""
    steps_measured: int = 0
    """Steps in ``round_step_ms``, all rounds."""
    traced_step_ms: float | None = None
    """Mean of the traced steps (round 1), never in the speedup."""
    post_trace_step_ms: float | None = None
    """The step after the traced ones (it writes the trace), never in the speedup."""
    samples_per_step: int | None = None
    """Samples the job trained per step (summed over ranks)."""
    speedup_low: float | None = None
    speedup_high: float | None = None
    """95 % interval of ``speedup``."""
    other_load_cores: float | None = None
    """CPU time other processes used while this row ran, in cores (the most of its rounds)."""
    steal_pct: float | None = None
    """Steal time (a hypervisor gave the cores to another guest) while this row ran, percent
    of the machine's cores (the most of its rounds)."""


class NotApplicable(msgspec.Struct, kw_only=True):
    """A strategy that was asked for but cannot run here, and why (never a made-up row)."""

    strategy: str
    reason: str


class Comparison(msgspec.Struct, kw_only=True):
    """What ``comparison.json`` holds: the table, the runs behind it, the verdict."""

    schema_version: int = COMPARISON_VERSION
    comparison_id: str = ""
    """The comparison directory's name (``<UTC>-compare-<script stem>``)."""
    created_utc: str = ""
    script: str = ""
    script_args: list[str] = msgspec.field(default_factory=list)
    mode: Literal["weak", "strong", "mixed", "unknown"] = "weak"
    """What the rows' trained batches show: ``weak`` (per-device batch the same in every row),
    ``strong`` (global batch the same), ``mixed`` (neither), ``unknown`` (a batch unseen)."""
    mode_basis: str = ""
    """The batches that decided ``mode``, in words."""
    batch_size: int | None = None
    gpus: int = 1
    steps: int = 0
    warmup: int = 0
    nosync_steps: int = 0
    cpu_fallback: bool = False
    cpu_note: str | None = None
    rows: list[Row] = msgspec.field(default_factory=list)
    not_applicable: list[NotApplicable] = msgspec.field(default_factory=list)
    bandwidth: dict[str, Any] | None = None
    """The bandwidth probe's result at the DDP row's message sizes (``mgprof doctor
    --bandwidth``'s format), when the DDP row had collectives with a bus bandwidth."""
    precisions: list[str] = msgspec.field(default_factory=list)
    """``--precision`` rows per strategy, in order (``script`` first when the script brought
    its own autocast/GradScaler); empty without ``--precision``."""
    runs: dict[str, str] = msgspec.field(default_factory=dict)
    """strategy (``strategy precision`` with precision rows) -> run directory relative to the
    comparison directory."""
    verdict: str = ""
    definitions: dict[str, str] = msgspec.field(default_factory=lambda: dict(DEFINITIONS))
    rounds: int = 1
    """Interleaved rounds per row (the first traced, the others not)."""
    cpu_threads_setting: str | None = None
    """``OMP_NUM_THREADS`` every row ran with, and who chose it."""
    intervals: list[Interval] = msgspec.field(default_factory=list)
    """Throughput ratios between rows with their 95 % intervals (what the verdict reads)."""
    differences: list[str] = msgspec.field(default_factory=list)
    """What differs between the rows besides the strategy and could explain the result."""
    busy: list[str] = msgspec.field(default_factory=list)
    """Rows measured while other processes used the machine, in words."""
    answer: list[str] = msgspec.field(default_factory=list)
    """The verdict's answer, a sentence each: the strategy, then the precision rows and the
    memory trade-off when measured (what every report puts first)."""
    caveats: list[str] = msgspec.field(default_factory=list)
    """What could have moved the figures (one round, rows that differ in more than the
    strategy, a busy machine, CPU ranks): said beside the answer. Both are empty in a
    comparison recorded before they existed; ``verdict`` holds everything in one line."""


# --------------------------------------------------------------------------------------------
# Batch plan


def trial_batches(mode: str, batch: int, devices: int) -> dict[str, tuple[int, int]]:
    """strategy -> (batch each process draws, batch per device), as ``mgprof compare`` promises.

    Weak: per-device batch fixed, so DDP ranks draw ``batch`` each and DataParallel draws
    ``batch * devices`` (it splits its input). Strong: global batch fixed, so DDP ranks draw
    ``batch / devices`` and DataParallel draws ``batch``. Raises ValueError when a strong
    batch does not divide.
    """
    if mode == "weak":
        return {
            "single": (batch, batch),
            "dp": (batch * devices, batch),
            **{s: (batch, batch) for s in RANKED},
        }
    if batch % devices:
        raise ValueError(
            f"--global-batch {batch} does not divide over {devices} devices; pick a multiple "
            f"of {devices}"
        )
    share = batch // devices
    return {"single": (batch, batch), "dp": (batch, share), **{s: (share, share) for s in RANKED}}


# --------------------------------------------------------------------------------------------
# Rows


def _devices(run: RunRecord) -> int:
    if run.strategy == "dp":
        return max((r.devices_used for r in run.ranks), default=1)
    return max(run.world_size, 1)


def _memory(row: Row, ranks: Sequence[Mapping[str, Any]]) -> None:
    peaks: list[float | None] = []
    kind = None
    for rank in ranks:
        mem = rank.get("memory")
        if not isinstance(mem, Mapping):
            peaks.append(None)
            continue
        if mem.get("kind") == "cuda":
            kind = "cuda allocated"
            per_device = mem.get("per_device")
            if isinstance(per_device, Mapping) and len(per_device) > 1:
                peaks += [
                    _num(v.get("peak_allocated_mib")) if isinstance(v, Mapping) else None
                    for _, v in sorted(per_device.items())
                ]
            else:
                peaks.append(_num(mem.get("peak_allocated_mib")))
        else:
            kind = "cpu rss"
            peaks.append(_num(mem.get("peak_rss_mib")))
    row.peak_mem_kind = kind
    row.peak_mem_mib = peaks


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _comm(row: Row, ranks: Sequence[Mapping[str, Any]]) -> None:
    comms = [r.get("comm") for r in ranks]
    figures = [c for c in comms if isinstance(c, Mapping)]
    row.exposed_comm_pct = _mean([_num(c.get("exposed_comm_pct")) for c in figures])
    row.comm_pct = _mean([_num(c.get("comm_pct")) for c in figures])
    if row.exposed_comm_pct is None and row.devices > 1:
        why = next(
            (
                r.get("not_applicable", {}).get("comm")
                for r in ranks
                if isinstance(r.get("not_applicable"), Mapping)
            ),
            None,
        )
        row.notes.append(f"trace communication not measured: {why or 'no trace figures'}")


def _ab(row: Row, ab: Mapping[str, Any] | None, asked: bool = True) -> None:
    if row.strategy != "ddp" or not asked:
        return
    if ab is None:
        row.notes.append("sync A/B: no result from rank 0 (the run stopped before it began?)")
        return
    if not ab.get("available"):
        row.notes.append(f"sync A/B not available: {ab.get('reason') or 'no reason given'}")
        return
    if ab.get("reason"):
        row.notes.append(f"sync A/B partial: {ab['reason']}")
    row.ab_sync_ms = _num(ab.get("sync_median_ms"))
    row.ab_nosync_ms = _num(ab.get("nosync_median_ms"))
    if row.ab_sync_ms and row.ab_nosync_ms is not None:
        row.ab_comm_pct = 100.0 * (row.ab_sync_ms - row.ab_nosync_ms) / row.ab_sync_ms
        if row.ab_comm_pct < 0:
            row.notes.append("sync A/B: the step without sync was not faster (within noise)")


def build_row(
    strategy: str,
    run: RunRecord,
    analysis: Mapping[str, Any],
    run_name: str,
    expected_batch: int | None,
    ab: Mapping[str, Any] | None = None,
    ab_asked: bool = True,
) -> Row:
    """One strategy's row from its first round: run record, analysis and (DDP) A/B result.

    ``expected_batch`` is the batch each process was asked to draw (None: not controlled).
    Later rounds join with :func:`add_round`; :func:`add_speedups` then pools them.
    """
    ranks = [r for r in analysis.get("ranks", []) if isinstance(r, Mapping)]
    job = analysis.get("job") if isinstance(analysis.get("job"), Mapping) else {}
    assert isinstance(job, Mapping)
    row = Row(strategy=strategy, devices=_devices(run), run=run_name, status=run.status)
    threads = [r.training.cpu_threads for r in run.ranks if r.training.cpu_threads]
    row.cpu_threads = max(threads) if threads else None
    if run.status != "complete":
        row.notes.append(f"run {run.status}: {run.error or 'no error recorded'}")
    steps = run_steps(run)
    row.round_step_ms = [steps.clean_ms]
    row.traced_step_ms = _mean(list(steps.traced_ms))
    row.post_trace_step_ms = _mean(list(steps.post_trace_ms))
    usual = steps.per_rank_batch
    if usual:
        row.samples_per_step = steps.samples_per_step
        row.global_batch = sum(usual)
        per_process = usual[0]
        row.batch_per_device = per_process // row.devices if strategy == "dp" else per_process
    row.batch_controlled = (
        expected_batch is not None and bool(usual) and set(usual) == {expected_batch}
    )
    if expected_batch is not None and not row.batch_controlled:
        row.notes.append(
            f"batch not controlled: asked for {expected_batch} per process, the records show "
            f"{sorted(set(usual)) or 'none'} (neither mgprof.batch_size() nor a DataLoader set it)"
        )
    untrained = [r.training.untrained_samples for r in run.ranks if r.training.untrained_samples]
    if untrained:
        row.notes.append(
            f"{sum(untrained):,} samples fetched from the DataLoader never reached the model "
            "(a peek with next(iter(loader))?): not counted in any step"
        )
    sync = job.get("grad_sync")
    if isinstance(sync, Mapping) and isinstance(sync.get("status"), str):
        row.grad_sync = sync["status"]
        if sync["status"] in ("independent", "partial"):
            row.notes.append(
                f"{INDEPENDENT_LABEL}: {sync.get('detail', '')}; no speedup or efficiency for "
                "this row (run without --no-auto-wrap, or wrap the model in the script)"
            )
    _pool(row)
    if row.samples_per_s is None and row.grad_sync not in ("independent", "partial"):
        if row.samples_per_step is None:
            row.notes.append(
                "throughput not measured: no step recorded a batch (neither the trained "
                "module's inputs nor a DataLoader were seen)"
            )
        elif not row.steps_measured:
            row.notes.append("throughput not measured: no untraced steady-state step")
    _comm(row, ranks)
    _ab(row, ab, ab_asked)
    _trace_vs_ab(row)
    _memory(row, ranks)
    _model_state(row, run)
    _comm_volume(row, analysis)
    return row


def _model_state(row: Row, run: RunRecord) -> None:
    """The model's state per rank (the most any rank held), from each rank's own tensors."""
    found = [r.training.model_state for r in run.ranks if r.training.model_state is not None]
    if not found:
        return
    row.params_mib = max(m.parameters_mib for m in found)
    row.grads_mib = max(m.gradients_mib for m in found)
    row.optimizer_mib = max(m.optimizer_mib for m in found)
    row.state_sharded = any(m.sharded for m in found)


def _comm_volume(row: Row, analysis: Mapping[str, Any]) -> None:
    """MiB rank 0's collectives moved per traced step (the trace's message sizes)."""
    traces = analysis.get("traces") if isinstance(analysis.get("traces"), Mapping) else {}
    assert isinstance(traces, Mapping)
    ranks = traces.get("ranks") if isinstance(traces.get("ranks"), Mapping) else {}
    assert isinstance(ranks, Mapping)
    summaries = [s for s in ranks.get("0") or [] if isinstance(s, Mapping)]
    moved = sum(
        _num(c.get("bytes")) or 0.0
        for s in summaries
        for c in s.get("collectives") or []
        if isinstance(c, Mapping)
    )
    steps = sum(len(s.get("steps") or []) for s in summaries)
    if steps and row.devices > 1:
        row.comm_mib_per_step = moved / steps / (1024 * 1024)


def add_round(row: Row, run: RunRecord, run_name: str) -> None:
    """A later (untraced) round of ``row``: its clean steps join the pool."""
    row.rounds_run.append(run_name)
    if run.status != "complete":
        row.notes.append(f"round {len(row.rounds_run) + 1} {run.status}: {run.error or '?'}")
    steps = run_steps(run)
    if row.samples_per_step is not None and steps.samples_per_step not in (
        None,
        row.samples_per_step,
    ):
        row.notes.append(
            f"round {len(row.rounds_run) + 1} trained {steps.samples_per_step} samples per step, "
            f"round 1 {row.samples_per_step}: its steps are left out"
        )
        return
    row.round_step_ms.append(steps.clean_ms)
    _pool(row)


def _samples(row: Row) -> RowSamples:
    return RowSamples([r for r in row.round_step_ms if r], row.samples_per_step)


def _pool(row: Row) -> None:
    """Step time and throughput from the clean steps of every round (a row without step data,
    e.g. from an older comparison.json, keeps its figures)."""
    if not row.round_step_ms:
        return
    samples = _samples(row)
    row.steps_measured = len(samples.pooled)
    row.step_time_ms = samples.mean_ms()
    independent = row.grad_sync in ("independent", "partial")
    rate = samples.rate() if row.samples_per_step is not None and not independent else None
    row.samples_per_s = rate


def observed_mode(rows: Sequence[Row]) -> tuple[str, str]:
    """``weak``, ``strong``, ``mixed`` or ``unknown``, and the batches that decided it: the
    global batch the same in every row is strong scaling (nanoGPT keeps its tokens per
    iteration), the per-device batch the same is weak scaling."""
    measured = [r for r in rows if r.grad_sync not in ("independent", "partial")]
    if len(measured) < 2:
        return "unknown", "one row: no scaling to read"
    if any(r.global_batch is None or r.batch_per_device is None for r in measured):
        return "unknown", "a row's batch per step was not seen"
    text = ", ".join(
        f"{row_name(r)} {r.global_batch} ({r.batch_per_device}/device)" for r in measured
    )
    if len({r.global_batch for r in measured}) == 1 and len({r.devices for r in measured}) > 1:
        return "strong", f"global batch the same in every row: {text}"
    if len({r.batch_per_device for r in measured}) == 1:
        return "weak", f"per-device batch the same in every row: {text}"
    if len({r.global_batch for r in measured}) == 1:
        return "strong", f"global batch the same in every row: {text}"
    return "mixed", f"neither the global nor the per-device batch is the same: {text}"


def row_name(row: Row) -> str:
    """``ddp`` or, with precision rows, ``ddp bf16``."""
    return row.strategy if row.precision is None else f"{row.strategy} {row.precision}"


def differences(rows: Sequence[Row]) -> list[str]:
    """What differs between rows besides the strategy and could explain a result."""
    out = []
    threads = {row_name(r): r.cpu_threads for r in rows if r.cpu_threads}
    if len(set(threads.values())) > 1:
        out.append(
            "CPU threads per process differ: " + ", ".join(f"{k} {v}" for k, v in threads.items())
        )
    per_device = {row_name(r): r.batch_per_device for r in rows if r.batch_per_device}
    if len(set(per_device.values())) > 1:
        out.append(
            "batch per device differs: " + ", ".join(f"{k} {v}" for k, v in per_device.items())
        )
    precision = {row_name(r): r.precision_setting for r in rows if r.precision_setting}
    if len(set(precision.values())) > 1:
        out.append("precision differs between rows (see the precision table)")
    return out


TRACE_AB_GAP_PP = 10.0
"""DESIGN.md's sanity anchor: on a CPU DDP run the trace's exposed-comm share and the no_sync
A/B's comm share measure the same thing; a larger gap is a defect to explain, not to hide."""


def _trace_vs_ab(row: Row) -> None:
    if row.exposed_comm_pct is None or row.ab_comm_pct is None:
        return
    gap = row.exposed_comm_pct - row.ab_comm_pct
    if abs(gap) > TRACE_AB_GAP_PP:
        row.notes.append(
            f"trace exposed comm {row.exposed_comm_pct:.1f}% and the sync A/B's "
            f"{row.ab_comm_pct:.1f}% differ by {abs(gap):.1f} pp (> {TRACE_AB_GAP_PP:g}): they "
            "should measure the same cost; the trace sees only its traced steps, the A/B only "
            "its own; a busy machine widens the gap (see docs/compare.md)"
        )


SUPERLINEAR_PCT = 110.0
"""Scaling efficiency above this is superlinear: the devices' added memory or cache can do
it, but far more often the baseline ran handicapped, so the rows say so."""


def _superlinear(row: Row, base: Row) -> str:
    text = (
        f"superlinear ({row.efficiency_pct:.0f} % efficiency): per device, the {base.strategy} "
        f"row ran slower than this row's ranks, so the speedup overstates what more devices buy"
    )
    if base.cpu_threads and row.cpu_threads and base.cpu_threads != row.cpu_threads:
        text += (
            f"; CPU threads per process differ: {base.strategy} {base.cpu_threads}, "
            f"{row.strategy} {row.cpu_threads} (set OMP_NUM_THREADS to compare alike)"
        )
    return text


def add_speedups(rows: Sequence[Row]) -> list[Interval]:
    """Speedup against the single-device row of the same precision, its 95 % interval, and
    efficiency = speedup / devices, in place; returns the intervals between every pair of rows
    with a throughput (what the verdict reads)."""
    for row in rows:
        _pool(row)
    named = {row_name(r): _samples(r) for r in rows if r.samples_per_s is not None}
    pairs = [(a, b) for a in named for b in named if a != b]
    found = {(i.a, i.b): i for i in rate_intervals(named, pairs)}
    for row in rows:
        base = next(
            (r for r in rows if r.strategy == "single" and r.precision == row.precision), None
        )
        base_thr = base.samples_per_s if base is not None else None
        if row.samples_per_s is None:
            continue
        if not base_thr or base is None:
            row.notes.append("no speedup: the single-device baseline has no throughput")
            continue
        row.speedup = row.samples_per_s / base_thr
        row.efficiency_pct = 100.0 * row.speedup / row.devices
        interval = found.get((row_name(row), row_name(base)))
        if interval is not None:
            row.speedup_low, row.speedup_high = interval.low, interval.high
        if row.efficiency_pct > SUPERLINEAR_PCT:
            row.notes.append(_superlinear(row, base))
    return [i for i in found.values() if i.a < i.b]


def analysis_rows(comp: Comparison) -> dict[str, Any]:
    """The table as ``analysis["comparison"]`` of each strategy's run.json, for the HTML report.

    ``efficiency`` is a fraction there and ``comm_share_pct`` is the A/B figure when measured,
    else the exposed share from the traces.
    """
    rows = []
    for r in comp.rows:
        plain = msgspec.to_builtins(r)
        plain["efficiency"] = None if r.efficiency_pct is None else r.efficiency_pct / 100.0
        plain["comm_share_pct"] = r.ab_comm_pct if r.ab_comm_pct is not None else r.exposed_comm_pct
        rows.append(plain)
    return {
        "comparison_id": comp.comparison_id,
        "mode": comp.mode,
        "verdict": comp.verdict,
        "rows": rows,
        "not_applicable": [msgspec.to_builtins(n) for n in comp.not_applicable],
    }


# --------------------------------------------------------------------------------------------
# comparison.json

_encoder = msgspec.json.Encoder()


def encode_comparison(comp: Comparison) -> bytes:
    return msgspec.json.format(_encoder.encode(comp), indent=1)


def read_comparison(path: str | Path) -> Comparison:
    """Load ``comparison.json`` (or the one in a comparison directory); one-line errors."""
    p = Path(path)
    if p.is_dir():
        p = p / COMPARISON_JSON
    data = read_regular(p, error=RunRecordError)
    try:
        comp = msgspec.json.decode(data, type=Comparison)
    except RecursionError:
        raise RunRecordError(f"{p} is nested too deeply to be an mgprof comparison.json") from None
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise RunRecordError(f"{p} is not an mgprof comparison.json: {exc}") from None
    if comp.schema_version > COMPARISON_VERSION:
        raise RunRecordError(
            f"{p} has schema_version {comp.schema_version}, newer than this mgprof understands; "
            "upgrade with 'pip install -U mgprof'"
        )
    return comp
