"""Figures for one saved run: step time, throughput, utilisation, MFU, energy, communication,
memory headroom, data loading, slow ranks and identical batches.

Pure: a ``RunRecord`` (and the trace files beside it) in, a plain JSON-ready dict out. Every figure
that cannot be computed is None with its reason in a ``not_applicable`` dict, and every figure's
definition is named in ``definitions``, so a report never shows a made-up number. Trace analysis
is delegated to ``mgprof.analyze.trace_summary``; its failures become reasons, never exceptions,
because a broken trace must not hide the figures the step timer and sampler did record.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec

from mgprof.analyze.readers import num as _float_or_none
from mgprof.analyze.stats import mean, percentile, ratio_pct, spread_pct
from mgprof.records import RankRecord, RunRecord, StepRecord

ANALYSIS_VERSION = 1
"""Version of the dict ``analyze_run`` returns (stored under ``run.json`` ``analysis``)."""

TraceAnalyzer = Callable[[Path], Any]
"""Turns one trace file into a summary (a msgspec Struct or a dict); raises on a bad trace."""

DEFINITIONS: dict[str, str] = {
    "steady_state_steps": (
        "the steps a figure is computed over: all recorded steps of a rank but the first (its "
        "warm-up: allocator growth, cuDNN autotuning, lazy init) when the rank has 3 or more "
        "steps, otherwise all of them"
    ),
    "step_time_ms": (
        "wall time of one step as the step timer measured it (CUDA events on GPU, perf_counter "
        "on CPU), over the steady-state steps: mean, p50, p95 (linear interpolation, numpy's "
        "default), min, max"
    ),
    "samples_per_s": (
        "per rank: sum of batch sizes / sum of step durations, over the steady-state steps "
        "whose batch size is known"
    ),
    "job_samples_per_s": (
        "sum over ranks of each rank's samples_per_s (each DDP rank trains on its own batches); "
        "for a single process (single device or DataParallel) that process's samples_per_s"
    ),
    "nvml_gpu_util_pct": (
        "mean of NVML's utilization.gpu over the sampling period: percent of sample periods in "
        "which at least one kernel ran; says nothing about how much of the GPU the kernel used"
    ),
    "trace_busy_pct": (
        "100 * |union of device events| / trace window (see the trace definitions); time-weighted "
        "over a rank's trace files"
    ),
    "mfu_pct": (
        "model FLOP utilisation: FLOPs counted in the trace (torch.profiler with_flops) / trace "
        "window / (devices used * peak dense FLOP/s of the device for the dtype); bf16/fp16 peak "
        "when autocast was seen, else fp32 (non-TF32) peak"
    ),
    "energy_j": (
        "NVML total energy counter difference over the sampling period, summed over devices"
    ),
    "energy_per_sample_j": (
        "energy_j / samples in all recorded steps; the sampling period also covers time outside "
        "the steps, so this is an upper bound"
    ),
    "comm_us": "time in communication (trace comm: NCCL kernels, or gloo/nccl ops on CPU traces)",
    "comm_overlap_us": "communication time overlapped by compute: |compute ∩ comm|",
    "exposed_comm_us": "communication time not overlapped by compute: comm - overlap",
    "comm_overlap_pct": "100 * overlap / comm (HTA's comp_comm_overlap)",
    "exposed_comm_pct": "100 * exposed comm / trace window",
    "busbw_gbps": (
        "collective bus bandwidth as nccl-tests defines it (algbw scaled by 2(n-1)/n for "
        "all-reduce, (n-1)/n for all-gather and reduce-scatter), from the trace engine"
    ),
    "headroom_mib": "device total memory - peak reserved by PyTorch's caching allocator",
    "headroom_pct": "100 * headroom_mib / device total memory",
    "dataloader_share_pct": (
        "100 * sum of time waiting on the DataLoader / sum of iteration time, over the "
        "steady-state steps whose DataLoader wait was timed; iteration time is the step time "
        "where the wait falls inside the step (prof.step() calls, mgprof analyze's automatic "
        "steps) and step time + wait for `with prof.step():` blocks, which exclude the wait"
    ),
    "slowest_rank": "the rank with the highest mean steady-state step time",
    "step_time_spread_pct": (
        "100 * (highest - lowest) / lowest of the ranks' mean steady-state step times"
    ),
    "identical_batches": (
        "true when, for every step index that all ranks fingerprinted, every rank's batch "
        "fingerprint is the same: the ranks train on the same data (no DistributedSampler?)"
    ),
}

_STEADY_STATE_MIN_STEPS = 3


# --------------------------------------------------------------------------------------------
# Result shapes (converted to plain dicts by ``analyze_run``)


class _Out(msgspec.Struct, kw_only=True):
    """Base for result records: keyword-only so field order never matters to callers."""


class StepTimeStats(_Out):
    """Summary of one rank's steady-state step times, in milliseconds."""

    count: int
    mean: float
    p50: float
    p95: float
    min: float
    max: float


