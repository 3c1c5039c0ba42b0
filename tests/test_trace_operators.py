"""The Operators and Kernels views' data (issue #14) on real traces, checked against an
independent stack-based walk of the same events, and the step timeline's ``start_us``."""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
from _data import GPU, TRACES, need

from mgprof.analyze.trace import operators as ops_mod
from mgprof.analyze.trace.kernels import KERNELS_LIMIT
from mgprof.analyze.trace.summary import analyze_trace_file
from mgprof.analyze.tracefile.load import load_trace
from mgprof.analyze.tracefile.rank_trace import HostOps
from mgprof.report.trace_terminal import _rank_json

FIXTURES = TRACES
GPU_DATA = GPU / "traces"
A100 = FIXTURES / "gpu-nccl-a100-rank0of2" / "rank-0.json.gz"
SAMPLED = FIXTURES / "gpu-nccl-128ranks-sampled" / "rank-0.json.gz"
OLD_SCHEMA = need(FIXTURES / "gpu-resnet50-v100-old-schema", "*.json.gz")
CPU_DDP = need(FIXTURES / "cpu-gloo-ddp-mlp-2ranks", "rank0.*.json.gz")
BF16 = need(GPU_DATA / "bf16-mlp", "*.json.gz")
GLOO_CUDA = need(GPU_DATA / "ddp-gloo-cuda-2ranks", "rank0.*.json.gz")

_OP_CATS = {"cpu_op", "operator"}
_DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"}
_LAUNCH_CATS = {"cuda_runtime", "cuda_driver", "runtime"}
_CONTAINERS = (
    "ProfilerStep#",
    "enumerate(DataLoader)#",
    "DistributedDataParallel.forward",
    "Optimizer.step#",
    "Optimizer.zero_grad#",
)


def _events(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path) as fh:
        doc = json.load(fh)
    return [e for e in doc["traceEvents"] if e.get("ph") == "X" and "dur" in e and "ts" in e]


def _shape(e: dict[str, Any]) -> str:
    dims = (e.get("args") or {}).get("Input Dims")
    text = "" if dims is None else json.dumps(dims)
    cut = ops_mod._SHAPE_CHARS
    return text if len(text) <= cut else text[: cut - 1] + "…"


def _reference(path: Path) -> dict[str, Any]:
    """Per (name, shapes): calls, host total/self, device self, by a plain tree walk per thread
    (a stack, independent of mgprof's vectorised pointer jumping), folding an operator whose
    only child has its name (PyTorch's _remove_dup_nodes); and the device time whose launch lies
    inside an operator."""
    events = _events(path)
    by_thread: dict[str, list[dict[str, Any]]] = defaultdict(list)
    calls_by_thread: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    device_by_corr: dict[Any, float] = defaultdict(float)
    device_total = 0.0
    for e in events:
        cat = str(e.get("cat", "")).lower()
        if cat in _OP_CATS and not e["name"].startswith(_CONTAINERS):
            by_thread[str(e["tid"])].append(e)
        elif cat in _DEVICE_CATS:
            device_total += e["dur"]
            device_by_corr[(e.get("args") or {}).get("correlation")] += e["dur"]
    for e in events:
        if str(e.get("cat", "")).lower() in _LAUNCH_CATS:
            corr = (e.get("args") or {}).get("correlation")
            dev = device_by_corr.pop(corr, 0.0) if corr is not None else 0.0
            calls_by_thread[str(e["tid"])].append((e["ts"], e["dur"], dev))
    groups: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0, 0.0, 0.0, 0.0])
    attributed = sum(
        _walk_thread(rows, calls_by_thread.get(tid, []), groups) for tid, rows in by_thread.items()
    )
    return {"groups": groups, "attributed": attributed, "device_total": device_total}


