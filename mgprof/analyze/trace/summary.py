"""The public trace-analysis API: one rank's file → :class:`RankTraceSummary`, a folder → a job.

Results are msgspec Structs (``msgspec.to_builtins`` turns them into JSON-ready dicts). Every
figure that does not apply is None and ``not_applicable`` gives the reason; ``definitions`` names
the definition of each figure so it can be set beside HTA's or the TensorBoard plugin's.
Ranks are analysed one at a time (or one per worker process), and each worker returns only its
summary, so memory stays bounded by one rank's trace per process.

This module holds the per-rank summary; the health block is in
:mod:`mgprof.analyze.tracefile.health`, and the job level (finding a folder's traces,
``analyze_job``, ``JobTraceSummary``) is in :mod:`mgprof.analyze.trace.job`, which imports this
module.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np
from msgspec import UNSET, UnsetType

from mgprof.analyze import intervals as iv
from mgprof.analyze.trace import breakdown as bd
from mgprof.analyze.trace.bandwidth import Attainable
from mgprof.analyze.trace.comm import (
    LAUNCH_ONLY_REASON,
    CollectiveCall,
    CollectiveStats,
    cpu_collective_calls,
    gpu_collective_calls,
    summarize_collectives,
    type_unions,
)
from mgprof.analyze.trace.compiled import DEFINITIONS as COMPILED_DEFINITIONS
from mgprof.analyze.trace.compiled import CompiledRegions, compiled_regions
from mgprof.analyze.trace.fsdp import DEFINITIONS as FSDP_DEFINITIONS
from mgprof.analyze.trace.fsdp import FsdpComm, fsdp_comm
from mgprof.analyze.trace.idle import IdleBreakdown, LaunchDelay, idle_breakdown, launch_delay
from mgprof.analyze.trace.kernels import (
    KERNELS_LIMIT,
    FlopFacts,
    KernelsDropped,
    KernelStat,
    TensorCoreFacts,
    flop_facts,
    kernel_table,
)
from mgprof.analyze.trace.operators import (
    DEVICE_LIMIT,
    LIMIT,
    OperatorNameStat,
    OperatorsDropped,
    OperatorStat,
    operator_tables,
)
from mgprof.analyze.tracefile.flop_estimate import GemmPrecisionFacts, gemm_precision_facts
from mgprof.analyze.tracefile.health import TraceHealth, trace_health
from mgprof.analyze.tracefile.load import KIND_COMPUTE, RankTrace, load_trace

__all__ = [
    "DEFINITIONS",
    "RankTraceSummary",
    "StepSummary",
    "TraceHealth",
    "TraceTotals",
    "analyze_trace_file",
]

_GPU = "DESIGN.md GPU rule"
_FLOPS_DEF = (
    "FLOPs / window; FLOPs = Σ args.flops of CPU ops when the trace has them (flops_source "
    "'trace args.flops'), else Σ over the innermost GEMM/conv ops of 2·M·N·K (mm, addmm, "
    "matmul, linear), 2·B·M·N·K (bmm, baddbmm), 2·N·prod(weight)·prod(output spatial) "
    "(convolution; backward × grads computed) from Input Dims"
)
_CPU = "DESIGN.md CPU-only rule"
_OPS_DEF = (
    f"host operators (cat cpu_op; 2021 schema Operator) on any thread, annotation spans "
    f"(user_annotation: ProfilerStep#N, record_function regions, Optimizer.step#…) excluded, "
    f"grouped by (name, Input Dims); the top {LIMIT} groups by host_self_us plus any group in "
    f"the top {DEVICE_LIMIT} by device_self_us, ordered by host_self_us; operators_dropped "
    "sums the groups left out (TensorBoard plugin's Operator view, group by input shape)"
)
_OPS_COMMON = {
    "operators": _OPS_DEF,
    "operators.input_shapes": "the call's args Input Dims (record_shapes=True) as a list of "
    'shapes, e.g. [[64, 256], [512, 256]]; "" when not recorded',
    "operators.host_total_us": "Σ call durations (a call nested in a call of the same group "
    "counts in both)",
    "operators.host_self_us": "Σ (call duration − Σ durations of the operators directly nested "
    "in the call on its thread − the runtime/driver calls made directly in it); an operator "
    "whose only nested operator has its name is one call (PyTorch key_averages, TensorBoard "
    "plugin)",
    "operators_by_name": "the operators grouped by name only, bounded the same way "
    "(input_shape_groups = distinct Input Dims); operators_by_name_dropped sums the rest",
    "operators_dropped": "groups, calls, host_self_us and device_self_us of the groups left "
    "out of operators: listed + dropped = every operator",
    "kernels": f"compute kernels by summed duration, the top {KERNELS_LIMIT} (top_kernels is "
    "the first --top of them); kernels_dropped sums the rest",
    "top_kernels.tensor_core": "kind == tensor_core: tensor-core launches hold most of the "
    "name's time (see tensor_cores)",
    "steps.start_us": "the step's CPU span start − the trace start (the earliest complete "
    "event of the file), µs; cpu_duration_us is its length",
    "gemm_precision": "host µs of the innermost GEMM/conv ops (mm, addmm, bmm, matmul, linear, "
    "convolutions; an op with another inside it is not innermost) by the dtype of their two "
    "matrix operands (Input type): reduced (bf16, fp16, fp8, int8), fp32, fp64, unknown (mixed "
    "or not recorded); reduced_pct/fp32_pct are shares of their sum. Evidence that autocast "
    "reached the matrix multiplies; on a GPU trace the host time is the launch, and "
    "tensor_cores says where the kernels ran",
}
_OPS_GPU = {
    "operators.device_self_us": "Σ durations of device events (kernels, memcpy, memset) whose "
    "runtime launch (cudaLaunchKernel …, same args.correlation) lies inside the call and "
    "inside none of its nested operators (TensorBoard plugin's self device duration)",
    "operators.device_total_us": "Σ device self time of the call and of every operator nested "
    "in it",
    "operators_device_unattributed_us": "device time whose launch lies in no host operator, or "
    "whose launch is not in the trace",
}
_OPS_CPU = {
    "operators.device_self_us": "not applicable: no device events",
    "operators.device_total_us": "not applicable: no device events",
    "operators_device_unattributed_us": "not applicable: no device events",
}
DEFINITIONS: dict[str, dict[str, str]] = {
    "gpu": {
        "window_us": f"first device event start … last device event end, extended over host "
        f"gloo:* collectives when present ({_GPU})",
        "busy_pct": f"100*|all device events ∪ host gloo:* collectives|/window ({_GPU}; HTA "
        "get_temporal_breakdown without gloo)",
        "idle_pct": "100*(window − busy)/window (HTA idle_time_pctg)",
        "compute_pct": "100*|compute kernels (kernels not matching nccl|rccl)|/window",
        "comm_pct": "100*|communication kernels (name matches nccl|rccl) ∪ host gloo:* "
        "collectives|/window",
        "comm_overlap_pct": "100*|compute ∩ comm|/comm (HTA get_comm_comp_overlap)",
        "exposed_comm_pct": "100*(comm − |compute ∩ comm|)/window",
        "memcpy_pct": "100*|memcpy ∪ memset device events|/window",
        "dataloader_pct": "100*|enumerate(DataLoader)#* spans ∩ window|/window",
        "steps": "device events belong to the ProfilerStep#N containing their launch "
        "(runtime call with the same correlation id); same rules inside each step",
        "top_kernels.pct_of_compute": "100*summed kernel duration/summed duration of all "
        "compute kernels",
        "flops.achieved_tflops": _FLOPS_DEF,
        "collectives": "one call per communication kernel; see mgprof.analyze.comm",
    },
    "cpu": {
        "window_us": f"|∪ ProfilerStep#N spans| (whole trace when there are none) ({_CPU})",
        "busy_pct": "100*|compute ∪ comm|/window",
        "idle_pct": "100*(window − busy)/window",
        "compute_pct": "100*|main-thread operator events (cat cpu_op) except comm ops "
        "(gloo:*, nccl:*, c10d::*, record_param_comms), clipped to the window|/window; "
        "annotation spans (user_annotation: steps, regions, record_function) are containers; "
        "main thread = thread of ProfilerStep#N (busiest thread without steps)",
        "comm_pct": "100*|gloo:* complete events on any thread ∩ window|/window (nccl:* CPU "
        "ops are host-side launches: counted as collectives, never as communication time)",
        "comm_overlap_pct": "100*|compute ∩ comm|/comm",
        "exposed_comm_pct": "100*(comm − |compute ∩ comm|)/window",
        "memcpy_pct": "not applicable: no device events",
        "dataloader_pct": "100*|enumerate(DataLoader)#* spans ∩ window|/window",
        "steps": "same rules with the window = the ProfilerStep#N span",
        "top_kernels.pct_of_compute": "not applicable: no kernels",
        "flops.achieved_tflops": _FLOPS_DEF,
        "collectives": "one call per gloo:*/nccl:* CPU event; see mgprof.analyze.comm",
    },
}
DEFINITIONS_COMMON = {
    "collectives.busbw_gbps": "nccl-tests: algbw×2(n−1)/n all-reduce, ×(n−1)/n all-gather, "
    "reduce-scatter, all-to-all, ×1 broadcast/reduce/send/recv; algbw = bytes/time",
    "collectives.exposed_us": "call duration minus the part covered by compute",
    "cross_rank.transfer_us": "per matched call: shortest duration over the ranks",
    "cross_rank.wait_us": "per rank and matched call: its duration − transfer_us",
    "slowest_rank": "the rank the others wait for: it arrives last (least wait) in the most "
    "matched calls (the same definition as the run report's, which falls back to the highest "
    "mean step time only without matched collectives)",
}


class TraceTotals(msgspec.Struct):
    """Trace-window totals of one rank (or one step); ``*_pct`` are percent of the window."""

    window_us: float | None
    busy_pct: float | None
    idle_pct: float | None
    compute_pct: float | None
    comm_pct: float | None
    comm_overlap_pct: float | None
    exposed_comm_pct: float | None
    busy_us: float | None
    idle_us: float | None
    compute_us: float | None
    comm_us: float | None
    overlap_us: float | None
    exposed_comm_us: float | None
    memcpy_us: float | None
    memcpy_pct: float | None
    dataloader_us: float | None
    dataloader_pct: float | None


class StepSummary(msgspec.Struct):
    """One ProfilerStep#N: CPU span, device window, and the totals inside it.

    Times ``*_start_us``/``*_end_us`` are absolute (the trace's clock). ``extended_us`` is the
    TensorBoard plugin's step time: from the later of the CPU start and the previous step's
    extended end, to the later of the CPU end and the step's last device event (its "Average
    Step Time" is their mean). Per step, ``dataloader_pct`` is of the CPU span (a step's loading
    runs before its kernels); the other ``*_pct`` are of the step's device window.
    """

    step: int
    cpu_duration_us: float
    device_events: int
    totals: TraceTotals
    cpu_start_us: float | None = None
    cpu_end_us: float | None = None
    device_start_us: float | None = None
    device_end_us: float | None = None
    extended_us: float | None = None
    start_us: float | None = None
    """The CPU span's start relative to the trace start (the earliest complete event), µs: with
    ``cpu_duration_us``, a bar on a step timeline."""
    dataloader_exclusive_us: float | None = None
    """DataLoader time in the extended step span while no device event and no runtime call
    runs: the TensorBoard plugin's per-step "DataLoader" (its categories are exclusive)."""
    not_applicable: dict[str, str] = msgspec.field(default_factory=dict)