class DeviceUtil(_Out):
    """One sampled device of a rank: NVML (or CPU sampler) means and energy."""

    device: str
    name: str | None = None
    gpu_util_pct: float | None = None
    cpu_pct: float | None = None
    energy_j: float | None = None


class CommFigures(_Out):
    """A rank's communication time from its traces, summed over trace files."""

    window_us: float
    comm_us: float
    comm_overlap_us: float
    exposed_comm_us: float
    comm_pct: float | None
    comm_overlap_pct: float | None
    exposed_comm_pct: float | None
    busbw_gbps: float | None = None
    collectives: dict[str, dict[str, Any]] = msgspec.field(default_factory=dict)


class MemoryFigures(_Out):
    """Peak memory of a rank and what was left of the device."""

    kind: str
    peak_allocated_mib: float | None = None
    peak_reserved_mib: float | None = None
    total_mib: float | None = None
    headroom_mib: float | None = None
    headroom_pct: float | None = None
    peak_rss_mib: float | None = None
    per_device: dict[str, dict[str, float | None]] = msgspec.field(default_factory=dict)


class RankAnalysis(_Out):
    """Every per-rank figure; None figures have their reason in ``not_applicable``."""

    rank: int
    host: str = ""
    device: str = "cpu"
    device_name: str | None = None
    devices_used: int = 1
    steps_total: int = 0
    steps_measured: int = 0
    step_time_ms: StepTimeStats | None = None
    samples_per_s: float | None = None
    sampler: str = "none"
    devices: list[DeviceUtil] = msgspec.field(default_factory=list)
    nvml_gpu_util_pct: float | None = None
    trace_busy_pct: float | None = None
    trace_files: list[str] = msgspec.field(default_factory=list)
    achieved_tflops: float | None = None
    peak_tflops: float | None = None
    peak_dtype: str | None = None
    mfu_pct: float | None = None
    energy_j: float | None = None
    energy_per_sample_j: float | None = None
    comm: CommFigures | None = None
    memory: MemoryFigures | None = None
    dataloader_share_pct: float | None = None
    not_applicable: dict[str, str] = msgspec.field(default_factory=dict)


class JobAnalysis(_Out):
    """Figures across ranks; None figures have their reason in ``not_applicable``."""

    strategy: str
    world_size: int
    ranks_reported: int
    missing_ranks: list[int] = msgspec.field(default_factory=list)
    samples_per_s: float | None = None
    energy_j: float | None = None
    energy_per_sample_j: float | None = None
    dataloader_share_pct: float | None = None
    slowest_rank: int | None = None
    slowest_mean_step_ms: float | None = None
    fastest_rank: int | None = None
    fastest_mean_step_ms: float | None = None
    step_time_spread_pct: float | None = None
    identical_batches: bool | None = None
    fingerprint_steps_compared: int = 0
    identical_batch_steps: list[int] = msgspec.field(default_factory=list)
    cpu_fallback: bool = False
    cpu_fallback_notice: str | None = None
    not_applicable: dict[str, str] = msgspec.field(default_factory=dict)


# --------------------------------------------------------------------------------------------
# Device peaks

# Peak dense (no structured sparsity) tensor FLOP/s in TFLOP/s from vendor datasheets; fp32 is
# plain FP32 (PyTorch does not use TF32 for matmuls by default). First matching pattern wins, so
# specific variants come before the family name. None: the device lacks that dtype.
_PEAKS_TFLOPS: tuple[tuple[str, dict[str, float | None]], ...] = (
    (r"\bH200 NVL\b", {"bf16": 835.0, "fp16": 835.0, "fp32": 60.0}),
    (r"\bH200\b", {"bf16": 989.0, "fp16": 989.0, "fp32": 67.0}),
    (r"\bH100 PCIe\b", {"bf16": 756.0, "fp16": 756.0, "fp32": 51.0}),
    (r"\bH100 NVL\b", {"bf16": 835.0, "fp16": 835.0, "fp32": 60.0}),
    (r"\bH100\b", {"bf16": 989.0, "fp16": 989.0, "fp32": 67.0}),  # SXM ("H100 80GB HBM3")
    (r"\bA100\b", {"bf16": 312.0, "fp16": 312.0, "fp32": 19.5}),
    (r"\bL40S\b", {"bf16": 362.0, "fp16": 362.0, "fp32": 91.6}),
    (r"\bL4\b", {"bf16": 121.0, "fp16": 121.0, "fp32": 30.3}),
    (r"\bA10\b", {"bf16": 125.0, "fp16": 125.0, "fp32": 31.2}),
    (r"\bV100S\b", {"bf16": None, "fp16": 130.0, "fp32": 16.4}),
    (r"\bV100-PCIE\b", {"bf16": None, "fp16": 112.0, "fp32": 14.0}),
    (r"\bV100\b", {"bf16": None, "fp16": 125.0, "fp32": 15.7}),
    (r"\bT4\b", {"bf16": None, "fp16": 65.0, "fp32": 8.1}),
    (r"\bRTX 4090\b", {"bf16": 165.2, "fp16": 165.2, "fp32": 82.6}),
    (r"\bRTX 3090\b", {"bf16": 71.0, "fp16": 71.0, "fp32": 35.6}),
)


