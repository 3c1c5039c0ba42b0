"""NVML access: error mapping with pynvml's real error codes, reads, and the real no-GPU path."""

from __future__ import annotations

import pynvml
import pytest

from mgprof.collect.devices.nvml import (
    READ_COLUMNS,
    NvmlSession,
    NvmlUnavailable,
    clock_event_reason_bits,
    decode_clock_event_reasons,
    nvml_query,
)
from mgprof.testing import FakeNvml, h200


def raising(code: int):
    def nvmlDeviceGetSomething(*args: object) -> int:
        raise pynvml.NVMLError(code)

    return nvmlDeviceGetSomething


@pytest.mark.parametrize(
    "code",
    [
        pynvml.NVML_ERROR_NOT_SUPPORTED,
        pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
        pynvml.NVML_ERROR_NO_PERMISSION,
        pynvml.NVML_ERROR_NOT_FOUND,
    ],
)
def test_absent_metric_codes_give_none(code: int) -> None:
    assert nvml_query(raising(code), "handle") is None


def test_not_found_raises_for_required_queries() -> None:
    with pytest.raises(NvmlUnavailable):
        nvml_query(raising(pynvml.NVML_ERROR_NOT_FOUND), optional=False)


@pytest.mark.parametrize(
    "code", [pynvml.NVML_ERROR_GPU_IS_LOST, pynvml.NVML_ERROR_UNKNOWN, pynvml.NVML_ERROR_TIMEOUT]
)
def test_broken_device_codes_raise_own_error_naming_the_fix(code: int) -> None:
    with pytest.raises(NvmlUnavailable) as info:
        nvml_query(raising(code))
    assert info.value.code == code
    message = str(info.value)
    assert "nvmlDeviceGetSomething" in message
    assert "nvidia-smi" in message  # names where to look


def test_gpu_lost_message_says_reset() -> None:
    with pytest.raises(NvmlUnavailable, match=r"NVML_ERROR_GPU_IS_LOST.*reset or a reboot"):
        nvml_query(raising(pynvml.NVML_ERROR_GPU_IS_LOST))


def test_none_on_extends_the_absent_codes_and_other_exceptions_propagate() -> None:
    assert nvml_query(raising(pynvml.NVML_ERROR_INVALID_ARGUMENT), none_on=(2,)) is None
    with pytest.raises(NvmlUnavailable):
        nvml_query(raising(pynvml.NVML_ERROR_INVALID_ARGUMENT))

    def buggy() -> None:
        raise ValueError("not an NVML problem")

    with pytest.raises(ValueError):
        nvml_query(buggy)
    assert nvml_query(None) is None  # function missing from an older binding


def test_clock_event_reasons_decode_with_pynvml_constants() -> None:
    bits = clock_event_reason_bits(pynvml)
    assert bits["sw_power_cap"] == pynvml.nvmlClocksEventReasonSwPowerCap
    assert bits["hw_power_brake"] == pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown
    mask = pynvml.nvmlClocksEventReasonSwPowerCap | pynvml.nvmlClocksEventReasonHwThermalSlowdown
    assert decode_clock_event_reasons(mask, pynvml) == ["sw_power_cap", "hw_thermal_slowdown"]
    assert decode_clock_event_reasons(0x1) == ["gpu_idle"]  # documented fallback bits
    assert decode_clock_event_reasons(None) == []


def test_real_pynvml_without_gpu_gives_a_reason_not_an_exception() -> None:
    session = NvmlSession()  # the real pynvml on this machine
    reason = session.init()
    if reason is None:
        session.shutdown()
        pytest.skip("this machine has a working NVML")
    assert "NVMLError" in reason
    assert "CPU sampler" in reason  # says what happens instead
    assert not session.available
    session.shutdown()  # harmless when init failed


@pytest.mark.parametrize(
    ("code", "fix"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "install NVIDIA drivers"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "load the NVIDIA driver"),
    ],
)
def test_init_failure_reasons_name_the_fix(code: int, fix: str) -> None:
    reason = NvmlSession(FakeNvml(init_error=code)).init()
    assert reason is not None and fix in reason


def test_device_facts_convert_units_and_list_nvlinks() -> None:
    gpu = h200(0, nvlink_active=[True, False, True])
    fake = FakeNvml([gpu])
    with NvmlSession(fake) as session:
        assert session.driver_version() == "550.54.15"
        assert session.cuda_driver_version() == "12.4"
        facts = session.device_facts(0)
    assert facts["uuid"] == gpu.uuid
    assert facts["pci_bus_id"] == "00000000:19:00.0"
    assert facts["memory_total_mib"] == 143771.0
    assert facts["power_limit_w"] == 700.0
    assert facts["compute_capability"] == "9.0"
    assert facts["nvlink_active"] == [True, False, True]
    assert fake.initialised == 0  # shut down on exit


def test_nvlink_unsupported_is_none() -> None:
    with NvmlSession(FakeNvml([h200(0, nvlink_active=None)])) as session:
        assert session.device_facts(0)["nvlink_active"] is None


def test_read_units_and_unsupported_calls_are_none_and_not_asked_again() -> None:
    fake = FakeNvml(
        [h200(0)],
        unsupported={"nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetPcieThroughput"},
    )
    skip: set[str] = set()
    with NvmlSession(fake) as session:
        handle = session.handle(0)
        first = session.read(handle, skip=skip)
        second = session.read(handle, skip=skip)
    assert set(first) == set(READ_COLUMNS)
    assert first["power_w"] == pytest.approx(612.345)
    assert first["mem_used_mib"] == 81920.0
    assert first["gpu_util_pct"] == 98.0
    assert first["energy_mj"] is None and second["energy_mj"] is None
    assert first["pcie_tx_kbps"] is None
    assert fake.calls["nvmlDeviceGetTotalEnergyConsumption"] == 1
    assert fake.calls["nvmlDeviceGetPcieThroughput"] == 2  # tx and rx once each, then skipped
    assert {"energy_mj", "pcie_tx_kbps", "pcie_rx_kbps"} <= skip


def test_read_falls_back_to_throttle_reasons_name_on_old_bindings() -> None:
    fake = FakeNvml(
        [h200(0, clock_event_reasons=0x4)], missing={"nvmlDeviceGetCurrentClocksEventReasons"}
    )
    with NvmlSession(fake) as session:
        values = session.read(session.handle(0), pcie=False)
    assert values["clock_event_reasons"] == 4.0
    assert fake.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 1
    assert values["pcie_tx_kbps"] is None
    assert fake.calls["nvmlDeviceGetPcieThroughput"] == 0


def test_topology_names_follow_nvidia_smi() -> None:
    fake = FakeNvml([h200(0), h200(1), h200(2)], topology={(0, 2): pynvml.NVML_TOPOLOGY_SYSTEM})
    with NvmlSession(fake) as session:
        assert session.topology(0, 1) == "NODE"
        assert session.topology(0, 2) == "SYS"