def _walk_thread(
    rows: list[dict[str, Any]],
    calls: list[tuple[float, float, float]],
    groups: dict[tuple[str, str], list[float]],
) -> float:
    """Add one thread's operators to ``groups``; return the device µs attributed to them."""
    rows.sort(key=lambda e: (e["ts"], -e["dur"]))
    kids: list[list[int]] = [[] for _ in rows]
    roots: list[int] = []
    stack: list[int] = []
    for i, e in enumerate(rows):
        while stack and rows[stack[-1]]["ts"] + rows[stack[-1]]["dur"] < e["ts"] + e["dur"]:
            stack.pop()
        (kids[stack[-1]] if stack else roots).append(i)
        stack.append(i)
    # each runtime call belongs to the innermost operator running at its start
    runtime_us = [0.0] * len(rows)
    device_us = [0.0] * len(rows)
    attributed = 0.0
    stack, k = [], 0
    for ts, dur, dev in sorted(calls):
        while k < len(rows) and rows[k]["ts"] <= ts:
            while stack and rows[stack[-1]]["ts"] + rows[stack[-1]]["dur"] < rows[k]["ts"]:
                stack.pop()
            stack.append(k)
            k += 1
        while stack and rows[stack[-1]]["ts"] + rows[stack[-1]]["dur"] < ts:
            stack.pop()
        if stack:
            runtime_us[stack[-1]] += dur
            device_us[stack[-1]] += dev
            attributed += dev

    def visit(i: int) -> float:
        own_rt, own_dev = runtime_us[i], device_us[i]
        children = kids[i]
        while len(children) == 1 and rows[children[0]]["name"] == rows[i]["name"]:
            only = children[0]
            own_rt += runtime_us[only]
            own_dev += device_us[only]
            children = kids[only]
        e = rows[i]
        g = groups[(e["name"], _shape(e))]
        g[0] += 1
        g[1] += e["dur"]
        g[2] += max(e["dur"] - sum(rows[c]["dur"] for c in children) - own_rt, 0.0)
        g[3] += own_dev
        total = own_dev + sum(visit(c) for c in children)
        g[4] += total
        return total

    for r in roots:
        visit(r)
    return attributed


def _close(a: float, b: float, rel: float = 1e-6, abs_us: float = 1e-3) -> bool:
    return abs(a - b) <= max(rel * max(abs(a), abs(b)), abs_us)


@pytest.mark.parametrize("path", [A100, BF16, SAMPLED], ids=["a100", "bf16-h200", "sampled"])
def test_gpu_operators_match_a_stack_walk(path: Path) -> None:
    s = analyze_trace_file(path)
    ref = _reference(path)
    assert s.operators_dropped is not None
    listed_dev = sum(o.device_self_us or 0.0 for o in s.operators)
    dropped_dev = s.operators_dropped.device_self_us or 0.0
    # Every device µs that has a launching operator is some operator's device self time.
    assert listed_dev + dropped_dev == pytest.approx(ref["attributed"], rel=0.01)
    assert ref["attributed"] > 0
    unattributed = s.operators_device_unattributed_us
    assert unattributed is not None
    assert listed_dev + dropped_dev + unattributed == pytest.approx(ref["device_total"], rel=1e-6)
    for o in s.operators:
        calls, host_total, host_self, dev_self, dev_total = ref["groups"][(o.name, o.input_shapes)]
        assert o.calls == calls, o.name
        assert _close(o.host_total_us, host_total), o.name
        assert _close(o.host_self_us, host_self), o.name
        assert o.device_self_us is not None and o.device_total_us is not None
        assert _close(o.device_self_us, dev_self), o.name
        assert _close(o.device_total_us, dev_total), o.name
        assert 0.0 <= o.host_self_us <= o.host_total_us + 1e-6
        assert 0.0 <= o.device_self_us <= o.device_total_us + 1e-6
    assert "operators.device_self_us" not in s.not_applicable


def test_linear_self_time_excludes_its_addmm() -> None:
    s = analyze_trace_file(BF16)
    by_name = {o.name: o for o in s.operators_by_name}
    linear, addmm = by_name["aten::linear"], by_name["aten::addmm"]
    assert linear.host_self_us < linear.host_total_us
    # aten::linear is a wrapper: its addmm (or t + matmul) children hold nearly all its time,
    # and the kernels they launch count as its device total, never as its device self.
    assert linear.host_total_us - linear.host_self_us >= addmm.host_total_us * 0.5
    assert linear.device_self_us == 0.0
    assert linear.device_total_us is not None and addmm.device_self_us is not None
    assert linear.device_total_us >= addmm.device_self_us * 0.5 > 0


