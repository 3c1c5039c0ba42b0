"""Facts about the process a session runs in, for its ``RankRecord``: which CUDA devices it
drives, what the first of them is, the versions in use, and the strategy when none was given.

Split from ``session.py``: these are plain look-ups of torch and the environment with no session
state, so they read better on their own. ``session.py`` keeps ``_cuda_indices_in_use`` as a name
of its own (tests replace it there).
"""

from __future__ import annotations

from typing import Any

import torch

from mgprof.collect.distenv import RankInfo
from mgprof.records import DeviceInfo


def guess_strategy(info: RankInfo) -> str:
    return "ddp" if info.world_size > 1 else "single"


def cuda_indices_in_use(strategy: str | None) -> list[int]:
    """CUDA devices this process drives: all of them under DataParallel, else its own."""
    if not torch.cuda.is_available():
        return []
    from mgprof.collect.wrapping.wrap import devices_in_use

    return devices_in_use(strategy)


def device_info(cuda_indices: list[int]) -> DeviceInfo:
    if not cuda_indices:
        import platform

        return DeviceInfo(kind="cpu", name=platform.processor() or platform.machine())
    idx = cuda_indices[0]
    props = torch.cuda.get_device_properties(idx)
    uuid = getattr(props, "uuid", None)
    return DeviceInfo(
        kind="cuda",
        index=idx,
        name=props.name,
        total_memory_mib=round(props.total_memory / (1024 * 1024), 3),
        uuid=f"GPU-{uuid}" if uuid is not None and not str(uuid).startswith("GPU-") else uuid,
        pci_bus_id=pci_bus_id(props),
        capability=f"{props.major}.{props.minor}",
    )


def pci_bus_id(props: Any) -> str | None:
    try:
        return f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    except AttributeError:
        return None


def record_versions() -> dict[str, str | None]:
    try:
        from mgprof.collect.environment import versions

        return {k: None if v is None else str(v) for k, v in versions().items()}
    except Exception:
        import platform

        from mgprof import __version__

        return {
            "mgprof": __version__,
            "python": platform.python_version(),
            "torch": str(torch.__version__),
            "cuda": None if torch.version.cuda is None else str(torch.version.cuda),
        }
