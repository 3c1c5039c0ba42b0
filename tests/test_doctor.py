"""``mgprof doctor``: never crashes, and says what mgprof falls back to on this machine."""

from __future__ import annotations

import io
import json

import pynvml
import pytest
from rich.console import Console

from mgprof.cli import main
from mgprof.collect import environment
from mgprof.collect.environment import collect_environment, versions
from mgprof.report.doctor_view import render_doctor
from mgprof.testing import FakeNvml, h200


def test_doctor_terminal_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "mgprof doctor" in out and "torch" in out


def test_doctor_json_names_the_cpu_fallback(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--json"]) == 0
    env = json.loads(capsys.readouterr().out)
    assert env["python"]["version"]
    assert env["torch"]["version"]
    if env["torch"]["cuda_available"]:
        pytest.skip("this machine has CUDA: no CPU fallback to report")
    assert "no CUDA: --gpus N runs N CPU ranks over gloo" in env["fallbacks"]
    assert env["nvml"]["ok"] is False and env["nvml"]["reason"]
    assert any("replaced by the CPU sampler" in line for line in env["fallbacks"])
    assert env["probe_errors"] == []


def test_environment_with_fake_nvml_lists_gpus_links_and_topology(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # torch's view is pinned so the test means the same on a CPU box and on a GPU machine
    monkeypatch.setattr(environment, "_cuda_gpus", lambda count, errors: [])
    fake = FakeNvml(
        [h200(0), h200(1, nvlink_active=[True, False])],
        topology={(0, 1): pynvml.NVML_TOPOLOGY_SYSTEM},
    )
    env = collect_environment(nvml_module=fake)
    assert env["nvml"]["ok"] is True
    assert env["nvml"]["driver_version"] == "550.54.15"
    assert env["nvml"]["topology"] == [{"a": 0, "b": 1, "level": "SYS"}]
    assert [d["nvlink_active"] for d in env["nvml"]["devices"]] == [[True] * 18, [True, False]]
    assert [g["nvml_index"] for g in env["gpus"]] == [0, 1]
    assert not any("NVML sampler replaced" in line for line in env["fallbacks"])
    assert fake.initialised == 0  # doctor leaves NVML shut down
    console = Console(file=io.StringIO(), width=120)
    render_doctor(env, console)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "NVIDIA H200" in text and "1/2 active" in text and "SYS" in text


def test_torch_gpus_are_joined_to_nvml_by_uuid(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = [h200(0), h200(1, nvlink_active=[True, False])]
    torch_row = {"cuda_index": 0, "name": "NVIDIA H200", "uuid": gpus[1].uuid[4:]}
    monkeypatch.setattr(environment, "_cuda_gpus", lambda count, errors: [torch_row])
    env = collect_environment(nvml_module=FakeNvml(gpus))
    (row,) = env["gpus"]
    assert (row["cuda_index"], row["nvml_index"], row["nvml_mapped_by"]) == (0, 1, "uuid")
    assert row["nvlink_active"] == [True, False]
    assert row["pci_bus_id"] == gpus[1].pci_bus_id


def test_doctor_survives_a_binding_that_breaks_everywhere() -> None:
    fake = FakeNvml([h200(0)], fail_after={"nvmlDeviceGetCount": (0, pynvml.NVML_ERROR_UNKNOWN)})
    env = collect_environment(nvml_module=fake)
    assert env["nvml"]["ok"] is True and env["nvml"]["devices"] == []
    assert any("nvml device count" in line for line in env["probe_errors"])
    render_doctor(env, Console(file=io.StringIO()))


def test_versions_keys() -> None:
    v = versions(nvml_module=FakeNvml())
    assert set(v) == {"python", "torch", "cuda", "cudnn", "nccl", "mgprof", "driver"}
    assert v["driver"] == "550.54.15" and v["mgprof"]
