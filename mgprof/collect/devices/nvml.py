"""The one module that talks to NVML: every pynvml call goes through :func:`nvml_query`.

Keeping NVML behind one door means one place decides what an error means ("not supported" is a
missing number, "GPU is lost" is a broken device) and tests can swap the whole binding for
:class:`mgprof.testing.FakeNvml`. The pynvml module is imported lazily so that importing mgprof
never needs the NVIDIA driver.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Collection
from typing import Any

from mgprof.errors import MgprofError

__all__ = [
    "CLOCK_EVENT_REASON_BITS",
    "FALLBACK_HINT",
    "READ_COLUMNS",
    "NvmlSession",
    "NvmlUnavailable",
    "clock_event_reason_bits",
    "decode_clock_event_reasons",
    "nvml_error_code",
    "nvml_query",
]

FALLBACK_HINT = "mgprof falls back to the CPU sampler"

READ_COLUMNS: tuple[str, ...] = (
    "gpu_util_pct",
    "mem_util_pct",
    "mem_used_mib",
    "mem_total_mib",
    "power_w",
    "energy_mj",
    "sm_clock_mhz",
    "clock_event_reasons",
    "pcie_tx_kbps",
    "pcie_rx_kbps",
    "temperature_c",
)
"""Keys of :meth:`NvmlSession.read`, in the order the sampler stores them."""

PCIE_COLUMNS = ("pcie_tx_kbps", "pcie_rx_kbps")

# Documented bit values of nvmlClocksEventReason* (nvml.h); pynvml's constants win where present.
CLOCK_EVENT_REASON_BITS: dict[str, int] = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake": 0x80,
    "display_clocks_setting": 0x100,
}

_REASON_CONSTANT_SUFFIX = {
    "gpu_idle": "GpuIdle",
    "applications_clocks_setting": "ApplicationsClocksSetting",
    "sw_power_cap": "SwPowerCap",
    "hw_slowdown": "HwSlowdown",
    "sync_boost": "SyncBoost",
    "sw_thermal_slowdown": "SwThermalSlowdown",
    "hw_thermal_slowdown": "HwThermalSlowdown",
    "hw_power_brake": "HwPowerBrakeSlowdown",
    "display_clocks_setting": "DisplayClockSetting",
}

# Documented NVML return codes, used when pynvml itself is not importable.
_CODE = {
    "NOT_SUPPORTED": 3,
    "NO_PERMISSION": 4,
    "NOT_FOUND": 6,
    "DRIVER_NOT_LOADED": 9,
    "LIBRARY_NOT_FOUND": 12,
    "FUNCTION_NOT_FOUND": 13,
    "GPU_IS_LOST": 15,
    "RESET_REQUIRED": 16,
    "LIB_RM_VERSION_MISMATCH": 18,
    "UNINITIALIZED": 1,
    "INVALID_ARGUMENT": 2,
}
_ALWAYS_NONE = frozenset(
    {_CODE["NOT_SUPPORTED"], _CODE["FUNCTION_NOT_FOUND"], _CODE["NO_PERMISSION"]}
)

_ADVICE = {
    _CODE["GPU_IS_LOST"]: (
        "the GPU stopped answering (fell off the bus); check 'nvidia-smi' and the kernel log "
        "for Xid errors: it needs a GPU reset or a reboot"
    ),
    _CODE["RESET_REQUIRED"]: "reset the GPU ('nvidia-smi -r') or reboot",
    _CODE["LIB_RM_VERSION_MISMATCH"]: (
        "the NVIDIA kernel module and user-space driver differ in version; reboot after the "
        "driver upgrade"
    ),
    _CODE["UNINITIALIZED"]: (
        "NVML was used before init or after shutdown: an mgprof bug, please report it"
    ),
    _CODE["DRIVER_NOT_LOADED"]: "load the NVIDIA driver (see 'nvidia-smi') or run without GPUs",
    _CODE["LIBRARY_NOT_FOUND"]: (
        "install the NVIDIA driver (it ships libnvidia-ml.so) or run without GPUs"
    ),
}
_DEFAULT_ADVICE = "check 'nvidia-smi'; mgprof stops NVML reads for this device and the run goes on"


class NvmlUnavailable(MgprofError):
    """NVML failed in a way that means its numbers cannot be trusted (lost GPU, unknown error).

    ``code`` is the NVML return code (None when the failure was not an NVMLError).
    """

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


def _pynvml_error_type() -> type[BaseException] | None:
    try:
        module = importlib.import_module("pynvml")
    except ImportError:
        return None
    error_type = getattr(module, "NVMLError", None)
    return error_type if isinstance(error_type, type) else None


def nvml_error_code(exc: BaseException) -> int | None:
    """The NVML return code carried by a pynvml ``NVMLError`` (its ``value``), else None."""
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _error_name(code: int) -> str:
    try:
        module = importlib.import_module("pynvml")
    except ImportError:
        module = None
    if module is not None:
        for name in dir(module):
            if name.startswith("NVML_ERROR_") and getattr(module, name) == code:
                return name
    for name, value in _CODE.items():
        if value == code:
            return f"NVML_ERROR_{name}"
    return f"NVML error {code}"


def _describe(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:
        text = ""
    return text or type(exc).__name__


def nvml_query(
    fn: Callable[..., Any] | None,
    *args: Any,
    optional: bool = True,
    none_on: Collection[int] = (),
) -> Any:
    """Call one pynvml function and map its errors to what they mean for mgprof.

    NOT_SUPPORTED, FUNCTION_NOT_FOUND and NO_PERMISSION give None: the metric is absent on this
    device or driver, which is normal (e.g. no energy counter before Volta). NOT_FOUND also gives
    None for ``optional`` queries, and so do the extra codes in ``none_on``. A function missing
    from the binding (``fn`` is None: an older pynvml) gives None. Any other NVML error raises
    :class:`NvmlUnavailable` with a message that names the fix; non-NVML exceptions propagate.
    """
    if fn is None:
        return None
    error_type = _pynvml_error_type()
    try:
        return fn(*args)
    except Exception as exc:
        if error_type is None or not isinstance(exc, error_type):
            raise
        code = nvml_error_code(exc)
        if code is None:
            raise
        if code in _ALWAYS_NONE or code in none_on:
            return None
        if optional and code == _CODE["NOT_FOUND"]:
            return None
        name = getattr(fn, "__name__", "NVML call")
        raise NvmlUnavailable(
            f"{name} failed: {_describe(exc)} ({_error_name(code)}); "
            f"{_ADVICE.get(code, _DEFAULT_ADVICE)}",
            code,
        ) from None


def clock_event_reason_bits(module: Any = None) -> dict[str, int]:
    """Reason name -> bit, from pynvml's constants where the module has them."""
    bits = dict(CLOCK_EVENT_REASON_BITS)
    if module is None:
        return bits
    for name, suffix in _REASON_CONSTANT_SUFFIX.items():
        for prefix in ("nvmlClocksEventReason", "nvmlClocksThrottleReason"):
            value = getattr(module, prefix + suffix, None)
            if isinstance(value, int) and not isinstance(value, bool):
                bits[name] = value
                break
    return bits


