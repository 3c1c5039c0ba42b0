"""FSDP2 communication by unit and phase (``mgprof.analyze.trace.fsdp``): the recorded FSDP2 run
(fully_shard per block and on the root, 2 gloo ranks) against a recount from the raw JSON, sums
against the rank's own communication figures, a GPU-shaped and a CPU-shaped synthetic trace, the
span-name rules, and both renderings."""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from _data import TRACES, need
from _trace_events import ev
from rich.console import Console

from mgprof.analyze.run.schema import decode_analysis
from mgprof.analyze.trace.fsdp import (
    BACKWARD_AG,
    FORWARD_AG,
    OTHER,
    POST_BACKWARD_RS,
    ROOT,
    attribute,
    phase_of,
    span_stage,
    span_unit,
)
from mgprof.analyze.trace.fsdp_events import HostSpan, read_fsdp_events
from mgprof.analyze.trace.job import analyze_job
from mgprof.analyze.trace.summary import RankTraceSummary, analyze_trace_file
from mgprof.report.run.figures import communication_section
from mgprof.report.trace_terminal import render_job

FSDP = TRACES / "cpu-gloo-fsdp2-2ranks"
DDP = TRACES / "cpu-gloo-ddp-mlp-2ranks"
LAYERS = [f"layers.{i}" for i in range(4)]


@pytest.fixture(scope="module")
def ranks() -> list[RankTraceSummary]:
    return [analyze_trace_file(need(FSDP / f"rank{r}.pt.trace.json.gz")) for r in (0, 1)]


def _recount(path: Path) -> dict[tuple[str, str], int]:
    """(unit, phase) -> c10d collectives, from the JSON with plain loops: the FSDP spans on the
    op's thread that contain its start; unit from the innermost, pass from the innermost that
    names one (FSDP2's own record_function labels)."""
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    spans = [e for e in events if e.get("ph") == "X" and e["name"].startswith("FSDP::")]
    counts: dict[tuple[str, str], int] = {}
    for op in events:
        if op.get("ph") != "X" or not op["name"].startswith("c10d::"):
            continue
        around = sorted(
            (
                s
                for s in spans
                if s["tid"] == op["tid"] and s["ts"] <= op["ts"] <= s["ts"] + s["dur"]
            ),
            key=lambda s: s["ts"],
        )
        inner = around[-1]["name"]
        unit = inner.split("(", 1)[1].rstrip(")") if "(" in inner else ROOT
        passes = [s["name"].split("::")[1].split(" ")[0] for s in around]
        stage = next(
            p
            for p in reversed(passes)
            if p in ("pre_forward", "pre_backward", "backward_prefetch", "post_backward_reduce")
        )
        kind = "all_gather" if "allgather" in op["name"] else "reduce_scatter"
        phase = {
            ("pre_forward", "all_gather"): FORWARD_AG,
            ("pre_backward", "all_gather"): BACKWARD_AG,
            ("backward_prefetch", "all_gather"): BACKWARD_AG,
            ("post_backward_reduce", "reduce_scatter"): POST_BACKWARD_RS,
        }[(stage, kind)]
        counts[(unit, phase)] = counts.get((unit, phase), 0) + 1
    return counts


# ------------------------------------------------------------------ the recorded FSDP2 run


def test_units_are_the_blocks_and_the_root(ranks: list[RankTraceSummary]) -> None:
    for r in ranks:
        assert r.fsdp is not None
        assert r.fsdp.units == [ROOT, *LAYERS]


def test_phases_per_unit(ranks: list[RankTraceSummary]) -> None:
    """Each block: forward all-gather, backward all-gather (its prefetch), reduce-scatter, once
    per traced step; the root keeps its parameters after forward (FSDP2 does not reshard the
    root), so it has no backward all-gather."""
    for r in ranks:
        assert r.fsdp is not None
        got = {(row.unit, row.phase): row.count for row in r.fsdp.rows}
        want = {(ROOT, FORWARD_AG): 3, (ROOT, POST_BACKWARD_RS): 3}
        for layer in LAYERS:
            want.update({(layer, FORWARD_AG): 3, (layer, BACKWARD_AG): 3})
            want[(layer, POST_BACKWARD_RS)] = 3
        assert got == want
        assert got == _recount(FSDP / f"rank{r.rank}.pt.trace.json.gz")
        for row in r.fsdp.rows:
            assert row.type == ("all_gather" if "all_gather" in row.phase else "reduce_scatter")
            assert (row.group, row.group_size) == ("0", 2)


