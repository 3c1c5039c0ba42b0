"""Findings: each rule fires on measured figures, stays quiet below its threshold, and never fires
on missing data. Records are built by hand with realistic GPU numbers (H100, NCCL); the analysis
dict comes from the real ``analyze_run``, with trace summaries fed through its trace_analyzer."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from rich.console import Console

from mgprof.analyze import findings as fd
from mgprof.analyze.findings import RULES, evaluate_findings
from mgprof.analyze.run.analysis import analyze_run
from mgprof.analyze.run.schema import decode_analysis
from mgprof.records import (
    AutoWrapRecord,
    CompileRecord,
    DeviceInfo,
    DeviceSamples,
    FsdpRecord,
    MemoryRecord,
    RankRecord,
    RunRecord,
    SamplerRecord,
    StepRecord,
    TrainingFacts,
)
from mgprof.report.run.markdown import run_to_markdown
from mgprof.report.run.terminal import render_run
from tests._analysis import trace_summary

H100 = "NVIDIA H100 80GB HBM3"
H100_MIB = 81_559.0


def steps(ms: float = 100.0, n: int = 6, batch: int | None = 64, **kw: Any) -> list[StepRecord]:
    return [StepRecord(index=i, duration_ms=ms, batch_size=batch, **kw) for i in range(n)]


def nvml(util: float = 95.0, **facts: Any) -> SamplerRecord:
    dev = DeviceSamples(
        device="cuda:0",
        t_s=[0.0, 0.1, 0.2],
        columns={"gpu_util_pct": [util] * 3, "mem_used_mib": [40_000.0] * 3},
        summary={"gpu_util_pct_mean": util},
        facts={"name": H100, "uuid": f"GPU-{id(facts)}", **facts},
    )
    return SamplerRecord(kind="nvml", interval_s=0.1, devices=[dev])


def gpu_rank(r: int, world: int = 2, **kw: Any) -> RankRecord:
    defaults: dict[str, Any] = {
        "rank": r,
        "world_size": world,
        "strategy": "ddp",
        "backend": "nccl",
        "device": DeviceInfo(
            kind="cuda", index=r, name=H100, total_memory_mib=H100_MIB, capability="9.0"
        ),
        "steps": steps(),
        "sampler": nvml(),
        "memory": MemoryRecord(
            kind="cuda", peak_allocated_mib=38_000.0, peak_reserved_mib=44_000.0, total_mib=H100_MIB
        ),
        "training": TrainingFacts(
            dataloader_num_workers=8,
            dataloader_pin_memory=True,
            distributed_sampler=True,
            set_epoch_called=True,
            find_unused_parameters=False,
            autocast_used=True,
            ddp_bucket_cap_mb=25.0,
        ),
    }
    defaults.update(kw)
    return RankRecord(**defaults)


def gpu_run(*ranks: RankRecord, **kw: Any) -> RunRecord:
    ranks = ranks or (gpu_rank(0), gpu_rank(1))
    return RunRecord(
        run_id="t",
        strategy=kw.pop("strategy", "ddp"),
        world_size=len(ranks),
        backend="nccl",
        ranks=list(ranks),
        **kw,
    )


def summary(
    exposed_pct: float = 3.0, busy_pct: float = 92.0, tensor_cores: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A GPU trace summary shaped like the trace engine's output."""
    return trace_summary(
        kind="gpu",
        totals={
            "window_us": 300_000.0,
            "busy_pct": busy_pct,
            "idle_pct": 100.0 - busy_pct,
            "compute_pct": busy_pct - exposed_pct,
            "comm_pct": 20.0,
            "exposed_comm_pct": exposed_pct,
        },
        collectives=[
            {
                "type": "all_reduce",
                "count": 30,
                "total_us": 60_000.0,
                "exposed_us": 300_000.0 * exposed_pct / 100.0,
                "busbw_gbps": 180.0,
                "group_size": 2,
            }
        ],
        tensor_cores=tensor_cores
        or {
            "tensor_core_us": 200_000.0,
            "fp32_gemm_us": 0.0,
            "tensor_core_kernels": 12,
            "fp32_gemm_kernels": 0,
            "tensor_core_pct": 80.0,
            "fp32_gemm_pct": 0.0,
        },
    )


def analysed(run: RunRecord, tmp_path: Path | None = None, **summary_kw: Any) -> dict[str, Any]:
    """analyze_run on the run; with tmp_path, every rank has a trace with ``summary(...)``."""
    if tmp_path is None:
        return analyze_run(run, None)
    (tmp_path / "traces").mkdir(exist_ok=True)
    ranks = []
    for rec in run.ranks:
        rel = f"traces/rank{rec.rank}.pt.trace.json"
        (tmp_path / rel).write_text("{}")
        ranks.append(msgspec.structs.replace(rec, traces=[rel]))
    traced = msgspec.structs.replace(run, ranks=ranks)
    return analyze_run(traced, tmp_path, trace_analyzer=lambda p: summary(**summary_kw))


def rules_fired(run: RunRecord, analysis: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["rule"]: f for f in evaluate_findings(run, analysis)}


def fired(rule: str, run: RunRecord, analysis: dict[str, Any]) -> dict[str, Any] | None:
    return rules_fired(run, analysis).get(rule)


# ------------------------------------------------------------------ a healthy run: nothing fires


def test_healthy_gpu_run_has_no_findings(tmp_path: Path) -> None:
    run = gpu_run()
    assert evaluate_findings(run, analysed(run, tmp_path)) == []