def device_peak_tflops(device_name: str | None, dtype: str) -> float | None:
    """Peak dense TFLOP/s of a device for ``dtype`` (bf16, fp16, fp32), None when not known."""
    if not device_name:
        return None
    for pattern, peaks in _PEAKS_TFLOPS:
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            return peaks.get(dtype)
    return None


# --------------------------------------------------------------------------------------------
# Steps


def steady_state_steps(steps: Sequence[StepRecord]) -> list[StepRecord]:
    """All steps but the first (warm-up) when there are at least three; all of them otherwise."""
    ordered = sorted(steps, key=lambda s: s.index)
    if len(ordered) >= _STEADY_STATE_MIN_STEPS:
        return ordered[1:]
    return ordered


def step_time_stats(durations_ms: Sequence[float]) -> StepTimeStats:
    """mean/p50/p95/min/max of step durations (ms); ``durations_ms`` must not be empty."""
    return StepTimeStats(
        count=len(durations_ms),
        mean=mean(durations_ms),
        p50=percentile(durations_ms, 50.0),
        p95=percentile(durations_ms, 95.0),
        min=min(durations_ms),
        max=max(durations_ms),
    )


def _throughput(steps: Sequence[StepRecord]) -> tuple[float | None, str]:
    """Samples per second over steps with a known batch size, or None and the reason."""
    sized = [s for s in steps if s.batch_size is not None]
    if not sized:
        return None, "no batch sizes recorded (pass batch_size= to prof.step())"
    seconds = sum(s.duration_ms for s in sized) / 1000.0
    if seconds <= 0.0:
        return None, "the steps with a batch size took no measurable time"
    return sum(s.batch_size or 0 for s in sized) / seconds, ""


def _dataloader_totals(rank: RankRecord, steps: Sequence[StepRecord]) -> tuple[float, float]:
    """(sum of DataLoader wait, sum of iteration time) in ms over the steps whose wait was timed.

    A ``with prof.step():`` block starts after the next batch was fetched, so its wait lies
    outside the step and is added to it; in the other forms the wait is part of the step.
    """
    timed = [s for s in steps if s.dataloader_ms is not None]
    wait = sum(s.dataloader_ms or 0.0 for s in timed)
    busy = sum(s.duration_ms for s in timed)
    return wait, busy + wait if rank.step_form == "with" else busy


# --------------------------------------------------------------------------------------------
# Sampler, memory


def _column_mean(dev: Any, column: str) -> float | None:
    """Mean of a sampler column from the summary, or from the raw column when not summarised."""
    value = dev.summary.get(f"{column}_mean")
    if value is not None:
        return float(value)
    raw = [float(v) for v in dev.columns.get(column, []) if v is not None]
    return mean(raw) if raw else None


def _sampler_figures(rank: RankRecord, out: RankAnalysis) -> None:
    """Fill per-device utilisation and energy from the sampler, with reasons when absent."""
    sampler = rank.sampler
    out.sampler = sampler.kind
    why_not_nvml = {
        "cpu": f"no NVML on this rank; the CPU sampler ran ({sampler.reason or 'no reason given'})",
        "none": f"no sampler ran on this rank ({sampler.reason or 'sampling was off'})",
    }.get(sampler.kind)
    for dev in sampler.devices:
        out.devices.append(
            DeviceUtil(
                device=dev.device,
                name=dev.facts.get("name") if isinstance(dev.facts.get("name"), str) else None,
                gpu_util_pct=_column_mean(dev, "gpu_util_pct") if sampler.kind == "nvml" else None,
                cpu_pct=_column_mean(dev, "cpu_pct") if sampler.kind == "cpu" else None,
                energy_j=_float_or_none(dev.summary.get("energy_j")),
            )
        )
    if why_not_nvml is not None:
        out.not_applicable["nvml_gpu_util_pct"] = why_not_nvml
        out.not_applicable["energy_j"] = why_not_nvml
        return
    if not out.devices:
        out.not_applicable["nvml_gpu_util_pct"] = "the NVML sampler recorded no device"
        out.not_applicable["energy_j"] = "the NVML sampler recorded no device"
        return
    utils = [d.gpu_util_pct for d in out.devices if d.gpu_util_pct is not None]
    if utils:
        out.nvml_gpu_util_pct = mean(utils)
    else:
        out.not_applicable["nvml_gpu_util_pct"] = "NVML returned no utilisation samples"
    energies = [d.energy_j for d in out.devices]
    if all(e is not None for e in energies):
        out.energy_j = sum(e or 0.0 for e in energies)
    else:
        out.not_applicable["energy_j"] = (
            "NVML total energy counter not supported on this device (needs Volta or newer)"
        )


