"""Map a CUDA device index in this process to the NVML device that is physically the same GPU.

CUDA renumbers devices: under ``CUDA_VISIBLE_DEVICES="2,0"`` CUDA's ``cuda:0`` is NVML's device 2,
and CUDA's default order (fastest first) need not be NVML's PCI order. Sampling the wrong GPU would
put another job's numbers in the report, so the mapping prefers the GPU's own identity (UUID, then
PCI bus id) and refuses, with a reason, whenever it cannot be sure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mgprof.errors import MgprofError

__all__ = [
    "DeviceMapError",
    "NvmlMatch",
    "cuda_device_identity",
    "normalize_pci_bus_id",
    "normalize_uuid",
    "resolve_nvml_device",
    "resolve_nvml_index",
]


class DeviceMapError(MgprofError):
    """The CUDA device cannot be matched to one NVML device with certainty."""


@dataclass(frozen=True)
class NvmlMatch:
    """The NVML index of a CUDA device and how it was found (``uuid``, ``pci_bus_id``, ...)."""

    index: int
    by: str


_PCI_RE = re.compile(
    r"^(?:(?P<domain>[0-9a-f]{1,8}):)?(?P<bus>[0-9a-f]{1,2}):(?P<dev>[0-9a-f]{1,2})\.(?P<fn>[0-7])$"
)


def normalize_pci_bus_id(bus_id: str) -> str | None:
    """``'00000000:3B:00.0'`` and ``'0000:3b:00.0'`` both become ``'0000:3b:00.0'``; junk -> None.

    NVML pads the PCI domain to 8 hex digits and uses upper case; torch and sysfs use 4 and lower.
    """
    m = _PCI_RE.match(bus_id.strip().lower())
    if m is None:
        return None
    domain = int(m["domain"] or "0", 16)
    return f"{domain:04x}:{int(m['bus'], 16):02x}:{int(m['dev'], 16):02x}.{m['fn']}"


def normalize_uuid(uuid: str) -> str:
    """Lower-case UUID without the ``GPU-`` prefix (NVML has it, torch's str(uuid) may not)."""
    text = uuid.strip().lower()
    return text[4:] if text.startswith("gpu-") else text


def _nvml_index(facts: Mapping[str, Any], position: int) -> int:
    value = facts.get("nvml_index", facts.get("index"))
    return value if isinstance(value, int) and not isinstance(value, bool) else position


def _by_uuid(devices: Sequence[Mapping[str, Any]], uuid: str) -> int | None:
    want = normalize_uuid(uuid)
    for pos, facts in enumerate(devices):
        have = facts.get("uuid")
        if isinstance(have, str) and normalize_uuid(have) == want:
            return _nvml_index(facts, pos)
    return None


def _by_pci(devices: Sequence[Mapping[str, Any]], pci_bus_id: str) -> int | None:
    want = normalize_pci_bus_id(pci_bus_id)
    if want is None:
        return None
    for pos, facts in enumerate(devices):
        have = facts.get("pci_bus_id")
        if isinstance(have, str) and normalize_pci_bus_id(have) == want:
            return _nvml_index(facts, pos)
    return None


def _cuda_order_matches_nvml(
    devices: Sequence[Mapping[str, Any]], cuda_device_order: str | None
) -> bool:
    """Whether CUDA's ordinal order is NVML's (PCI) order.

    CUDA orders fastest first, ties broken by PCI bus id; NVML orders by PCI bus id. The two agree
    when CUDA_DEVICE_ORDER=PCI_BUS_ID or when all GPUs are the same model.
    """
    if (cuda_device_order or "").strip().upper() == "PCI_BUS_ID":
        return True
    names = {facts.get("name") for facts in devices}
    return len(devices) <= 1 or (len(names) == 1 and None not in names)


def _parse_visible(
    devices: Sequence[Mapping[str, Any]], cuda_visible_devices: str, cuda_device_order: str | None
) -> list[int]:
    """NVML indices of CUDA's visible devices, in CUDA's order, parsed as the CUDA runtime does.

    The runtime stops at the first entry it cannot use, so this does too.
    """
    out: list[int] = []
    for raw in cuda_visible_devices.split(","):
        entry = raw.strip()
        if entry.upper().startswith("MIG-"):
            raise DeviceMapError(
                f"CUDA_VISIBLE_DEVICES names a MIG instance ({entry}); NVML sampling of MIG "
                "instances is not supported, so the NVML sampler is off for it"
            )
        if entry.upper().startswith("GPU-"):
            want = normalize_uuid(entry)
            hits = [
                _nvml_index(f, pos)
                for pos, f in enumerate(devices)
                if isinstance(f.get("uuid"), str) and normalize_uuid(f["uuid"]).startswith(want)
            ]
            if len(hits) != 1:
                break  # unknown or ambiguous prefix: the runtime hides this and later entries
            out.append(hits[0])
            continue
        m = re.match(r"^\+?(\d+)", entry)
        if m is None:
            break
        ordinal = int(m.group(1))
        if ordinal >= len(devices):
            break
        if not _cuda_order_matches_nvml(devices, cuda_device_order):
            raise DeviceMapError(
                f"CUDA_VISIBLE_DEVICES entry {entry!r} counts in CUDA's fastest-first order, which "
                "differs from NVML's on this mix of GPU models; set CUDA_DEVICE_ORDER=PCI_BUS_ID "
                "(or use GPU UUIDs) so mgprof can tell which GPU to sample"
            )
        out.append(_nvml_index(devices[ordinal], ordinal))
    return out


def resolve_nvml_device(
    nvml_devices_facts: Sequence[Mapping[str, Any]],
    *,
    uuid: str | None = None,
    pci_bus_id: str | None = None,
    cuda_visible_devices: str | None = None,
    cuda_index: int,
    cuda_device_order: str | None = None,
) -> NvmlMatch:
    """Find the NVML device behind ``cuda:<cuda_index>``; raise :class:`DeviceMapError` if unsure.

    Order: the GPU's UUID, then its PCI bus id; only when the process could not tell either
    (``uuid`` and ``pci_bus_id`` both None) is ``CUDA_VISIBLE_DEVICES`` parsed. An identity that
    matches no NVML device is an error, never a guess.
    """
    devices = list(nvml_devices_facts)
    if uuid:
        index = _by_uuid(devices, uuid)
        if index is not None:
            return NvmlMatch(index, "uuid")
    if pci_bus_id:
        index = _by_pci(devices, pci_bus_id)
        if index is not None:
            return NvmlMatch(index, "pci_bus_id")
    if uuid or pci_bus_id:
        raise DeviceMapError(
            f"cuda:{cuda_index} (uuid {uuid or '?'}, PCI {pci_bus_id or '?'}) matches none of the "
            f"{len(devices)} GPU(s) NVML sees; a MIG instance or a container with a different "
            "view of the GPUs can cause this; the NVML sampler skips this device"
        )
    if cuda_index < 0:
        raise DeviceMapError(f"cuda:{cuda_index} is not a CUDA device index")
    if cuda_visible_devices is None:
        if cuda_index >= len(devices):
            raise DeviceMapError(
                f"cuda:{cuda_index} does not exist: NVML sees {len(devices)} GPU(s)"
            )
        if not _cuda_order_matches_nvml(devices, cuda_device_order):
            raise DeviceMapError(
                f"cannot tell which GPU cuda:{cuda_index} is: its UUID is unknown and CUDA's "
                "fastest-first order differs from NVML's on this mix of GPU models; set "
                "CUDA_DEVICE_ORDER=PCI_BUS_ID"
            )
        return NvmlMatch(_nvml_index(devices[cuda_index], cuda_index), "index")
    visible = _parse_visible(devices, cuda_visible_devices, cuda_device_order)
    if cuda_index >= len(visible):
        raise DeviceMapError(
            f"cuda:{cuda_index} is not among the {len(visible)} device(s) that "
            f"CUDA_VISIBLE_DEVICES={cuda_visible_devices!r} makes visible"
        )
    return NvmlMatch(visible[cuda_index], "cuda_visible_devices")


def resolve_nvml_index(
    nvml_devices_facts: Sequence[Mapping[str, Any]],
    *,
    uuid: str | None = None,
    pci_bus_id: str | None = None,
    cuda_visible_devices: str | None = None,
    cuda_index: int,
    cuda_device_order: str | None = None,
) -> int:
    """NVML index of ``cuda:<cuda_index>`` (see :func:`resolve_nvml_device` for the rule)."""
    return resolve_nvml_device(
        nvml_devices_facts,
        uuid=uuid,
        pci_bus_id=pci_bus_id,
        cuda_visible_devices=cuda_visible_devices,
        cuda_index=cuda_index,
        cuda_device_order=cuda_device_order,
    ).index


def _format_torch_uuid(raw: Any) -> str | None:
    if raw is None:
        return None
    text = str(raw).strip()
    if not text:
        return None
    if text.upper().startswith(("GPU-", "MIG-")):
        return text
    return f"GPU-{text}"


def cuda_device_identity(index: int) -> tuple[str | None, str | None]:
    """``(uuid, pci_bus_id)`` of ``cuda:<index>`` as torch reports them; None for what it lacks.

    torch is imported here, not at module level, so device mapping stays usable without it.
    """
    try:
        import torch

        props = torch.cuda.get_device_properties(index)
    except Exception:
        return None, None
    uuid = _format_torch_uuid(getattr(props, "uuid", None))
    bus = getattr(props, "pci_bus_id", None)
    dev = getattr(props, "pci_device_id", None)
    domain = getattr(props, "pci_domain_id", None)
    pci: str | None = None
    if isinstance(bus, int) and isinstance(dev, int):
        pci = f"{domain if isinstance(domain, int) else 0:04x}:{bus:02x}:{dev:02x}.0"
    return uuid, pci
