"""Test doubles that ship with mgprof, so users and mgprof's own tests can run without a GPU.

``FakeNvml`` stands in for the pynvml module: same function names, the REAL ``pynvml.NVMLError``
and error codes, values that look like an H200's, and failure injection. ``ManualClock`` is a clock
that only moves when told to. Import-light on purpose: pynvml only, never torch.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml

__all__ = ["FakeGpu", "FakeHandle", "FakeNvml", "ManualClock", "h200"]


class ManualClock:
    """A monotonic clock for tests: ``clock()`` reads it, ``advance(dt)`` moves it.

    ``auto_advance_s`` moves it by that much on every read, like rich's ``MockClock``.
    """

    def __init__(self, start: float = 0.0, auto_advance_s: float = 0.0) -> None:
        self.now = float(start)
        self.auto_advance_s = float(auto_advance_s)

    def __call__(self) -> float:
        value = self.now
        self.now += self.auto_advance_s
        return value

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a monotonic clock cannot go back")
        self.now += seconds


@dataclass
class FakeGpu:
    """One fake device. Readings are plain attributes: change them between ticks in a test.

    Units follow NVML's own (mW, mJ, bytes) where NVML returns them, so the code under test does
    the conversions it does on a real GPU. ``unsupported`` names functions that answer
    NVML_ERROR_NOT_SUPPORTED on this device.
    """

    name: str = "NVIDIA H200"
    uuid: str = "GPU-5f3d2c1b-8a9e-4b7c-9d1e-2f3a4b5c6d7e"
    pci_bus_id: str = "00000000:19:00.0"
    memory_total_bytes: int = 143771 * 2**20
    power_limit_mw: int = 700_000
    max_sm_clock_mhz: int = 1980
    compute_capability: tuple[int, int] = (9, 0)
    nvlink_active: list[bool] | None = field(default_factory=lambda: [True] * 18)
    pcie_gen: int = 5
    pcie_width: int = 16
    pcie_max_gen: int = 5
    gpu_util_pct: int = 98
    mem_util_pct: int = 41
    memory_used_bytes: int = 81_920 * 2**20
    power_mw: int = 612_345
    energy_mj: int = 1_234_567_890
    energy_step_mj: int = 61_234
    """Added to the energy counter on every read (a GPU at ~612 W read every 0.1 s)."""
    sm_clock_mhz: int = 1980
    clock_event_reasons: int = 0
    pcie_tx_kbps: int = 1_250_000
    pcie_rx_kbps: int = 2_500_000
    temperature_c: int = 47
    unsupported: set[str] = field(default_factory=set)


def h200(index: int, **overrides: Any) -> FakeGpu:
    """An H200-like device with a UUID and PCI bus id unique to ``index``."""
    base: dict[str, Any] = {
        "uuid": f"GPU-{index:08x}-8a9e-4b7c-9d1e-2f3a4b5c6d7e",
        "pci_bus_id": f"00000000:{0x19 + 0x10 * index:02X}:00.0",
    }
    base.update(overrides)
    return FakeGpu(**base)


@dataclass(frozen=True)
class FakeHandle:
    """What ``nvmlDeviceGetHandleByIndex`` returns: the device's NVML index."""

    index: int


