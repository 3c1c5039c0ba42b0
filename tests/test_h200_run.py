"""A real run recorded on an NVIDIA H200 (``mgprof analyze examples/mlp_context.py --gpus 1``),
analysed here without a GPU: NVML figures, energy and MFU come out of real data, and each is
checked against the raw record rather than against the code that computed it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mgprof.analyze.run.analysis import analyze_run
from mgprof.records import RunRecord, read_run

Analysed = tuple[RunRecord, dict[str, Any]]

RUN = Path(__file__).resolve().parent / "data" / "gpu" / "mgprof-run-h200"


@pytest.fixture(scope="module")
def analysed() -> Analysed:
    run = read_run(RUN)
    return run, analyze_run(run, RUN)


def test_device_and_sampler_are_the_real_ones(analysed: Analysed) -> None:
    run, _ = analysed
    rank = run.ranks[0]
    assert rank.device.kind == "cuda" and rank.device.name == "NVIDIA H200"
    assert rank.sampler.kind == "nvml"
    dev = rank.sampler.devices[0]
    # the sampled GPU is the one torch used, matched by UUID
    assert dev.facts["uuid"] == rank.device.uuid


def test_energy_is_the_counter_difference(analysed: Analysed) -> None:
    run, analysis = analysed
    series = [v for v in run.ranks[0].sampler.devices[0].columns["energy_mj"] if v is not None]
    expected_j = (series[-1] - series[0]) / 1000.0
    rank = analysis["ranks"][0]
    assert rank["energy_j"] == pytest.approx(expected_j)
    samples = sum(s.batch_size or 0 for s in run.ranks[0].steps)
    assert rank["energy_per_sample_j"] == pytest.approx(expected_j / samples)


def test_nvml_utilisation_is_the_mean_of_the_samples(analysed: Analysed) -> None:
    run, analysis = analysed
    util = [v for v in run.ranks[0].sampler.devices[0].columns["gpu_util_pct"] if v is not None]
    assert analysis["ranks"][0]["nvml_gpu_util_pct"] == pytest.approx(sum(util) / len(util))


def test_mfu_uses_the_h200_fp32_peak_and_trace_flops(analysed: Analysed) -> None:
    _, analysis = analysed
    rank = analysis["ranks"][0]
    assert rank["peak_dtype"] == "fp32" and rank["peak_tflops"] == pytest.approx(67.0)
    assert rank["achieved_tflops"] > 0
    assert rank["mfu_pct"] == pytest.approx(100 * rank["achieved_tflops"] / rank["peak_tflops"])
