"""Render ``mgprof doctor``'s environment facts (a plain dict) as rich tables.

Takes the dict from ``mgprof.collect.environment.collect_environment`` and nothing else, so this
module stays free of torch and pynvml like the rest of ``report/``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.table import Table

__all__ = ["render_doctor"]


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.0f}" if value >= 100 else f"{value:g}"
    return str(value)


def _software(env: Mapping[str, Any]) -> Table:
    torch = env.get("torch") or {}
    dist = torch.get("distributed") or {}
    nvml = env.get("nvml") or {}
    python = env.get("python") or {}
    plat = env.get("platform") or {}
    table = Table(title="mgprof doctor", show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value", overflow="fold")
    backends = [name for name in ("gloo", "nccl", "mpi") if dist.get(name)]
    rows = [
        ("mgprof", env.get("mgprof")),
        ("python", python.get("version")),
        ("platform", f"{plat.get('system')} {plat.get('release')} {plat.get('machine')}"),
        ("torch", torch.get("version")),
        ("CUDA available", torch.get("cuda_available")),
        ("CUDA runtime", torch.get("cuda_runtime")),
        ("cuDNN", torch.get("cudnn")),
        ("NCCL", torch.get("nccl")),
        ("distributed backends", ", ".join(backends) if backends else "none"),
        ("NVML", "works" if nvml.get("ok") else f"not available: {nvml.get('reason')}"),
        ("driver", nvml.get("driver_version")),
        ("CUDA driver API", nvml.get("cuda_driver_version")),
    ]
    for env_name, env_value in (env.get("env") or {}).items():
        if env_value is not None:
            rows.append((env_name, env_value))
    for name, value in rows:
        table.add_row(name, _fmt(value))
    return table


def _gpus(gpus: list[Mapping[str, Any]]) -> Table:
    table = Table(title="GPUs", title_justify="left")
    for name in ("cuda", "nvml", "name", "memory MiB", "cc", "uuid", "PCI", "NVLink", "PCIe"):
        table.add_column(name, overflow="fold")
    for gpu in gpus:
        links = gpu.get("nvlink_active")
        nvlink = f"{sum(bool(x) for x in links)}/{len(links)} active" if links else "-"
        pcie = (
            f"gen{_fmt(gpu.get('pcie_gen'))} x{_fmt(gpu.get('pcie_width'))}"
            if gpu.get("pcie_gen") is not None
            else "-"
        )
        table.add_row(
            _fmt(gpu.get("cuda_index")),
            _fmt(gpu.get("nvml_index")),
            _fmt(gpu.get("name")),
            _fmt(gpu.get("memory_total_mib")),
            _fmt(gpu.get("compute_capability")),
            _fmt(gpu.get("uuid")),
            _fmt(gpu.get("pci_bus_id")),
            nvlink,
            pcie,
        )
    return table


def _topology(topology: list[Mapping[str, Any]]) -> Table:
    indices = sorted({t["a"] for t in topology} | {t["b"] for t in topology})
    level = {(t["a"], t["b"]): t["level"] for t in topology}
    table = Table(
        title="Topology (NVML common ancestor, as nvidia-smi topo -m)", title_justify="left"
    )
    table.add_column("")
    for i in indices:
        table.add_column(f"GPU{i}")
    for a in indices:
        cells = ["X" if a == b else level.get((min(a, b), max(a, b)), "-") for b in indices]
        table.add_row(f"GPU{a}", *cells)
    return table


def render_doctor(env: Mapping[str, Any], console: Console | None = None) -> None:
    """Print the doctor report: software, GPUs, topology, and what mgprof falls back to."""
    out = console or Console()
    out.print(_software(env))
    gpus = env.get("gpus") or []
    if gpus:
        out.print(_gpus(gpus))
    else:
        out.print("[bold]GPUs[/bold]: none visible")
    topology = (env.get("nvml") or {}).get("topology") or []
    if topology:
        out.print(_topology(topology))
    fallbacks = env.get("fallbacks") or []
    out.print(
        "[bold]mgprof will fall back to[/bold]:" if fallbacks else "[bold]Fallbacks[/bold]: none"
    )
    for line in fallbacks:
        out.print(f"  - {line}", markup=False)
    for gpu in gpus:
        if gpu.get("nvml_mapping_error"):
            out.print(
                f"  - cuda:{gpu.get('cuda_index')}: {gpu['nvml_mapping_error']}", markup=False
            )
    for line in env.get("probe_errors") or []:
        out.print(f"[yellow]probe failed[/yellow]: {line}", highlight=False)


def render_bandwidth(result: Mapping[str, Any], console: Console | None = None) -> None:
    """The measured bus bandwidth per collective and size (``mgprof doctor --bandwidth``)."""
    console = console or Console()
    table = Table(
        title=(
            f"Collective bandwidth: {result.get('world_size')} ranks, backend "
            f"{result.get('backend')} on {result.get('device')} "
            f"({result.get('iters')} timed calls per size)"
        )
    )
    for col in ("op", "bytes", "time us", "algbw GB/s", "busbw GB/s"):
        table.add_column(col, justify="left" if col == "op" else "right")
    for row in result.get("rows", []):
        if not isinstance(row, Mapping):
            continue
        if row.get("error"):
            table.add_row(
                str(row.get("op")), str(row.get("bytes")), "n/a", "n/a", str(row["error"])
            )
            continue
        table.add_row(
            str(row.get("op")),
            f"{row.get('bytes'):,}",
            f"{row.get('time_us', 0):,.1f}",
            f"{row.get('algbw_gbps', 0):.3f}",
            "n/a" if row.get("busbw_gbps") is None else f"{row['busbw_gbps']:.3f}",
        )
    console.print(table)
    console.print(
        "busbw = algbw x 2(n-1)/n (all-reduce), x (n-1)/n (all-gather, reduce-scatter), as "
        "nccl-tests; set a job's busbw (mgprof trace, the report) beside these figures",
        highlight=False,
    )