@pytest.mark.parametrize(
    "run",
    [RunRecord(), gpu_run(RankRecord(rank=0, world_size=1)), gpu_run()],
    ids=["empty-run", "bare-rank", "gpu-run"],
)
def test_nothing_fires_on_missing_figures(run: RunRecord) -> None:
    """An empty analysis (no figures at all) is "do not know", never a problem."""
    bare = msgspec.structs.replace(
        run,
        ranks=[
            msgspec.structs.replace(r, training=TrainingFacts(), sampler=SamplerRecord(kind="none"))
            for r in run.ranks
        ],
    )
    assert evaluate_findings(bare, {}) == []
    assert (
        evaluate_findings(bare, {"ranks": [{}], "job": {}, "traces": {"ranks": {"0": [{}]}}}) == []
    )


# ------------------------------------------------------------------ DataParallel


def dp_run(devices: int = 4) -> RunRecord:
    per_device = {
        f"cuda:{i}": {"peak_allocated_mib": 30_000.0 if i == 0 else 18_000.0}
        for i in range(devices)
    }
    return gpu_run(
        gpu_rank(
            0,
            world=1,
            strategy="dp",
            devices_used=devices,
            memory=MemoryRecord(kind="cuda", total_mib=H100_MIB, per_device=per_device),
        ),
        strategy="dp",
    )


def test_dataparallel_fires_with_device0_imbalance_and_measured_saving() -> None:
    run = dp_run()
    analysis = analysed(run)
    analysis["comparison"] = {
        "rows": [
            {
                "strategy": "dp",
                "devices": 4,
                "run": "dp",
                "status": "complete",
                "samples_per_s": 1000.0,
            },
            {
                "strategy": "ddp",
                "devices": 4,
                "run": "ddp",
                "status": "complete",
                "samples_per_s": 2400.0,
            },
        ]
    }
    f = fired("dataparallel", run, analysis)
    assert f is not None and f["severity"] == "high"
    assert "4 devices" in f["evidence"] and "30,000 MiB" in f["evidence"]
    assert "18,000 MiB" in f["evidence"]
    assert "DistributedDataParallel" in f["change"] and "--strategy ddp" in f["change"]
    assert f["saving"] is not None and "2.40x" in f["saving"]


def test_dataparallel_quiet_for_ddp_and_single_device() -> None:
    run = gpu_run()
    assert fired("dataparallel", run, analysed(run)) is None
    one = dp_run(devices=1)
    assert fired("dataparallel", one, analysed(one)) is None


def test_dataparallel_without_comparison_has_no_saving() -> None:
    run = dp_run()
    f = fired("dataparallel", run, analysed(run))
    assert f is not None and f["saving"] is None


# ------------------------------------------------------------------ exposed communication


def test_exposed_comm_fires_with_severity_by_share(tmp_path: Path) -> None:
    run = gpu_run()
    f = fired("exposed_comm", run, analysed(run, tmp_path, exposed_pct=18.0))
    assert f is not None and f["severity"] == "medium" and f["id"] == "exposed_comm"
    assert "18.0 % of the trace window (median of 2 ranks" in f["evidence"]
    assert "54.00 ms of 300.00 ms" in f["evidence"]
    assert "no_sync" in f["change"] and "per-GPU batch" in f["change"]
    # The gradients' size is not known here: no bucket-size advice.
    assert "bucket_cap_mb" not in f["change"] and f["fix"] == ["model.no_sync()"]
    # 18 % of a 100 ms step.
    assert f["saving"].startswith("up to 18.00 ms per step")
    high = fired("exposed_comm", run, analysed(run, tmp_path, exposed_pct=30.0))
    assert high is not None and high["severity"] == "high"


def test_exposed_comm_bucket_advice_only_when_gradients_exceed_a_bucket(tmp_path: Path) -> None:
    def with_gradients(mib: float) -> RunRecord:
        facts = TrainingFacts(ddp_bucket_cap_mb=25.0, ddp_gradient_mib=mib)
        return gpu_run(gpu_rank(0, training=facts), gpu_rank(1, training=facts))

    big = with_gradients(400.0)
    f = fired("exposed_comm", big, analysed(big, tmp_path, exposed_pct=18.0))
    assert f is not None and "DDP gradients 400.0 MiB, bucket_cap_mb=25" in f["evidence"]
    for knob in ("bucket_cap_mb=50", "gradient_as_bucket_view", "static_graph", "no_sync"):
        assert knob in f["change"]
    assert any("bucket_cap_mb=50" in x for x in f["fix"])
    small = with_gradients(0.001)
    g = fired("exposed_comm", small, analysed(small, tmp_path, exposed_pct=18.0))
    assert g is not None and "fit within one bucket" in g["evidence"]
    assert "bucket_cap_mb" not in g["change"] and "no_sync" in g["change"]


def test_exposed_comm_quiet_below_threshold_and_without_traces(tmp_path: Path) -> None:
    run = gpu_run()
    assert fired("exposed_comm", run, analysed(run, tmp_path, exposed_pct=5.0)) is None
    assert fired("exposed_comm", run, analysed(run)) is None  # no trace: comm is None


# ------------------------------------------------------------------ utilisation


def test_low_utilisation_fires_on_nvml() -> None:
    run = gpu_run(gpu_rank(0, sampler=nvml(util=42.0)), gpu_rank(1, sampler=nvml(util=88.0)))
    f = fired("low_utilisation", run, analysed(run))
    assert f is not None and f["severity"] == "medium"
    assert f["evidence"] == "GPU utilisation below 60 % (high < 30 %): rank 0 42.0 % (NVML)"
    very = gpu_run(gpu_rank(0, sampler=nvml(util=20.0)))
    assert fired("low_utilisation", very, analysed(very))["severity"] == "high"  # type: ignore[index]