def _memory_figures(rank: RankRecord, out: RankAnalysis) -> None:
    """Peak memory and headroom (device total − peak reserved) of a rank."""
    mem = rank.memory
    if mem is None:
        out.not_applicable["memory"] = "no memory record on this rank"
        out.not_applicable["headroom_pct"] = "no memory record on this rank"
        return
    figures = MemoryFigures(
        kind=mem.kind,
        peak_allocated_mib=mem.peak_allocated_mib,
        peak_reserved_mib=mem.peak_reserved_mib,
        total_mib=mem.total_mib if mem.total_mib is not None else rank.device.total_memory_mib,
        peak_rss_mib=mem.peak_rss_mib,
    )
    for name, peaks in mem.per_device.items():
        row = dict(peaks)
        total, reserved = row.get("total_mib"), row.get("peak_reserved_mib")
        if total is not None and reserved is not None and total > 0:
            row["headroom_mib"] = total - reserved
            row["headroom_pct"] = 100.0 * (total - reserved) / total
        figures.per_device[name] = row
    out.memory = figures
    cpu_only = "CPU run: no CUDA caching allocator"
    for key in ("peak_allocated_mib", "peak_reserved_mib", "total_mib", "peak_rss_mib"):
        if getattr(figures, key) is None:
            out.not_applicable[key] = (
                cpu_only
                if mem.kind != "cuda" and key != "peak_rss_mib"
                else f"{key} not recorded on this rank"
            )
    if mem.kind != "cuda":
        out.not_applicable["headroom_pct"] = (
            "CPU run: device memory headroom does not apply (peak RSS shown instead)"
        )
    elif figures.peak_reserved_mib is None or figures.total_mib is None or figures.total_mib <= 0:
        out.not_applicable["headroom_pct"] = "peak reserved or device total memory not recorded"
    else:
        figures.headroom_mib = figures.total_mib - figures.peak_reserved_mib
        figures.headroom_pct = 100.0 * figures.headroom_mib / figures.total_mib


# --------------------------------------------------------------------------------------------
# Traces


_DROPPED_TRACE_FIELDS = ("collective_calls",)
"""Per-call lists: raw data, not figures; they would bloat run.json (re-run ``mgprof trace``)."""


def _as_dict(summary: Any) -> dict[str, Any]:
    plain = summary if isinstance(summary, dict) else msgspec.to_builtins(summary)
    if not isinstance(plain, dict):
        raise TypeError(f"trace summary is a {type(plain).__name__}, not a mapping")
    return {k: v for k, v in plain.items() if k not in _DROPPED_TRACE_FIELDS}


def _resolve_trace(run_dir: Path, rel: str) -> Path | None:
    """The trace path inside the run directory; None for a path that escapes it (run.json is
    untrusted). Lexical, so a trace symlinked into the run directory is still accepted."""
    base = Path(os.path.abspath(run_dir))
    path = Path(os.path.normpath(base / rel))
    if path != base and base not in path.parents:
        return None
    return path


class _Traces:
    """Trace summaries per rank, why a rank has none, and the cross-rank summary."""

    def __init__(self) -> None:
        self.per_rank: dict[int, list[dict[str, Any]]] = {}
        self.reasons: dict[int, str] = {}
        self.job: dict[str, Any] | None = None
        self.warnings: list[str] = []


def _trace_files(
    run: RunRecord, run_dir: Path | None, traces: _Traces
) -> list[tuple[int, str, Path]]:
    """(rank, name in run.json, resolved path) of every trace file that can be read."""
    files: list[tuple[int, str, Path]] = []
    for rec in run.ranks:
        if not rec.traces:
            traces.reasons[rec.rank] = (
                "no trace recorded on this rank (the torch.profiler window was off)"
            )
            continue
        if run_dir is None:
            traces.reasons[rec.rank] = "run directory not given: the trace files cannot be located"
            continue
        found = 0
        for rel in rec.traces:
            path = _resolve_trace(run_dir, rel)
            if path is None:
                traces.warnings.append(f"rank {rec.rank}: trace {rel} is outside the run directory")
            elif not path.is_file():
                traces.warnings.append(f"rank {rec.rank}: trace {rel} is missing from {run_dir}")
            else:
                files.append((rec.rank, rel, path))
                found += 1
        if not found:
            traces.reasons[rec.rank] = "trace files listed in run.json are missing or unreadable"
    return files