class RankTraceSummary(msgspec.Struct, kw_only=True):
    """Everything mgprof reports about one rank's trace file."""

    rank: int | None
    rank_source: str
    world_size: int | None
    backend: str | None
    source: str
    kind: str
    events: int
    device_events: int
    skipped_device_events: int
    devices: list[dict[str, object]]
    totals: TraceTotals
    steps: list[StepSummary]
    collectives: list[CollectiveStats]
    collective_calls: list[CollectiveCall] | UnsetType = UNSET
    """One entry per call (for cross-rank matching); absent from the summaries a run analysis
    stores (raw data, not figures)."""
    top_kernels: list[KernelStat]
    tensor_cores: TensorCoreFacts
    flops: FlopFacts
    not_applicable: dict[str, str]
    definitions: dict[str, str]
    health: TraceHealth | None = None
    idle: IdleBreakdown | None = None
    """GPU idle gaps by cause (``mgprof.analyze.trace.idle``); None on CPU-only traces."""
    launch_delay: LaunchDelay | None = None
    attainable: list[Attainable] | None = None
    """Each collective's busbw beside this machine's measured baseline (``--bandwidth``)."""
    operators: list[OperatorStat] = msgspec.field(default_factory=list)
    """Host operators by (name, input shapes): the Operators view
    (``mgprof.analyze.trace.operators``)."""
    operators_by_name: list[OperatorNameStat] = msgspec.field(default_factory=list)
    operators_dropped: OperatorsDropped | None = None
    operators_by_name_dropped: OperatorsDropped | None = None
    operators_device_unattributed_us: float | None = None
    kernels: list[KernelStat] = msgspec.field(default_factory=list)
    """Compute kernels by summed time, up to ``KERNELS_LIMIT``: the Kernels view."""
    kernels_dropped: KernelsDropped | None = None
    gemm_precision: GemmPrecisionFacts | None = None
    """Host time of the innermost GEMM/conv ops by operand dtype (``record_shapes``)."""
    fsdp: FsdpComm | None = None
    """FSDP2 (``fully_shard``) communication by unit and phase (``mgprof.analyze.trace.fsdp``);
    None for a trace that is not FSDP2's."""
    compiled: CompiledRegions | None = None
    """``torch.compile``'s regions in the traced steps (``mgprof.analyze.trace.compiled``);
    None for a trace without compiled code."""