def test_low_utilisation_from_gpu_trace_busy(tmp_path: Path) -> None:
    run = gpu_run(gpu_rank(0, sampler=SamplerRecord(kind="none")))
    f = fired("low_utilisation", run, analysed(run, tmp_path, busy_pct=45.0))
    assert f is not None and "rank 0 45.0 % (trace busy)" in f["evidence"]


def test_low_utilisation_quiet_when_busy_missing_or_cpu(tmp_path: Path) -> None:
    run = gpu_run()
    assert fired("low_utilisation", run, analysed(run)) is None
    unsampled = gpu_run(gpu_rank(0, sampler=SamplerRecord(kind="none")))
    assert fired("low_utilisation", unsampled, analysed(unsampled)) is None
    cpu = gpu_run(RankRecord(rank=0, world_size=1, steps=steps()))
    # A CPU rank's trace busy share (20 %) is not GPU utilisation.
    assert fired("low_utilisation", cpu, analysed(cpu, tmp_path, busy_pct=20.0)) is None


# ------------------------------------------------------------------ data loading


def loader_run(wait_ms: float | None, workers: int = 0, pinned: bool = False) -> RunRecord:
    facts = TrainingFacts(dataloader_num_workers=workers, dataloader_pin_memory=pinned)
    return gpu_run(
        gpu_rank(0, steps=steps(dataloader_ms=wait_ms), training=facts),
        gpu_rank(1, steps=steps(dataloader_ms=wait_ms), training=facts),
    )


def test_dataloader_stall_fires_with_worker_advice() -> None:
    run = loader_run(wait_ms=35.0)
    f = fired("dataloader_stall", run, analysed(run))
    assert f is not None and f["severity"] == "high"
    assert "35.0 % of step time" in f["evidence"] and "num_workers=0" in f["evidence"]
    # The cores were not recorded: the advice computes its share of them on the machine.
    for knob in ("num_workers=min(4, os.cpu_count() // 2)", "pin_memory=True", "persistent"):
        assert knob in f["change"]
    assert f["saving"] == "up to 35.00 ms of the 100.00 ms mean step"
    mid = loader_run(wait_ms=15.0, workers=4, pinned=True)
    g = fired("dataloader_stall", mid, analysed(mid))
    assert g is not None and g["severity"] == "medium"
    assert "num_workers=min(8, os.cpu_count() // 2)" in g["change"]
    assert "pin_memory" not in g["change"]


def test_dataloader_stall_quiet_below_threshold_or_untimed() -> None:
    fast = loader_run(wait_ms=2.0)
    assert fired("dataloader_stall", fast, analysed(fast)) is None
    untimed = loader_run(wait_ms=None)
    assert fired("dataloader_stall", untimed, analysed(untimed)) is None


# ------------------------------------------------------------------ tensor cores / AMP

FP32_HEAVY = {
    "tensor_core_us": 0.0,
    "fp32_gemm_us": 90_000.0,
    "tensor_core_kernels": 0,
    "fp32_gemm_kernels": 3,
    "tensor_core_pct": 0.0,
    "fp32_gemm_pct": 45.0,
}


def no_autocast_run(autocast: bool | None = None, capability: str = "9.0") -> RunRecord:
    dev = DeviceInfo(kind="cuda", index=0, name=H100, capability=capability)
    return gpu_run(gpu_rank(0, world=1, device=dev, training=TrainingFacts(autocast_used=autocast)))


def test_fp32_gemm_fires_without_autocast(tmp_path: Path) -> None:
    run = no_autocast_run()
    f = fired("fp32_gemm", run, analysed(run, tmp_path, tensor_cores=FP32_HEAVY))
    assert f is not None
    assert "45.0 % of compute-kernel time" in f["evidence"] and "90.00 ms" in f["evidence"]
    assert "torch.bfloat16" in f["change"] and "torch.autocast" in f["change"]
    old = no_autocast_run(capability="7.0")  # V100: no bf16, fp16 needs a GradScaler
    g = fired("fp32_gemm", old, analysed(old, tmp_path, tensor_cores=FP32_HEAVY))
    assert g is not None and "torch.float16" in g["change"] and "GradScaler" in g["change"]


def test_fp32_gemm_quiet_with_autocast_small_share_or_no_trace(tmp_path: Path) -> None:
    amp = no_autocast_run(autocast=True)
    assert fired("fp32_gemm", amp, analysed(amp, tmp_path, tensor_cores=FP32_HEAVY)) is None
    small = {**FP32_HEAVY, "fp32_gemm_us": 10_000.0, "fp32_gemm_pct": 5.0}
    run = no_autocast_run()
    assert fired("fp32_gemm", run, analysed(run, tmp_path, tensor_cores=small)) is None
    assert fired("fp32_gemm", run, analysed(run)) is None
    na = {**FP32_HEAVY, "fp32_gemm_pct": None}
    assert fired("fp32_gemm", run, analysed(run, tmp_path, tensor_cores=na)) is None


# ------------------------------------------------------------------ memory


def mem_run(reserved: float | None, total: float | None = H100_MIB) -> RunRecord:
    mem = MemoryRecord(kind="cuda", peak_reserved_mib=reserved, total_mib=total)
    return gpu_run(gpu_rank(0, memory=mem), gpu_rank(1, memory=mem))


