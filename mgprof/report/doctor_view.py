"""Render ``mgprof doctor``'s environment facts (a plain dict) as rich tables.

Takes the dict from ``mgprof.collect.environment.collect_environment`` and nothing else, so this
module stays free of torch and pynvml like the rest of ``report/``. Every value (device names,
driver strings, environment variables, error text) enters rich as ``Text`` through ``safe_text``:
never markup, control characters shown escaped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from mgprof.report.safe_text import rich_text

__all__ = ["render_doctor"]


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.0f}" if value >= 100 else f"{value:g}"
    return str(value)


def _cell(value: Any) -> Text:
    """A table cell: the value as text (``safe_text``), never markup."""
    return rich_text(_fmt(value))


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
        table.add_row(rich_text(name), _cell(value))
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
            _cell(gpu.get("cuda_index")),
            _cell(gpu.get("nvml_index")),
            _cell(gpu.get("name")),
            _cell(gpu.get("memory_total_mib")),
            _cell(gpu.get("compute_capability")),
            _cell(gpu.get("uuid")),
            _cell(gpu.get("pci_bus_id")),
            _cell(nvlink),
            _cell(pcie),
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
        table.add_column(rich_text(f"GPU{i}"))
    for a in indices:
        cells = [_cell("X" if a == b else level.get((min(a, b), max(a, b)), "-")) for b in indices]
        table.add_row(_cell(f"GPU{a}"), *cells)
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
        out.print(rich_text(f"  - {line}", multiline=True, highlight=True))
    for gpu in gpus:
        if gpu.get("nvml_mapping_error"):
            out.print(
                rich_text(
                    f"  - cuda:{gpu.get('cuda_index')}: {gpu['nvml_mapping_error']}",
                    multiline=True,
                    highlight=True,
                )
            )
    for line in env.get("probe_errors") or []:
        out.print(Text("probe failed", style="yellow") + rich_text(f": {line}", multiline=True))


def render_bandwidth(result: Mapping[str, Any], console: Console | None = None) -> None:
    """The measured bus bandwidth per collective and size (``mgprof doctor --bandwidth``)."""
    console = console or Console()
    title = (
        f"Collective bandwidth: {result.get('world_size')} ranks, backend "
        f"{result.get('backend')} on {result.get('device')} "
        f"({result.get('iters')} timed calls per size)"
    )
    table = Table(title=rich_text(title, "table.title"))
    for col in ("op", "bytes", "time us", "algbw GB/s", "busbw GB/s"):
        table.add_column(col, justify="left" if col == "op" else "right")
    for row in result.get("rows", []):
        if not isinstance(row, Mapping):
            continue
        if row.get("error"):
            table.add_row(
                _cell(row.get("op")),
                _cell(row.get("bytes")),
                "n/a",
                "n/a",
                _cell(row["error"]),
            )
            continue
        table.add_row(
            _cell(row.get("op")),
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