def test_rows_sum_to_the_rank_communication(ranks: list[RankTraceSummary]) -> None:
    """Every collective of the run is FSDP's: the rows add up to the rank's comm and exposed
    comm (the trace-window totals), and their counts to the per-type collectives (gloo runs
    the reduce-scatters as all_reduce)."""
    for r in ranks:
        f = r.fsdp
        assert f is not None and f.comm_us is not None and f.exposed_us is not None
        assert f.outside_calls == 0 and f.outside_comm_us == 0.0
        assert r.totals.comm_us is not None and r.totals.exposed_comm_us is not None
        rows_comm = sum(row.comm_us or 0.0 for row in f.rows)
        rows_exposed = sum(row.exposed_us or 0.0 for row in f.rows)
        assert rows_comm == pytest.approx(f.comm_us, abs=1e-6)
        assert rows_exposed == pytest.approx(f.exposed_us, abs=1e-6)
        assert f.comm_us == pytest.approx(r.totals.comm_us, abs=0.01)
        assert f.exposed_us == pytest.approx(r.totals.exposed_comm_us, abs=0.01)
        by_type = {c.type: c.count for c in r.collectives}
        assert sum(row.count for row in f.rows if row.type == "all_gather") == by_type["all_gather"]
        rs = sum(row.count for row in f.rows if row.type == "reduce_scatter")
        assert rs == by_type["all_reduce"] == 15


def test_exposed_never_exceeds_comm(ranks: list[RankTraceSummary]) -> None:
    for r in ranks:
        assert r.fsdp is not None
        for row in r.fsdp.rows:
            assert row.comm_us is not None and row.exposed_us is not None
            assert 0.0 <= row.exposed_us <= row.comm_us + 1e-6
            assert row.comm_us > 0


def test_bytes_and_bus_bandwidth(ranks: list[RankTraceSummary]) -> None:
    """Bytes are nccl-tests' buffer from the c10d op's Input Dims: a block's gathered output
    (2 × a 65984-float shard) and its full gradient input to the reduce-scatter; the root's
    4482 floats. busbw = bytes / time × (n−1)/n with n = 2."""
    f = ranks[0].fsdp
    assert f is not None
    for row in f.rows:
        per_call = (4482 if row.unit == ROOT else 131968) * 4
        assert row.bytes == 3 * per_call
        assert row.busbw_gbps is not None and row.busbw_gbps > 0
        assert row.not_applicable is None
    assert [g.ranks for g in f.groups] == [[0, 1]]
    assert f.groups[0].description == "default_pg"


def test_first_all_gather_is_the_root_forward(ranks: list[RankTraceSummary]) -> None:
    """Each step opens with the root's all-gather (the embedding and head it needs first)."""
    for r in ranks:
        f = r.fsdp
        assert f is not None and f.first_all_gather is not None
        first = f.first_all_gather
        assert (first.unit, first.calls) == (ROOT, 3)
        root = next(row for row in f.rows if (row.unit, row.phase) == (ROOT, FORWARD_AG))
        assert first.comm_us == pytest.approx(root.comm_us)
        assert first.exposed_us is not None and first.comm_us is not None
        assert first.exposed_us <= first.comm_us + 1e-6


def test_a_trace_that_is_not_fsdp_has_no_section() -> None:
    for path in sorted(DDP.glob("*.json.gz")):
        s = analyze_trace_file(path)
        assert s.fsdp is None
        assert "fsdp" not in s.not_applicable and "fsdp" not in s.definitions
    out = _render(analyze_job(sorted(DDP.glob("*.json.gz")), cache=False, workers=1))
    assert "FSDP" not in out


