"""Findings on how well the GPUs compute: idle time, FP32 matmuls, throttled clocks."""

from __future__ import annotations

from typing import Any

from mgprof.analyze.findings.core import Finding, _cuda_ranks, _trace_summaries, finding_id
from mgprof.analyze.findings.fit import uses_gpu
from mgprof.analyze.readers import num as _num
from mgprof.analyze.run.schema import RunAnalysis, given
from mgprof.records import RunRecord

# --------------------------------------------------------------------------------------------
# Thresholds

LOW_UTIL_PCT = 60.0
"""GPU busy below 60 % of the time: a well-fed training step keeps kernels running > 80 %, and the
gap between 60 and 80 is often launch overhead that only CUDA graphs remove."""
VERY_LOW_UTIL_PCT = 30.0
"""Busy under 30 %: the GPU mostly waits; the host side is the bottleneck."""

FP32_GEMM_PCT = 20.0
"""FP32 GEMMs above 20 % of compute-kernel time: tensor cores (bf16/fp16) run GEMMs 8-16x
faster at peak, so even a partly memory-bound share this size saves noticeable time."""

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


# --------------------------------------------------------------------------------------------
# Rules


def low_utilisation(run: RunRecord, figures: RunAnalysis) -> Finding | None:
    """GPUs idle much of the time (NVML utilisation, or trace busy on GPU traces)."""
    if not uses_gpu(run):
        return None
    cuda = {r.rank for r in _cuda_ranks(run)}
    low: list[tuple[float, int, str]] = []
    for rank in figures.ranks:
        if rank.rank not in cuda:
            continue  # a CPU rank's busy share says nothing about a GPU
        nvml = rank.nvml_gpu_util_pct
        busy = rank.trace_busy_pct
        readings = [
            (v, what) for v, what in ((nvml, "NVML"), (busy, "trace busy")) if v is not None
        ]
        if not readings:
            continue
        value, what = min(readings)
        if value < LOW_UTIL_PCT:
            low.append((value, rank.rank, what))
    if not low:
        return None
    worst, worst_rank, what = min(low)
    listed = ", ".join(
        f"rank {r} {v:.1f} % ({src})" for v, r, src in sorted(low, key=lambda x: x[1])
    )
    evidence = (
        f"GPU utilisation below {LOW_UTIL_PCT:.0f} % (high < {VERY_LOW_UTIL_PCT:.0f} %): {listed}"
    )
    return Finding(
        id=finding_id("low_utilisation"),
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
        fix=[
            "DataLoader(num_workers=..., pin_memory=True)",
            "torch.compile(model)",
            'torch.compile(model, mode="reduce-overhead")',
        ],
        saving=f"up to {100.0 - worst:.1f} % of step time is GPU idle time on rank {worst_rank}",
        figures={
            "lowest_util_pct": worst,
            "rank": worst_rank,
            "source": what,
            "util_pct_by_rank": {str(r): v for v, r, _ in sorted(low, key=lambda x: x[1])},
            "idle_pct": 100.0 - worst,
            "threshold_util_pct": LOW_UTIL_PCT,
            "threshold_high_util_pct": VERY_LOW_UTIL_PCT,
        },
    )


def _tensor_core_facts(figures: RunAnalysis, rank: int) -> tuple[float, float, int] | None:
    """(fp32 GEMM µs, all compute µs estimate, fp32 GEMM launches) summed over a rank's traces."""
    fp32_us = compute_us = 0.0
    kernels = 0
    seen = False
    for summary in _trace_summaries(figures, rank):
        if summary.kind != "gpu":
            continue
        tc = summary.tensor_cores
        fp_us, fp_pct = tc.fp32_gemm_us, tc.fp32_gemm_pct
        if fp_pct is None:
            continue
        seen = True
        fp32_us += fp_us
        kernels += tc.fp32_gemm_kernels
        if fp_pct > 0:
            compute_us += fp_us * 100.0 / fp_pct
        else:
            # fp32 share zero: the compute total is tensor-core time over its share, if any.
            tc_us, tc_pct = tc.tensor_core_us, tc.tensor_core_pct
            if tc_pct:
                compute_us += tc_us * 100.0 / tc_pct
    return (fp32_us, compute_us, kernels) if seen else None


