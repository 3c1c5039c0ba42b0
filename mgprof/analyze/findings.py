"""Findings: advice drawn from a run's analysed figures, each backed by the numbers it rests on.

Each rule is a small function ``(run, figures) -> Finding | None`` over the ``RunRecord`` and the
dict ``analyze_run`` returns. A rule fires only on figures that were measured: a missing or None
figure means "do not know", never "looks bad", so a CPU run or a run without traces gets no GPU
advice. Thresholds are named constants below, each with the reason for its value; the rule list
and the advice are documented in ``docs/findings.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import msgspec

from mgprof.analyze.readers import as_dict as _dict
from mgprof.analyze.readers import num as _num
from mgprof.analyze.readers import rank_dicts as _ranks
from mgprof.records import RankRecord, RunRecord

__all__ = [
    "RULES",
    "SEVERITY_ORDER",
    "Finding",
    "evaluate_findings",
]

Severity = Literal["high", "medium", "low", "info"]
SEVERITY_ORDER: dict[str, int] = {"high": 0, "medium": 1, "low": 2, "info": 3}
"""Report order: what costs most first; ``info`` is context, not a problem."""

# --------------------------------------------------------------------------------------------
# Thresholds

EXPOSED_COMM_PCT = 10.0
"""Exposed (not overlapped) communication above 10 % of the trace window is worth tuning: below
it, bucket and batch changes rarely repay the effort (PyTorch DDP notes: overlap hides most)."""
EXPOSED_COMM_HIGH_PCT = 25.0
"""A quarter of the window spent waiting on the network: the scaling is broken, not just slow."""

LOW_UTIL_PCT = 60.0
"""GPU busy below 60 % of the time: a well-fed training step keeps kernels running > 80 %, and the
gap between 60 and 80 is often launch overhead that only CUDA graphs remove."""
VERY_LOW_UTIL_PCT = 30.0
"""Busy under 30 %: the GPU mostly waits; the host side is the bottleneck."""

DATALOADER_SHARE_PCT = 10.0
"""Waiting 10 % of step time for data: more than the cost of a few loader workers."""
DATALOADER_HIGH_PCT = 30.0
"""A third of the step waiting for data: the model runs at loader speed."""

FP32_GEMM_PCT = 20.0
"""FP32 GEMMs above 20 % of compute-kernel time: tensor cores (bf16/fp16) run GEMMs 8-16x
faster at peak, so even a partly memory-bound share this size saves noticeable time."""

HEADROOM_LOW_PCT = 10.0
"""Under 10 % free device memory: allocator fragmentation or a longer batch can OOM the run."""
HEADROOM_CRITICAL_PCT = 5.0
"""Under 5 % free: the next larger input will most likely fail with CUDA out of memory."""
HEADROOM_HIGH_PCT = 50.0
"""More than half the device unused: a larger batch (or model) is likely to raise throughput."""

SPREAD_PCT = 10.0
"""Ranks' mean step times more than 10 % apart: every collective waits for the slowest rank,
so the job runs at its speed; smaller spreads are within run-to-run noise."""
SPREAD_HIGH_PCT = 25.0
"""A quarter slower: the whole job loses a fifth of its throughput to one rank."""

# Documented nvmlClocksEventReason* bits (nvml.h) that mean the clocks were lowered for power or
# heat. GpuIdle, application clocks, sync boost and display clocks are left out on purpose: they
# are choices, not throttling. The sampler stores its decoded reasons in
# ``facts["throttle_reasons_seen"]``; the bits here are only used to count affected samples.
THROTTLE_REASON_BITS: dict[str, int] = {
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake": 0x80,
}
HARDWARE_THROTTLE = frozenset({"hw_slowdown", "hw_thermal_slowdown", "hw_power_brake"})
"""Reasons the hardware enforces (overheating, power brake): high severity, as the clocks can
drop by half and the cause is physical (cooling, power supply), not a setting."""


class Finding(msgspec.Struct, kw_only=True):
    """One piece of advice: what was measured, why it matters, what to change, what it may save."""

    rule: str
    severity: Severity
    title: str
    evidence: str
    """The measured figures, with units, that made the rule fire."""
    cause: str
    change: str
    """The concrete change: code or a flag the user can apply."""
    saving: str | None = None
    """Estimated gain with its basis, when the figures allow an estimate."""
    figures: dict[str, Any] = msgspec.field(default_factory=dict)
    """The raw numbers behind ``evidence``, for JSON consumers."""


# --------------------------------------------------------------------------------------------
# Small readers that turn "absent or wrong type" into None


def _job(figures: Mapping[str, Any]) -> dict[str, Any]:
    return _dict(figures.get("job"))


def _mean_step_ms(rank: Mapping[str, Any]) -> float | None:
    return _num(_dict(rank.get("step_time_ms")).get("mean"))


def _cuda_ranks(run: RunRecord) -> list[RankRecord]:
    return [r for r in run.ranks if r.device.kind == "cuda"]


def _rank_list(ranks: Sequence[int]) -> str:
    return ", ".join(str(r) for r in sorted(ranks))


def _trace_summaries(figures: Mapping[str, Any], rank: int) -> list[dict[str, Any]]:
    per_rank = _dict(_dict(figures.get("traces")).get("ranks"))
    raw = per_rank.get(str(rank), per_rank.get(rank))  # type: ignore[call-overload]
    return [s for s in raw if isinstance(s, dict)] if isinstance(raw, list) else []


def _facts(run: RunRecord, name: str) -> dict[int, Any]:
    """rank -> observed training fact, only for ranks where it was observed (not None)."""
    out: dict[int, Any] = {}
    for rec in run.ranks:
        value = getattr(rec.training, name, None)
        if value is not None:
            out[rec.rank] = value
    return out


# --------------------------------------------------------------------------------------------
# Rules


def dataparallel_in_use(run: RunRecord, figures: Mapping[str, Any]) -> Finding | None:
    """nn.DataParallel over several GPUs: one process, GIL-bound, device 0 does extra work."""
    if run.strategy != "dp":
        return None
    devices = max((r.devices_used for r in run.ranks), default=0)
    if devices < 2:
        return None
    parts = [f"strategy dp over {devices} devices in one process"]
    figs: dict[str, Any] = {"devices": devices}
    rank0 = next(iter(_ranks(figures)), {})
    step_ms = _mean_step_ms(rank0)
    if step_ms is not None:
        parts.append(f"mean step {step_ms:,.2f} ms")
        figs["step_time_ms"] = step_ms
    per_device = _dict(_dict(rank0.get("memory")).get("per_device"))
    peaks = {
        name: _num(_dict(v).get("peak_allocated_mib"))
        for name, v in per_device.items()
        if _num(_dict(v).get("peak_allocated_mib")) is not None
    }
    if len(peaks) >= 2:
        first = sorted(peaks)[0]
        others = [v for k, v in peaks.items() if k != first and v is not None]
        parts.append(
            f"{first} peak {peaks[first]:,.0f} MiB vs others up to {max(others):,.0f} MiB "
            "(outputs and gradients gather on device 0)"
        )
        figs["per_device_peak_allocated_mib"] = peaks
    saving = _ddp_saving(figures)
    return Finding(
        rule="dataparallel",
        severity="high",
        title="nn.DataParallel in use where DistributedDataParallel applies",
        evidence="; ".join(parts),
        cause=(
            "DataParallel runs every replica from one Python process (GIL contention), copies "
            "the model to each device every step and gathers outputs on device 0, which then "
            "does more work and holds more memory than the others."
        ),
        change=(
            "use DistributedDataParallel, one process per GPU: `mgprof analyze script.py --gpus "
            f"{devices} --strategy ddp`, or `torchrun --nproc-per-node {devices} script.py` with "
            "`model = DistributedDataParallel(model, device_ids=[local_rank])`"
        ),
        saving=saving,
        figures=figs,
    )


def _comparison_rows(figures: Mapping[str, Any]) -> list[dict[str, Any]]:
    raw = figures.get("comparison")
    if isinstance(raw, dict):
        raw = raw.get("rows")
    return [r for r in raw if isinstance(r, dict)] if isinstance(raw, list) else []


def _ddp_saving(figures: Mapping[str, Any]) -> str | None:
    """DDP vs DP throughput from ``mgprof compare``, when the run has a comparison."""
    rows = _comparison_rows(figures)
    rate = {str(r.get("strategy")): _num(r.get("samples_per_s")) for r in rows}
    dp, ddp = rate.get("dp"), rate.get("ddp")
    if dp is None or ddp is None or dp <= 0 or ddp <= dp:
        return None
    return (
        f"measured by mgprof compare: {ddp:,.1f} samples/s with DDP vs {dp:,.1f} with "
        f"DataParallel ({ddp / dp:.2f}x)"
    )


def exposed_communication(run: RunRecord, figures: Mapping[str, Any]) -> Finding | None:
    """Communication the compute does not hide: every rank waits for it each step."""
    worst: tuple[float, dict[str, Any], dict[str, Any]] | None = None
    for rank in _ranks(figures):
        comm = _dict(rank.get("comm"))
        pct = _num(comm.get("exposed_comm_pct"))
        if pct is not None and (worst is None or pct > worst[0]):
            worst = (pct, rank, comm)
    if worst is None or worst[0] < EXPOSED_COMM_PCT:
        return None
    pct, rank, comm = worst
    exposed_ms = (_num(comm.get("exposed_comm_us")) or 0.0) / 1000.0
    window_ms = (_num(comm.get("window_us")) or 0.0) / 1000.0
    overlap = _num(comm.get("comm_overlap_pct"))
    evidence = (
        f"rank {rank.get('rank')}: exposed communication {pct:.1f} % of the trace window "
        f"({exposed_ms:,.2f} ms of {window_ms:,.2f} ms)"
    )
    if overlap is not None:
        evidence += f"; only {overlap:.1f} % of communication overlaps compute"
    busbw = _num(comm.get("busbw_gbps"))
    if busbw is not None:
        evidence += f"; bus bandwidth {busbw:,.2f} GB/s"
    caps = _facts(run, "ddp_bucket_cap_mb")
    cap = next(iter(caps.values()), None)
    if cap is not None:
        evidence += f"; bucket_cap_mb={cap:g}"
    step_ms = _mean_step_ms(rank)
    saving = None
    if step_ms is not None:
        saving = (
            f"up to {step_ms * pct / 100.0:,.2f} ms per step ({pct:.1f} % of the "
            f"{step_ms:,.2f} ms mean step) if all of it were overlapped"
        )
    return Finding(
        rule="exposed_comm",
        severity="high" if pct >= EXPOSED_COMM_HIGH_PCT else "medium",
        title="Communication is not hidden behind compute",
        evidence=evidence,
        cause=(
            "gradients are all-reduced after the backward pass has little compute left to hide "
            "them behind: the per-GPU batch is small relative to the model, buckets are "
            "launched late, or the interconnect is slow."
        ),
        change=(
            "raise the per-GPU batch (or accumulate gradients over k steps inside "
            "`with model.no_sync():` for k-1 of them); tune "
            "`DistributedDataParallel(model, bucket_cap_mb=50, gradient_as_bucket_view=True, "
            "static_graph=True)` (static_graph only when the graph is the same every step)"
        ),
        saving=saving,
        figures={
            "rank": rank.get("rank"),
            "exposed_comm_pct": pct,
            "exposed_comm_us": _num(comm.get("exposed_comm_us")),
            "comm_overlap_pct": overlap,
            "busbw_gbps": busbw,
            "bucket_cap_mb": cap,
        },
    )


def low_utilisation(run: RunRecord, figures: Mapping[str, Any]) -> Finding | None:
    """GPUs idle much of the time (NVML utilisation, or trace busy on GPU traces)."""
    cuda = {r.rank for r in _cuda_ranks(run)}
    low: list[tuple[float, int, str]] = []
    for rank in _ranks(figures):
        if rank.get("rank") not in cuda:
            continue  # a CPU rank's busy share says nothing about a GPU
        nvml = _num(rank.get("nvml_gpu_util_pct"))
        busy = _num(rank.get("trace_busy_pct"))
        readings = [
            (v, what) for v, what in ((nvml, "NVML"), (busy, "trace busy")) if v is not None
        ]
        if not readings:
            continue
        value, what = min(readings)
        if value < LOW_UTIL_PCT:
            low.append((value, int(rank.get("rank", -1)), what))
    if not low:
        return None
    worst, worst_rank, what = min(low)
    listed = ", ".join(
        f"rank {r} {v:.1f} % ({src})" for v, r, src in sorted(low, key=lambda x: x[1])
    )
    evidence = f"GPU utilisation below {LOW_UTIL_PCT:.0f} %: {listed}"
    return Finding(
        rule="low_utilisation",
        severity="high" if worst < VERY_LOW_UTIL_PCT else "medium",
        title="GPUs are idle for much of the step",
        evidence=evidence,
        cause=(
            "the GPU waits for the host: data loading, Python overhead between many small "
            "kernels, host-device synchronisation (`.item()`, `.cpu()`, printing losses), or "
            "waiting for other ranks."
        ),
        change=(
            "raise the batch size; remove per-step `.item()`/`.cpu()` calls; feed the GPU with "
            "`DataLoader(num_workers=..., pin_memory=True)`; fuse small kernels with "
            "`model = torch.compile(model)` (CUDA graphs: `mode='reduce-overhead'`)"
        ),
        saving=f"up to {100.0 - worst:.1f} % of step time is GPU idle time on rank {worst_rank}",
        figures={"lowest_util_pct": worst, "rank": worst_rank, "source": what},
    )


def dataloader_stall(run: RunRecord, figures: Mapping[str, Any]) -> Finding | None:
    """Steps waiting for the next batch: the input pipeline is slower than the model."""
    shares = [
        (share, rank)
        for rank in _ranks(figures)
        if (share := _num(rank.get("dataloader_share_pct"))) is not None
    ]
    job_share = _num(_job(figures).get("dataloader_share_pct"))
    if not shares:
        return None
    worst, rank = max(shares, key=lambda s: s[0])
    if worst < DATALOADER_SHARE_PCT:
        return None
    evidence = f"rank {rank.get('rank')} waits for the DataLoader {worst:.1f} % of step time"
    if job_share is not None:
        evidence += f" (all ranks: {job_share:.1f} %)"
    workers = next(iter(_facts(run, "dataloader_num_workers").values()), None)
    pinned = next(iter(_facts(run, "dataloader_pin_memory").values()), None)
    changes = []
    if workers is not None:
        evidence += f"; num_workers={workers}"
        if workers == 0:
            changes.append("num_workers=4")
        else:
            changes.append(f"num_workers={workers * 2}")
    else:
        changes.append("num_workers=4")
    if pinned is not None:
        evidence += f", pin_memory={pinned}"
    if pinned is not True and _cuda_ranks(run):
        changes.append("pin_memory=True")
    changes.append("persistent_workers=True")
    step_ms = _mean_step_ms(rank)
    saving = None
    if step_ms is not None:
        saving = f"up to {step_ms * worst / 100.0:,.2f} ms of the {step_ms:,.2f} ms mean step"
    return Finding(
        rule="dataloader_stall",
        severity="high" if worst >= DATALOADER_HIGH_PCT else "medium",
        title="Training waits for the data loader",
        evidence=evidence,
        cause=(
            "batches are loaded and collated in the training process (or by too few workers), "
            "so the step stops until the next one is ready."
        ),
        change=(
            f"`DataLoader(dataset, ..., {', '.join(changes)})`; if the wait remains, add workers "
            "up to the CPU cores available per rank"
        ),
        saving=saving,
        figures={
            "dataloader_share_pct": worst,
            "rank": rank.get("rank"),
            "job_dataloader_share_pct": job_share,
            "num_workers": workers,
            "pin_memory": pinned,
        },
    )


def _tensor_core_facts(figures: Mapping[str, Any], rank: int) -> tuple[float, float, int] | None:
    """(fp32 GEMM µs, all compute µs estimate, fp32 GEMM kernels) summed over a rank's traces."""
    fp32_us = compute_us = 0.0
    kernels = 0
    seen = False
    for summary in _trace_summaries(figures, rank):
        if summary.get("kind") not in (None, "gpu"):
            continue
        tc = _dict(summary.get("tensor_cores"))
        fp_us, fp_pct = _num(tc.get("fp32_gemm_us")), _num(tc.get("fp32_gemm_pct"))
        if fp_us is None or fp_pct is None:
            continue
        seen = True
        fp32_us += fp_us
        kernels += int(_num(tc.get("fp32_gemm_kernels")) or 0)
        if fp_pct > 0:
            compute_us += fp_us * 100.0 / fp_pct
        else:
            # fp32 share zero: the compute total is tensor-core time over its share, if any.
            tc_us, tc_pct = _num(tc.get("tensor_core_us")), _num(tc.get("tensor_core_pct"))
            if tc_us is not None and tc_pct:
                compute_us += tc_us * 100.0 / tc_pct
    return (fp32_us, compute_us, kernels) if seen else None