def test_memory_near_limit_fires() -> None:
    run = mem_run(reserved=78_000.0)  # 4.4 % free
    f = fired("memory_near_limit", run, analysed(run))
    assert f is not None and f["severity"] == "high"
    assert "4.4 % free (peak reserved 78,000 MiB of 81,559 MiB)" in f["evidence"]
    assert "torch.utils.checkpoint" in f["change"] and "smaller batch" in f["change"]
    tight = mem_run(reserved=75_000.0)  # 8.0 % free
    assert fired("memory_near_limit", tight, analysed(tight))["severity"] == "medium"  # type: ignore[index]


def test_memory_headroom_fires_with_batch_estimate() -> None:
    run = mem_run(reserved=10_000.0)
    f = fired("memory_headroom", run, analysed(run))
    assert f is not None and f["severity"] == "low"
    assert "87.7 % free" in f["evidence"] and "above 64" in f["change"]
    # 64 samples in 10,000 MiB; 90 % of 81,559 MiB -> at most ~469 samples.
    assert "up to about 469 samples" in f["saving"]


def test_memory_rules_quiet_in_the_middle_and_on_missing_data() -> None:
    mid = mem_run(reserved=44_000.0)
    assert {"memory_near_limit", "memory_headroom"}.isdisjoint(rules_fired(mid, analysed(mid)))
    for run in (
        mem_run(reserved=None),
        gpu_run(
            gpu_rank(
                0,
                device=DeviceInfo(kind="cuda", index=0, name=H100),  # total unknown
                memory=MemoryRecord(kind="cuda", peak_reserved_mib=78_000.0),
            )
        ),
        gpu_run(gpu_rank(0, memory=None)),
        gpu_run(
            RankRecord(rank=0, world_size=1, memory=MemoryRecord(kind="cpu", peak_rss_mib=900.0))
        ),
    ):
        assert {"memory_near_limit", "memory_headroom"}.isdisjoint(rules_fired(run, analysed(run)))


def test_memory_headroom_needs_every_gpu_measured() -> None:
    free = MemoryRecord(kind="cuda", peak_reserved_mib=10_000.0, total_mib=H100_MIB)
    run = gpu_run(gpu_rank(0, memory=free), gpu_rank(1, memory=None))
    assert fired("memory_headroom", run, analysed(run)) is None


# ------------------------------------------------------------------ stragglers


def test_rank_imbalance_fires_on_spread() -> None:
    run = gpu_run(gpu_rank(0, steps=steps(ms=100.0)), gpu_rank(1, steps=steps(ms=130.0)))
    f = fired("rank_imbalance", run, analysed(run))
    assert f is not None and f["severity"] == "high" and f["id"] == "rank_imbalance:rank1"
    assert "rank 1 is the slowest in 5/5 steady-state steps" in f["evidence"]
    assert "mean step 130.00 ms vs rank 0 100.00 ms: spread 30.0 % > 10.0 %" in f["evidence"]
    assert "nvidia-smi" in f["change"]  # a CUDA rank: its GPU is worth a look
    assert f["saving"].startswith("up to 30.00 ms per step (23.1 %")
    mild = gpu_run(gpu_rank(0, steps=steps(ms=100.0)), gpu_rank(1, steps=steps(ms=115.0)))
    assert fired("rank_imbalance", mild, analysed(mild))["severity"] == "medium"  # type: ignore[index]


def test_rank_imbalance_quotes_collective_waits() -> None:
    run = gpu_run(gpu_rank(0, steps=steps(ms=100.0)), gpu_rank(1, steps=steps(ms=130.0)))
    analysis = analysed(run)
    analysis["traces"]["job"] = {
        "slowest_rank": 1,
        "cross_rank": {
            "ranks": [0, 1],
            "match_key": "order",
            "matched_calls": 30,
            "unmatched_calls": 0,
            "per_type": [],
            "per_rank": [
                {"rank": 0, "wait_us": 25_000.0, "last_arrivals": 0},
                {"rank": 1, "wait_us": 0.0, "last_arrivals": 30},
            ],
            "slowest_rank": 1,
        },
    }
    f = fired("rank_imbalance", run, analysis)
    assert f is not None and "last to arrive at collectives: rank 1" in f["evidence"]
    assert "rank 0 waited 25.00 ms" in f["evidence"]


def test_rank_imbalance_quiet_when_even_or_single_rank() -> None:
    even = gpu_run(gpu_rank(0, steps=steps(ms=100.0)), gpu_rank(1, steps=steps(ms=104.0)))
    assert fired("rank_imbalance", even, analysed(even)) is None
    one = gpu_run(gpu_rank(0, world=1))
    assert fired("rank_imbalance", one, analysed(one)) is None


# ------------------------------------------------------------------ data across ranks


def fp_run(fps: tuple[str | None, str | None], sampler: bool | None = False) -> RunRecord:
    facts = TrainingFacts(distributed_sampler=sampler)
    return gpu_run(
        *(gpu_rank(r, steps=steps(fingerprint=fp), training=facts) for r, fp in enumerate(fps))
    )


def test_identical_batches_fires_and_blames_the_sampler() -> None:
    run = fp_run(("abc", "abc"), sampler=False)
    f = fired("identical_batches", run, analysed(run))
    assert f is not None and f["severity"] == "high"
    assert "all 2 ranks in 6/6 compared steps" in f["evidence"]
    assert "no DistributedSampler on ranks 0, 1" in f["evidence"]
    assert "sampler=DistributedSampler(dataset)" in f["change"]
    seeded = fp_run(("abc", "abc"), sampler=True)
    g = fired("identical_batches", seeded, analysed(seeded))
    assert g is not None and "same seed" in g["cause"]