def fp32_gemms(run: RunRecord, figures: RunAnalysis) -> Finding | None:
    """Matrix multiplies in FP32 on a GPU that has tensor cores, and no autocast in sight."""
    if not uses_gpu(run):
        return None
    if any(r.training.autocast_used for r in run.ranks):
        return None
    for rec in sorted(_cuda_ranks(run), key=lambda r: r.rank):
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
        fix = [f'torch.autocast("cuda", dtype={dtype})']
        if not bf16:
            fix.append("torch.amp.GradScaler()")
        fix.append("torch.backends.cuda.matmul.allow_tf32 = True")
        measured = measured_precision(figures, run.strategy)
        return Finding(
            id=finding_id("fp32_gemm"),
            rule="fp32_gemm",
            severity="medium",
            title="Matrix multiplies run in FP32, not on tensor cores",
            evidence=(
                f"rank {rec.rank} ({name}): FP32 GEMM kernels take {pct:.1f} % of compute-kernel "
                f"time ({fp32_us / 1000.0:,.2f} ms, {kernels} launches); {seen}"
                + (f"; {measured}" if measured else "")
            ),
            cause=(
                "without autocast every matmul and convolution runs in float32 on the CUDA cores; "
                "tensor cores only take bf16/fp16 (or TF32 when enabled)."
            ),
            change=change,
            fix=fix,
            saving=(
                f"most of the {fp32_us / 1000.0:,.2f} ms of FP32 GEMM time per trace: tensor-core "
                "GEMMs reach 8-16x the FP32 peak"
            ),
            figures={
                "rank": rec.rank,
                "fp32_gemm_pct": pct,
                "fp32_gemm_ms": fp32_us / 1000.0,
                "fp32_gemm_kernels": kernels,
                "threshold_fp32_gemm_pct": FP32_GEMM_PCT,
            },
        )
    return None


def _capability(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return 0.0


def clock_throttling(run: RunRecord, figures: RunAnalysis) -> Finding | None:
    """NVML reported power or thermal clock reductions while the GPU was working."""
    if not uses_gpu(run):
        return None
    hits: list[str] = []
    reasons_all: set[str] = set()
    figs: dict[str, Any] = {}
    for rec in sorted(run.ranks, key=lambda r: r.rank):
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
            device_figs: dict[str, Any] = {"reasons": reasons}
            hits.append(_throttle_text(rec.rank, dev, reasons, device_figs))
            figs[f"rank {rec.rank} {dev.device}"] = device_figs
    if not hits:
        return None
    hardware = bool(reasons_all & HARDWARE_THROTTLE)
    return Finding(
        id=finding_id("clock_throttling"),
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
        fix=["nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER", "nvidia-smi -pl <watts>"],
        saving=None,
        figures={"devices": figs},
    )


def _throttle_text(rank: int, dev: Any, reasons: list[str], figs: dict[str, Any]) -> str:
    """Reasons plus the measured clock, temperature and power behind them (also into ``figs``)."""
    text = f"rank {rank} {dev.device}: {', '.join(reasons)}"
    masks = [int(m) for m in dev.columns.get("clock_event_reasons", []) if m is not None]
    bits = 0
    for name in reasons:
        bits |= THROTTLE_REASON_BITS[name]
    if masks:
        hit = sum(1 for m in masks if m & bits)
        text += f" in {hit}/{len(masks)} samples"
        figs["samples_throttled"], figs["samples"] = hit, len(masks)
    clock = _num(dev.summary.get("sm_clock_mhz_mean"))
    max_clock = _num(dev.facts.get("max_sm_clock_mhz"))
    if clock is not None and max_clock:
        text += f"; SM clock mean {clock:,.0f} MHz of {max_clock:,.0f} MHz max"
        text += f" ({100.0 * clock / max_clock:.0f} %)"
        figs["sm_clock_mhz_mean"], figs["max_sm_clock_mhz"] = clock, max_clock
        figs["sm_clock_pct_of_max"] = 100.0 * clock / max_clock
    temp = _num(dev.summary.get("temperature_c_max"))
    if temp is not None:
        text += f"; temperature max {temp:.0f} °C"
        figs["temperature_c_max"] = temp
    power, limit = _num(dev.summary.get("power_w_mean")), _num(dev.facts.get("power_limit_w"))
    if power is not None and limit:
        text += f"; power mean {power:,.0f} W of {limit:,.0f} W limit"
        figs["power_w_mean"], figs["power_limit_w"] = power, limit
    return text


def measured_precision(analysis: RunAnalysis, strategy: str) -> str | None:
    """``measured by mgprof compare: bf16 1.90x, memory -31 %`` from the precision rows of
    ``strategy`` in the comparison this run belongs to (``analysis.comparison``)."""
    table = given(analysis.comparison)
    parts = []
    for row in table.rows if table is not None else []:
        if row.strategy != strategy:
            continue
        speedup = row.precision_speedup
        if row.precision not in ("bf16", "fp16") or speedup is None:
            continue
        text = f"{row.precision} {speedup:.2f}x"
        mem = row.peak_mem_change_pct
        if mem is not None:
            text += f", memory {mem:+.0f} %"
        status = row.loss_check.status if row.loss_check is not None else None
        if status in ("non-finite", "diverged"):
            text += f", loss {status}"
        parts.append(f"{text} (run {row.run})")
    return "measured by mgprof compare: " + "; ".join(parts) if parts else None