def fp32_gemms(run: RunRecord, figures: Mapping[str, Any]) -> Finding | None:
    """Matrix multiplies in FP32 on a GPU that has tensor cores, and no autocast in sight."""
    if any(r.training.autocast_used for r in run.ranks):
        return None
    for rec in _cuda_ranks(run):
        facts = _tensor_core_facts(figures, rec.rank)
        if facts is None:
            continue
        fp32_us, compute_us, kernels = facts
        if compute_us <= 0:
            continue
        pct = 100.0 * fp32_us / compute_us
        if pct < FP32_GEMM_PCT:
            continue
        autocast = rec.training.autocast_used
        seen = "torch.autocast not seen" if autocast is None else "autocast disabled"
        name = rec.device.name or "this GPU"
        bf16 = rec.device.capability is None or _capability(rec.device.capability) >= 8.0
        dtype = "torch.bfloat16" if bf16 else "torch.float16"
        change = f'`with torch.autocast("cuda", dtype={dtype}):` around forward and loss'
        if not bf16:
            change += " with `torch.amp.GradScaler()` for the backward"
        change += "; or at least `torch.backends.cuda.matmul.allow_tf32 = True` (Ampere+)"
        return Finding(
            rule="fp32_gemm",
            severity="medium",
            title="Matrix multiplies run in FP32, not on tensor cores",
            evidence=(
                f"rank {rec.rank} ({name}): FP32 GEMM kernels take {pct:.1f} % of compute-kernel "
                f"time ({fp32_us / 1000.0:,.2f} ms, {kernels} kernel names); {seen}"
            ),
            cause=(
                "without autocast every matmul and convolution runs in float32 on the CUDA cores; "
                "tensor cores only take bf16/fp16 (or TF32 when enabled)."
            ),
            change=change,
            saving=(
                f"most of the {fp32_us / 1000.0:,.2f} ms of FP32 GEMM time per trace: tensor-core "
                "GEMMs reach 8-16x the FP32 peak"
            ),
            figures={"rank": rec.rank, "fp32_gemm_pct": pct, "fp32_gemm_us": fp32_us},
        )
    return None