def test_identical_batches_quiet_when_different_or_unknown() -> None:
    different = fp_run(("abc", "def"))
    assert fired("identical_batches", different, analysed(different)) is None
    unknown = fp_run((None, None))
    assert fired("identical_batches", unknown, analysed(unknown)) is None


def epoch_run(sampler: bool | None, called: bool | None) -> RunRecord:
    facts = TrainingFacts(distributed_sampler=sampler, set_epoch_called=called)
    return gpu_run(gpu_rank(0, training=facts), gpu_rank(1, training=facts))


def test_set_epoch_missing_fires() -> None:
    run = epoch_run(sampler=True, called=False)
    f = fired("set_epoch_missing", run, analysed(run))
    assert f is not None and "ranks 0, 1" in f["evidence"] and "6 recorded steps" in f["evidence"]
    assert "sampler.set_epoch(epoch)" in f["change"]


@pytest.mark.parametrize(
    ("sampler", "called"), [(True, True), (False, None), (None, None), (True, None)]
)
def test_set_epoch_quiet(sampler: bool | None, called: bool | None) -> None:
    run = epoch_run(sampler, called)
    assert fired("set_epoch_missing", run, analysed(run)) is None


@pytest.mark.parametrize(("value", "fires"), [(True, True), (False, False), (None, False)])
def test_find_unused_parameters(value: bool | None, fires: bool) -> None:
    facts = TrainingFacts(find_unused_parameters=value)
    run = gpu_run(gpu_rank(0, training=facts), gpu_rank(1, training=facts))
    f = fired("find_unused_parameters", run, analysed(run))
    assert (f is not None) == fires
    if f is not None:
        assert "mean step 100.00 ms" in f["evidence"]
        assert "find_unused_parameters=False" in f["change"] and "static_graph" in f["change"]


# ------------------------------------------------------------------ clock throttling


def throttled(reasons: Any, masks: list[float | None] | None = None) -> RunRecord:
    sampler = nvml(throttle_reasons_seen=reasons, max_sm_clock_mhz=1980.0, power_limit_w=700.0)
    dev = sampler.devices[0]
    dev.columns["clock_event_reasons"] = masks if masks is not None else [0.0, 0.0, 0.0]
    dev.summary.update(
        {"sm_clock_mhz_mean": 1400.0, "temperature_c_max": 88.0, "power_w_mean": 690.0}
    )
    return gpu_run(gpu_rank(0, world=1, sampler=sampler))


def test_clock_throttling_hardware_is_high() -> None:
    # 0x40 hw_thermal_slowdown in two of three samples.
    run = throttled(["hw_thermal_slowdown"], masks=[0.0, 64.0, 64.0])
    f = fired("clock_throttling", run, analysed(run))
    assert f is not None and f["severity"] == "high"
    ev = f["evidence"]
    assert "hw_thermal_slowdown in 2/3 samples" in ev
    assert "SM clock mean 1,400 MHz of 1,980 MHz max (71 %)" in ev
    assert "temperature max 88 °C" in ev and "power mean 690 W of 700 W limit" in ev
    assert "nvidia-smi" in f["change"]


def test_clock_throttling_power_cap_is_medium() -> None:
    run = throttled(["sw_power_cap"], masks=[4.0, 4.0, 0.0])
    f = fired("clock_throttling", run, analysed(run))
    assert f is not None and f["severity"] == "medium" and "in 2/3 samples" in f["evidence"]


@pytest.mark.parametrize("reasons", [[], ["applications_clocks_setting", "sync_boost"], None, "x"])
def test_clock_throttling_quiet_on_benign_or_missing_reasons(reasons: Any) -> None:
    run = throttled(reasons)
    assert fired("clock_throttling", run, analysed(run)) is None


def test_clock_throttling_ignores_cpu_sampler() -> None:
    sampler = SamplerRecord(
        kind="cpu",
        devices=[DeviceSamples(device="cpu", facts={"throttle_reasons_seen": ["hw_slowdown"]})],
    )
    run = gpu_run(gpu_rank(0, world=1, sampler=sampler))
    assert fired("clock_throttling", run, analysed(run)) is None


# ------------------------------------------------------------------ memory profile (--memory)

IMBALANCED: dict[str, Any] = {
    "ranks": [
        {"rank": 0, "top_sites": []},
        {"rank": 1, "top_sites": [{"site": "train.py:42 forward", "mib": 2048.0, "count": 1}]},
    ],
    "comparison": {
        "basis": "peak reserved",
        "threshold_pct": 10.0,
        "threshold_mib": 800.0,
        "differs": {"rank": 1, "delta_mib": 2048.0, "delta_pct": 25.0, "median_others_mib": 8192.0},
    },
}
FRAGMENTED: dict[str, Any] = {
    "ranks": [{"rank": 0, "fragmentation_mib": 3072.0, "fragmentation_pct": 40.0}],
    "comparison": {},
}


def with_memory(analysis: dict[str, Any], memory: dict[str, Any]) -> dict[str, Any]:
    return {**analysis, "memory": memory}


def test_memory_imbalance_names_the_rank_and_what_it_holds() -> None:
    run = gpu_run()
    f = fired("memory_imbalance", run, with_memory(analysed(run), IMBALANCED))
    assert f is not None and f["id"] == "memory_imbalance:rank1"
    assert "2,048.0 MiB (+25 %)" in f["evidence"] and "train.py:42 forward" in f["evidence"]
    quiet = {**IMBALANCED, "comparison": {**IMBALANCED["comparison"], "differs": None}}
    assert fired("memory_imbalance", run, with_memory(analysed(run), quiet)) is None