def _pct(x: float | None, window: float) -> float | None:
    return None if x is None or window <= 0 else 100.0 * x / window


def _totals(b: bd.Breakdown | None, na: dict[str, str], prefix: str = "") -> TraceTotals:
    """Turn absolute figures into the contract's totals, recording every None with a reason."""
    if b is None:
        for key in TraceTotals.__struct_fields__:
            na.setdefault(prefix + key, "no events in this window")
        return TraceTotals(*([None] * len(TraceTotals.__struct_fields__)))
    w = b.window_us
    if w <= 0:
        for key in TraceTotals.__struct_fields__:
            if key.endswith("_pct"):
                na.setdefault(prefix + key, "the trace window is zero long")
    overlap_pct = None
    if b.comm_us > 0:
        overlap_pct = 100.0 * b.overlap_us / b.comm_us
    else:
        na.setdefault(prefix + "comm_overlap_pct", "no communication in the window (comm = 0)")
    if b.memcpy_us is None:
        na.setdefault(prefix + "memcpy_us", "CPU-only trace: no device memory copies")
        na.setdefault(prefix + "memcpy_pct", "CPU-only trace: no device memory copies")
    if b.dataloader_us is None:
        reason = "no enumerate(DataLoader)#* spans in the trace"
        na.setdefault(prefix + "dataloader_us", reason)
        na.setdefault(prefix + "dataloader_pct", reason)
    return TraceTotals(
        window_us=w,
        busy_pct=_pct(b.busy_us, w),
        idle_pct=_pct(b.idle_us, w),
        compute_pct=_pct(b.compute_us, w),
        comm_pct=_pct(b.comm_us, w),
        comm_overlap_pct=overlap_pct,
        exposed_comm_pct=_pct(b.exposed_comm_us, w),
        busy_us=b.busy_us,
        idle_us=b.idle_us,
        compute_us=b.compute_us,
        comm_us=b.comm_us,
        overlap_us=b.overlap_us,
        exposed_comm_us=b.exposed_comm_us,
        memcpy_us=b.memcpy_us,
        memcpy_pct=_pct(b.memcpy_us, w),
        dataloader_us=b.dataloader_us,
        dataloader_pct=_pct(b.dataloader_us, w),
    )