def test_cpu_trace_has_no_device_figures_and_separates_shapes() -> None:
    s = analyze_trace_file(CPU_DDP)
    ref = _reference(CPU_DDP)
    assert s.kind == "cpu" and s.operators
    assert all(o.device_self_us is None and o.device_total_us is None for o in s.operators)
    assert all(o.device_self_us is None for o in s.operators_by_name)
    assert s.operators_device_unattributed_us is None
    for key in ("operators.device_self_us", "operators.device_total_us"):
        assert "CPU-only" in s.not_applicable[key]
    assert s.operators_dropped is not None and s.operators_dropped.device_self_us is None
    # aten::mm runs with several shapes (forward and backward GEMMs): one group per shape,
    # summing to the by-name row.
    mm = [o for o in s.operators if o.name == "aten::mm"]
    assert len({o.input_shapes for o in mm}) == len(mm) >= 2
    assert all(o.input_shapes.startswith("[[") for o in mm)
    (mm_name,) = [o for o in s.operators_by_name if o.name == "aten::mm"]
    assert mm_name.input_shape_groups == len(mm)
    assert mm_name.calls == sum(o.calls for o in mm)
    assert mm_name.host_self_us == pytest.approx(sum(o.host_self_us for o in mm))
    for o in s.operators:
        calls, host_total, host_self, _, _ = ref["groups"][(o.name, o.input_shapes)]
        assert (o.calls, _close(o.host_total_us, host_total)) == (calls, True), o.name
        assert _close(o.host_self_us, host_self), o.name
    linear = next(o for o in s.operators_by_name if o.name == "aten::linear")
    assert linear.host_self_us < 0.1 * linear.host_total_us
    # Containers are not operators: steps, DDP forward, optimizer spans, DataLoader.
    names = {o.name for o in s.operators_by_name}
    assert not any(n.startswith(_CONTAINERS) for n in names)


def test_old_schema_operators_and_unsorted_threads() -> None:
    # 2021 schema: cat "Operator", which also holds ProfilerStep#N and record_function spans;
    # its threads are not written in start order, so the full sort runs.
    s = analyze_trace_file(OLD_SCHEMA)
    names = {o.name for o in s.operators_by_name}
    assert "aten::addmm" in names and "aten::cudnn_convolution" in names
    assert not any(n.startswith(_CONTAINERS) for n in names)
    ref = _reference(OLD_SCHEMA)
    assert s.operators_dropped is not None
    listed = sum(o.device_self_us or 0.0 for o in s.operators)
    assert listed + (s.operators_dropped.device_self_us or 0.0) == pytest.approx(
        ref["attributed"], rel=0.01
    )
    for o in s.operators[:50]:
        calls, host_total, host_self, _, _ = ref["groups"][(o.name, o.input_shapes)]
        assert o.calls == calls and _close(o.host_total_us, host_total), o.name
        assert _close(o.host_self_us, host_self), o.name
        assert 0.0 <= o.host_self_us <= o.host_total_us


def test_bounded_tables_keep_shares_honest() -> None:
    rt = load_trace(A100)
    full = ops_mod.operator_tables(rt)
    cut = ops_mod.operator_tables(rt, limit=5, device_limit=3)
    assert cut.dropped.groups > 0
    for table, dropped, whole in (
        (cut.by_shape, cut.dropped, full.by_shape),
        (cut.by_name, cut.dropped_by_name, full.by_name),
    ):
        host = sum(o.host_self_us for o in whole)
        dev = sum(o.device_self_us or 0.0 for o in whole)
        assert sum(o.host_self_us for o in table) + dropped.host_self_us == pytest.approx(host)
        assert sum(o.device_self_us or 0.0 for o in table) + (
            dropped.device_self_us or 0.0
        ) == pytest.approx(dev)
        assert sum(o.calls for o in table) + dropped.calls == sum(o.calls for o in whole)
        assert len(table) + dropped.groups == len(whole)
        # the top 5 by host self, plus every group in the top 3 by device self
        by_host = sorted(whole, key=lambda o: -o.host_self_us)[:5]
        by_dev = sorted(whole, key=lambda o: -(o.device_self_us or 0.0))[:3]
        kept = {msgspec.json.encode(o) for o in table}
        assert all(msgspec.json.encode(o) in kept for o in by_host + by_dev)
        assert 5 <= len(table) <= 8
        assert [o.host_self_us for o in table] == sorted(
            (o.host_self_us for o in table), reverse=True
        )