def _engine_summaries(
    files: Sequence[tuple[int, str, Path]], traces: _Traces
) -> dict[Path, dict[str, Any]] | None:
    """All files through the trace engine's ``analyze_job`` (one pass, cross-rank matching).

    None when the job as a whole fails (one bad file fails it): the caller then goes file by
    file so the good traces still count.
    """
    from mgprof.analyze.trace_summary import analyze_job

    try:
        job = _as_dict(analyze_job([path for _, _, path in files]))
    except Exception as exc:  # the per-file pass reports each file's own error
        traces.warnings.append(f"job trace summary not computed: {type(exc).__name__}: {exc}")
        return None
    by_path: dict[Path, dict[str, Any]] = {}
    for summary in job.pop("ranks", []):
        if isinstance(summary, dict) and isinstance(summary.get("source"), str):
            by_path[Path(os.path.abspath(summary["source"]))] = _as_dict(summary)
    traces.job = job if len(files) > 1 else None
    return by_path


def _analyze_traces(
    run: RunRecord, run_dir: Path | None, analyzer: TraceAnalyzer | None
) -> _Traces:
    """Run the trace engine over every rank's trace files; failures become reasons."""
    traces = _Traces()
    files = _trace_files(run, run_dir, traces)
    if not files:
        return traces
    by_path: dict[Path, dict[str, Any]] | None = None
    if analyzer is None:
        # Imported here: the trace engine is a sibling module and this keeps the run analysis
        # usable (trace figures marked not applicable) in a build that lacks it.
        try:
            from mgprof.analyze.trace_summary import analyze_trace_file
        except ImportError as exc:
            for rank, _, _ in files:
                traces.reasons[rank] = f"trace engine not available ({exc})"
            return traces
        analyzer = analyze_trace_file
        by_path = _engine_summaries(files, traces)
    failures: dict[int, list[str]] = {}
    for rank, rel, path in files:
        summary = by_path.get(path) if by_path is not None else None
        if summary is None:
            try:
                summary = _as_dict(analyzer(path))
            except Exception as exc:  # a broken trace must not hide the other figures
                failures.setdefault(rank, []).append(f"{rel}: {type(exc).__name__}: {exc}")
                continue
        traces.per_rank.setdefault(rank, []).append(summary)
    for rank, msgs in failures.items():
        traces.warnings.extend(f"rank {rank}: trace not analysed: {m}" for m in msgs)
        if rank not in traces.per_rank:
            traces.reasons[rank] = "trace analysis failed: " + "; ".join(msgs)
    return traces


def _totals(summary: dict[str, Any]) -> dict[str, Any]:
    totals = summary.get("totals")
    return totals if isinstance(totals, dict) else {}


def _weighted_pct(summaries: Sequence[dict[str, Any]], key: str) -> tuple[float | None, float]:
    """Time-weighted percentage across trace files, and the summed window (µs)."""
    num = 0.0
    window = 0.0
    for s in summaries:
        t = _totals(s)
        w, pct = _float_or_none(t.get("window_us")), _float_or_none(t.get(key))
        if w is None or pct is None or w <= 0.0:
            continue
        num += pct * w
        window += w
    return (num / window if window > 0.0 else None), window


def _trace_reason(summaries: Sequence[dict[str, Any]], key: str, default: str) -> str:
    """The trace engine's own reason for a missing figure, when it gave one."""
    for s in summaries:
        na = s.get("not_applicable")
        if isinstance(na, dict) and isinstance(na.get(key), str):
            return str(na[key])
    return default


