"""Real H200 traces (torch 2.11, cu130): tensor-core detection, FLOP estimates, chunked loading."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import msgspec
import pytest
from _data import GPU as GPU_DATA
from _data import TRACES, need

from mgprof.analyze.trace.kernels import classify_kernel
from mgprof.analyze.trace.summary import analyze_trace_file
from mgprof.analyze.tracefile import stream as trace_stream
from mgprof.analyze.tracefile.load import FLOPS_ESTIMATED, estimate_flops, load_trace

GPU = GPU_DATA / "traces"
BF16 = need(GPU / "bf16-mlp", "*.json.gz")
FP32 = need(GPU / "fp32-mlp", "*.json.gz")
CPU_MLP = TRACES / "cpu-gloo-ddp-mlp-2ranks"

# The MLP in both traces: Linear(1024→4096), GELU, Linear(4096→4096), GELU, Linear(4096→1024) on a
# 256-row batch, 3 profiled steps. Forward: one GEMM per layer; backward: grad-input and grad-weight
# GEMMs, except the first layer, whose input needs no grad.
_LAYERS = [(1024, 4096), (4096, 4096), (4096, 1024)]
_ROWS = 256
_FWD = sum(2 * _ROWS * k * n for k, n in _LAYERS)
_BWD = sum(2 * _ROWS * k * n for k, n in _LAYERS) * 2 - 2 * _ROWS * 1024 * 4096
MLP_FLOPS_PER_STEP = _FWD + _BWD  # 36_507_222_016


def test_hopper_nvjet_names_are_tensor_core() -> None:
    assert classify_kernel("nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_NTN") == "tensor_core"
    assert classify_kernel("nvjet_sm90_tst_128x64_64x8_1x2_h_bz_bias_TNT") == "tensor_core"
    name = "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x64x8_stage3_warpsize1x2x1_ffma"
    assert classify_kernel(name) == "fp32_gemm"


def test_bf16_mlp_is_tensor_core() -> None:
    s = analyze_trace_file(BF16)
    assert s.tensor_cores.tensor_core_us > 0
    assert s.tensor_cores.fp32_gemm_us == 0
    assert s.tensor_cores.launches_by_op_dtype > 0
    assert "tensor_cores" not in s.not_applicable
    nvjet = [k for k in s.top_kernels if k.name.startswith("nvjet")]
    assert nvjet and all(k.kind == "tensor_core" for k in nvjet)


def test_fp32_mlp_is_fp32_gemm() -> None:
    s = analyze_trace_file(FP32)
    assert s.tensor_cores.tensor_core_us == 0
    assert s.tensor_cores.fp32_gemm_us > 0


@pytest.mark.parametrize("path", [BF16, FP32], ids=["bf16", "fp32"])
def test_mlp_flops_match_hand_arithmetic(path: Path) -> None:
    s = analyze_trace_file(path)
    assert s.flops.flops_source == FLOPS_ESTIMATED
    assert s.flops.total_flops == 3 * MLP_FLOPS_PER_STEP
    assert s.flops.ops_with_flops == 3 * 8  # 3 forward GEMMs (addmm, not linear) + 5 backward mm
    window = s.totals.window_us
    assert window is not None
    assert s.flops.achieved_tflops == pytest.approx(3 * MLP_FLOPS_PER_STEP / (window * 1e-6) / 1e12)


def test_cpu_fixture_flops() -> None:
    """CPU gloo DDP MLP: GEMM FLOPs from Input Dims, recounted here from the JSON."""
    path = need(CPU_MLP, "rank0*")
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    want = 0
    for e in events:
        if e.get("ph") != "X" or e.get("name") not in ("aten::mm", "aten::addmm"):
            continue
        dims = e["args"]["Input Dims"]
        a, b = (dims[0], dims[1]) if e["name"] == "aten::mm" else (dims[1], dims[2])
        want += 2 * a[0] * a[1] * b[1]
    s = analyze_trace_file(path)
    assert want > 0
    assert s.flops.total_flops == want
    assert s.flops.flops_source == FLOPS_ESTIMATED


def _raw(v: object) -> msgspec.Raw:
    return msgspec.Raw(msgspec.json.encode(v))


def test_estimate_flops_formulas() -> None:
    mm = estimate_flops("aten::bmm", _raw([[4, 8, 16], [4, 16, 32]]), msgspec.Raw())
    assert mm == (2.0 * 4 * 8 * 32 * 16, "")
    mat = estimate_flops("aten::matmul", _raw([[2, 3, 8, 16], [16, 5]]), msgspec.Raw())
    assert mat == (2.0 * 6 * 8 * 5 * 16, "")
    lin = estimate_flops("aten::linear", _raw([[2, 7, 16], [32, 16], [32]]), msgspec.Raw())
    assert lin == (2.0 * 14 * 32 * 16, "")
    # conv2d 3x3, stride 2, padding 1: 32x32 -> 16x16; weight [64, 3/1, 3, 3]
    conc = _raw(["", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1"])
    dims = _raw([[8, 3, 32, 32], [64, 3, 3, 3], [64], [], [], [], [], [], []])
    assert estimate_flops("aten::convolution", dims, conc) == (2.0 * 8 * 64 * 3 * 9 * 16 * 16, "")
    fl, why = estimate_flops("aten::convolution", dims, msgspec.Raw())
    assert fl is None and "Concrete Inputs" in why


def test_nested_ops_count_once(tmp_path: Path) -> None:
    """linear > addmm counts the addmm once; an args.flops trace uses args.flops instead."""

    def op(name: str, ts: float, dur: float, dims: list, **extra: object) -> dict:
        args = {"Input Dims": dims, "Input type": ["float"] * len(dims), **extra}
        return {"ph": "X", "cat": "cpu_op", "name": name, "ts": ts, "dur": dur, "tid": 1,
                "pid": 1, "args": args}  # fmt: skip

    events = [
        op("aten::linear", 0, 10, [[4, 8], [16, 8], [16]]),
        op("aten::t", 1, 1, [[16, 8]]),
        op("aten::addmm", 2, 5, [[16], [4, 8], [8, 16]]),
        op("aten::matmul", 20, 10, [[4, 8], [8, 16]]),  # no GEMM child: counted itself
    ]
    f = tmp_path / "t.json"
    f.write_text(json.dumps({"traceEvents": events}))
    rt = load_trace(f)
    assert (rt.flops_total, rt.flops_ops) == (2 * 2.0 * 4 * 8 * 16, 2)
    events[2]["args"]["flops"] = 7
    f.write_text(json.dumps({"traceEvents": events}))
    rt = load_trace(f)
    assert (rt.flops_total, rt.flops_source) == (7.0, "trace args.flops")


def test_chunked_decode_matches_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """Decoding traceEvents in small slices gives the same result as one whole decode."""
    whole = msgspec.to_builtins(analyze_trace_file(BF16))
    monkeypatch.setattr(trace_stream, "_CHUNK_BYTES", 997)
    sliced = msgspec.to_builtins(analyze_trace_file(BF16))
    assert sliced == whole


def test_cut_inside_string_falls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A '}, {' inside a name is not an event boundary; the loader must still read the trace."""
    monkeypatch.setattr(trace_stream, "_CHUNK_BYTES", 1)
    events = [
        {"ph": "X", "cat": "kernel", "name": "k}, {x", "ts": 1e15 + i, "dur": 0.5, "tid": 7}
        for i in range(5)
    ]
    f = tmp_path / "t.json"
    f.write_text(json.dumps({"traceEvents": events}))
    rt = load_trace(f)
    assert rt.dev_start.size == 5 and rt.kernel_names == ["k}, {x"]
    assert rt.time_base_us == 1e15
    assert rt.dev_end.tolist() == [i + 0.5 for i in range(5)]
