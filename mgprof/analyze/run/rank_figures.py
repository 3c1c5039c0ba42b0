"""Every figure of one rank: steps, sampler utilisation and energy, memory headroom, traces."""

from __future__ import annotations

from typing import Any

import msgspec

from mgprof.analyze.readers import num as _float_or_none
from mgprof.analyze.run.regions import region_figures
from mgprof.analyze.run.results import DevicePeaks, DeviceUtil, MemoryFigures, RankAnalysis
from mgprof.analyze.run.steps import (
    dataloader_totals,
    steady_state_steps,
    step_time_stats,
    throughput,
)
from mgprof.analyze.run.trace_figures import trace_figures
from mgprof.analyze.run.traces import RunTraces
from mgprof.analyze.stats import mean, ratio_pct
from mgprof.records import RankRecord

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
        known = {k: row[k] for k in DevicePeaks.__struct_fields__ if k in row}
        figures.per_device[name] = msgspec.convert(known, DevicePeaks)
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
# Per rank


def _device_label(rank: RankRecord) -> str:
    dev = rank.device
    return dev.kind if dev.index is None else f"{dev.kind}:{dev.index}"


def analyze_rank(rank: RankRecord, traces: RunTraces) -> RankAnalysis:
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
        out.samples_per_s, why = throughput(steady, rank.step_form)
        if out.samples_per_s is None:
            na["samples_per_s"] = why
        dl, dur = dataloader_totals(rank, steady)
        out.dataloader_share_pct = ratio_pct(dl, dur)
        if out.dataloader_share_pct is None:
            na["dataloader_share_pct"] = "DataLoader wait was not timed on this rank"
    else:
        why = (
            "no steps recorded on this rank (the script made no optimizer step)"
            if rank.step_form == "auto"
            else "no steps recorded on this rank (call prof.step() once per iteration)"
        )
        for key in ("step_time_ms", "samples_per_s", "dataloader_share_pct"):
            na[key] = why

    out.regions = region_figures(rank.regions, rank.steps)
    _sampler_figures(rank, out)
    _energy_per_sample(rank, out)
    _memory_figures(rank, out)

    summaries = traces.per_rank.get(rank.rank)
    if summaries:
        trace_figures(rank, summaries, out)
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