class FakeNvml:
    """A stand-in for the ``pynvml`` module, built from :class:`FakeGpu` devices.

    - ``fail_after={"nvmlDeviceGetUtilizationRates": (3, NVML_ERROR_GPU_IS_LOST)}``: the first 3
      calls succeed, later ones raise ``pynvml.NVMLError(code)``; a 3-tuple ``(n, code, index)``
      limits the failure to one device.
    - ``unsupported``: functions that raise NOT_SUPPORTED on every device.
    - ``missing``: functions absent from this binding (an older pynvml); reading them gives None.
    - ``init_error``: an NVML error code that ``nvmlInit`` raises (e.g. LIBRARY_NOT_FOUND).
    - ``calls`` counts every call by function name.
    """

    NVMLError = pynvml.NVMLError

    def __init__(
        self,
        gpus: Iterable[FakeGpu] | None = None,
        *,
        driver_version: str = "550.54.15",
        cuda_driver_version: int = 12040,
        fail_after: Mapping[str, tuple[int, int] | tuple[int, int, int]] | None = None,
        unsupported: Iterable[str] = (),
        missing: Iterable[str] = (),
        init_error: int | None = None,
        topology: Mapping[tuple[int, int], int] | None = None,
    ) -> None:
        for name in dir(pynvml):
            if name.startswith(("NVML_", "nvmlClocksEventReason", "nvmlClocksThrottleReason")):
                setattr(self, name, getattr(pynvml, name))
        self.gpus = list(gpus) if gpus is not None else [h200(0)]
        self.driver_version = driver_version
        self.cuda_driver_version = cuda_driver_version
        self.fail_after = dict(fail_after or {})
        self.unsupported = set(unsupported)
        self.init_error = init_error
        self.topology = dict(topology or {})
        self.calls: Counter[str] = Counter()
        self.initialised = 0
        for name in missing:
            setattr(self, name, None)

    # --- plumbing --------------------------------------------------------------------------

    def _enter(self, name: str, handle: FakeHandle | None = None) -> FakeGpu | None:
        self.calls[name] += 1
        gpu = self.gpus[handle.index] if handle is not None else None
        if name in self.unsupported or (gpu is not None and name in gpu.unsupported):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        rule = self.fail_after.get(name)
        if rule is not None:
            after, code = rule[0], rule[1]
            only = rule[2] if len(rule) > 2 else None  # type: ignore[misc]
            if only is None or (handle is not None and handle.index == only):
                key = f"{name}@{only}"
                self.calls[key] += 1
                if self.calls[key] > after:
                    raise pynvml.NVMLError(code)
        if name != "nvmlInit" and self.initialised <= 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        return gpu

    def _gpu(self, name: str, handle: FakeHandle) -> FakeGpu:
        gpu = self._enter(name, handle)
        assert gpu is not None
        return gpu

    # --- system ----------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self._enter("nvmlInit")
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialised -= 1

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return FakeHandle(index)

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._enter("nvmlSystemGetCudaDriverVersion")
        return self.cuda_driver_version

    # --- static facts ----------------------------------------------------------------------

    def nvmlDeviceGetName(self, handle: FakeHandle) -> str:
        return self._gpu("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetUUID(self, handle: FakeHandle) -> str:
        return self._gpu("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetPciInfo(self, handle: FakeHandle) -> SimpleNamespace:
        gpu = self._gpu("nvmlDeviceGetPciInfo", handle)
        return SimpleNamespace(busId=gpu.pci_bus_id, busIdLegacy=gpu.pci_bus_id[4:])

    def nvmlDeviceGetMemoryInfo(self, handle: FakeHandle) -> SimpleNamespace:
        gpu = self._gpu("nvmlDeviceGetMemoryInfo", handle)
        return SimpleNamespace(
            total=gpu.memory_total_bytes,
            used=gpu.memory_used_bytes,
            free=gpu.memory_total_bytes - gpu.memory_used_bytes,
        )

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: FakeHandle) -> int:
        return self._gpu("nvmlDeviceGetEnforcedPowerLimit", handle).power_limit_mw

    def nvmlDeviceGetPowerManagementLimit(self, handle: FakeHandle) -> int:
        return self._gpu("nvmlDeviceGetPowerManagementLimit", handle).power_limit_mw

    def nvmlDeviceGetMaxClockInfo(self, handle: FakeHandle, clock_type: int) -> int:
        return self._gpu("nvmlDeviceGetMaxClockInfo", handle).max_sm_clock_mhz

    def nvmlDeviceGetCudaComputeCapability(self, handle: FakeHandle) -> tuple[int, int]:
        return self._gpu("nvmlDeviceGetCudaComputeCapability", handle).compute_capability

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: FakeHandle) -> int:
        return self._gpu("nvmlDeviceGetCurrPcieLinkGeneration", handle).pcie_gen

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: FakeHandle) -> int:
        return self._gpu("nvmlDeviceGetCurrPcieLinkWidth", handle).pcie_width

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: FakeHandle) -> int:
        return self._gpu("nvmlDeviceGetMaxPcieLinkGeneration", handle).pcie_max_gen

    def nvmlDeviceGetNvLinkState(self, handle: FakeHandle, link: int) -> int:
        gpu = self._gpu("nvmlDeviceGetNvLinkState", handle)
        if gpu.nvlink_active is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if link >= len(gpu.nvlink_active):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return int(gpu.nvlink_active[link])

    def nvmlDeviceGetTopologyCommonAncestor(self, a: FakeHandle, b: FakeHandle) -> int:
        self._enter("nvmlDeviceGetTopologyCommonAncestor", a)
        key = (min(a.index, b.index), max(a.index, b.index))
        if a.index == b.index:
            return int(pynvml.NVML_TOPOLOGY_INTERNAL)
        return int(self.topology.get(key, pynvml.NVML_TOPOLOGY_NODE))

    # --- readings --------------------------------------------------------------------------

    def nvmlDeviceGetUtilizationRates(self, handle: FakeHandle) -> SimpleNamespace:
        gpu = self._gpu("nvmlDeviceGetUtilizationRates", handle)
        return SimpleNamespace(gpu=gpu.gpu_util_pct, memory=gpu.mem_util_pct)

    def nvmlDeviceGetPowerUsage(self, handle: FakeHandle) -> int:
        return self._gpu("nvmlDeviceGetPowerUsage", handle).power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: FakeHandle) -> int:
        gpu = self._gpu("nvmlDeviceGetTotalEnergyConsumption", handle)
        value = gpu.energy_mj
        gpu.energy_mj += gpu.energy_step_mj
        return value

    def nvmlDeviceGetClockInfo(self, handle: FakeHandle, clock_type: int) -> int:
        return self._gpu("nvmlDeviceGetClockInfo", handle).sm_clock_mhz

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: FakeHandle) -> int:
        return self._gpu("nvmlDeviceGetCurrentClocksEventReasons", handle).clock_event_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: FakeHandle) -> int:
        return self._gpu("nvmlDeviceGetCurrentClocksThrottleReasons", handle).clock_event_reasons

    def nvmlDeviceGetPcieThroughput(self, handle: FakeHandle, counter: int) -> int:
        gpu = self._gpu("nvmlDeviceGetPcieThroughput", handle)
        if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES:
            return gpu.pcie_tx_kbps
        return gpu.pcie_rx_kbps

    def nvmlDeviceGetTemperature(self, handle: FakeHandle, sensor: int) -> int:
        return self._gpu("nvmlDeviceGetTemperature", handle).temperature_c