# The TensorBoard plugin's Operator view of this trace (torch-tb-profiler 0.4.3,
# RunProfileData.from_json(...).op_list_groupby_name_input / _name): (name, input shape, calls,
# host total, host self, device total, device self), µs.
# (the plugin's tb-resnet50_num_workers_0 sample, kept once as the old-schema fixture)
TB_RESNET50 = OLD_SCHEMA
_BN = "[[32, 256, 56, 56], [32, 256, 56, 56], [256], [256], [256], [256], [256], [], [0]]"
_TB_BY_SHAPE = [
    ("aten::cudnn_batch_norm_backward", _BN, 24, 2177, 919, 16151, 16151),
    ("aten::cudnn_convolution_backward_input",
     "[[], [32, 1024, 14, 14], [1024, 256, 1, 1], [], [], [], [], [], [], []]",
     36, 3453, 2304, 15448, 15448),
    ("aten::cudnn_convolution_backward_weight",
     "[[], [32, 64, 56, 56], [32, 64, 56, 56], [], [], [], [], [], [], []]",
     24, 3256, 1904, 14196, 14196),
    ("aten::cudnn_convolution",
     "[[32, 256, 14, 14], [1024, 256, 1, 1], [], [], [], [], [], [], []]",
     36, 5212, 2821, 12778, 12778),
]  # fmt: skip
_TB_BY_NAME = [
    ("aten::empty", 4404, 68147, 68147, 0, 0),
    ("aten::add_", 2994, 78125, 51013, 24098, 24098),
    ("aten::copy_", 588, 52853, 40255, 11492, 11492),
    ("aten::cudnn_convolution", 318, 56998, 33121, 126619, 126619),
]


def test_operators_equal_the_tensorboard_plugin_rows() -> None:
    s = analyze_trace_file(TB_RESNET50)
    by_shape = {(o.name, o.input_shapes): o for o in s.operators}
    for name, shape, *want in _TB_BY_SHAPE:
        o = by_shape[(name, shape)]
        got = [o.calls, o.host_total_us, o.host_self_us, o.device_total_us, o.device_self_us]
        assert got == want, name
    by_name = {o.name: o for o in s.operators_by_name}
    for name, *want in _TB_BY_NAME:
        o = by_name[name]
        got = [o.calls, o.host_total_us, o.host_self_us, o.device_total_us, o.device_self_us]
        assert got == want, name


@pytest.mark.filterwarnings("ignore::Warning")  # the plugin's own pandas deprecations
def test_operators_equal_the_tensorboard_plugin_everywhere() -> None:
    # Every group of the plugin's two tables, all five figures, on the plugin's own sample.
    tb_data = pytest.importorskip("torch_tb_profiler.profiler.data")
    with gzip.open(TB_RESNET50) as fh:
        doc = json.load(fh)
    prof = tb_data.RunProfileData.from_json("worker0", None, doc)
    tables = ops_mod.operator_tables(load_trace(TB_RESNET50), limit=10**6, device_limit=0)
    assert tables.dropped.groups == 0
    for mine, theirs, key in (
        (tables.by_shape, prof.op_list_groupby_name_input, lambda a: (a.name, str(a.input_shape))),
        (tables.by_name, prof.op_list_groupby_name, lambda a: (a.name, "")),
    ):
        tb = {
            key(a): (a.calls, a.host_duration, a.self_host_duration, a.device_duration,
                     a.self_device_duration)
            for a in theirs
        }  # fmt: skip
        got = {
            (o.name, getattr(o, "input_shapes", "")): (
                o.calls, o.host_total_us, o.host_self_us, o.device_total_us, o.device_self_us
            )
            for o in mine
        }  # fmt: skip
        assert len(tb) > 70
        assert got == tb


def _stack_parents(start: list[float], end: list[float]) -> list[int]:
    out, stack = [], []
    for i in range(len(start)):
        while stack and end[stack[-1]] < end[i]:
            stack.pop()
        out.append(stack[-1] if stack else -1)
        stack.append(i)
    return out


def _nest(
    rows: list[tuple[int, float, float]],
    rng: np.random.Generator,
    thread: int,
    lo: float,
    hi: float,
    depth: int,
) -> None:
    """Random properly nested intervals inside [lo, hi], some zero long, some touching."""
    t = lo
    while t < hi and len(rows) < 400:
        a = t + rng.integers(0, 3)
        b = min(hi, a + rng.integers(0, 40))
        if a > b:
            break
        rows.append((thread, float(a), float(b)))
        if depth < 6 and b - a > 2:
            _nest(rows, rng, thread, a, b, depth + 1)
        t = b + rng.integers(0, 3)


