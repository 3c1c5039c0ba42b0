"""Run analysis on hand-built records whose answers are known, and on the real gloo fixture."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from _data import TRACES
from hypothesis import given
from hypothesis import strategies as st

from mgprof.analyze.run.analysis import analyze_run, device_peak_tflops, steady_state_steps
from mgprof.analyze.stats import mean, percentile, percentile_of_sorted, ratio_pct, spread_pct
from mgprof.records import (
    DeviceInfo,
    DeviceSamples,
    MemoryRecord,
    RankRecord,
    RunRecord,
    SamplerRecord,
    StepRecord,
    TrainingFacts,
)

FIXTURE = TRACES / "cpu-gloo-ddp-mlp-2ranks"


def steps(
    durations: list[float],
    batch: int | None = 8,
    fingerprint: str | None = None,
    dataloader_ms: float | None = None,
) -> list[StepRecord]:
    return [
        StepRecord(
            index=i,
            duration_ms=d,
            batch_size=batch,
            fingerprint=None if fingerprint is None else f"{fingerprint}{i}",
            dataloader_ms=dataloader_ms,
        )
        for i, d in enumerate(durations)
    ]


def rank(r: int, world: int = 2, **kw: Any) -> RankRecord:
    kw.setdefault("steps", steps([100.0, 10.0, 20.0, 30.0, 40.0]))
    return RankRecord(rank=r, world_size=world, **kw)


def run_of(*ranks: RankRecord, **kw: Any) -> RunRecord:
    kw.setdefault("world_size", len(ranks))
    kw.setdefault("strategy", "ddp" if len(ranks) > 1 else "single")
    return RunRecord(ranks=list(ranks), **kw)


# ------------------------------------------------------------------------------------ stats


def test_percentile_linear_definition() -> None:
    assert percentile([10.0, 20.0, 30.0, 40.0], 50) == 25.0
    assert percentile([10.0, 20.0, 30.0, 40.0], 95) == pytest.approx(38.5)
    assert percentile([40.0, 10.0, 30.0, 20.0], 0) == 10.0
    assert percentile([40.0, 10.0, 30.0, 20.0], 100) == 40.0
    assert percentile([7.0], 95) == 7.0
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


@given(
    st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=50),
    st.floats(0, 100),
)
def test_percentile_matches_numpy(values: list[float], q: float) -> None:
    np = pytest.importorskip("numpy")
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), abs=1e-6)


@given(
    st.lists(st.floats(-1e12, 1e12, allow_nan=False), min_size=1, max_size=80),
    st.floats(0, 100),
)
def test_percentile_of_sorted_is_numpy_bit_for_bit(values: list[float], q: float) -> None:
    """The launch-delay percentiles skip numpy.percentile (it imports numpy.ma) and must still
    give its exact figure."""
    np = pytest.importorskip("numpy")
    ordered = np.sort(np.asarray(values))
    want = float(np.percentile(ordered, q))
    assert percentile_of_sorted(ordered, q) == want
    assert percentile(values, q) == want


def test_mean_ratio_spread() -> None:
    assert mean([1.0, 2.0, 6.0]) == 3.0
    with pytest.raises(ValueError):
        mean([])
    assert ratio_pct(1.0, 4.0) == 25.0
    assert ratio_pct(1.0, 0.0) is None
    assert spread_pct([10.0, 12.5]) == 25.0
    assert spread_pct([10.0]) is None


# ------------------------------------------------------------------------------- step time


def test_steady_state_drops_first_step_only_with_three_or_more() -> None:
    assert [s.index for s in steady_state_steps(steps([5.0, 1.0, 2.0]))] == [1, 2]
    assert [s.index for s in steady_state_steps(steps([5.0, 1.0]))] == [0, 1]


def test_step_time_statistics_and_throughput() -> None:
    a = analyze_run(run_of(rank(0), rank(1, steps=steps([999.0, 50.0, 50.0, 50.0]))), None)
    r0, r1 = a["ranks"]
    assert r0["steps_total"] == 5 and r0["steps_measured"] == 4
    assert r0["step_time_ms"] == {
        "count": 4,
        "mean": 25.0,
        "p50": 25.0,
        "p95": pytest.approx(38.5),
        "min": 10.0,
        "max": 40.0,
        # 25 ± t(0.975, 3) 3.182 x sd 12.91 / sqrt(4): textbook t; mgprof's within 1 % (0.21 ms)
        "ci95_low": pytest.approx(25.0 - 20.54, abs=0.21),
        "ci95_high": pytest.approx(25.0 + 20.54, abs=0.21),
    }
    # 4 steps x 8 samples in 100 ms; rank 1: 3 x 8 in 150 ms.
    assert r0["samples_per_s"] == pytest.approx(320.0)
    assert r1["samples_per_s"] == pytest.approx(160.0)
    assert a["job"]["samples_per_s"] == pytest.approx(480.0)
    # rank 1 (50 ms, every step alike) is the slowest: its interval is a point, and so is the
    # job's throughput interval
    assert r1["step_time_ms"]["ci95_low"] == r1["step_time_ms"]["ci95_high"] == 50.0
    assert a["job"]["samples_per_s_ci95"] == [pytest.approx(480.0), pytest.approx(480.0)]
    assert "steady_state_steps" in a["definitions"]
    json.dumps(a, allow_nan=False)  # JSON-ready


def test_throughput_not_applicable_without_batch_sizes_or_with_missing_ranks() -> None:
    a = analyze_run(run_of(rank(0, steps=steps([1.0, 2.0, 3.0], batch=None))), None)
    assert a["ranks"][0]["samples_per_s"] is None
    assert "batch size" in a["ranks"][0]["not_applicable"]["samples_per_s"]
    assert a["job"]["samples_per_s"] is None
    b = analyze_run(run_of(rank(0), world_size=2, missing_ranks=[1]), None)
    assert b["job"]["samples_per_s"] is None
    assert "[1]" in b["job"]["not_applicable"]["samples_per_s"]


def test_no_steps_gives_reasons_not_numbers() -> None:
    a = analyze_run(run_of(rank(0, steps=[])), None)
    r = a["ranks"][0]
    assert r["step_time_ms"] is None and r["samples_per_s"] is None
    assert "no steps" in r["not_applicable"]["step_time_ms"]


# ---------------------------------------------------------------------- memory, data, ranks


def test_headroom_from_total_minus_peak_reserved() -> None:
    mem = MemoryRecord(
        kind="cuda", peak_allocated_mib=50_000.0, peak_reserved_mib=60_000.0, total_mib=80_000.0
    )
    a = analyze_run(run_of(rank(0, memory=mem, device=DeviceInfo(kind="cuda", index=0))), None)
    m = a["ranks"][0]["memory"]
    assert m["headroom_mib"] == 20_000.0
    assert m["headroom_pct"] == 25.0


def test_headroom_per_device_and_cpu_reason() -> None:
    mem = MemoryRecord(
        kind="cuda",
        per_device={"cuda:0": {"peak_reserved_mib": 30.0, "total_mib": 40.0}},
    )
    a = analyze_run(run_of(rank(0, memory=mem)), None)
    r = a["ranks"][0]
    assert r["memory"]["per_device"]["cuda:0"]["headroom_pct"] == 25.0
    assert r["memory"]["headroom_pct"] is None
    assert "not recorded" in r["not_applicable"]["headroom_pct"]
    cpu = analyze_run(run_of(rank(0, memory=MemoryRecord(kind="cpu", peak_rss_mib=5.0))), None)
    assert "CPU run" in cpu["ranks"][0]["not_applicable"]["headroom_pct"]
    none = analyze_run(run_of(rank(0)), None)
    assert none["ranks"][0]["memory"] is None
    assert "no memory record" in none["ranks"][0]["not_applicable"]["memory"]


def test_dataloader_share() -> None:
    # Steady steps 10+20+30+40 = 100 ms, 5 ms waiting each = 20 ms.
    a = analyze_run(
        run_of(rank(0, steps=steps([1.0, 10.0, 20.0, 30.0, 40.0], dataloader_ms=5.0))), None
    )
    assert a["ranks"][0]["dataloader_share_pct"] == pytest.approx(20.0)
    assert a["job"]["dataloader_share_pct"] == pytest.approx(20.0)
    b = analyze_run(run_of(rank(0)), None)
    assert b["ranks"][0]["dataloader_share_pct"] is None
    assert "not timed" in b["ranks"][0]["not_applicable"]["dataloader_share_pct"]


def test_slowest_rank_and_spread() -> None:
    slow = steps([1.0, 30.0, 30.0, 30.0])
    even = steps([100.0, 24.0, 25.0, 26.0, 25.0])
    a = analyze_run(run_of(rank(0, steps=even), rank(1, steps=slow), rank(2, steps=even)), None)
    job = a["job"]
    assert job["slowest_rank"] == 1 and job["slowest_mean_step_ms"] == 30.0
    assert job["fastest_mean_step_ms"] == 25.0
    assert job["step_time_spread_pct"] == pytest.approx(20.0)
    assert job["slowest_rank_basis"] == "highest mean step time"
    single = analyze_run(run_of(rank(0, world=1)), None)
    assert single["job"]["slowest_rank"] is None
    assert "fewer than two ranks" in single["job"]["not_applicable"]["slowest_rank"]


def test_no_slowest_rank_within_the_steps_own_noise() -> None:
    """Mean step times 25 vs 30 ms from steps that scatter by ±15 ms name no rank: the same run
    again could order them the other way."""
    noisy = steps([100.0, 10.0, 20.0, 30.0, 40.0])
    slow = steps([1.0, 30.0, 30.0, 30.0])
    job = analyze_run(run_of(rank(0, steps=noisy), rank(1, steps=slow)), None)["job"]
    assert job["slowest_rank"] is None and job["fastest_rank"] is None
    why = job["not_applicable"]["slowest_rank"]
    assert "rank 1 30.00 ms vs rank 0 25.00 ms mean step" in why and "own noise" in why
    assert job["step_time_spread_pct"] == pytest.approx(20.0)  # still reported, as measured


def test_slowest_rank_follows_the_collectives_when_traces_matched_them() -> None:
    """One definition with ``mgprof trace``: the rank the others wait for. Mean step times of
    lock-stepped ranks differ by noise, so they only decide without matched collectives."""
    from mgprof.analyze.run.analysis import analyze_rank, job_analysis

    slow = steps([1.0, 30.0, 30.0, 30.0])
    run = run_of(rank(0), rank(1, steps=slow), rank(2))
    from mgprof.analyze.run.traces import RunTraces

    ranks = [analyze_rank(r, RunTraces()) for r in run.ranks]
    job = job_analysis(run, ranks, {"slowest_rank": 2})
    assert job.slowest_rank == 2 and job.slowest_mean_step_ms == pytest.approx(25.0)
    assert job.slowest_rank_basis == "last to arrive at collectives (traces)"
    assert job.step_time_spread_pct == pytest.approx(20.0)  # still from the step times


def _cross(last_arrivals: dict[int, int]) -> dict[str, Any]:
    per_rank = [{"rank": r, "wait_us": 0.0, "last_arrivals": n} for r, n in last_arrivals.items()]
    slowest = max(last_arrivals, key=lambda r: last_arrivals[r])
    return {"slowest_rank": slowest, "cross_rank": {"per_rank": per_rank}}


def test_last_arrivals_name_a_rank_only_beyond_chance() -> None:
    """Two ranks, 52 vs 48 last arrivals: a coin does that often, so the collectives name no
    rank; 80 vs 20 it does not."""
    from mgprof.analyze.run.analysis import analyze_rank, job_analysis
    from mgprof.analyze.run.traces import RunTraces

    noisy = steps([100.0, 10.0, 20.0, 30.0, 40.0])
    run = run_of(rank(0, steps=noisy), rank(1, steps=noisy))
    ranks = [analyze_rank(r, RunTraces()) for r in run.ranks]
    job = job_analysis(run, ranks, _cross({0: 48, 1: 52}))
    assert job.slowest_rank is None
    why = job.not_applicable["slowest_rank"]
    assert why.startswith("rank 1 arrived last at 52 of 100 collectives, which chance gives")
    job = job_analysis(run, ranks, _cross({0: 20, 1: 80}))
    assert job.slowest_rank == 1 and job.slowest_rank_basis.startswith("last to arrive")
    # the calls of one step share their latecomer: 80 of 100 calls over 3 traced steps is
    # about 2 of 3 draws, which a coin gives often
    clustered = {**_cross({0: 20, 1: 80}), "ranks": [{"steps": [{}, {}, {}]}] * 2}
    job = job_analysis(run, ranks, clustered)
    assert job.slowest_rank is None
    assert "80 of 100 collectives over 3 traced steps" in job.not_applicable["slowest_rank"]


def test_identical_batches_detected_across_ranks() -> None:
    same = analyze_run(
        run_of(
            rank(0, steps=steps([1.0] * 4, fingerprint="f")),
            rank(1, steps=steps([1.0] * 4, fingerprint="f")),
        ),
        None,
    )
    assert same["job"]["identical_batches"] is True
    assert same["job"]["identical_batch_steps"] == [0, 1, 2, 3]
    differ = analyze_run(
        run_of(
            rank(0, steps=steps([1.0] * 4, fingerprint="a")),
            rank(1, steps=steps([1.0] * 4, fingerprint="b")),
        ),
        None,
    )
    assert differ["job"]["identical_batches"] is False
    assert differ["job"]["fingerprint_steps_compared"] == 4
    one = analyze_run(run_of(rank(0, world=1, steps=steps([1.0] * 3, fingerprint="f"))), None)
    assert one["job"]["identical_batches"] is None
    assert "one process" in one["job"]["not_applicable"]["identical_batches"]
    unprinted = analyze_run(run_of(rank(0), rank(1)), None)
    assert unprinted["job"]["identical_batches"] is None
    assert "fingerprint" in unprinted["job"]["not_applicable"]["identical_batches"]


def test_cpu_fallback_notice() -> None:
    a = analyze_run(
        run_of(
            rank(0), cpu_fallback=True, cpu_fallback_reason="torch.cuda.is_available() is False"
        ),
        None,
    )
    assert a["job"]["cpu_fallback"] is True
    assert "torch.cuda.is_available() is False" in a["job"]["cpu_fallback_notice"]
    assert analyze_run(run_of(rank(0)), None)["job"]["cpu_fallback_notice"] is None


# -------------------------------------------------------------------------- sampler, energy


def nvml(util: float, energy: float | None, uuid: str) -> SamplerRecord:
    summary: dict[str, float | None] = {"gpu_util_pct_mean": util, "energy_j": energy}
    return SamplerRecord(
        kind="nvml",
        devices=[
            DeviceSamples(
                device="cuda:0",
                summary=summary,
                facts={"uuid": uuid, "name": "NVIDIA H100 80GB HBM3"},
            )
        ],
    )


def test_nvml_utilisation_and_energy_per_sample() -> None:
    # 5 steps x 8 samples = 40 samples per rank.
    a = analyze_run(
        run_of(rank(0, sampler=nvml(80.0, 400.0, "u0")), rank(1, sampler=nvml(60.0, 200.0, "u1"))),
        None,
    )
    r0, r1 = a["ranks"]
    assert r0["nvml_gpu_util_pct"] == 80.0 and r1["nvml_gpu_util_pct"] == 60.0
    assert r0["energy_per_sample_j"] == pytest.approx(10.0)
    assert a["job"]["energy_j"] == 600.0
    assert a["job"]["energy_per_sample_j"] == pytest.approx(7.5)
    # Two ranks reporting the same physical GPU count its energy once.
    dup = analyze_run(
        run_of(rank(0, sampler=nvml(80.0, 400.0, "u0")), rank(1, sampler=nvml(80.0, 400.0, "u0"))),
        None,
    )
    assert dup["job"]["energy_j"] == 400.0


def test_utilisation_from_raw_columns_when_not_summarised() -> None:
    dev = DeviceSamples(device="cuda:0", columns={"gpu_util_pct": [10.0, None, 30.0]})
    a = analyze_run(run_of(rank(0, sampler=SamplerRecord(kind="nvml", devices=[dev]))), None)
    assert a["ranks"][0]["nvml_gpu_util_pct"] == 20.0
    assert "energy counter not supported" in a["ranks"][0]["not_applicable"]["energy_j"]


def test_cpu_sampler_makes_nvml_figures_not_applicable() -> None:
    sampler = SamplerRecord(kind="cpu", reason="NVMLError_LibraryNotFound")
    a = analyze_run(run_of(rank(0, sampler=sampler)), None)
    na = a["ranks"][0]["not_applicable"]
    assert "NVMLError_LibraryNotFound" in na["nvml_gpu_util_pct"]
    assert a["ranks"][0]["energy_per_sample_j"] is None and "energy_per_sample_j" in na


# ------------------------------------------------------------------------- traces and MFU


def fake_summary(flops: float | None = 4.0e12) -> dict[str, Any]:
    return {
        "totals": {
            "window_us": 100_000.0,
            "busy_pct": 90.0,
            "comm_pct": 30.0,
            "exposed_comm_pct": 10.0,
        },
        "flops": {"total_flops": flops},
        "collectives": [
            {
                "type": "all_reduce",
                "count": 2,
                "total_us": 30_000.0,
                "exposed_us": 10_000.0,
                "busbw_gbps": 100.0,
                "group_size": 8,
            }
        ],
        "collective_calls": [{"type": "all_reduce"}] * 2,
        "not_applicable": {},
    }


def traced_run(
    tmp_path: Path, name: str = "NVIDIA H100 80GB HBM3", autocast: bool | None = True
) -> RunRecord:
    (tmp_path / "traces").mkdir(exist_ok=True)
    (tmp_path / "traces" / "r0.pt.trace.json").write_text("{}")
    return run_of(
        rank(
            0,
            world=1,
            device=DeviceInfo(kind="cuda", index=0, name=name),
            training=TrainingFacts(autocast_used=autocast),
            traces=["traces/r0.pt.trace.json"],
        )
    )


def test_mfu_comm_and_busy_from_trace_summary(tmp_path: Path) -> None:
    a = analyze_run(traced_run(tmp_path), tmp_path, trace_analyzer=lambda p: fake_summary())
    r = a["ranks"][0]
    assert r["trace_busy_pct"] == 90.0
    # 4e12 FLOP in 0.1 s = 40 TFLOP/s against the H100 SXM bf16 dense peak of 989.
    assert r["achieved_tflops"] == pytest.approx(40.0)
    assert r["peak_tflops"] == 989.0 and r["peak_dtype"] == "bf16"
    assert r["mfu_pct"] == pytest.approx(100 * 40.0 / 989.0)
    comm = r["comm"]
    assert comm["comm_us"] == pytest.approx(30_000.0)
    assert comm["exposed_comm_us"] == pytest.approx(10_000.0)
    assert comm["comm_overlap_us"] == pytest.approx(20_000.0)
    assert comm["comm_overlap_pct"] == pytest.approx(200.0 / 3.0)
    assert comm["busbw_gbps"] == 100.0
    assert comm["collectives"]["all_reduce"]["count"] == 2
    assert "collective_calls" not in a["traces"]["ranks"]["0"][0]


def test_mfu_not_applicable_reasons(tmp_path: Path) -> None:
    no_flops = analyze_run(
        traced_run(tmp_path), tmp_path, trace_analyzer=lambda p: fake_summary(None)
    )
    assert no_flops["ranks"][0]["mfu_pct"] is None
    assert "with_flops" in no_flops["ranks"][0]["not_applicable"]["mfu_pct"]
    unknown = analyze_run(
        traced_run(tmp_path, name="Mystery GPU 9000"),
        tmp_path,
        trace_analyzer=lambda p: fake_summary(),
    )
    assert unknown["ranks"][0]["mfu_pct"] is None
    assert "not in mgprof's table" in unknown["ranks"][0]["not_applicable"]["mfu_pct"]
    fp32 = analyze_run(
        traced_run(tmp_path, autocast=None), tmp_path, trace_analyzer=lambda p: fake_summary()
    )
    assert fp32["ranks"][0]["peak_dtype"] == "fp32" and fp32["ranks"][0]["peak_tflops"] == 67.0


def test_device_peak_table_matches_by_name() -> None:
    assert device_peak_tflops("NVIDIA A100-SXM4-80GB", "bf16") == 312.0
    assert device_peak_tflops("NVIDIA A10", "bf16") == 125.0
    assert device_peak_tflops("NVIDIA A10G", "bf16") is None  # not the A10, nor the A100
    assert device_peak_tflops("NVIDIA H100 PCIe", "bf16") == 756.0
    assert device_peak_tflops("NVIDIA H200", "bf16") == 989.0
    assert device_peak_tflops("Tesla V100-SXM2-16GB", "fp16") == 125.0
    assert device_peak_tflops("Tesla V100-SXM2-16GB", "bf16") is None
    assert device_peak_tflops(None, "fp32") is None


def test_trace_failures_become_reasons_and_warnings(tmp_path: Path) -> None:
    def broken(path: Path) -> Any:
        raise ValueError("truncated gzip")

    a = analyze_run(traced_run(tmp_path), tmp_path, trace_analyzer=broken)
    r = a["ranks"][0]
    assert r["trace_busy_pct"] is None
    assert "truncated gzip" in r["not_applicable"]["trace_busy_pct"]
    assert any("truncated gzip" in w for w in a["warnings"])
    assert r["step_time_ms"] is not None  # the other figures survive


def test_trace_paths_outside_run_dir_and_missing_run_dir(tmp_path: Path) -> None:
    run = run_of(rank(0, world=1, traces=["../../etc/passwd"]))
    calls: list[Path] = []

    def record(path: Path) -> dict[str, Any]:
        calls.append(path)
        return fake_summary()

    a = analyze_run(run, tmp_path, trace_analyzer=record)
    assert calls == []
    assert any("outside the run directory" in w for w in a["warnings"])
    b = analyze_run(run_of(rank(0, world=1, traces=["t.json"])), None)
    assert "run directory not given" in b["ranks"][0]["not_applicable"]["trace_busy_pct"]
    c = analyze_run(run_of(rank(0, world=1)), tmp_path)
    assert "no trace recorded" in c["ranks"][0]["not_applicable"]["trace_busy_pct"]


def fixture_run(tmp_path: Path) -> RunRecord:
    files = sorted(FIXTURE.glob("*.pt.trace.json.gz"))
    assert len(files) == 2, f"two rank traces expected in {FIXTURE}"
    (tmp_path / "traces").mkdir()
    for f in files:
        shutil.copy(f, tmp_path / "traces" / f.name)
    return run_of(
        *(rank(i, traces=[f"traces/{f.name}"]) for i, f in enumerate(files)),
        backend="gloo",
        cpu_fallback=True,
        cpu_fallback_reason="no CUDA device",
    )


def test_real_gloo_fixture_through_the_trace_engine(tmp_path: Path) -> None:
    from mgprof.analyze.trace.summary import analyze_trace_file

    run = fixture_run(tmp_path)
    a = analyze_run(run, tmp_path)
    assert a["warnings"] == []
    for r, rec in zip(a["ranks"], run.ranks):
        own = analyze_trace_file(tmp_path / rec.traces[0]).totals
        assert r["trace_busy_pct"] == pytest.approx(own.busy_pct)
        assert r["comm"]["comm_pct"] == pytest.approx(own.comm_pct)
        assert r["comm"]["exposed_comm_us"] == pytest.approx(own.exposed_comm_us)
        assert r["comm"]["comm_us"] > 0 and r["comm"]["collectives"]["all_reduce"]["count"] > 0
        assert "CPU device" in r["not_applicable"]["mfu_pct"]
    job = a["traces"]["job"]
    assert job is not None and job["slowest_rank"] in (0, 1) and "ranks" not in job
    json.dumps(a, allow_nan=False)
