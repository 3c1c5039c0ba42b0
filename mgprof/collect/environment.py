"""Facts about the machine and software a run depends on, as plain dicts.

Used by ``mgprof doctor`` and by run records (:func:`versions`). Every probe is guarded: a broken
driver, a CPU-only torch or a missing NCCL is a fact to report, never an exception, so the doctor
works exactly where it is most needed.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Callable
from itertools import combinations
from typing import Any

from mgprof import __version__
from mgprof.collect.devices.device_map import (
    DeviceMapError,
    cuda_device_identity,
    resolve_nvml_device,
)
from mgprof.collect.devices.nvml import FALLBACK_HINT, NvmlSession

__all__ = ["collect_environment", "fallbacks", "versions"]


def _probe(errors: list[str], label: str, fn: Callable[..., Any], default: Any, *args: Any) -> Any:
    """Run ``fn(*args)``; a failure becomes a line in ``errors`` and the default value."""
    try:
        return fn(*args)
    except Exception as exc:
        errors.append(f"{label}: {type(exc).__name__}: {exc}")
        return default


def _format_nccl(raw: Any) -> str | None:
    if isinstance(raw, tuple):
        return ".".join(str(part) for part in raw)
    if isinstance(raw, int):  # older torch: 2.18.3 -> 21803
        major, rest = divmod(raw, 10000) if raw >= 10000 else divmod(raw, 1000)
        minor, patch = divmod(rest, 100)
        return f"{major}.{minor}.{patch}"
    return str(raw) if raw is not None else None


def _torch_facts(errors: list[str]) -> dict[str, Any]:
    facts: dict[str, Any] = {
        "version": None,
        "cuda_available": False,
        "cuda_runtime": None,
        "cudnn": None,
        "nccl": None,
        "device_count": 0,
        "distributed": {"available": False, "gloo": False, "nccl": False, "mpi": False},
    }
    try:
        import torch
    except Exception as exc:
        errors.append(f"torch: cannot import ({type(exc).__name__}: {exc})")
        return facts
    facts["version"] = str(torch.__version__)
    facts["cuda_runtime"] = torch.version.cuda
    facts["cuda_available"] = _probe(errors, "torch.cuda", torch.cuda.is_available, False)
    if facts["cuda_available"]:
        facts["device_count"] = _probe(errors, "torch.cuda", torch.cuda.device_count, 0)
    facts["cudnn"] = _probe(
        errors,
        "cudnn",
        lambda: (
            str(torch.backends.cudnn.version()) if torch.backends.cudnn.is_available() else None
        ),
        None,
    )
    if facts["cuda_runtime"]:
        facts["nccl"] = _probe(
            errors, "nccl", lambda: _format_nccl(torch.cuda.nccl.version()), None
        )
    dist = facts["distributed"]

    def dist_probe() -> None:
        import torch.distributed as td

        dist["available"] = bool(td.is_available())
        if dist["available"]:
            dist["gloo"] = bool(td.is_gloo_available())
            dist["nccl"] = bool(td.is_nccl_available())
            dist["mpi"] = bool(td.is_mpi_available())

    _probe(errors, "torch.distributed", dist_probe, None)
    return facts


def _cuda_gpus(count: int, errors: list[str]) -> list[dict[str, Any]]:
    gpus: list[dict[str, Any]] = []
    if count <= 0:
        return gpus
    import torch

    for index in range(count):

        def one(i: int = index) -> dict[str, Any]:
            props = torch.cuda.get_device_properties(i)
            uuid, pci = cuda_device_identity(i)
            return {
                "cuda_index": i,
                "name": props.name,
                "memory_total_mib": props.total_memory / 2**20,
                "compute_capability": f"{props.major}.{props.minor}",
                "uuid": uuid,
                "pci_bus_id": pci,
            }

        gpus.append(_probe(errors, f"cuda:{index}", one, {"cuda_index": index}))
    return gpus


def _nvml_facts(module: Any, errors: list[str]) -> dict[str, Any]:
    session = NvmlSession(module)
    reason = session.init()
    facts: dict[str, Any] = {
        "ok": reason is None,
        "reason": reason,
        "driver_version": None,
        "cuda_driver_version": None,
        "devices": [],
        "topology": [],
    }
    if reason is not None:
        return facts
    try:
        facts["driver_version"] = _probe(errors, "nvml driver", session.driver_version, None)
        facts["cuda_driver_version"] = _probe(
            errors, "nvml cuda driver", session.cuda_driver_version, None
        )
        count = _probe(errors, "nvml device count", session.device_count, 0)
        for i in range(count):
            facts["devices"].append(_probe(errors, f"nvml device {i}", session.device_facts, {}, i))
        for a, b in combinations(range(count), 2):
            level = _probe(
                errors, f"nvml topology {a}-{b}", lambda a=a, b=b: session.topology(a, b), None
            )
            if level is not None:
                facts["topology"].append({"a": a, "b": b, "level": level})
    finally:
        session.shutdown()
    return facts


def _merge_gpus(
    torch_gpus: list[dict[str, Any]], nvml_devices: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """One row per visible GPU: torch's view, joined to NVML's facts by the mapping rule."""
    if not torch_gpus:
        return [{"cuda_index": None, **facts} for facts in nvml_devices]
    rows = []
    for gpu in torch_gpus:
        row = dict(gpu)
        if nvml_devices:
            try:
                match = resolve_nvml_device(
                    nvml_devices,
                    uuid=gpu.get("uuid"),
                    pci_bus_id=gpu.get("pci_bus_id"),
                    cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
                    cuda_index=gpu["cuda_index"],
                    cuda_device_order=os.environ.get("CUDA_DEVICE_ORDER"),
                )
            except DeviceMapError as exc:
                row["nvml_mapping_error"] = str(exc)
            else:
                nvml = next((d for d in nvml_devices if d.get("nvml_index") == match.index), {})
                row.update({k: v for k, v in nvml.items() if row.get(k) is None})
                row["nvml_index"] = match.index
                row["nvml_mapped_by"] = match.by
        rows.append(row)
    return rows


def fallbacks(env: dict[str, Any]) -> list[str]:
    """What mgprof will do instead, given the environment facts (empty: nothing falls back)."""
    out: list[str] = []
    torch_facts = env.get("torch", {})
    dist = torch_facts.get("distributed", {})
    nvml = env.get("nvml", {})
    if not torch_facts.get("cuda_available"):
        if dist.get("gloo"):
            out.append("no CUDA: --gpus N runs N CPU ranks over gloo")
        else:
            out.append("no CUDA and no gloo in torch.distributed: only single-process runs")
        out.append("no CUDA: DataParallel and GPU metrics (MFU, NVML) are reported not applicable")
    elif not dist.get("nccl"):
        out.append("NCCL not available in torch: DDP runs over gloo on CUDA tensors (slower)")
    if not nvml.get("ok"):
        why = str(nvml.get("reason") or "NVML probe failed").removesuffix(f"; {FALLBACK_HINT}")
        out.append(f"NVML sampler replaced by the CPU sampler ({why})")
    return out


def collect_environment(nvml_module: Any = None) -> dict[str, Any]:
    """Everything ``mgprof doctor`` shows, as a JSON-ready dict. Never raises."""
    errors: list[str] = []
    torch_facts = _probe(errors, "torch", lambda: _torch_facts(errors), {})
    nvml = _probe(errors, "nvml", lambda: _nvml_facts(nvml_module, errors), {"ok": False})
    torch_gpus = _probe(
        errors, "cuda devices", lambda: _cuda_gpus(torch_facts.get("device_count", 0), errors), []
    )
    env: dict[str, Any] = {
        "mgprof": __version__,
        "python": {
            "version": platform.python_version(),
            "implementation": platform.python_implementation(),
            "executable": sys.executable,
        },
        "platform": {
            "system": platform.system(),
            "release": platform.release(),
            "machine": platform.machine(),
            "cpu_count": os.cpu_count(),
        },
        "env": {
            name: os.environ.get(name)
            for name in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "NCCL_DEBUG")
        },
        "torch": torch_facts,
        "nvml": nvml,
        "gpus": _probe(
            errors, "gpu mapping", lambda: _merge_gpus(torch_gpus, nvml.get("devices", [])), []
        ),
    }
    env["fallbacks"] = _probe(errors, "fallbacks", lambda: fallbacks(env), [])
    env["probe_errors"] = errors
    return env


def versions(nvml_module: Any = None) -> dict[str, str | None]:
    """Versions that decide what a run's numbers mean; recorded in every RankRecord."""
    errors: list[str] = []
    torch_facts = _probe(errors, "torch", lambda: _torch_facts(errors), {})
    session = NvmlSession(nvml_module)
    driver: str | None = None
    if session.init() is None:
        driver = _probe(errors, "driver", session.driver_version, None)
        session.shutdown()
    return {
        "python": platform.python_version(),
        "torch": torch_facts.get("version"),
        "cuda": torch_facts.get("cuda_runtime"),
        "cudnn": torch_facts.get("cudnn"),
        "nccl": torch_facts.get("nccl"),
        "mgprof": __version__,
        "driver": driver,
    }