def _capability(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return 0.0


def _memory_rows(figures: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(label, memory figures) per CUDA device: each DataParallel device counts on its own."""
    rows: list[tuple[str, dict[str, Any]]] = []
    for rank in _ranks(figures):
        mem = _dict(rank.get("memory"))
        if mem.get("kind") != "cuda":
            continue
        per_device = _dict(mem.get("per_device"))
        if per_device:
            rows.extend((f"rank {rank.get('rank')} {k}", _dict(v)) for k, v in per_device.items())
        else:
            rows.append((f"rank {rank.get('rank')} {rank.get('device', '')}".strip(), mem))
    return [(label, m) for label, m in rows if _num(m.get("headroom_pct")) is not None]


def _mem_text(label: str, mem: Mapping[str, Any]) -> str:
    reserved, total = _num(mem.get("peak_reserved_mib")), _num(mem.get("total_mib"))
    pct = _num(mem.get("headroom_pct")) or 0.0
    text = f"{label}: {pct:.1f} % free"
    if reserved is not None and total is not None:
        text += f" (peak reserved {reserved:,.0f} MiB of {total:,.0f} MiB)"
    return text


def memory_near_limit(run: RunRecord, figures: Mapping[str, Any]) -> Finding | None:
    """Peak reserved memory close to the device total: the next longer input may OOM."""
    rows = _memory_rows(figures)
    tight = [
        (label, m) for label, m in rows if (_num(m.get("headroom_pct")) or 0) < HEADROOM_LOW_PCT
    ]
    if not tight:
        return None
    label, mem = min(tight, key=lambda r: _num(r[1].get("headroom_pct")) or 0.0)
    pct = _num(mem.get("headroom_pct")) or 0.0
    return Finding(
        rule="memory_near_limit",
        severity="high" if pct < HEADROOM_CRITICAL_PCT else "medium",
        title="Device memory is nearly full",
        evidence="; ".join(_mem_text(lbl, m) for lbl, m in tight),
        cause=(
            "activations of the batch, parameters, gradients and optimizer state fill the "
            "device; fragmentation or a longer input can then fail with CUDA out of memory."
        ),
        change=(
            "checkpoint activations (`torch.utils.checkpoint.checkpoint(block, x, "
            "use_reentrant=False)`), use a smaller batch with gradient accumulation, enable "
            '`torch.autocast("cuda", dtype=torch.bfloat16)`, or set '
            "`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` against fragmentation"
        ),
        figures={"device": label, "headroom_pct": pct},
    )


def memory_headroom(run: RunRecord, figures: Mapping[str, Any]) -> Finding | None:
    """Most of every device unused: room for a larger batch, which usually raises throughput."""
    rows = _memory_rows(figures)
    if not rows or len(rows) < len(_cuda_ranks(run)):
        return None  # one unmeasured device might be the full one
    if min(_num(m.get("headroom_pct")) or 0.0 for _, m in rows) <= HEADROOM_HIGH_PCT:
        return None
    label, mem = min(rows, key=lambda r: _num(r[1].get("headroom_pct")) or 0.0)
    reserved, total = _num(mem.get("peak_reserved_mib")), _num(mem.get("total_mib"))
    batch = _batch_size(run)
    change = "raise the per-GPU batch size (scale the learning rate with it)"
    if batch is not None:
        change = f"raise the per-GPU batch size above {batch} (scale the learning rate with it)"
    change += "; find the throughput sweet spot with `mgprof sweep`"
    saving = None
    if reserved and total and batch:
        # Upper bound: parameters and optimizer state do not grow with the batch.
        saving = (
            f"memory allows up to about {int(batch * 0.9 * total / reserved)} samples per GPU "
            "(upper bound; throughput gain depends on utilisation, measure with mgprof sweep)"
        )
    return Finding(
        rule="memory_headroom",
        severity="low",
        title="Most of the device memory is unused",
        evidence="least free device: " + _mem_text(label, mem),
        cause="the batch (or model) uses a small part of the device's memory.",
        change=change,
        saving=saving,
        figures={"device": label, "headroom_pct": _num(mem.get("headroom_pct")), "batch": batch},
    )


def _batch_size(run: RunRecord) -> int | None:
    sizes = [s.batch_size for r in run.ranks for s in r.steps if s.batch_size is not None]
    return max(set(sizes), key=sizes.count) if sizes else None


def rank_imbalance(run: RunRecord, figures: Mapping[str, Any]) -> Finding | None:
    """One rank slower than the others: every collective waits for it."""
    job = _job(figures)
    spread = _num(job.get("step_time_spread_pct"))
    slow, fast = job.get("slowest_rank"), job.get("fastest_rank")
    slow_ms, fast_ms = _num(job.get("slowest_mean_step_ms")), _num(job.get("fastest_mean_step_ms"))
    if spread is None or slow_ms is None or fast_ms is None or spread < SPREAD_PCT:
        return None
    evidence = (
        f"rank {slow} mean step {slow_ms:,.2f} ms vs rank {fast} {fast_ms:,.2f} ms "
        f"(spread {spread:.1f} %)"
    )
    trace_job = _dict(_dict(figures.get("traces")).get("job"))
    last = trace_job.get("slowest_rank")
    if isinstance(last, int):
        evidence += f"; last to arrive at collectives: rank {last}"
        waits = _dict(trace_job.get("cross_rank")).get("per_rank")
        for w in waits if isinstance(waits, list) else []:
            wait_us = _num(_dict(w).get("wait_us"))
            if wait_us is not None and w.get("rank") != last:
                evidence += f"; rank {w.get('rank')} waited {wait_us / 1000.0:,.2f} ms"
    return Finding(
        rule="rank_imbalance",
        severity="high" if spread >= SPREAD_HIGH_PCT else "medium",
        title="Ranks run at different speeds (straggler)",
        evidence=evidence,
        cause=(
            "uneven work per rank (variable-length inputs, extra logging or checkpointing on "
            "rank 0), a slower or throttled GPU, or CPU contention on one host."
        ),
        change=(
            "give every rank equal work (bucket inputs by length, `drop_last=True`); move "
            "rank-0-only work (logging, evaluation, checkpoints) out of the step; check the slow "
            "rank's GPU with `nvidia-smi -q -d PERFORMANCE,TEMPERATURE`"
        ),
        saving=(
            f"up to {slow_ms - fast_ms:,.2f} ms per step "
            f"({100.0 * (slow_ms - fast_ms) / slow_ms:.1f} % of the slowest rank's step) "
            "if every rank ran at the fastest rank's pace"
        ),
        figures={"spread_pct": spread, "slowest_rank": slow, "fastest_rank": fast},
    )


def identical_batches(run: RunRecord, figures: Mapping[str, Any]) -> Finding | None:
    """Every rank trained on the same batches: N GPUs doing one GPU's worth of learning."""
    job = _job(figures)
    if job.get("identical_batches") is not True:
        return None
    compared = int(_num(job.get("fingerprint_steps_compared")) or 0)
    same = job.get("identical_batch_steps")
    n_same = len(same) if isinstance(same, list) else compared
    n_ranks = len(run.ranks)
    samplers = _facts(run, "distributed_sampler")
    evidence = (
        f"batch fingerprints equal on all {n_ranks} ranks in {n_same}/{compared} compared steps"
    )
    if samplers:
        without = [r for r, v in samplers.items() if v is False]
        evidence += (
            f"; no DistributedSampler on ranks {_rank_list(without)}"
            if without
            else "; DistributedSampler in use"
        )
    uses_sampler = bool(samplers) and all(samplers.values())
    cause = (
        "each rank builds or shuffles its data from the same seed, so the DistributedSampler's "
        "shards hold the same values (e.g. synthetic data from one `torch.manual_seed`)"
        if uses_sampler
        else "the DataLoader has no DistributedSampler, so every rank iterates the whole "
        "dataset in the same order"
    )
    return Finding(
        rule="identical_batches",
        severity="high",
        title="All ranks train on the same batches",
        evidence=evidence,
        cause=cause + "; the gradients are then averaged over copies of one batch.",
        change=(
            "`DataLoader(dataset, batch_size=..., sampler=DistributedSampler(dataset))` "
            "(and no `shuffle=True`); seed per-rank randomness with `seed + rank`"
        ),
        saving=(
            f"the job learns from 1/{n_ranks} of the samples it pays for: fixing it gives "
            f"{n_ranks}x the distinct samples per second"
        ),
        figures={"ranks": n_ranks, "identical_steps": n_same, "compared_steps": compared},
    )


def set_epoch_missing(run: RunRecord, figures: Mapping[str, Any]) -> Finding | None:
    """DistributedSampler without ``set_epoch``: the same shuffle every epoch."""
    samplers = _facts(run, "distributed_sampler")
    called = _facts(run, "set_epoch_called")
    missing = [r for r, used in samplers.items() if used is True and called.get(r) is False]
    if not missing:
        return None
    steps = max((len(r.steps) for r in run.ranks if r.rank in missing), default=0)
    return Finding(
        rule="set_epoch_missing",
        severity="medium",
        title="DistributedSampler.set_epoch() is never called",
        evidence=(
            f"DistributedSampler in use on ranks {_rank_list(missing)}; set_epoch() not called "
            f"during {steps} recorded steps"
        ),
        cause=(
            "the sampler shuffles with a seed derived from the epoch; without set_epoch every "
            "epoch repeats the first epoch's order on every rank."
        ),
        change="call `sampler.set_epoch(epoch)` at the start of each epoch, before iterating",
        figures={"ranks": missing},
    )


def find_unused_parameters(run: RunRecord, figures: Mapping[str, Any]) -> Finding | None:
    """DDP(find_unused_parameters=True): an autograd-graph traversal every iteration."""
    flagged = [r for r, v in _facts(run, "find_unused_parameters").items() if v is True]
    if not flagged or run.strategy != "ddp":
        return None
    means = [m for r in _ranks(figures) if (m := _mean_step_ms(r)) is not None]
    evidence = (
        f"DistributedDataParallel(find_unused_parameters=True) on ranks {_rank_list(flagged)}"
    )
    if means:
        evidence += f"; mean step {sum(means) / len(means):,.2f} ms"
    return Finding(
        rule="find_unused_parameters",
        severity="low",
        title="DDP searches for unused parameters every step",
        evidence=evidence,
        cause=(
            "find_unused_parameters=True makes DDP walk the autograd graph after each forward "
            "and delays bucket all-reduces until it knows which gradients will never arrive."
        ),
        change=(
            "`DistributedDataParallel(model, find_unused_parameters=False)`; if some parameters "
            "really are unused in every step, keep it off and pass `static_graph=True`"
        ),
        figures={"ranks": flagged},
    )


def clock_throttling(run: RunRecord, figures: Mapping[str, Any]) -> Finding | None:
    """NVML reported power or thermal clock reductions while the GPU was working."""
    hits: list[str] = []
    reasons_all: set[str] = set()
    figs: dict[str, Any] = {}
    for rec in run.ranks:
        if rec.sampler.kind != "nvml":
            continue
        for dev in rec.sampler.devices:
            seen = dev.facts.get("throttle_reasons_seen")
            if not isinstance(seen, list):
                continue
            reasons = sorted(str(r) for r in seen if r in THROTTLE_REASON_BITS)
            if not reasons:
                continue
            reasons_all.update(reasons)
            hits.append(_throttle_text(rec.rank, dev, reasons))
            figs[f"rank {rec.rank} {dev.device}"] = reasons
    if not hits:
        return None
    hardware = bool(reasons_all & HARDWARE_THROTTLE)
    return Finding(
        rule="clock_throttling",
        severity="high" if hardware else "medium",
        title="GPU clocks were throttled (power or temperature)",
        evidence="; ".join(hits),
        cause=(
            "the GPU lowered its SM clock to stay within its power limit or temperature: "
            "kernels run slower, and in multi-GPU jobs the throttled GPU becomes the straggler."
        ),
        change=(
            "check cooling and airflow and the power limit: `nvidia-smi -q -d "
            "PERFORMANCE,TEMPERATURE,POWER`; restore the default limit with `nvidia-smi -pl "
            "<watts>` if it was lowered"
        ),
        saving=None,
        figures={"reasons": figs},
    )


def _throttle_text(rank: int, dev: Any, reasons: list[str]) -> str:
    """Reasons plus the measured clock, temperature and power behind them."""
    text = f"rank {rank} {dev.device}: {', '.join(reasons)}"
    masks = [int(m) for m in dev.columns.get("clock_event_reasons", []) if m is not None]
    bits = 0
    for name in reasons:
        bits |= THROTTLE_REASON_BITS[name]
    if masks:
        hit = sum(1 for m in masks if m & bits)
        text += f" in {hit}/{len(masks)} samples"
    clock = _num(dev.summary.get("sm_clock_mhz_mean"))
    max_clock = _num(dev.facts.get("max_sm_clock_mhz"))
    if clock is not None and max_clock:
        text += f"; SM clock mean {clock:,.0f} MHz of {max_clock:,.0f} MHz max"
        text += f" ({100.0 * clock / max_clock:.0f} %)"
    temp = _num(dev.summary.get("temperature_c_max"))
    if temp is not None:
        text += f"; temperature max {temp:.0f} °C"
    power, limit = _num(dev.summary.get("power_w_mean")), _num(dev.facts.get("power_limit_w"))
    if power is not None and limit:
        text += f"; power mean {power:,.0f} W of {limit:,.0f} W limit"
    return text


Rule = Callable[[RunRecord, Mapping[str, Any]], "Finding | None"]

RULES: tuple[Rule, ...] = (
    dataparallel_in_use,
    identical_batches,
    exposed_communication,
    low_utilisation,
    dataloader_stall,
    fp32_gemms,
    memory_near_limit,
    rank_imbalance,
    clock_throttling,
    set_epoch_missing,
    find_unused_parameters,
    memory_headroom,
)
"""Every rule, in the order equal-severity findings are reported."""


def evaluate_findings(run: RunRecord, analysis: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every finding that fires, as JSON-ready dicts, most severe first.

    A rule that raises on malformed figures is skipped: findings are advice, and one bad figure
    in a run.json must not hide the report or the other findings.
    """
    found: list[Finding] = []
    for rule in RULES:
        try:
            finding = rule(run, analysis)
        except (TypeError, ValueError, KeyError, AttributeError, ZeroDivisionError):
            continue
        if finding is not None:
            found.append(finding)
    found.sort(key=lambda f: SEVERITY_ORDER[f.severity])
    return [msgspec.to_builtins(f) for f in found]