def _render(job: Any, width: int = 80) -> str:
    buf = io.StringIO()
    render_job(job, Console(file=buf, width=width, color_system=None, legacy_windows=False))
    return buf.getvalue()


def test_terminal_table_fits_80_columns() -> None:
    job = analyze_job(sorted(FSDP.glob("*.json.gz")), cache=False, workers=1)
    out = _render(job)
    assert "FSDP communication by unit and phase, rank 0" in out
    assert max(len(line) for line in out.splitlines()) <= 80
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("unit ") and "phase" in line)
    assert "count" in lines[head] and "exposed" in lines[head - 1] + lines[head]
    table = lines[head + 2 : head + 16]
    assert [line.split()[0] for line in table] == [ROOT] * 2 + [x for x in LAYERS for _ in "abc"]
    assert "layers.0   fwd all-gather" in out
    assert "First all-gather ((root), forward): nothing to overlap with" in out
    assert "rank 1: FSDP collectives" in out


def test_json_carries_the_rows() -> None:
    from mgprof.report.trace_terminal import job_to_json

    job = analyze_job([need(FSDP / "rank0.pt.trace.json.gz")], cache=False, workers=1)
    data = job_to_json(job)
    fsdp = data["ranks"][0]["fsdp"]
    assert fsdp["units"] == [ROOT, *LAYERS] and len(fsdp["rows"]) == 14
    assert json.loads(json.dumps(data))["ranks"][0]["fsdp"] == fsdp


def test_run_report_communication_section_has_the_table(ranks: list[RankTraceSummary]) -> None:
    """Through the run analysis schema (run.json's traces) into the Communication section."""
    stored = {}
    for r in ranks:
        plain = msgspec.to_builtins(r)
        plain.pop("collective_calls", None)
        stored[str(r.rank)] = [plain]
    analysis = decode_analysis({"traces": {"ranks": stored}})
    assert analysis.warnings == []
    sec = communication_section(analysis)
    table = sec.tables[-1]
    assert table.columns == ["unit", "phase", "count", "comm ms", "exposed ms", "bus GB/s"]
    assert table.rows[0][:3] == [ROOT, "fwd all-gather", "3"]
    assert len(table.rows) == 14
    assert any("nothing to overlap with" in note for note in sec.notes)
    plain_ddp = msgspec.to_builtins(analyze_trace_file(sorted(DDP.glob("*.json.gz"))[0]))
    plain_ddp.pop("collective_calls", None)
    none = communication_section(decode_analysis({"traces": {"ranks": {"0": [plain_ddp]}}}))
    assert all(t.columns[0] != "unit" for t in none.tables)


# ------------------------------------------------------------------ span names and phases


def test_span_names() -> None:
    assert span_unit("FSDP::pre_forward (layers.0)") == "layers.0"
    assert span_unit("FSDP::pre_forward") == ROOT
    assert span_unit("FSDP::post_backward_rs_wait ()") == ROOT
    assert span_unit("FSDP::backward_prefetch for layers.2") == "layers.2"
    assert span_unit("FSDP::all_gather (model.layers.10.mlp) [pg=4]") == "model.layers.10.mlp"
    assert span_unit("FSDP::all_gather [pg=4]") == ROOT
    assert span_unit("aten::mm") is None
    assert span_stage("FSDP::pre_forward (layers.0)") == "forward"
    assert span_stage("FSDP::root_pre_forward") == "forward"
    assert span_stage("FSDP::forward_prefetch for layers.1") == "forward"
    assert span_stage("FSDP::pre_backward") == "backward"
    assert span_stage("FSDP::backward_prefetch for layers.2") == "backward"
    assert span_stage("FSDP::post_backward_reduce (layers.0)") == "post_backward"
    assert span_stage("FSDP::root_post_backward_callback") == "post_backward"
    assert span_stage("FSDP::all_gather (layers.0)") is None
    assert phase_of("forward", "all_gather") == FORWARD_AG
    assert phase_of("backward", "all_gather") == BACKWARD_AG
    assert phase_of("post_backward", "reduce_scatter") == POST_BACKWARD_RS
    assert phase_of("post_backward", "all_reduce") == OTHER  # HSDP's replica all-reduce
    assert phase_of(None, "all_gather") == OTHER  # an explicit unshard() outside the passes


