"""Test inputs shaped like the analysis schema (``mgprof.analyze.run.schema``): a trace summary
with every key the trace engine writes, so a hand-made one decodes like a real one."""

from __future__ import annotations

from typing import Any

TOTALS = (
    "window_us",
    "busy_pct",
    "idle_pct",
    "compute_pct",
    "comm_pct",
    "comm_overlap_pct",
    "exposed_comm_pct",
    "busy_us",
    "idle_us",
    "compute_us",
    "comm_us",
    "overlap_us",
    "exposed_comm_us",
    "memcpy_us",
    "memcpy_pct",
    "dataloader_us",
    "dataloader_pct",
)
COLLECTIVE = ("type", "count", "total_us", "exposed_us", "bytes", "group_size", "algbw_gbps",
              "busbw_gbps")  # fmt: skip


def _kernel(k: dict[str, Any]) -> dict[str, Any]:
    return {"count": 0, "total_us": 0.0, "pct_of_compute": 0.0, "kind": "other", **k}


def _collective(c: dict[str, Any]) -> dict[str, Any]:
    return {**{key: None for key in COLLECTIVE}, "count": 0, **c}


def trace_summary(**fields: Any) -> dict[str, Any]:
    """One rank's trace summary as the trace engine writes it (``mgprof trace --json``'s per-rank
    entry without ``collective_calls``), with ``fields`` over it: ``totals``, ``tensor_cores``
    and ``flops`` key by key, kernels and collectives filled to full entries."""
    out: dict[str, Any] = {
        "rank": None,
        "rank_source": "none",
        "world_size": None,
        "backend": None,
        "source": "trace.json",
        "kind": "gpu",
        "events": 0,
        "device_events": 0,
        "skipped_device_events": 0,
        "devices": [],
        "totals": dict.fromkeys(TOTALS),
        "steps": [],
        "collectives": [],
        "top_kernels": [],
        "tensor_cores": {
            "tensor_core_us": 0.0,
            "fp32_gemm_us": 0.0,
            "tensor_core_kernels": 0,
            "fp32_gemm_kernels": 0,
            "tensor_core_pct": None,
            "fp32_gemm_pct": None,
        },
        "flops": {"total_flops": None, "ops_with_flops": 0, "achieved_tflops": None},
        "not_applicable": {},
        "definitions": {},
    }
    for key in ("totals", "tensor_cores", "flops"):
        if key in fields:
            value = fields.pop(key)
            out[key] = {**out[key], **value} if isinstance(value, dict) else value
    for key in ("top_kernels", "kernels"):
        if key in fields:
            fields[key] = [_kernel(k) for k in fields[key]]
    if "collectives" in fields:
        fields["collectives"] = [_collective(c) for c in fields["collectives"]]
    out.update(fields)
    return out
