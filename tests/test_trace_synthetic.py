"""Small hand-written traces whose answers are worked out in the comments."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from _trace_events import ev

from mgprof.analyze.intervals import as_array, covered_within, intersect, union_length
from mgprof.analyze.trace.comm import busbw_factor, collective_type
from mgprof.analyze.trace.job import analyze_job
from mgprof.analyze.trace.kernels import classify_kernel
from mgprof.analyze.trace.summary import analyze_trace_file
from mgprof.errors import TraceError


def write(tmp: Path, name: str, events: list[dict], gz: bool = False, **top: Any) -> Path:
    doc = {"traceEvents": events, **top}
    p = tmp / name
    data = json.dumps(doc).encode()
    p.write_bytes(gzip.compress(data) if gz else data)
    return p


def test_intervals_union_intersect_cover() -> None:
    s, e = as_array([0, 5, 20, 1]), as_array([10, 15, 30, 2])
    assert union_length(s, e) == 25  # [0,15] + [20,30]
    w = intersect((s, e), (as_array([12, 25]), as_array([22, 40])))
    assert list(zip(w[0].tolist(), w[1].tolist())) == [(12, 15), (20, 22), (25, 30)]
    cov = covered_within(
        as_array([5, 14]), as_array([25, 16]), (as_array([0, 20]), as_array([10, 22]))
    )
    assert cov.tolist() == [7, 0]  # [5,10] + [20,22]; [14,16] is uncovered


def test_overlap_and_exposed_comm(tmp_path: Path) -> None:
    # compute [0,100] and [150,200]; comm [80,180] on another stream; memcpy [200,210].
    # window 210, busy 210 − gap [? none: 100..150 is covered by comm] = 210,
    # compute 150, comm 100, overlap |[80,100]|+|[150,180]| = 50, exposed 50.
    p = write(
        tmp_path,
        "rank-0.json",
        [
            ev("gemm", "kernel", 0, 100),
            ev("gemm", "kernel", 150, 50),
            ev("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "kernel", 80, 100, tid=9),
            ev("Memcpy DtoH", "gpu_memcpy", 200, 10),
        ],
    )
    t = analyze_trace_file(p).totals
    assert t.window_us == 210
    assert t.busy_pct == pytest.approx(100.0)
    assert t.compute_pct == pytest.approx(100 * 150 / 210)
    assert t.comm_pct == pytest.approx(100 * 100 / 210)
    assert t.comm_overlap_pct == pytest.approx(50.0)
    assert t.exposed_comm_pct == pytest.approx(100 * 50 / 210)
    assert t.memcpy_pct == pytest.approx(100 * 10 / 210)
    s = analyze_trace_file(p)
    (ar,) = s.collectives
    assert (ar.type, ar.count, ar.total_us, ar.exposed_us) == ("all_reduce", 1, 100, 50)
    assert ar.busbw_gbps is None and "message size" in (ar.not_applicable or "")


def test_steps_follow_launch_correlation(tmp_path: Path) -> None:
    # Step 1 = CPU [0,100], step 2 = [100,200]. Kernel A launched at 50 (corr 1) runs at 120..140,
    # i.e. inside step 2's CPU span, but belongs to step 1 because its launch does.
    cpu = 1
    p = write(
        tmp_path,
        "rank-0.json",
        [
            ev("ProfilerStep#1", "user_annotation", 0, 100, tid=cpu),
            ev("ProfilerStep#2", "user_annotation", 100, 100, tid=cpu),
            ev("cudaLaunchKernel", "cuda_runtime", 50, 5, tid=cpu, correlation=1),
            ev("cudaLaunchKernel", "cuda_runtime", 150, 5, tid=cpu, correlation=2),
            ev("A", "kernel", 120, 20, correlation=1),
            ev("B", "kernel", 160, 10, correlation=2),
            ev("orphan", "kernel", 300, 10, correlation=99),
        ],
    )
    s = analyze_trace_file(p)
    assert [(st.step, st.device_events) for st in s.steps] == [(1, 1), (2, 1)]
    assert s.steps[0].totals.window_us == 20 and s.steps[1].totals.window_us == 10
    assert s.steps[0].cpu_duration_us == 100
    assert s.totals.window_us == 190  # the orphan still counts in the trace window


def test_old_schema_string_tids(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        "worker3.123.pt.trace.json.gz",
        [
            ev("ProfilerStep#5", "Operator", 0, 100, tid="25738"),
            ev("cudaLaunchKernel", "Runtime", 10, 2, tid="25738", correlation=7),
            ev("volta_sgemm_128x64_nn", "Kernel", 20, 30, tid="stream 7", correlation=7),
            ev("Memset (Device)", "Memset", 50, 10, tid="stream 7", correlation=8),
        ],
        gz=True,
    )
    s = analyze_trace_file(p)
    assert (s.kind, s.rank, s.rank_source) == ("gpu", 3, "file name")
    assert s.totals.window_us == 40 and s.totals.memcpy_pct == pytest.approx(25.0)
    assert s.steps[0].step == 5 and s.steps[0].device_events == 1
    assert s.tensor_cores.fp32_gemm_kernels == 1


def test_fractional_ts_and_negative_dur(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        "rank-0.json",
        [
            ev("k1", "kernel", 1000.125, 0.5),
            ev("k2", "kernel", 1000.875, 0.25),
            ev("bad", "kernel", 900.0, -5.0),
            ev("nodur", "kernel", 800.0, None),
        ],
        distributedInfo={"rank": 1, "world_size": 4, "backend": "nccl"},
    )
    s = analyze_trace_file(p)
    assert s.totals.window_us == pytest.approx(1.0)  # 1000.125 … 1001.125, never rounded
    assert s.totals.busy_pct == pytest.approx(75.0)
    assert s.skipped_device_events == 2 and "skipped_device_events" in s.not_applicable
    assert (s.rank, s.world_size, s.backend) == (1, 4, "nccl")


def _gloo_trace(tmp: Path, rank: int, comm: list[tuple[float, float]]) -> Path:
    main, worker = 10, 11
    events = [
        ev("ProfilerStep#1", "user_annotation", 0, 100, tid=main),
        ev("ProfilerStep#2", "user_annotation", 200, 100, tid=main),
        ev("aten::mm", "cpu_op", 10, 30, tid=main),
        ev("aten::mm", "cpu_op", 20, 30, tid=main),  # nested/overlapping: union [10,50]
        ev("c10d::allreduce_", "cpu_op", 60, 5, tid=main),  # a comm wrapper, not compute
        ev("aten::add", "cpu_op", 150, 10, tid=main),  # outside every step: clipped away
        # an mgprof.region around backward: a container that covers the all-reduce wait
        ev("backward", "user_annotation", 40, 50, tid=main),
        ev(
            "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
            "user_annotation",
            200,
            10,
            tid=main,
        ),
    ]
    events += [
        ev(
            "gloo:all_reduce",
            "user_annotation",
            s,
            d,
            tid=worker,
            **{"Input Dims": [[1000]], "Input type": ["float"]},
        )
        for s, d in comm
    ]
    info = {
        "rank": rank,
        "world_size": 2,
        "backend": "gloo",
        "pg_config": [{"pg_name": "0", "pg_size": 2}],
    }
    return write(tmp, f"rank{rank}.pt.trace.json", events, distributedInfo=info)


def test_cpu_gloo_rules(tmp_path: Path) -> None:
    # W = [0,100] ∪ [200,300] = 200. compute = the cpu_op events on the main thread: [10,50] = 40
    # (add at 150 is outside W; the DataLoader span and the "backward" region are annotations,
    # containers, not compute). comm = [40,70] ∪ [250,260] = 40; overlap = [40,50] = 10;
    # busy = 40+40−10 = 70. Counting the region would have read 100 % overlap, 0 % exposed.
    p = _gloo_trace(tmp_path, 0, [(40, 30), (250, 10)])
    s = analyze_trace_file(p)
    t = s.totals
    assert s.kind == "cpu" and t.window_us == 200
    assert t.compute_pct == pytest.approx(20.0) and t.comm_pct == pytest.approx(20.0)
    assert t.busy_pct == pytest.approx(35.0) and t.comm_overlap_pct == pytest.approx(25.0)
    assert t.exposed_comm_pct == pytest.approx(15.0)
    assert t.dataloader_pct == pytest.approx(5.0) and t.memcpy_pct is None
    (ar,) = s.collectives
    # 2 calls × 4000 bytes in 40 us: algbw = 8000 B / 40e-6 s = 0.2 GB/s; busbw ×2(2−1)/2 = ×1.
    assert ar.bytes == 8000 and ar.group_size == 2
    assert ar.algbw_gbps == pytest.approx(0.2) and ar.busbw_gbps == pytest.approx(0.2)


def test_busbw_factors() -> None:
    assert busbw_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert busbw_factor("all_gather", 4) == pytest.approx(3 / 4)
    assert busbw_factor("reduce_scatter", 4) == pytest.approx(3 / 4)
    assert busbw_factor("all_to_all", 2) == pytest.approx(1 / 2)
    assert busbw_factor("broadcast", None) == 1.0 and busbw_factor("send_recv", None) == 1.0
    assert busbw_factor("all_reduce", None) is None and busbw_factor("barrier", 4) is None
    assert collective_type("ncclDevKernel_AllReduce_Sum_f32_RING_LL") == "all_reduce"
    assert collective_type("ncclKernel_ReduceScatter_RING_LL_Sum_half(x)") == "reduce_scatter"
    assert collective_type("nccl:_all_gather_base") == "all_gather"
    assert collective_type("c10d::alltoall_base_") == "all_to_all"
    assert collective_type("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t") == "send_recv"
    assert collective_type("allgather_into_tensor_coalesced") == "all_gather"


def test_kernel_classes() -> None:
    assert classify_kernel("volta_h884gemm_128x128_ldg8_nn") == "tensor_core"
    assert classify_kernel("sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n") == "tensor_core"
    assert classify_kernel("cutlass_80_tensorop_s16816gemm_relu_f16_256x128") == "tensor_core"
    assert classify_kernel("ampere_sgemm_128x64_nn") == "fp32_gemm"
    assert classify_kernel("void gemv2T_kernel_val<int, int, float>") == "fp32_gemm"
    assert classify_kernel("void at::native::vectorized_elementwise_kernel") == "other"


def test_allreduce_busbw_from_kernel_args(tmp_path: Path) -> None:
    # 1,000,000 floats = 4e6 B in 100 us: algbw 40 GB/s; n=4 → busbw = 40 × 2·3/4 = 60 GB/s.
    args = {
        "Collective name": "allreduce",
        "In msg nelems": 1_000_000,
        "Out msg nelems": 1_000_000,
        "dtype": "Float",
        "Group size": 4,
    }
    p = write(
        tmp_path, "rank-0.json", [ev("ncclDevKernel_AllReduce_Sum_f32", "kernel", 0, 100, **args)]
    )
    (c,) = analyze_trace_file(p).collectives
    assert c.algbw_gbps == pytest.approx(40.0) and c.busbw_gbps == pytest.approx(60.0)


def test_cross_rank_wait_and_slowest(tmp_path: Path) -> None:
    # Matched by order: call 1 lasts 30 on rank 0, 10 on rank 1 → transfer 10, rank 0 waits 20
    # (rank 1 arrived last). Call 2: 40 vs 15 → rank 0 waits 25. Rank 1 is the slowest rank.
    _gloo_trace(tmp_path, 0, [(40, 30), (250, 40)])
    _gloo_trace(tmp_path, 1, [(60, 10), (270, 15)])
    job = analyze_job(sorted(tmp_path.glob("*.json")), workers=1)
    assert job.slowest_rank == 1 and job.cross_rank is not None
    waits = {w.rank: (w.wait_us, w.last_arrivals) for w in job.cross_rank.per_rank}
    assert waits == {0: (45.0, 0), 1: (0.0, 2)}
    assert job.cross_rank.per_type[0].transfer_us == 25.0
    # the same job analysed in worker processes gives the same answer
    assert analyze_job(sorted(tmp_path.glob("*.json")), workers=2).slowest_rank == 1


def test_one_rank_only_is_not_applicable(tmp_path: Path) -> None:
    job = analyze_job([_gloo_trace(tmp_path, 0, [(40, 30)])], workers=1)
    assert job.slowest_rank is None and job.not_applicable["slowest_rank"] == "one rank only"


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"", "empty"),
        (b'{"traceEvents": [{"ph": "X"', "not valid JSON"),
        (b'{"foo": 1}', "traceEvents"),
        (b'{"traceEvents": [{"ph": "M", "name": "x"}]}', "no complete"),
        (b"[1, 2]", "not a Kineto"),
        (gzip.compress(b'{"traceEvents": []}')[:-6], "gzip"),
    ],
)
def test_bad_input_is_one_line_trace_error(tmp_path: Path, content: bytes, needle: str) -> None:
    p = tmp_path / "rank-0.json"
    p.write_bytes(content)
    with pytest.raises(TraceError) as info:
        analyze_trace_file(p)
    msg = str(info.value)
    assert "\n" not in msg and str(p) in msg and needle in msg


def test_cpu_comm_op_nested_in_an_operator_is_not_compute(tmp_path: Path) -> None:
    """DDP's reducer launches c10d::allreduce_ from inside autograd's AccumulateGrad: the main
    thread then waits in an operator span. The wait is cut out of compute, so the gloo
    transfer behind it reads as exposed (it read as overlapped, 32 % vs the A/B's 47 %)."""
    main, worker = 1, 2
    events = [
        ev("ProfilerStep#1", "user_annotation", 0, 300, tid=main),
        ev("aten::mm", "cpu_op", 10, 40, tid=main),  # compute [10,50]
        ev("autograd::engine::evaluate_function: AccumulateGrad", "cpu_op", 100, 100, tid=main),
        ev("c10d::allreduce_", "cpu_op", 120, 70, tid=main),  # the wait: [120,190]
        ev("gloo:all_reduce", "cpu_op", 125, 60, tid=worker),  # comm [125,185]
    ]
    t = analyze_trace_file(write(tmp_path, "rank0.pt.trace.json", events)).totals
    # compute = [10,50] + [100,120] + [190,200] = 70; comm = 60, none of it under compute
    assert t.compute_us == pytest.approx(70.0) and t.comm_us == pytest.approx(60.0)
    assert t.overlap_us == pytest.approx(0.0) and t.exposed_comm_us == pytest.approx(60.0)


def test_idle_breakdown_and_launch_delay(tmp_path: Path) -> None:
    """HTA's idle categories on one stream, and device start − launch start per kernel."""
    kernels = [  # (start, end, launch at)
        (0.0, 10.0, -5.0),
        (
            15.0,
            20.0,
            1.0,
        ),  # launched early, 5 us gap < 30 us (HTA's effective default): kernel wait
        (30.0, 40.0, 25.0),  # launched after the previous kernel ended: host wait 10
        (80.0, 90.0, 5.0),  # launched early, 40 us gap: other
    ]
    events = [ev("ProfilerStep#1", "user_annotation", -10, 110, tid=1)]
    for i, (start, end, launch) in enumerate(kernels):
        events.append(ev(f"k{i}", "kernel", start, end - start, tid="stream 7", correlation=i))
        events.append(ev("cudaLaunchKernel", "cuda_runtime", launch, 1, tid=1, correlation=i))
    s = analyze_trace_file(write(tmp_path, "rank0.pt.trace.json", events))
    assert s.idle is not None and s.idle.streams == 1
    assert s.idle.kernel_wait_us == pytest.approx(5.0) and s.idle.threshold_us == 30.0
    assert s.idle.host_wait_us == pytest.approx(10.0)
    assert s.idle.other_us == pytest.approx(40.0)
    assert s.launch_delay is not None and s.launch_delay.events == 4
    assert s.launch_delay.max_us == pytest.approx(75.0)
    assert s.launch_delay.mean_us == pytest.approx((5 + 14 + 5 + 75) / 4)