def _comm_unknown(totals: TraceTotals, na: dict[str, str]) -> TraceTotals:
    """A CPU-only trace whose only collectives are ``nccl:*`` launches: its communication time
    is unknown, not zero (the transfers ran on a GPU the trace did not record)."""
    for key in ("comm", "exposed_comm", "comm_overlap", "busy", "idle"):
        na[f"{key}_pct"] = LAUNCH_ONLY_REASON
    return msgspec.structs.replace(
        totals,
        comm_pct=None,
        comm_us=None,
        comm_overlap_pct=None,
        overlap_us=None,
        exposed_comm_pct=None,
        exposed_comm_us=None,
        busy_pct=None,
        busy_us=None,
        idle_pct=None,
        idle_us=None,
    )


def _dataloader_exclusive(
    rt: RankTrace,
    loading: tuple[np.ndarray, np.ndarray],
    busy: tuple[np.ndarray, np.ndarray],
    begin: float,
    end: float,
) -> float | None:
    """DataLoader time in [begin, end] not covered by ``busy`` (the merged device events and
    runtime calls); ``loading`` is the merged DataLoader spans. Both are built once per trace,
    so a step costs a binary search, not a sort of the whole trace."""
    if rt.dataloader[0].size == 0:
        return None
    inside = iv.within(loading, begin, end)
    return iv.union_length(*inside) - iv.intersection_length(inside, iv.within(busy, begin, end))