def test_memory_near_limit_names_what_was_live_at_the_peak() -> None:
    run = mem_run(80_000.0)
    sites = [{"site": "model.py:88 forward", "mib": 30_000.0, "count": 12}]
    memory = {"ranks": [{"rank": 0, "top_sites": sites}], "comparison": {}}
    f = fired("memory_near_limit", run, with_memory(analysed(run), memory))
    assert f is not None and "largest live at the peak" in f["evidence"]
    assert "model.py:88 forward 30,000.0 MiB" in f["evidence"]
    assert f["figures"]["live_sites_mib"] == [30_000.0]


def test_memory_fragmentation_fires_on_gpu_only_beyond_both_thresholds() -> None:
    run = gpu_run()
    f = fired("memory_fragmentation", run, with_memory(analysed(run), FRAGMENTED))
    assert f is not None and "expandable_segments:True" in f["change"]
    small = {"ranks": [{"rank": 0, "fragmentation_mib": 512.0, "fragmentation_pct": 60.0}]}
    assert fired("memory_fragmentation", run, with_memory(analysed(run), small)) is None
    cpu = gpu_run(cpu_fallback=True)  # a CPU run: no CUDA cache to fragment
    assert fired("memory_fragmentation", cpu, with_memory(analysed(cpu), FRAGMENTED)) is None


def grads_run(*per_rank: list[float | None] | None) -> RunRecord:
    """A 2-rank run whose ranks checked these gradient norms (None: the rank checked none)."""
    ranks = []
    for r, norms in enumerate(per_rank):
        facts = TrainingFacts()
        if norms is not None:
            facts = TrainingFacts(grad_check_updates=list(range(len(norms))), grad_norms=norms)
        ranks.append(gpu_rank(r, world=len(per_rank), training=facts))
    return gpu_run(*ranks)


def test_zero_gradients_fires_only_when_every_checked_norm_is_zero() -> None:
    run = grads_run([0.0, 0.0, 0.0], [0.0, 0.0, 0.0])
    f = fired("zero_gradients", run, analysed(run))
    assert f is not None and f["severity"] == "high"
    assert "exactly 0 on ranks 0, 1 in each of 3 checked update(s)" in f["evidence"]
    assert "CrossEntropyLoss" in f["cause"] and "check the loss" in f["change"]
    for norms in ([0.0, 0.0, 1e-30], [0.0, 2.5, 0.0]):  # one rank, one update that learns
        run = grads_run([0.0, 0.0, 0.0], norms)
        assert fired("zero_gradients", run, analysed(run)) is None
    run = grads_run(None, None)  # nothing checked (an older record): do not know
    assert fired("zero_gradients", run, analysed(run)) is None
    run = grads_run([0.0, None], [0.0, 0.0])  # NaN at one check (JSON null): not zero
    run.ranks[0].training.grad_nonfinite = [1]
    assert fired("zero_gradients", run, analysed(run)) is None


def test_zero_gradients_names_gradients_that_never_arrived() -> None:
    run = grads_run([None, None], [None, None])
    f = fired("zero_gradients", run, analysed(run))
    assert f is not None and "no parameter the optimizer holds received a gradient" in f["evidence"]
    assert ".detach()" in f["cause"]


# ------------------------------------------------------------------ FSDP and torch.compile


def fsdp_run(unit_parameters: list[int] | None = None) -> RunRecord:
    """2 ranks that synchronised through FSDP (launched as ``--strategy fsdp``)."""
    record = FsdpRecord(
        api="fully_shard",
        units=len(unit_parameters or [1, 1]),
        unit_classes={"Block": 4, "Net": 1},
        unit_parameters=unit_parameters or [400_000, 300_000, 300_000],
    )
    facts = TrainingFacts(cpu_threads=1, fsdp_forwards=10, fsdp=record)
    return gpu_run(gpu_rank(0, training=facts), gpu_rank(1, training=facts), strategy="fsdp")


def _row(strategy: str, step_ms: float, state_mib: float) -> dict[str, Any]:
    rounds = [[step_ms * (1 + 0.01 * (i % 3)) for i in range(8)]]
    return {
        "strategy": strategy, "devices": 2, "run": strategy, "status": "complete",
        "samples_per_s": 64_000.0 / step_ms, "samples_per_step": 64, "round_step_ms": rounds,
        "grad_sync": "synchronised", "params_mib": state_mib / 4, "grads_mib": state_mib / 4,
        "optimizer_mib": state_mib / 2, "peak_mem_mib": [9_000.0, 9_000.0],
        "peak_mem_kind": "cuda allocated",
    }  # fmt: skip


DDP_FASTER = [_row("ddp", 10.0, 2_048.0), _row("fsdp", 25.0, 1_024.0)]