def test_pointer_jumping_parents_equal_a_stack_on_random_nests() -> None:
    rng = np.random.default_rng(7)
    for _ in range(30):
        # random properly nested intervals on two threads, some of them zero long
        rows: list[tuple[int, float, float]] = []
        for thread in range(2):
            _nest(rows, rng, thread, 0.0, 500.0, 0)
        th = np.asarray([r[0] for r in rows], dtype=np.int32)
        s = np.asarray([r[1] for r in rows])
        e = np.asarray([r[2] for r in rows])
        order = np.lexsort((-e, s, th))
        hops = HostOps(
            start=s[order],
            end=e[order],
            thread=th[order],
            name=np.zeros(len(rows), dtype=np.int32),
            shape=np.zeros(len(rows), dtype=np.int32),
            names=["op"],
            shapes=[b""],
            threads=["0", "1"],
        )
        got = ops_mod._parents(hops).tolist()
        want: list[int] = []
        for t in (0, 1):
            idx = np.flatnonzero(hops.thread == t)
            par = _stack_parents(hops.start[idx].tolist(), hops.end[idx].tolist())
            want += [int(idx[p]) if p >= 0 else -1 for p in par]
        assert got == want


def test_kernel_entries_carry_the_kernels_view_keys() -> None:
    s = analyze_trace_file(BF16, top=3)
    assert len(s.top_kernels) == 3
    assert s.kernels[:3] == s.top_kernels
    assert len(s.kernels) <= KERNELS_LIMIT
    assert s.kernels_dropped is not None and s.kernels_dropped.names == 0
    assert any(k.tensor_core for k in s.kernels)
    for k in s.kernels:
        d = msgspec.to_builtins(k)
        assert {"name", "calls", "count", "total_us", "mean_us", "min_us", "max_us"} <= set(d)
        assert {"tensor_core", "pct_of_compute", "kind"} <= set(d)
        assert k.calls == k.count > 0
        assert k.tensor_core == (k.kind == "tensor_core")
        assert k.min_us is not None and k.max_us is not None and k.mean_us is not None
        assert k.min_us <= k.mean_us <= k.max_us
        assert k.mean_us == pytest.approx(k.total_us / k.calls)
    assert sum(k.pct_of_compute for k in s.kernels) == pytest.approx(100.0)


def test_kernels_list_is_bounded_with_its_remainder() -> None:
    s = analyze_trace_file(A100, top=2)
    rt = load_trace(A100)
    from mgprof.analyze.trace.kernels import kernel_table

    few, _, dropped = kernel_table(rt, 5)
    assert len(few) == 5 and dropped.names == len(s.kernels) - 5
    assert sum(k.total_us for k in few) + dropped.total_us == pytest.approx(
        sum(k.total_us for k in s.kernels)
    )
    assert dropped.calls == sum(k.calls for k in s.kernels[5:])


@pytest.mark.parametrize("path", [A100, CPU_DDP, GLOO_CUDA], ids=["gpu", "cpu", "gloo-cuda"])
def test_steps_carry_start_relative_to_trace_start(path: Path) -> None:
    s = analyze_trace_file(path)
    first_ts = min(e["ts"] for e in _events(path) if e.get("cat") not in ("Trace", "trace"))
    assert s.steps
    for st in s.steps:
        assert st.start_us is not None and st.cpu_start_us is not None
        assert st.start_us == pytest.approx(st.cpu_start_us - first_ts, abs=1e-3)
        assert st.start_us >= 0 and st.cpu_duration_us > 0
    starts = [st.start_us for st in s.steps]
    assert starts == sorted(starts)
    assert "steps.start_us" in s.definitions


def test_json_shape_and_definitions() -> None:
    for path in (BF16, CPU_DDP):
        s = analyze_trace_file(path)
        d = _rank_json(s)
        op = d["operators"][0]
        assert list(op) == [
            "name",
            "input_shapes",
            "calls",
            "host_total_us",
            "host_self_us",
            "device_total_us",
            "device_self_us",
        ]
        assert set(d["operators_by_name"][0]) == {
            "name",
            "calls",
            "host_total_us",
            "host_self_us",
            "device_total_us",
            "device_self_us",
            "input_shape_groups",
        }
        assert set(d["operators_dropped"]) == {"groups", "calls", "host_self_us", "device_self_us"}
        assert "start_us" in d["steps"][0]
        for key in (
            "operators",
            "operators.host_self_us",
            "operators.host_total_us",
            "operators.device_self_us",
            "operators.device_total_us",
            "operators.input_shapes",
            "operators_by_name",
            "operators_dropped",
            "kernels",
            "top_kernels.tensor_core",
            "steps.start_us",
        ):
            assert key in s.definitions, key
        json.dumps(d)  # plain JSON, no NaN-only types
