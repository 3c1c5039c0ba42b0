"""Samplers: NVML on FakeNvml with a manual clock, failing open, and the real CPU sampler."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pynvml
import pytest

from mgprof.collect.devices.sampler import (
    CpuSampler,
    NvmlSampler,
    Sampler,
    read_samples_csv,
    start_sampler,
    write_samples_csv,
)
from mgprof.records import SamplerRecord
from mgprof.testing import FakeNvml, ManualClock, h200

IDLE = pynvml.nvmlClocksEventReasonGpuIdle
POWER_CAP = pynvml.nvmlClocksEventReasonSwPowerCap
HW_THERMAL = pynvml.nvmlClocksEventReasonHwThermalSlowdown


def unknown_identity(index: int) -> tuple[None, None]:
    return None, None


def nvml_sampler(
    fake: FakeNvml,
    clock: ManualClock,
    cuda: list[int],
    pcie_every: int = 10,
    energy_every: int = 1,
) -> NvmlSampler:
    sampler = start_sampler(
        cuda,
        nvml_module=fake,
        clock=clock,
        start=False,
        identify=unknown_identity,
        environ={},
        pcie_every=pcie_every,
        energy_every=energy_every,
    )
    assert isinstance(sampler, NvmlSampler), sampler.reason
    return sampler


def run_ticks(sampler: Sampler, clock: ManualClock, n: int, dt: float = 0.1):
    for _ in range(n):
        sampler.tick()
        clock.advance(dt)


def test_columns_summary_and_energy_arithmetic() -> None:
    gpu = h200(0, energy_mj=5_000_000, energy_step_mj=70_000)
    fake = FakeNvml([gpu])
    clock = ManualClock(start=100.0)
    sampler = nvml_sampler(fake, clock, [0], pcie_every=2)
    sampler.tick()
    clock.advance(0.1)
    gpu.power_mw, gpu.gpu_util_pct = 400_000, 50
    run_ticks(sampler, clock, 3)
    record = sampler.stop()  # stop() never ticks a sampler whose thread never ran
    assert record.kind == "nvml" and record.errors == []
    (dev,) = record.devices
    assert dev.device == "cuda:0" and dev.facts["nvml_index"] == 0
    assert dev.t_s == pytest.approx([0.0, 0.1, 0.2, 0.3])
    assert dev.columns["power_w"] == pytest.approx([612.345, 400.0, 400.0, 400.0])
    assert dev.columns["pcie_tx_kbps"] == [1_250_000.0, None, 1_250_000.0, None]
    assert dev.summary["samples"] == 4
    assert dev.summary["power_w_max"] == pytest.approx(612.345)
    assert dev.summary["power_w_mean"] == pytest.approx((612.345 + 3 * 400) / 4)
    assert dev.summary["gpu_util_pct_mean"] == pytest.approx((98 + 3 * 50) / 4)
    assert dev.summary["pcie_tx_kbps_mean"] == 1_250_000.0  # None (not read) is not a zero
    # counter read 4 times, +70 000 mJ each time: 3 steps = 210 J
    assert dev.summary["energy_j"] == pytest.approx(210.0)
    assert dev.facts["uuid"] == gpu.uuid and dev.facts["power_limit_w"] == 700.0
    assert fake.initialised == 0  # stop() shut NVML down


def test_energy_counter_is_read_every_nth_tick_and_on_the_last() -> None:
    """The counter costs ~3 ms per read on an H200: read its ends (and every Nth tick), and the
    energy over the run is unchanged."""
    gpu = h200(0, energy_mj=5_000_000, energy_step_mj=70_000)
    fake = FakeNvml([gpu])
    clock = ManualClock()
    sampler = nvml_sampler(fake, clock, [0], energy_every=3)
    run_ticks(sampler, clock, 5)
    sampler._stop_event.set()  # what stop() does before its last tick
    sampler.tick()
    dev = sampler.stop().devices[0]
    assert [v is not None for v in dev.columns["energy_mj"]] == [
        True, False, False, True, False, True
    ]  # fmt: skip
    assert dev.facts["energy_every_ticks"] == 3
    assert dev.summary["energy_j"] == pytest.approx(140.0)  # 2 reads after the first


def test_energy_absent_counter_gives_none() -> None:
    fake = FakeNvml([h200(0)], unsupported={"nvmlDeviceGetTotalEnergyConsumption"})
    clock = ManualClock()
    sampler = nvml_sampler(fake, clock, [0])
    run_ticks(sampler, clock, 3)
    dev = sampler.stop().devices[0]
    assert dev.columns["energy_mj"] == [None, None, None]
    assert dev.summary["energy_j"] is None
    assert dev.summary["power_w_mean"] == pytest.approx(612.345)


def test_throttle_reasons_seen_ignore_idle_samples() -> None:
    gpu = h200(0)
    fake = FakeNvml([gpu])
    clock = ManualClock()
    sampler = nvml_sampler(fake, clock, [0])
    for mask in (IDLE | HW_THERMAL, POWER_CAP, 0, IDLE):
        gpu.clock_event_reasons = mask
        sampler.tick()
        clock.advance(0.1)
    dev = sampler.stop().devices[0]
    assert dev.facts["throttle_reasons_seen"] == ["sw_power_cap"]
    assert "clock_event_reasons_mean" not in dev.summary  # a bitmask has no mean


def test_renumbered_devices_sample_the_right_gpu() -> None:
    gpus = [h200(i, power_mw=100_000 * (i + 1)) for i in range(3)]
    fake = FakeNvml(gpus)
    clock = ManualClock()
    sampler = start_sampler(
        [0, 1],
        nvml_module=fake,
        clock=clock,
        start=False,
        identify=unknown_identity,
        environ={"CUDA_VISIBLE_DEVICES": "2,0"},
    )
    run_ticks(sampler, clock, 1)
    devices = {d.device: d for d in sampler.stop().devices}
    assert devices["cuda:0"].facts["nvml_index"] == 2
    assert devices["cuda:0"].columns["power_w"] == [300.0]
    assert devices["cuda:1"].columns["power_w"] == [100.0]


def test_gpu_lost_mid_run_degrades_records_once_and_keeps_other_devices() -> None:
    fake = FakeNvml(
        [h200(0), h200(1)],
        fail_after={"nvmlDeviceGetUtilizationRates": (3, pynvml.NVML_ERROR_GPU_IS_LOST, 1)},
    )
    clock = ManualClock()
    sampler = nvml_sampler(fake, clock, [0, 1])
    run_ticks(sampler, clock, 6)
    record = sampler.stop()
    dev0, dev1 = record.devices
    assert len(dev0.t_s) == 6
    assert len(dev1.t_s) == 3  # kept what it had
    assert dev1.summary["samples"] == 3
    assert len(record.errors) == 1
    assert "cuda:1" in record.errors[0] and "GPU_IS_LOST" in record.errors[0]
    assert "stopped" in dev1.facts
    assert fake.calls["nvmlDeviceGetUtilizationRates@1"] == 4  # never asked again after failing


def test_unexpected_exception_in_the_thread_never_reaches_the_caller() -> None:
    fake = FakeNvml([h200(0)])

    def broken(handle: object) -> object:
        raise RuntimeError("driver exploded")

    fake.nvmlDeviceGetPowerUsage = broken  # type: ignore[method-assign,assignment]
    sampler = start_sampler(
        [0], interval_s=0.01, nvml_module=fake, identify=unknown_identity, environ={}
    )
    time.sleep(0.05)
    record = sampler.stop()
    assert record.kind == "nvml"
    assert record.errors == ["cuda:0: sampling stopped after 0 sample(s): driver exploded"]
    assert record.devices[0].t_s == []


def test_stop_is_idempotent_and_thread_safe() -> None:
    sampler = start_sampler(
        [0], interval_s=0.01, nvml_module=FakeNvml(), identify=unknown_identity, environ={}
    )
    time.sleep(0.05)
    results: list[SamplerRecord] = []
    threads = [threading.Thread(target=lambda: results.append(sampler.stop())) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 4 and all(r is results[0] for r in results)
    assert sampler.stop() is results[0]
    assert not sampler.running
    assert len(results[0].devices[0].t_s) >= 2  # thread samples plus the final one


def test_cpu_sampler_real_run() -> None:
    sampler = start_sampler(None, interval_s=0.05)
    deadline = time.monotonic() + 0.3
    while time.monotonic() < deadline:
        sum(i * i for i in range(10_000))  # some CPU work to measure
    record = sampler.stop()
    assert record.kind == "cpu"
    assert record.reason == "no CUDA devices in use; CPU sampler used"
    (dev,) = record.devices
    assert dev.device == "cpu"
    assert len(dev.t_s) >= 2
    assert dev.columns["cpu_pct"][0] is None  # psutil needs two points
    assert all(v is not None and v > 0 for v in dev.columns["rss_mib"])
    assert dev.summary["cpu_pct_max"] is not None and dev.summary["cpu_pct_max"] > 0
    assert dev.t_s == sorted(dev.t_s)


def test_start_sampler_without_nvml_library_falls_back_with_reason() -> None:
    sampler = start_sampler([0])  # real pynvml; this machine has no NVML library
    record = sampler.stop()
    if record.kind == "nvml":
        pytest.skip("this machine has a working NVML")
    assert record.kind == "cpu"
    assert record.reason.startswith("NVML not available: NVMLError_")
    assert record.reason.endswith("; CPU sampler used")


def test_unmappable_device_falls_back_and_says_why() -> None:
    sampler = start_sampler(
        [0],
        nvml_module=FakeNvml([h200(0)]),
        start=False,
        identify=lambda i: ("GPU-ffffffff-0000-0000-0000-000000000000", None),
        environ={},
    )
    record = sampler.stop()
    assert record.kind == "cpu"
    assert "cannot tell which GPU" in record.reason
    assert record.errors and "matches none" in record.errors[0]


def test_bad_interval_is_a_usage_error() -> None:
    from mgprof.errors import UsageError

    with pytest.raises(UsageError, match="interval_s"):
        CpuSampler(interval_s=0)


def test_csv_round_trip(tmp_path: Path) -> None:
    fake = FakeNvml([h200(0), h200(1)], unsupported={"nvmlDeviceGetTemperature"})
    clock = ManualClock()
    sampler = nvml_sampler(fake, clock, [0, 1], pcie_every=3)
    run_ticks(sampler, clock, 4, dt=0.25)
    record = sampler.stop()
    path = write_samples_csv(record, tmp_path / "samples" / "rank0.csv")
    header = path.read_text().splitlines()[0].split(",")
    assert header[:2] == ["device", "t_s"] and "power_w" in header
    back = {d.device: d for d in read_samples_csv(path)}
    for dev in record.devices:
        assert back[dev.device].t_s == dev.t_s
        assert back[dev.device].columns == dev.columns
