"""Single vs DataParallel vs DDP, measured: the rows of ``mgprof compare`` and its verdict.

Pure: each strategy's ``RunRecord`` and analysis dict (plus its A/B result) in, a ``Comparison``
out. Speedup is throughput(strategy) / throughput(single) — samples per second, so weak and
strong scaling are judged by the same rule (with a fixed global batch it equals the step-time
ratio) — and scaling efficiency is speedup / devices.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import msgspec

from mgprof.analyze.readers import num as _num
from mgprof.analyze.run.grad_sync import INDEPENDENT_LABEL
from mgprof.analyze.run.precision import LossCheck
from mgprof.analyze.run.steps import usual_batch_sizes
from mgprof.errors import RunRecordError
from mgprof.records import RunRecord
from mgprof.safe_read import read_regular

COMPARISON_VERSION = 1
COMPARISON_JSON = "comparison.json"

DEFINITIONS: dict[str, str] = {
    "step_time_ms": (
        "the slowest rank's mean steady-state step time (a DDP step ends when every rank is done)"
    ),
    "samples_per_s": "job throughput: sum over ranks of samples / step time (run analysis)",
    "speedup": "samples_per_s(strategy) / samples_per_s(single)",
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
    mode: Literal["weak", "strong"] = "weak"
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
        return {"single": (batch, batch), "ddp": (batch, batch), "dp": (batch * devices, batch)}
    if batch % devices:
        raise ValueError(
            f"--global-batch {batch} does not divide over {devices} devices; pick a multiple "
            f"of {devices}"
        )
    share = batch // devices
    return {"single": (batch, batch), "ddp": (share, share), "dp": (batch, share)}


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
    """One strategy's row from its run record, its analysis and (DDP) its A/B result.

    ``expected_batch`` is the batch each process was asked to draw (None: not controlled).
    """
    ranks = [r for r in analysis.get("ranks", []) if isinstance(r, Mapping)]
    job = analysis.get("job") if isinstance(analysis.get("job"), Mapping) else {}
    assert isinstance(job, Mapping)
    row = Row(strategy=strategy, devices=_devices(run), run=run_name, status=run.status)
    threads = [r.training.cpu_threads for r in run.ranks if r.training.cpu_threads]
    row.cpu_threads = max(threads) if threads else None
    if run.status != "complete":
        row.notes.append(f"run {run.status}: {run.error or 'no error recorded'}")
    usual = usual_batch_sizes(run)
    if usual:
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
    times = [
        _num(r["step_time_ms"].get("mean"))
        for r in ranks
        if isinstance(r.get("step_time_ms"), Mapping)
    ]
    known = [t for t in times if t is not None]
    row.step_time_ms = max(known) if known else None
    sync = job.get("grad_sync")
    if isinstance(sync, Mapping) and isinstance(sync.get("status"), str):
        row.grad_sync = sync["status"]
        if sync["status"] in ("independent", "partial"):
            row.notes.append(
                f"{INDEPENDENT_LABEL}: {sync.get('detail', '')}; no speedup or efficiency for "
                "this row (run without --no-auto-wrap, or wrap the model in the script)"
            )
    row.samples_per_s = _num(job.get("samples_per_s"))
    if row.samples_per_s is None:
        na = job.get("not_applicable")
        why = na.get("samples_per_s") if isinstance(na, Mapping) else None
        row.notes.append(f"throughput not measured: {why or 'unknown reason'}")
    _comm(row, ranks)
    _ab(row, ab, ab_asked)
    _trace_vs_ab(row)
    _memory(row, ranks)
    return row


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


def add_speedups(rows: Sequence[Row]) -> None:
    """Speedup against the single-device row of the same precision and efficiency = speedup /
    devices, in place."""
    for row in rows:
        base = next(
            (r for r in rows if r.strategy == "single" and r.precision == row.precision), None
        )
        base_thr = base.samples_per_s if base is not None else None
        if row.samples_per_s is None:
            continue
        if not base_thr:
            row.notes.append("no speedup: the single-device baseline has no throughput")
            continue
        row.speedup = row.samples_per_s / base_thr
        row.efficiency_pct = 100.0 * row.speedup / row.devices
        if base is not None and row.efficiency_pct > SUPERLINEAR_PCT:
            row.notes.append(_superlinear(row, base))


# --------------------------------------------------------------------------------------------
# Verdict


def verdict(rows: Sequence[Row], cpu_fallback: bool, mode: str) -> str:
    """One honest line: the best measured strategy and the figure that makes it best."""
    measured = [r for r in rows if r.samples_per_s is not None]
    if not measured:
        return "no verdict: no strategy produced a throughput figure (see the notes)"
    best = max(measured, key=lambda r: r.samples_per_s or 0.0)
    scale = "per-device batch fixed" if mode == "weak" else "global batch fixed"
    if best.strategy == "single" or best.speedup is None:
        others = [r for r in measured if r is not best and r.speedup is not None]
        text = f"best: {best.strategy} ({best.samples_per_s:.1f} samples/s)"
        if others:
            worst = ", ".join(
                f"{r.strategy} on {r.devices} devices reached {r.speedup:.2f}x" for r in others
            )
            text += f": {worst} ({scale}), so more devices did not pay off"
        if cpu_fallback:
            text += (
                "; these are CPU ranks over gloo sharing this machine's cores, which says "
                "nothing about GPUs"
            )
        return text
    text = (
        f"best: {best.strategy} — {best.speedup:.2f}x single's throughput on {best.devices} "
        f"devices ({best.efficiency_pct:.0f}% scaling efficiency, {scale})"
    )
    comm = best.ab_comm_pct if best.ab_comm_pct is not None else best.exposed_comm_pct
    if comm is not None:
        source = "sync A/B" if best.ab_comm_pct is not None else "exposed, from traces"
        text += f"; communication costs {comm:.0f}% of a step ({source})"
    if best.efficiency_pct is not None and best.efficiency_pct < 70.0:
        text += "; efficiency below 70%: communication or input loading limits scaling"
    if best.efficiency_pct is not None and best.efficiency_pct > SUPERLINEAR_PCT:
        text += (
            "; efficiency above 100%: the single-device row ran slower per device than these "
            "ranks (see its notes), so treat the speedup with care"
        )
    if cpu_fallback:
        text += "; measured on CPU ranks over gloo, not GPUs"
    return text


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