def _merge_collectives(summaries: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per collective type across trace files: counts, times and bytes add; bandwidths are
    time-weighted means (a bandwidth is a rate, so summing it would be meaningless)."""
    merged: dict[str, dict[str, Any]] = {}
    weights: dict[tuple[str, str], float] = {}
    for s in summaries:
        raw = s.get("collectives")
        items: list[tuple[str, Any]]
        if isinstance(raw, dict):
            items = list(raw.items())
        elif isinstance(raw, list):
            items = [
                (str(c.get("type", c.get("name", "?"))), c) for c in raw if isinstance(c, dict)
            ]
        else:
            continue
        for ctype, fields in items:
            if isinstance(fields, dict):
                _merge_collective(merged.setdefault(ctype, {}), fields, ctype, weights)
    return merged


def _merge_collective(
    row: dict[str, Any],
    fields: dict[str, Any],
    ctype: str,
    weights: dict[tuple[str, str], float],
) -> None:
    """Fold one trace file's figures for one collective type into the running ``row``."""
    time_us = _float_or_none(fields.get("total_us")) or 0.0
    for name, value in fields.items():
        num = _float_or_none(value)
        if num is not None and "bw" in name:
            acc = weights.get((ctype, name), 0.0)
            total = acc + time_us
            prev_bw = _float_or_none(row.get(name)) or 0.0
            row[name] = (prev_bw * acc + num * time_us) / total if total > 0 else num
            weights[(ctype, name)] = total
        elif name in _ADDITIVE or name.endswith("_us"):
            prev = row.get(name)
            # A total is only a total when every file has it: one unknown makes it unknown.
            row[name] = (
                None
                if num is None or (name in row and _float_or_none(prev) is None)
                else (prev or 0) + value
            )
        else:
            row.setdefault(name, value)


_ADDITIVE = frozenset({"count", "bytes"})


def _busbw(collectives: dict[str, dict[str, Any]]) -> float | None:
    """Time-weighted bus bandwidth (GB/s) over all collective types that report one."""
    num = 0.0
    den = 0.0
    for fields in collectives.values():
        bw = next(
            (_float_or_none(v) for k, v in fields.items() if k.startswith("busbw")),
            None,
        )
        t = _float_or_none(fields.get("total_us"))
        if bw is not None and t is not None and t > 0:
            num += bw * t
            den += t
    return num / den if den > 0 else None


def _comm_figures(summaries: Sequence[dict[str, Any]]) -> CommFigures | None:
    """Communication time of a rank from the trace totals (pct × window, summed over files)."""
    window = comm = exposed = 0.0
    for s in summaries:
        t = _totals(s)
        w = _float_or_none(t.get("window_us"))
        c_pct = _float_or_none(t.get("comm_pct"))
        e_pct = _float_or_none(t.get("exposed_comm_pct"))
        if w is None or c_pct is None:
            continue
        window += w
        # The engine's µs figures when it gives them, else its percentages of the window.
        c_us = _float_or_none(t.get("comm_us"))
        e_us = _float_or_none(t.get("exposed_comm_us"))
        comm += c_us if c_us is not None else c_pct * w / 100.0
        if e_us is not None:
            exposed += e_us
        else:
            exposed += (e_pct if e_pct is not None else c_pct) * w / 100.0
    if window <= 0.0:
        return None
    collectives = _merge_collectives(summaries)
    return CommFigures(
        window_us=window,
        comm_us=comm,
        comm_overlap_us=comm - exposed,
        exposed_comm_us=exposed,
        comm_pct=ratio_pct(comm, window),
        comm_overlap_pct=ratio_pct(comm - exposed, comm),
        exposed_comm_pct=ratio_pct(exposed, window),
        busbw_gbps=_busbw(collectives),
        collectives=collectives,
    )


def _trace_flops(summary: dict[str, Any]) -> float | None:
    """Total FLOPs the trace counted (ops recorded with_flops), whatever nesting the engine uses."""
    flops = summary.get("flops")
    if isinstance(flops, dict):
        for key in ("total_flops", "total", "flops"):
            value = _float_or_none(flops.get(key))
            if value is not None:
                return value
        return None
    return _float_or_none(flops)


def _trace_figures(rank: RankRecord, summaries: list[dict[str, Any]], out: RankAnalysis) -> None:
    """Busy %, communication and MFU of a rank from its trace summaries."""
    out.trace_busy_pct, window_us = _weighted_pct(summaries, "busy_pct")
    if out.trace_busy_pct is None:
        out.not_applicable["trace_busy_pct"] = _trace_reason(
            summaries, "busy_pct", "the trace has no time window"
        )
    out.comm = _comm_figures(summaries)
    if out.comm is None:
        out.not_applicable["comm"] = _trace_reason(
            summaries, "comm_pct", "the trace engine reported no communication figures"
        )
    else:
        if out.comm.comm_overlap_pct is None:
            out.not_applicable["comm_overlap_pct"] = "no communication in the trace"
        if out.comm.busbw_gbps is None:
            out.not_applicable["busbw_gbps"] = "no collective in the trace reports a bus bandwidth"
    _mfu(rank, summaries, window_us, out)


def _mfu(
    rank: RankRecord, summaries: Sequence[dict[str, Any]], window_us: float, out: RankAnalysis
) -> None:
    """Achieved TFLOP/s from the trace's FLOP count over its window, against the device peak."""
    if rank.device.kind != "cuda":
        out.not_applicable["mfu_pct"] = "CPU device: no peak FLOP/s to compare against"
        return
    counts = [_trace_flops(s) for s in summaries]
    if not any(c is not None for c in counts):
        out.not_applicable["mfu_pct"] = _trace_reason(
            summaries, "flops", "the trace has no FLOP counts (profile with with_flops=True)"
        )
        return
    if window_us <= 0.0:
        out.not_applicable["mfu_pct"] = "the trace has no time window"
        return
    dtype = "fp32"
    if rank.training.autocast_used:
        dtype = "bf16" if device_peak_tflops(out.device_name, "bf16") is not None else "fp16"
    peak = device_peak_tflops(out.device_name, dtype)
    out.achieved_tflops = sum(c or 0.0 for c in counts) / (window_us * 1e-6) / 1e12
    if peak is None:
        out.not_applicable["mfu_pct"] = (
            f"peak {dtype} FLOP/s of {out.device_name or 'this device'} is not in mgprof's table"
        )
        return
    out.peak_dtype = dtype
    out.peak_tflops = peak * max(rank.devices_used, 1)
    out.mfu_pct = 100.0 * out.achieved_tflops / out.peak_tflops


# --------------------------------------------------------------------------------------------
# Per rank


def _device_label(rank: RankRecord) -> str:
    dev = rank.device
    return dev.kind if dev.index is None else f"{dev.kind}:{dev.index}"


def _analyze_rank(rank: RankRecord, traces: _Traces) -> RankAnalysis:
    sampler_name = next(
        (d.facts["name"] for d in rank.sampler.devices if isinstance(d.facts.get("name"), str)),
        None,
    )
    out = RankAnalysis(
        rank=rank.rank,
        host=rank.host,
        device=_device_label(rank),
        device_name=rank.device.name or sampler_name,
        devices_used=rank.devices_used,
        steps_total=len(rank.steps),
        trace_files=list(rank.traces),
    )
    na = out.not_applicable
    steady = steady_state_steps(rank.steps)
    out.steps_measured = len(steady)
    if steady:
        out.step_time_ms = step_time_stats([s.duration_ms for s in steady])
        out.samples_per_s, why = _throughput(steady)
        if out.samples_per_s is None:
            na["samples_per_s"] = why
        dl, dur = _dataloader_totals(rank, steady)
        out.dataloader_share_pct = ratio_pct(dl, dur)
        if out.dataloader_share_pct is None:
            na["dataloader_share_pct"] = "DataLoader wait was not timed on this rank"
    else:
        why = "no steps recorded on this rank (call prof.step() once per iteration)"
        for key in ("step_time_ms", "samples_per_s", "dataloader_share_pct"):
            na[key] = why

    _sampler_figures(rank, out)
    _energy_per_sample(rank, out)
    _memory_figures(rank, out)

    summaries = traces.per_rank.get(rank.rank)
    if summaries:
        _trace_figures(rank, summaries, out)
    else:
        why_no_trace = traces.reasons.get(rank.rank, "no trace summary for this rank")
        for key in ("trace_busy_pct", "mfu_pct", "comm"):
            na[key] = why_no_trace
    return out


def _energy_per_sample(rank: RankRecord, out: RankAnalysis) -> None:
    if out.energy_j is None:
        out.not_applicable["energy_per_sample_j"] = out.not_applicable.get(
            "energy_j", "no energy reading"
        )
        return
    if not rank.steps or any(s.batch_size is None for s in rank.steps):
        out.not_applicable["energy_per_sample_j"] = (
            "batch size not recorded for every step, so the samples the energy paid for are unknown"
        )
        return
    samples = sum(s.batch_size or 0 for s in rank.steps)
    if samples <= 0:
        out.not_applicable["energy_per_sample_j"] = "no samples processed"
        return
    out.energy_per_sample_j = out.energy_j / samples


# --------------------------------------------------------------------------------------------
# Job


def _job_throughput(run: RunRecord, ranks: Sequence[RankAnalysis], job: JobAnalysis) -> None:
    missing = sorted(set(job.missing_ranks))
    if missing or len(ranks) < run.world_size:
        job.not_applicable["samples_per_s"] = (
            f"ranks {missing or 'some'} did not report; a job total would undercount"
        )
        return
    lacking = [r for r in ranks if r.samples_per_s is None]
    if not ranks or lacking:
        first = lacking[0] if lacking else None
        job.not_applicable["samples_per_s"] = (
            f"rank {first.rank}: {first.not_applicable.get('samples_per_s', 'no throughput')}"
            if first
            else "no rank reported"
        )
        return
    job.samples_per_s = sum(r.samples_per_s or 0.0 for r in ranks)


def _job_energy(run: RunRecord, ranks: Sequence[RankAnalysis], job: JobAnalysis) -> None:
    lacking = [r for r in ranks if r.energy_j is None]
    if not ranks or lacking:
        reason = lacking[0].not_applicable.get("energy_j", "no energy") if lacking else "no rank"
        job.not_applicable["energy_j"] = reason
        job.not_applicable["energy_per_sample_j"] = reason
        return
    # Ranks on one node may sample the same GPU: count each device (by NVML uuid) once.
    seen: set[str] = set()
    energy = 0.0
    for rec in run.ranks:
        for dev in rec.sampler.devices:
            uuid = dev.facts.get("uuid")
            if isinstance(uuid, str):
                if uuid in seen:
                    continue
                seen.add(uuid)
            energy += _float_or_none(dev.summary.get("energy_j")) or 0.0
    job.energy_j = energy
    if any(r.energy_per_sample_j is None for r in ranks):
        job.not_applicable["energy_per_sample_j"] = (
            "batch size not recorded for every step on every rank"
        )
        return
    samples = sum(s.batch_size or 0 for rec in run.ranks for s in rec.steps)
    job.energy_per_sample_j = energy / samples


def _job_dataloader(run: RunRecord, job: JobAnalysis) -> None:
    dl = dur = 0.0
    for rec in run.ranks:
        d, t = _dataloader_totals(rec, steady_state_steps(rec.steps))
        dl += d
        dur += t
    job.dataloader_share_pct = ratio_pct(dl, dur)
    if job.dataloader_share_pct is None:
        job.not_applicable["dataloader_share_pct"] = "DataLoader wait was not timed on any rank"


def _job_slowest(ranks: Sequence[RankAnalysis], job: JobAnalysis) -> None:
    timed = [(r.step_time_ms.mean, r.rank) for r in ranks if r.step_time_ms is not None]
    if len(timed) < 2:
        why = "fewer than two ranks with step times: nothing to compare"
        job.not_applicable["slowest_rank"] = why
        job.not_applicable["step_time_spread_pct"] = why
        return
    slow_ms, slow_rank = max(timed)
    fast_ms, fast_rank = min(timed)
    job.slowest_rank, job.slowest_mean_step_ms = slow_rank, slow_ms
    job.fastest_rank, job.fastest_mean_step_ms = fast_rank, fast_ms
    job.step_time_spread_pct = spread_pct([t for t, _ in timed])
    if job.step_time_spread_pct is None:
        job.not_applicable["step_time_spread_pct"] = "the fastest rank's mean step time is zero"


def _job_identical_batches(run: RunRecord, job: JobAnalysis) -> None:
    if len(run.ranks) < 2:
        job.not_applicable["identical_batches"] = (
            "one process: nothing to compare across ranks (DataParallel splits each batch itself)"
        )
        return
    by_rank = [
        {s.index: s.fingerprint for s in rec.steps if s.fingerprint is not None}
        for rec in run.ranks
    ]
    common = set.intersection(*(set(fp) for fp in by_rank))
    if not common:
        job.not_applicable["identical_batches"] = (
            "no step index has a batch fingerprint on every rank"
        )
        return
    job.fingerprint_steps_compared = len(common)
    job.identical_batch_steps = sorted(i for i in common if len({fp[i] for fp in by_rank}) == 1)
    job.identical_batches = len(job.identical_batch_steps) == len(common)


def _cpu_fallback(run: RunRecord, job: JobAnalysis) -> None:
    job.cpu_fallback = run.cpu_fallback
    if run.cpu_fallback:
        reason = run.cpu_fallback_reason or "no CUDA device was available"
        job.cpu_fallback_notice = (
            f"This run used the CPU, not GPUs: {reason}. It proves the wiring (ranks, gloo "
            "communication, step timing), not GPU performance: NVML utilisation, MFU, energy "
            "and CUDA memory figures do not apply."
        )


# --------------------------------------------------------------------------------------------
# Entry point


def analyze_run(
    run: RunRecord,
    run_dir: Path | None,
    *,
    trace_analyzer: TraceAnalyzer | None = None,
) -> dict[str, Any]:
    """All run figures as a plain, JSON-ready dict (see ``docs/reports.md`` for its layout).

    ``run_dir`` locates the trace files named in each rank record; without it the trace figures
    are not applicable. ``trace_analyzer`` replaces the trace engine (tests, other engines).
    Never raises for bad or missing data: such figures are None with a reason.
    """
    traces = _analyze_traces(run, run_dir, trace_analyzer)
    ranks = [_analyze_rank(rec, traces) for rec in sorted(run.ranks, key=lambda r: r.rank)]
    job = JobAnalysis(
        strategy=run.strategy,
        world_size=run.world_size,
        ranks_reported=len(run.ranks),
        missing_ranks=sorted(run.missing_ranks),
    )
    _job_throughput(run, ranks, job)
    _job_energy(run, ranks, job)
    _job_dataloader(run, job)
    _job_slowest(ranks, job)
    _job_identical_batches(run, job)
    _cpu_fallback(run, job)
    return {
        "version": ANALYSIS_VERSION,
        "ranks": [msgspec.to_builtins(r) for r in ranks],
        "job": msgspec.to_builtins(job),
        "traces": {
            "ranks": {str(rank): summaries for rank, summaries in sorted(traces.per_rank.items())},
            "job": traces.job,
        },
        "definitions": dict(DEFINITIONS),
        "warnings": traces.warnings,
    }
