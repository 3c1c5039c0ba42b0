"""Folds a rank's trace summaries into its figures: busy %, communication, bus bandwidth, MFU."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from mgprof.analyze.readers import num as _float_or_none
from mgprof.analyze.run.device_peaks import device_peak_tflops
from mgprof.analyze.run.results import CollectiveFigures, CommFigures, RankAnalysis
from mgprof.analyze.stats import ratio_pct
from mgprof.records import RankRecord


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
        collectives=_typed(collectives),
    )


def _typed(collectives: dict[str, dict[str, Any]]) -> dict[str, CollectiveFigures]:
    """The merged rows as records; a row another trace engine filled with values of the wrong
    type keeps only what can be read (never an exception: the other figures must show)."""
    out: dict[str, CollectiveFigures] = {}
    for ctype, row in collectives.items():
        known = {k: v for k, v in row.items() if k in CollectiveFigures.__struct_fields__}
        try:
            out[ctype] = msgspec.convert(known, CollectiveFigures)
        except msgspec.ValidationError:
            kept = {}
            for key, value in known.items():
                try:
                    msgspec.convert({key: value}, CollectiveFigures)
                except msgspec.ValidationError:
                    continue
                kept[key] = value
            out[ctype] = msgspec.convert(kept, CollectiveFigures)
    return out


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


def trace_figures(rank: RankRecord, summaries: list[dict[str, Any]], out: RankAnalysis) -> None:
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