def _span(name: str, start: float, end: float, tid: str = "1") -> HostSpan:
    return HostSpan(name, tid, start, end)


def test_attribute_nested_spans() -> None:
    """Unit from the innermost span, pass from the innermost span that names one: the root's
    pre_backward prefetching layers.3 is layers.3's backward all-gather."""
    spans = [
        _span("FSDP::pre_forward", 0, 10),
        _span("FSDP::all_gather", 1, 5),
        _span("FSDP::pre_forward (layers.0)", 20, 30),
        _span("FSDP::all_gather (layers.0)", 21, 25),
        _span("FSDP::pre_backward", 40, 60),
        _span("FSDP::backward_prefetch for layers.3", 41, 50),
        _span("FSDP::all_gather (layers.3)", 42, 49),
        _span("FSDP::root_post_backward_callback", 70, 90),
        _span("FSDP::post_backward_reduce", 75, 85),
        _span("FSDP::backward_prefetch for layers.1", 100, 110),
    ]
    places = [
        ("1", 2.0, "all_gather"),
        ("1", 22.0, "all_gather"),
        ("1", 45.0, "all_gather"),
        ("1", 80.0, "reduce_scatter"),
        ("1", 105.0, "all_gather"),  # no all_gather span inside: the prefetch names the unit
        ("1", 15.0, "all_reduce"),  # between spans
        ("2", 2.0, "all_gather"),  # another thread
        (None, 2.0, "all_gather"),  # not placed
        ("1", 80.0, "all_reduce"),
    ]
    assert attribute(places, spans) == [
        (ROOT, FORWARD_AG),
        ("layers.0", FORWARD_AG),
        ("layers.3", BACKWARD_AG),
        (ROOT, POST_BACKWARD_RS),
        ("layers.1", BACKWARD_AG),
        None,
        None,
        None,
        (ROOT, OTHER),
    ]


def test_attribute_span_edges_and_shuffled_input() -> None:
    spans = [
        _span("FSDP::all_gather (b)", 12, 14),
        _span("FSDP::pre_forward (b)", 10, 20),
        _span("FSDP::pre_forward (a)", 0, 10),
    ]
    got = attribute([("1", 10.0, "all_gather"), ("1", 12.0, "all_gather")], spans)
    assert got == [("b", FORWARD_AG), ("b", FORWARD_AG)]  # the later span at a shared edge


# ------------------------------------------------------------------ synthetic traces


def _launch(ts: float, corr: int) -> dict:
    return ev("cudaLaunchKernel", "cuda_runtime", ts, 1, tid=1, correlation=corr)


def _nccl(name: str, ts: float, dur: float, corr: int, pg: str, **args: Any) -> dict:
    return ev(
        name,
        "kernel",
        ts,
        dur,
        tid=7,
        correlation=corr,
        **{"Process Group Name": pg, "Process Group Ranks": args.pop("ranks"), **args},
    )