def with_rows(analysis: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {**analysis, "comparison": {"comparison_id": "c", "mode": "weak", "rows": rows}}


def test_fsdp_slower_than_ddp_needs_the_interval_above_one() -> None:
    run = fsdp_run()
    f = fired("fsdp_slower_than_ddp", run, with_rows(analysed(run), DDP_FASTER))
    assert f is not None and f["figures"]["ddp_over_fsdp_low"] > 1.0
    assert "2,048 MiB under ddp, 1,024 MiB sharded" in f["evidence"]
    tied = [_row("ddp", 10.0, 2_048.0), _row("fsdp", 10.05, 1_024.0)]
    assert fired("fsdp_slower_than_ddp", run, with_rows(analysed(run), tied)) is None
    ddp = gpu_run()  # a DDP run in the same comparison gets no FSDP advice
    assert fired("fsdp_slower_than_ddp", ddp, with_rows(analysed(ddp), DDP_FASTER)) is None


def test_fsdp_unit_layout_only_for_one_dominant_unit() -> None:
    run = fsdp_run()  # 40 % in the largest unit
    assert fired("fsdp_unit_layout", run, analysed(run)) is None
    run = fsdp_run(unit_parameters=[700_000, 200_000, 100_000])
    f = fired("fsdp_unit_layout", run, analysed(run))
    assert f is not None and f["figures"]["largest_unit_share_pct"] == pytest.approx(70.0)


def compiled_run(order: str | None = None, breaks: int = 3) -> RunRecord:
    wrap = AutoWrapRecord(wrapper="ddp", module_class="m.Net", parameters=10, compile_order=order)
    counted = CompileRecord(graphs=2, graph_breaks=breaks, break_reasons=[f"{breaks}x print"])
    facts = TrainingFacts(cpu_threads=1, ddp_sync_forwards=10, auto_wrap=wrap, compile=counted)
    return gpu_run(gpu_rank(0, training=facts), gpu_rank(1, training=facts))


def compiled_trace(run: RunRecord, tmp_path: Path, pct: float) -> dict[str, Any]:
    """analyze_run with every rank's trace holding compiled regions covering ``pct``."""
    (tmp_path / "traces").mkdir(exist_ok=True)
    ranks = []
    for rec in run.ranks:
        rel = f"traces/rank{rec.rank}.pt.trace.json"
        (tmp_path / rel).write_text("{}")
        ranks.append(msgspec.structs.replace(rec, traces=[rel]))
    regions = {
        "frames": ["0/0", "1/0"], "recompiled_frames": 0, "regions": 6, "nested": 0,
        "steps": 3, "regions_per_step": 2.0, "forward_us": 3_000.0 * pct,
        "backward_us": 0.0, "window_us": 300_000.0, "compiled_pct": pct,
    }  # fmt: skip
    traced = msgspec.structs.replace(run, ranks=ranks)
    return analyze_run(
        traced, tmp_path, trace_analyzer=lambda p: {**summary(), "compiled": regions}
    )


def test_mostly_uncompiled_needs_breaks_and_a_low_share(tmp_path: Path) -> None:
    run = compiled_run()
    assert fired("mostly_uncompiled", run, compiled_trace(run, tmp_path, 20.0)) is not None
    assert fired("mostly_uncompiled", run, compiled_trace(run, tmp_path, 80.0)) is None
    clean = compiled_run(breaks=0)
    assert fired("mostly_uncompiled", clean, compiled_trace(clean, tmp_path, 20.0)) is None


def test_ddp_around_compiled_only_when_the_order_was_kept() -> None:
    run = compiled_run(order="compile(ddp(model)) with the script's compile options")
    assert fired("ddp_around_compiled", run, analysed(run)) is None
    run = compiled_run(order="ddp(compiled): the model is torch's own Sequential, ...")
    f = fired("ddp_around_compiled", run, analysed(run))
    assert f is not None and "class of your own" in f["change"]


# ------------------------------------------------------------------ the whole set


FIRING: dict[str, Callable[[Path], tuple[RunRecord, dict[str, Any]]]] = {
    "dataparallel": lambda p: (dp_run(), analysed(dp_run())),
    "exposed_comm": lambda p: (gpu_run(), analysed(gpu_run(), p, exposed_pct=30.0)),
    "low_utilisation": lambda p: (
        r := gpu_run(gpu_rank(0, sampler=nvml(util=20.0))),
        analysed(r),
    ),
    "dataloader_stall": lambda p: (r := loader_run(40.0), analysed(r)),
    "fp32_gemm": lambda p: (r := no_autocast_run(), analysed(r, p, tensor_cores=FP32_HEAVY)),
    "memory_near_limit": lambda p: (r := mem_run(80_000.0), analysed(r)),
    "memory_headroom": lambda p: (r := mem_run(5_000.0), analysed(r)),
    "rank_imbalance": lambda p: (
        r := gpu_run(gpu_rank(0, steps=steps(ms=50.0)), gpu_rank(1, steps=steps(ms=80.0))),
        analysed(r),
    ),
    "identical_batches": lambda p: (r := fp_run(("a", "a")), analysed(r)),
    "set_epoch_missing": lambda p: (r := epoch_run(True, False), analysed(r)),
    "find_unused_parameters": lambda p: (
        r := gpu_run(gpu_rank(0, training=TrainingFacts(find_unused_parameters=True))),
        analysed(r),
    ),
    "clock_throttling": lambda p: (r := throttled(["hw_slowdown"]), analysed(r)),
    "memory_imbalance": lambda p: (r := gpu_run(), with_memory(analysed(r), IMBALANCED)),
    "memory_fragmentation": lambda p: (r := gpu_run(), with_memory(analysed(r), FRAGMENTED)),
    "zero_gradients": lambda p: (r := grads_run([0.0, 0.0], [0.0, 0.0]), analysed(r)),
    "fsdp_unit_layout": lambda p: (r := fsdp_run(unit_parameters=[1_000_000]), analysed(r)),
    "fsdp_slower_than_ddp": lambda p: (r := fsdp_run(), with_rows(analysed(r), DDP_FASTER)),
    "ddp_around_compiled": lambda p: (r := compiled_run(order="ddp(compiled): x"), analysed(r, p)),
    "mostly_uncompiled": lambda p: (r := compiled_run(), compiled_trace(r, p, 20.0)),
}


def test_every_rule_has_a_firing_case() -> None:
    assert len(FIRING) == len(RULES)


@pytest.mark.parametrize("rule", sorted(FIRING))
def test_finding_shape(rule: str, tmp_path: Path) -> None:
    """Every finding carries numbers with units as evidence, a cause and a concrete change."""
    run, analysis = FIRING[rule](tmp_path)
    found = evaluate_findings(run, analysis)
    mine = [f for f in found if f["rule"] == rule]
    assert len(mine) == 1
    f = mine[0]
    assert set(f) == {
        "id",
        "fix",
        "rule",
        "severity",
        "title",
        "evidence",
        "cause",
        "change",
        "saving",
        "figures",
    }
    assert f["severity"] in fd.SEVERITY_ORDER
    assert any(ch.isdigit() for ch in f["evidence"]), f["evidence"]
    assert f["cause"] and f["change"] and f["title"]
    assert f["id"].split(":")[0] == rule
    assert isinstance(f["fix"], list) and f["fix"] and all(isinstance(x, str) for x in f["fix"])
    json.dumps(found)  # plain, JSON-ready
    order = [(fd.SEVERITY_ORDER[x["severity"]], x["id"]) for x in found]
    assert order == sorted(order)
    cited = figure_values(f["figures"])
    for number in numbers_in(f["evidence"]):
        assert any(_same(number, v) for v in cited), (number, f["evidence"], f["figures"])


_NUMBER = re.compile(r"(?<![\w.:,])(-?\d+(?:,\d{3})*(?:\.\d+)?)(?![\w.])")


def numbers_in(text: str) -> list[str]:
    """The numbers a text cites; digits inside names (``H100``, ``p95``, ``cuda:0``) excluded."""
    return _NUMBER.findall(text)


def figure_values(figs: Any) -> list[Any]:
    """Every value (and key: ranks key some dicts) in a nested figures dict."""
    if isinstance(figs, dict):
        return [*figs.keys(), *(v for x in figs.values() for v in figure_values(x))]
    if isinstance(figs, list):
        return [v for x in figs for v in figure_values(x)]
    return [figs]


def _same(token: str, value: Any) -> bool:
    """``token`` is ``value`` as the evidence printed it (its decimals), or part of a label."""
    if isinstance(value, str):
        return token in re.findall(r"\d+", value) or token == value
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    number = float(token.replace(",", ""))
    decimals = len(token.split(".")[1]) if "." in token else 0
    return abs(number - value) <= 0.5 * 10**-decimals + 1e-9


def test_findings_sorted_by_severity(tmp_path: Path) -> None:
    run = gpu_run(
        gpu_rank(0, training=TrainingFacts(find_unused_parameters=True), steps=steps(ms=100.0)),
        gpu_rank(1, training=TrainingFacts(find_unused_parameters=True), steps=steps(ms=140.0)),
    )
    found = evaluate_findings(run, analysed(run, tmp_path, exposed_pct=12.0))
    assert [f["rule"] for f in found] == [
        "rank_imbalance",
        "exposed_comm",
        "find_unused_parameters",
    ]
    assert [f["severity"] for f in found] == ["high", "medium", "low"]


def test_malformed_figures_are_left_out_and_a_rule_that_breaks_is_skipped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = gpu_run()
    analysis = analysed(run)
    analysis["job"]["identical_batches"] = True
    good = json.loads(json.dumps(analysis))
    analysis["job"]["fingerprint_steps_compared"] = "many"  # malformed: not a number
    typed = decode_analysis(analysis)
    assert typed.job is None and typed.ranks  # the bad block alone is left out
    assert any("'job'" in w and "fingerprint_steps_compared" in w for w in typed.warnings)
    assert [f["rule"] for f in evaluate_findings(run, analysis)] == []
    analysis["ranks"] = "garbage"
    assert isinstance(evaluate_findings(run, analysis), list)

    def broken(run: RunRecord, figures: Any) -> None:
        raise KeyError("a rule that trips over a figure")

    monkeypatch.setattr(fd, "RULES", (broken, *RULES))
    assert [f["rule"] for f in evaluate_findings(run, good)] == ["identical_batches"]


def test_findings_reach_terminal_markdown(tmp_path: Path) -> None:
    run = epoch_run(sampler=True, called=False)
    analysis = analysed(run)
    analysis["findings"] = evaluate_findings(run, analysis)
    md = run_to_markdown(run, decode_analysis(analysis))
    assert "DistributedSampler.set\\_epoch() is never called" in md
    buf = io.StringIO()
    render_run(run, decode_analysis(analysis), Console(file=buf, width=120))
    assert "[medium] DistributedSampler.set_epoch() is never called" in buf.getvalue()


# ------------------------------------------------------------------ a real CPU run


@pytest.mark.slow
def test_real_cpu_run_stores_findings_and_gets_no_gpu_advice(cpu_run_dir: Path) -> None:
    from mgprof.records import read_run

    run = read_run(cpu_run_dir)
    assert run.analysis is not None and isinstance(run.analysis.get("findings"), list)
    found = evaluate_findings(run, run.analysis)
    assert found == run.analysis["findings"]
    rules = {f["rule"] for f in found}
    gpu_only = {"low_utilisation", "fp32_gemm", "memory_near_limit", "memory_headroom"}
    assert rules.isdisjoint(gpu_only | {"clock_throttling", "dataparallel"})
    # The example uses a DistributedSampler, calls set_epoch and trains on distinct shards.
    assert rules.isdisjoint({"identical_batches", "set_epoch_missing", "find_unused_parameters"})
    for f in found:
        text = json.dumps(f)
        assert "nvidia-smi" not in text and "NVML" not in text and "GPU" not in text, text