def _steps(
    rt: RankTrace, na: dict[str, str], spans: bd.CpuSpans | None = None
) -> list[StepSummary]:
    if not rt.steps:
        na["steps"] = "no ProfilerStep#N spans (trace recorded without a profiler schedule)"
        return []
    out = []
    step_of = bd.device_step_index(rt) if rt.has_device_events else None
    if step_of is not None and not (step_of >= 0).any():
        na["steps"] = "no device event correlates with a launch inside a ProfilerStep#N span"
    base = rt.time_base_us
    # Whatever every step reads is built once here: each step then costs binary searches and
    # its own rows, not a pass (or a sort) over the whole trace, which made long traces
    # quadratic in their steps.
    if step_of is not None:
        busy = iv.merge(
            np.concatenate((rt.dev_start, rt.runtime[0])),
            np.concatenate((rt.dev_end, rt.runtime[1])),
        )
        loading = iv.merge(*rt.dataloader)
        by_step = np.argsort(step_of, kind="stable")  # each step's device rows, ascending
        bounds = np.searchsorted(step_of[by_step], np.arange(len(rt.steps) + 1))
        gloo = bd.host_collectives(rt)
    elif spans is None:
        spans = bd.cpu_spans(rt)
    prev_end: float | None = None
    prev_extended: float | None = None
    for k, step in enumerate(rt.steps):
        step_na: dict[str, str] = {}
        cpu_us = step.end - step.start
        device_start = device_end = None
        if step_of is not None:
            rows = by_step[bounds[k] : bounds[k + 1]]
            n = int(rows.size)
            b = bd.gpu_breakdown(
                rt, rows, host_span=(step.start, step.end), not_before=prev_end, gloo=gloo
            )
            if b is None:
                why = (
                    "no device event was launched in this step"
                    if n == 0
                    else "all of this step's device work ran inside the previous step's window"
                )
                step_na.update(dict.fromkeys(TraceTotals.__struct_fields__, why))
            else:
                device_start, device_end = b.window_start_us, b.window_end_us
                prev_end = b.window_end_us
        else:
            b = bd.cpu_breakdown(rt, (np.asarray([step.start]), np.asarray([step.end])), spans)
            n = 0
        totals = _totals(b, step_na)
        if step_of is not None and totals.dataloader_us is not None and cpu_us > 0:
            totals = msgspec.structs.replace(
                totals, dataloader_pct=100.0 * totals.dataloader_us / cpu_us
            )
        end = step.end if device_end is None else max(step.end, device_end)
        begin = step.start if prev_extended is None else max(step.start, prev_extended)
        prev_extended = end
        exclusive = (
            _dataloader_exclusive(rt, loading, busy, begin, end) if step_of is not None else None
        )
        out.append(
            StepSummary(
                step.number,
                cpu_us,
                n,
                totals,
                cpu_start_us=base + step.start,
                cpu_end_us=base + step.end,
                device_start_us=None if device_start is None else base + device_start,
                device_end_us=None if device_end is None else base + device_end,
                extended_us=end - begin,
                start_us=step.start - rt.trace_start_us,
                dataloader_exclusive_us=exclusive,
                not_applicable=step_na,
            )
        )
    return out