def _gpu_hsdp_trace() -> dict:
    """One HSDP step on a GPU: layers.0's all-gather in its shard group "1" (2 ranks), its
    reduce-scatter there, then its all-reduce across replicas in group "2"; a GEMM kernel
    covers part of the reduce-scatter."""
    host = [
        ev("ProfilerStep#1", "user_annotation", 0, 1000, tid=1),
        ev("fsdp::all_gather_copy_in", "cpu_op", 5, 2, tid=1),
        ev("FSDP::pre_forward (layers.0)", "user_annotation", 10, 100, tid=1),
        ev("FSDP::all_gather (layers.0)", "user_annotation", 11, 50, tid=1),
        _launch(20, 1),
        ev("aten::mm", "cpu_op", 150, 20, tid=1),
        _launch(160, 2),
        ev("FSDP::post_backward_reduce (layers.0)", "user_annotation", 300, 200, tid=1),
        _launch(310, 3),
        _launch(320, 4),
        ev("c10d::allreduce_", "cpu_op", 600, 5, tid=1),
        _launch(602, 5),
    ]
    ag = {"ranks": [0, 1], "Group size": 2, "Collective name": "_allgather_base"}
    rs = {"ranks": [0, 1], "Group size": 2, "Collective name": "reduce_scatter_tensor"}
    ar = {"ranks": [0, 2], "Group size": 2, "Collective name": "allreduce"}
    typed = {"dtype": "Float", "In msg nelems": 1000, "Out msg nelems": 2000}
    device = [
        _nccl("ncclDevKernel_AllGather_RING_LL", 30, 40, 1, "1", **ag, **typed),
        ev("volta_sgemm_128x64_nn", "kernel", 170, 200, tid=7, correlation=2),
        _nccl("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", 330, 100, 3, "1", **rs, **typed),
        _nccl("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 440, 60, 4, "2", **ar, **typed),
        _nccl("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 610, 10, 5, "0", **ar, **typed),
    ]
    return {
        "traceEvents": host + device,
        "distributedInfo": {
            "rank": 0,
            "world_size": 4,
            "pg_config": [
                {"pg_name": "1", "pg_desc": "shard", "pg_size": 2, "ranks": [0, 1]},
                {"pg_name": "2", "pg_desc": "replicate", "pg_size": 2, "ranks": [0, 2]},
            ],
        },
        "deviceProperties": [{"id": 0, "name": "GPU"}],
    }


def test_gpu_kernels_at_their_launch_per_group(tmp_path: Path) -> None:
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps(_gpu_hsdp_trace()))
    s = analyze_trace_file(path)
    f = s.fsdp
    assert f is not None
    got = {(r.unit, r.phase, r.type, r.group): r for r in f.rows}
    assert set(got) == {
        ("layers.0", FORWARD_AG, "all_gather", "1"),
        ("layers.0", POST_BACKWARD_RS, "reduce_scatter", "1"),
        ("layers.0", OTHER, "all_reduce", "2"),
    }
    ag = got[("layers.0", FORWARD_AG, "all_gather", "1")]
    assert (ag.count, ag.comm_us, ag.exposed_us) == (1, 40.0, 40.0)
    assert ag.bytes == 8000  # max(in, out) × 4 B
    assert ag.busbw_gbps == pytest.approx(8000 / 40e-6 / 1e9 * 0.5)
    rs = got[("layers.0", POST_BACKWARD_RS, "reduce_scatter", "1")]
    assert (rs.comm_us, rs.exposed_us) == (100.0, 60.0)  # the GEMM runs until 370
    # the launch outside every FSDP span is the script's own all-reduce
    assert (f.outside_calls, f.outside_comm_us, f.outside_exposed_us) == (1, 10.0, 10.0)
    assert f.comm_us is not None and f.outside_comm_us is not None
    assert f.comm_us + f.outside_comm_us == pytest.approx(s.totals.comm_us)
    assert [(g.name, g.description, g.ranks) for g in f.groups] == [
        ("1", "shard", [0, 1]),
        ("2", "replicate", [0, 2]),
    ]
    assert f.first_all_gather is not None and f.first_all_gather.unit == "layers.0"
    out = _render(analyze_job([path], cache=False, workers=1))
    assert "group" in out and "1 (n=2)" in out and "other all_reduce" in out
    assert "Group 2 replicate: ranks 0, 2." in out
    assert max(len(line) for line in out.splitlines()) <= 80


def _cpu_trace(with_late_gloo: bool) -> dict:
    """Two gloo workers: an all-gather and a reduce-scatter (run as gloo:all_reduce) queued in
    FSDP spans, the script's own all-reduce after them, and the gloo events in a different
    order than their ops were queued across types."""
    dims = {"Input Dims": [[8], [4]], "Input type": ["float", "float"]}
    rs_dims = {"Input Dims": [[4], [8]], "Input type": ["float", "float"]}
    events = [
        ev("ProfilerStep#1", "user_annotation", 0, 1000, tid=1),
        ev("fsdp::all_gather_copy_in", "cpu_op", 1, 1, tid=1),
        ev("FSDP::pre_forward (layers.0)", "user_annotation", 10, 20, tid=1),
        ev("FSDP::all_gather (layers.0)", "user_annotation", 11, 10, tid=1),
        ev("c10d::_allgather_base_", "cpu_op", 12, 2, tid=1, **dims),
        ev("FSDP::post_backward_reduce (layers.0)", "user_annotation", 100, 20, tid=1),
        ev("c10d::_reduce_scatter_base_", "cpu_op", 101, 2, tid=1, **rs_dims),
        ev("c10d::allreduce_", "cpu_op", 200, 2, tid=1, **{"Input Dims": [[[2]]]}),
        ev("aten::add", "cpu_op", 105, 30, tid=1),
        ev("gloo:all_gather", "user_annotation", 13, 50, tid=2, **{"Input Dims": [[4]]}),
        ev("gloo:all_reduce", "user_annotation", 102, 40, tid=3, **{"Input Dims": [[8]]}),
        ev("gloo:all_reduce", "user_annotation", 201, 5, tid=2, **{"Input Dims": [[2]]}),
    ]
    if with_late_gloo:  # issued before the trace began: its c10d op is not in it
        events.append(
            ev("gloo:all_reduce", "user_annotation", 0.5, 3, tid=3, **{"Input Dims": [[8]]})
        )
    for e in events:
        if e["name"].startswith("gloo:"):
            e["args"]["Input type"] = ["float"]
    world = {"pg_name": "0", "pg_desc": "default_pg", "pg_size": 2, "ranks": [0, 1]}
    return {
        "traceEvents": events,
        "distributedInfo": {"rank": 0, "world_size": 2, "pg_config": [world]},
    }


@pytest.mark.parametrize("late", [False, True])
def test_gloo_events_at_the_op_that_queued_them(tmp_path: Path, late: bool) -> None:
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps(_cpu_trace(late)))
    s = analyze_trace_file(path)
    f = s.fsdp
    assert f is not None
    got = {(r.unit, r.phase, r.type): (r.count, r.comm_us, r.exposed_us, r.bytes) for r in f.rows}
    assert got == {
        ("layers.0", FORWARD_AG, "all_gather"): (1, 50.0, 50.0, 32),
        # the reduce-scatter (102..142) shares 105..135 with aten::add on the main thread
        ("layers.0", POST_BACKWARD_RS, "reduce_scatter"): (1, 40.0, 10.0, 32),
    }
    assert f.outside_calls == (2 if late else 1)
    assert f.comm_us is not None and f.outside_comm_us is not None
    assert f.comm_us + f.outside_comm_us == pytest.approx(s.totals.comm_us)
    # gloo events name no group: the job's only one (pg_config) is theirs
    assert [(g.name, g.size) for g in f.groups] == [("0", 2)]
    assert {(r.group, r.group_size) for r in f.rows} == {("0", 2)}
    assert all(r.busbw_gbps is not None for r in f.rows)


def test_read_fsdp_events_from_parsed_events() -> None:
    events = _gpu_hsdp_trace()
    events["traceEvents"][0]["args"] = {"Process Group Name": "9", "Process Group Ranks": "[3, 4]"}
    events["traceEvents"].append({"ph": "X", "name": "FSDP::pre_forward", "ts": "bad"})
    got = read_fsdp_events(events)
    assert [s.name for s in got.spans][:2] == [
        "FSDP::pre_forward (layers.0)",
        "FSDP::all_gather (layers.0)",
    ]
    assert got.groups["9"].ranks == [3, 4]
    assert got.groups["1"].ranks == [0, 1] and got.groups["1"].description == "shard"
    ops = read_fsdp_events(_cpu_trace(False)["traceEvents"]).ops
    assert [(o.name, o.sizes) for o in ops] == [
        ("c10d::_allgather_base_", (32, 16)),
        ("c10d::_reduce_scatter_base_", (16, 32)),
        ("c10d::allreduce_", ()),
    ]