def decode_clock_event_reasons(mask: float | None, module: Any = None) -> list[str]:
    """Names of the clock-event (throttle) reasons set in ``mask``, in bit order; [] for None."""
    if mask is None:
        return []
    value = int(mask)
    bits = clock_event_reason_bits(module)
    return [name for name, bit in sorted(bits.items(), key=lambda kv: kv[1]) if value & bit]


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


def _num(value: Any, scale: float = 1.0) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value) * scale
    except (TypeError, ValueError):
        return None


def _format_cuda_version(value: Any) -> str | None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        return None
    return f"{value // 1000}.{(value % 1000) // 10}"


_TOPOLOGY_NAMES = (
    ("NVML_TOPOLOGY_INTERNAL", 0, "internal"),
    ("NVML_TOPOLOGY_SINGLE", 10, "PIX"),
    ("NVML_TOPOLOGY_MULTIPLE", 20, "PXB"),
    ("NVML_TOPOLOGY_HOSTBRIDGE", 30, "PHB"),
    ("NVML_TOPOLOGY_NODE", 40, "NODE"),
    ("NVML_TOPOLOGY_SYSTEM", 50, "SYS"),
)
"""NVML's common-ancestor levels, named as ``nvidia-smi topo -m`` names them."""


class NvmlSession:
    """One NVML init/shutdown pair and the queries mgprof makes inside it.

    ``module`` is the pynvml binding (default: ``import pynvml`` on :meth:`init`); tests pass
    :class:`mgprof.testing.FakeNvml`. Nothing here raises on "not supported": absent numbers are
    None. Calls that mean the device is broken raise :class:`NvmlUnavailable`.
    """

    def __init__(self, module: Any = None) -> None:
        self._module = module
        self._initialised = False
        self.reason: str | None = None

    @property
    def module(self) -> Any:
        """The pynvml binding in use (None before a successful :meth:`init`)."""
        return self._module

    @property
    def available(self) -> bool:
        return self._initialised

    def _fn(self, name: str) -> Callable[..., Any] | None:
        fn = getattr(self._module, name, None)
        return fn if callable(fn) else None

    def _const(self, name: str, default: int) -> int:
        value = getattr(self._module, name, default)
        return value if isinstance(value, int) and not isinstance(value, bool) else default

    def init(self) -> str | None:
        """Start NVML. Returns None when it works, else the reason it cannot be used.

        The reason is one line naming the fix, fit for ``SamplerRecord.reason`` and ``doctor``.
        Never raises: a machine without NVIDIA drivers is a normal place to run mgprof.
        """
        if self._initialised:
            return None
        if self._module is None:
            try:
                self._module = importlib.import_module("pynvml")
            except ImportError as exc:
                self.reason = (
                    f"pynvml is not installed ({exc}); install it with 'pip install nvidia-ml-py' "
                    f"or run without GPUs; {FALLBACK_HINT}"
                )
                return self.reason
        init = self._fn("nvmlInit")
        if init is None:
            self.reason = (
                "the pynvml module has no nvmlInit; reinstall it with "
                f"'pip install -U nvidia-ml-py'; {FALLBACK_HINT}"
            )
            return self.reason
        try:
            init()
        except Exception as exc:
            self.reason = self._init_reason(exc)
            return self.reason
        self._initialised = True
        self.reason = None
        return None

    def _init_reason(self, exc: BaseException) -> str:
        code = nvml_error_code(exc)
        what = f"{type(exc).__name__}: {_describe(exc)}"
        if code == _CODE["LIBRARY_NOT_FOUND"]:
            fix = "install NVIDIA drivers (they ship libnvidia-ml.so) or run without GPUs"
        elif code == _CODE["DRIVER_NOT_LOADED"]:
            fix = "load the NVIDIA driver (check 'nvidia-smi') or run without GPUs"
        elif code == _CODE["NO_PERMISSION"]:
            fix = "give this user access to /dev/nvidia* or run without GPUs"
        elif code is not None:
            fix = _ADVICE.get(code, "check 'nvidia-smi' works on this machine")
        else:
            fix = "check that 'nvidia-smi' works and reinstall 'nvidia-ml-py'"
        return f"{what}; {fix}; {FALLBACK_HINT}"

    def shutdown(self) -> None:
        """End the session. Idempotent and never raises (it runs on the way out of a run)."""
        if not self._initialised:
            return
        self._initialised = False
        fn = self._fn("nvmlShutdown")
        if fn is None:
            return
        try:
            fn()
        except Exception:
            pass  # nothing useful to do with a failed shutdown while a run ends

    def __enter__(self) -> NvmlSession:
        reason = self.init()
        if reason is not None:
            raise NvmlUnavailable(f"NVML not available: {reason}")
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    # --- system ----------------------------------------------------------------------------

    def device_count(self) -> int:
        """Number of GPUs NVML sees (all of the machine's, regardless of CUDA_VISIBLE_DEVICES)."""
        count = nvml_query(self._fn("nvmlDeviceGetCount"), optional=False)
        return int(count) if count is not None else 0

    def handle(self, index: int) -> Any:
        """NVML handle of the device at NVML ``index``; raises NvmlUnavailable if absent."""
        handle = nvml_query(self._fn("nvmlDeviceGetHandleByIndex"), index, optional=False)
        if handle is None:
            raise NvmlUnavailable(
                f"NVML has no handle for device {index}; check 'nvidia-smi -L' lists it"
            )
        return handle

    def driver_version(self) -> str | None:
        return _text(nvml_query(self._fn("nvmlSystemGetDriverVersion")))

    def cuda_driver_version(self) -> str | None:
        """Highest CUDA version the driver supports, as ``"12.4"``."""
        fn = self._fn("nvmlSystemGetCudaDriverVersion_v2") or self._fn(
            "nvmlSystemGetCudaDriverVersion"
        )
        return _format_cuda_version(nvml_query(fn))

    # --- static facts ----------------------------------------------------------------------

    def device_facts(self, index: int) -> dict[str, Any]:
        """Static facts of one device: identity (for device mapping), limits, links."""
        h = self.handle(index)
        pci = nvml_query(self._fn("nvmlDeviceGetPciInfo"), h)
        memory = nvml_query(self._fn("nvmlDeviceGetMemoryInfo"), h)
        cc = nvml_query(self._fn("nvmlDeviceGetCudaComputeCapability"), h)
        limit_mw = nvml_query(self._fn("nvmlDeviceGetEnforcedPowerLimit"), h)
        if limit_mw is None:
            limit_mw = nvml_query(self._fn("nvmlDeviceGetPowerManagementLimit"), h)
        sm = self._const("NVML_CLOCK_SM", 1)
        return {
            "nvml_index": index,
            "name": _text(nvml_query(self._fn("nvmlDeviceGetName"), h)),
            "uuid": _text(nvml_query(self._fn("nvmlDeviceGetUUID"), h)),
            "pci_bus_id": _text(getattr(pci, "busId", None)) if pci is not None else None,
            "memory_total_mib": _num(getattr(memory, "total", None), 1 / 2**20),
            "power_limit_w": _num(limit_mw, 1e-3),
            "max_sm_clock_mhz": _num(nvml_query(self._fn("nvmlDeviceGetMaxClockInfo"), h, sm)),
            "compute_capability": f"{cc[0]}.{cc[1]}" if cc else None,
            "pcie_gen": _num(nvml_query(self._fn("nvmlDeviceGetCurrPcieLinkGeneration"), h)),
            "pcie_width": _num(nvml_query(self._fn("nvmlDeviceGetCurrPcieLinkWidth"), h)),
            "pcie_max_gen": _num(nvml_query(self._fn("nvmlDeviceGetMaxPcieLinkGeneration"), h)),
            "nvlink_active": self.nvlink_state(h),
        }

    def nvlink_state(self, handle: Any) -> list[bool] | None:
        """Active flag per NVLink the device has; None where NVLink is not supported.

        Links are probed up to NVML_NVLINK_MAX_LINKS; a link index the device lacks answers
        NOT_SUPPORTED or INVALID_ARGUMENT depending on the driver, which ends the list.
        """
        fn = self._fn("nvmlDeviceGetNvLinkState")
        if fn is None:
            return None
        states: list[bool] = []
        for link in range(self._const("NVML_NVLINK_MAX_LINKS", 18)):
            state = nvml_query(fn, handle, link, none_on=(_CODE["INVALID_ARGUMENT"],))
            if state is None:
                break
            states.append(bool(state))
        return states or None

    def all_device_facts(self) -> list[dict[str, Any]]:
        return [self.device_facts(i) for i in range(self.device_count())]

    def topology(self, index_a: int, index_b: int) -> str | None:
        """Closest common ancestor of two devices in nvidia-smi's words (PIX, PXB, NODE, SYS…)."""
        level = nvml_query(
            self._fn("nvmlDeviceGetTopologyCommonAncestor"),
            self.handle(index_a),
            self.handle(index_b),
            none_on=(_CODE["INVALID_ARGUMENT"],),
        )
        if level is None:
            return None
        for const, default, label in _TOPOLOGY_NAMES:
            if level == self._const(const, default):
                return label
        return f"level {level}"

    # --- samples ---------------------------------------------------------------------------

    def read(
        self,
        handle: Any,
        *,
        pcie: bool = True,
        energy: bool = True,
        skip: set[str] | None = None,
    ) -> dict[str, float | None]:
        """One sample of the device, keyed as :data:`READ_COLUMNS` (None: absent or skipped).

        ``pcie=False`` skips the PCIe throughput counters, which block for ~20 ms per call on
        real GPUs; ``energy=False`` skips the energy counter (~3 ms per call on an H200, against
        a few µs for power or clocks: a cumulative counter needs only its ends). ``skip`` is the
        caller's set of unsupported columns: a column that comes back None is added to it and
        not asked again, so unsupported queries cost one call per run.
        """
        skipped = skip if skip is not None else set()
        out: dict[str, float | None] = dict.fromkeys(READ_COLUMNS)

        def ask(columns: tuple[str, ...], fn_name: str, *args: Any) -> Any:
            if all(c in skipped for c in columns):
                return None
            value = nvml_query(self._fn(fn_name), handle, *args)
            if value is None:
                skipped.update(columns)
            return value

        util = ask(("gpu_util_pct", "mem_util_pct"), "nvmlDeviceGetUtilizationRates")
        if util is not None:
            out["gpu_util_pct"] = _num(getattr(util, "gpu", None))
            out["mem_util_pct"] = _num(getattr(util, "memory", None))
        memory = ask(("mem_used_mib", "mem_total_mib"), "nvmlDeviceGetMemoryInfo")
        if memory is not None:
            out["mem_used_mib"] = _num(getattr(memory, "used", None), 1 / 2**20)
            out["mem_total_mib"] = _num(getattr(memory, "total", None), 1 / 2**20)
        out["power_w"] = _num(ask(("power_w",), "nvmlDeviceGetPowerUsage"), 1e-3)
        if energy:
            out["energy_mj"] = _num(ask(("energy_mj",), "nvmlDeviceGetTotalEnergyConsumption"))
        sm = self._const("NVML_CLOCK_SM", 1)
        out["sm_clock_mhz"] = _num(ask(("sm_clock_mhz",), "nvmlDeviceGetClockInfo", sm))
        reasons_fn = (
            "nvmlDeviceGetCurrentClocksEventReasons"
            if self._fn("nvmlDeviceGetCurrentClocksEventReasons") is not None
            else "nvmlDeviceGetCurrentClocksThrottleReasons"
        )
        out["clock_event_reasons"] = _num(ask(("clock_event_reasons",), reasons_fn))
        if pcie:
            tx = self._const("NVML_PCIE_UTIL_TX_BYTES", 0)
            rx = self._const("NVML_PCIE_UTIL_RX_BYTES", 1)
            out["pcie_tx_kbps"] = _num(ask(("pcie_tx_kbps",), "nvmlDeviceGetPcieThroughput", tx))
            out["pcie_rx_kbps"] = _num(ask(("pcie_rx_kbps",), "nvmlDeviceGetPcieThroughput", rx))
        sensor = self._const("NVML_TEMPERATURE_GPU", 0)
        out["temperature_c"] = _num(ask(("temperature_c",), "nvmlDeviceGetTemperature", sensor))
        return out