def analyze_trace_file(path: str | Path, top: int = 10, processes: int = 1) -> RankTraceSummary:
    """Analyse one rank's trace (see the module docstring); TraceError on bad input.
    ``processes``: how many processes may read it (see :func:`load_trace`)."""
    rt = load_trace(path, processes)
    na: dict[str, str] = {}
    kind = "gpu" if rt.has_device_events else "cpu"
    spans: bd.CpuSpans | None = None
    if kind == "gpu":
        b = bd.gpu_breakdown(rt)
        compute = rt.dev_kind == KIND_COMPUTE
        cover = (rt.dev_start[compute], rt.dev_end[compute])
        calls = gpu_collective_calls(rt) + cpu_collective_calls(rt, cover=cover, gloo_only=True)
        window = (
            (iv.as_array([b.window_start_us]), iv.as_array([b.window_end_us]))
            if b is not None
            else cover
        )
    else:
        window = bd.cpu_window(rt)
        spans = bd.cpu_spans(rt)
        b = bd.cpu_breakdown(rt, window, spans)
        calls = cpu_collective_calls(rt)
        cover = rt.main_thread
    totals = _totals(b, na)
    if kind == "cpu" and calls and all(c.launch_only for c in calls):
        totals = _comm_unknown(totals, na)
    steps = _steps(rt, na, spans)
    collectives = summarize_collectives(calls, type_unions(calls, rt.time_base_us, window, cover))
    fsdp, fsdp_reason = fsdp_comm(rt, calls, window, cover)
    if fsdp_reason is not None:
        na["fsdp"] = fsdp_reason
    if not collectives:
        na["collectives"] = (
            "no communication kernels (nccl/rccl) in the trace"
            if kind == "gpu"
            else "no gloo:*/nccl:* events in the trace"
        )
    listed, tc, dropped = kernel_table(rt, max(top, KERNELS_LIMIT))
    kernels = listed[: max(top, 0)]
    if len(listed) > KERNELS_LIMIT:
        rest = listed[KERNELS_LIMIT:]
        dropped = KernelsDropped(
            names=dropped.names + len(rest),
            calls=dropped.calls + sum(k.count for k in rest),
            total_us=dropped.total_us + sum(k.total_us for k in rest),
        )
    ops = operator_tables(rt)
    if rt.host_ops is None:
        na["operators"] = "no host operators (cat cpu_op) in the trace"
        na["operators_by_name"] = na["operators"]
    if ops.device_reason is not None:
        for key in ("device_self_us", "device_total_us"):
            na[f"operators.{key}"] = ops.device_reason
            na[f"operators_by_name.{key}"] = ops.device_reason
    if ops.device_unattributed_us is None:
        na["operators_device_unattributed_us"] = ops.device_reason or na.get("operators", "")
    if kind == "cpu":
        na["top_kernels"] = "CPU-only trace: no kernels"
        na["tensor_cores"] = "CPU-only trace: no kernels"
    elif tc.tensor_core_kernels == 0 and tc.fp32_gemm_kernels == 0:
        na["tensor_cores"] = (
            "no kernel was launched by a GEMM/conv op with known input types, and no kernel "
            "name matches the tensor-core or FP32-GEMM pattern lists"
        )
    flops = flop_facts(rt, totals.window_us)
    if flops.total_flops is None:
        why = "; ".join(f"{n} op(s): {r}" for r, n in sorted(rt.flops_estimate_skipped.items()))
        na["flops"] = (
            "no CPU op carries args.flops and no GEMM/conv op has an Input Dims FLOP estimate"
            + (f" ({why})" if why else " (profile with record_shapes=True)")
        )
    elif rt.flops_estimate_skipped and flops.flops_source != "trace args.flops":
        why = "; ".join(f"{n} op(s): {r}" for r, n in sorted(rt.flops_estimate_skipped.items()))
        na["flops.partial"] = f"GEMM/conv ops left out of the FLOP estimate: {why}"
    if rt.rank is None:
        na["rank"] = "no distributedInfo.rank and no rank in the file name"
    if rt.skipped_device_events:
        na["skipped_device_events"] = (
            f"{rt.skipped_device_events} device events had a missing, negative or out-of-range "
            "ts/dur and were left out of every figure"
        )
    definitions = dict(DEFINITIONS[kind])
    definitions.update(DEFINITIONS_COMMON)
    definitions.update(_OPS_COMMON)
    definitions.update(_OPS_GPU if kind == "gpu" else _OPS_CPU)
    if fsdp is not None or fsdp_reason is not None:
        definitions.update(FSDP_DEFINITIONS)
    compiled = compiled_regions(rt)
    if compiled is not None:
        definitions.update(COMPILED_DEFINITIONS)
    return RankTraceSummary(
        rank=rt.rank,
        rank_source=rt.rank_source,
        world_size=rt.world_size,
        backend=rt.backend,
        source=str(rt.path),
        kind=kind,
        events=rt.n_events,
        device_events=int(rt.dev_start.size),
        skipped_device_events=rt.skipped_device_events,
        devices=rt.device_properties,
        totals=totals,
        steps=steps,
        collectives=collectives,
        collective_calls=calls,
        top_kernels=kernels,
        tensor_cores=tc,
        flops=flops,
        not_applicable=na,
        definitions=definitions,
        health=trace_health(rt),
        idle=idle_breakdown(rt) if kind == "gpu" else None,
        launch_delay=launch_delay(rt) if kind == "gpu" else None,
        operators=ops.by_shape,
        operators_by_name=ops.by_name,
        operators_dropped=ops.dropped,
        operators_by_name_dropped=ops.dropped_by_name,
        operators_device_unattributed_us=ops.device_unattributed_us,
        kernels=listed[:KERNELS_LIMIT],
        kernels_dropped=dropped,
        gemm_precision=gemm_precision_facts(rt.gemm_host_us),
        fsdp=fsdp,
        compiled=compiled,
    )
