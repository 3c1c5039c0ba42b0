"""Allocation curves, peaks and live sites from torch.profiler's memory events.

Real traces are recorded in-process with ``profile_memory=True`` on CPU; a 2-rank ``--memory``
run of ``tests/scripts/memory_hog.py`` (rank 1 holds an extra 64 MiB in region ``hog``) checks
the per-rank figures; hand-made events cover what a CPU run cannot produce (frees of blocks
allocated before the window, long curves).
"""

from __future__ import annotations

import gzip
import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from _data import TRACES

from mgprof.analyze.memory.events import DEFINITIONS, memory_timeline
from mgprof.errors import TraceError
from tests._spawn import python_args, run

MIB = 1 << 20
ROOT = Path(__file__).resolve().parents[1]
OLD_SCHEMA = TRACES / "gpu-resnet50-v100-old-schema" / "worker0.1623143089861.pt.trace.json.gz"


def _record(path: Path, *, memory: bool = True) -> Path:
    """Two traced steps (ProfilerStep#1, #2); step 2 keeps a 64 MiB block from region
    ``big_alloc`` alive until after its backward pass; every step allocates a little in
    ``small``."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    torch.manual_seed(0)
    model = torch.nn.Linear(32, 32)
    with profile(
        activities=[ProfilerActivity.CPU],
        profile_memory=memory,
        schedule=schedule(wait=0, warmup=1, active=2, repeat=1),
        on_trace_ready=lambda p: p.export_chrome_trace(str(path)),
    ) as prof:
        for step in range(3):
            held = None
            if step == 2:
                with record_function("big_alloc"):
                    held = torch.ones(16 * MIB)  # 64 MiB of float32
            with record_function("small"):
                little = torch.ones(64)
            model(torch.randn(16, 32)).sum().backward()
            del held, little
            prof.step()
    return path


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    result = memory_timeline(_record(tmp_path_factory.mktemp("mem") / "t.json"))
    assert result is not None
    return result


def _mem(ts: float, addr: int | None, nbytes: int, total: int | None, tid: int = 1) -> dict:
    args: dict[str, Any] = {"Bytes": nbytes, "Device Type": 1, "Device Id": 0}
    if addr is not None:
        args["Addr"] = addr
    if total is not None:
        args |= {"Total Allocated": total, "Total Reserved": 2 * max(total, 1)}
    return {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 7, "tid": tid,
            "ts": ts, "args": args}  # fmt: skip


def _span(name: str, ts: float, dur: float, cat: str = "cpu_op", tid: int = 1) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 7, "tid": tid, "ts": ts, "dur": dur}


# --- a real CPU trace -----------------------------------------------------------------------


def test_the_held_block_is_the_top_live_site_at_the_peak(recorded: dict[str, Any]) -> None:
    cpu = recorded["devices"]["cpu"]
    live = cpu["live_at_peak"]
    top = live["sites"][0]
    assert top["region"] == "big_alloc"
    assert top["op"].startswith("aten::")
    assert top["count"] == 1
    assert top["mib"] == pytest.approx(64.0, abs=1e-3) and top["largest_mib"] == top["mib"]
    assert any(s["region"] is None for s in live["sites"])  # the forward/backward tensors
    assert cpu["peak_step"] == 2  # the only step that held the block
    assert cpu["peak_allocated_mib"] == pytest.approx(64.0, abs=1.0)
    # CPU totals count only what the profiler saw allocated: the replay accounts for all of it
    assert cpu["replayed_peak_mib"] == pytest.approx(cpu["peak_allocated_mib"])
    assert live["mib"] == pytest.approx(cpu["peak_allocated_mib"])
    assert live["unattributed_mib"] == pytest.approx(0.0, abs=1e-5)


def test_the_curve_peak_is_the_reported_peak(recorded: dict[str, Any]) -> None:
    cpu = recorded["devices"]["cpu"]
    curve = cpu["curve"]
    assert curve["basis"] == "total_allocated" and not curve["downsampled"]
    assert len(curve["time_ms"]) == len(curve["allocated_mib"]) == cpu["events"]
    assert curve["time_ms"] == sorted(curve["time_ms"]) and curve["time_ms"][0] >= 0
    at = curve["allocated_mib"].index(max(curve["allocated_mib"]))
    assert curve["allocated_mib"][at] == cpu["peak_allocated_mib"]
    assert curve["time_ms"][at] == cpu["peak_time_ms"]
    step2 = next(s for s in recorded["steps"] if s["step"] == 2)
    assert step2["start_ms"] <= cpu["peak_time_ms"] <= step2["end_ms"]
    assert [s["step"] for s in recorded["steps"]] == [1, 2]
    assert cpu["peak_reserved_mib"] is None and "peak_reserved_mib" in cpu["not_applicable"]
    growth = cpu["growth"]
    assert growth["first_allocated_mib"] == curve["allocated_mib"][0]
    assert growth["growth_mib"] == pytest.approx(
        growth["last_allocated_mib"] - growth["first_allocated_mib"], abs=1e-5
    )


def test_the_output_is_plain_json_with_definitions(recorded: dict[str, Any]) -> None:
    text = json.dumps(recorded, allow_nan=False)
    assert json.loads(text) == recorded
    assert recorded["definitions"] == DEFINITIONS
    for key in ("curve", "peak_allocated_mib", "peak_step", "replay", "live_at_peak", "growth"):
        assert DEFINITIONS[key]
    assert recorded["not_applicable"] == {}


def test_a_trace_without_memory_events_gives_none(tmp_path: Path) -> None:
    path = _record(tmp_path / "plain.json", memory=False)
    assert memory_timeline(path) is None
    assert memory_timeline([_span("aten::mm", 0, 5)]) is None


def test_gzip_files_parsed_dicts_and_event_lists_agree(
    recorded: dict[str, Any], tmp_path: Path
) -> None:
    path = _record(tmp_path / "t.json")
    doc = json.loads(path.read_text())
    gz = tmp_path / "t.json.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    a, b, c = memory_timeline(gz), memory_timeline(doc), memory_timeline(doc["traceEvents"])
    assert a is not None and a == b == c
    assert a["devices"]["cpu"]["live_at_peak"]["sites"][0]["region"] == "big_alloc"


# --- hand-made events -----------------------------------------------------------------------


def test_frees_of_blocks_allocated_before_the_window_are_counted_and_ignored() -> None:
    events = [
        _span("ProfilerStep#4", 0, 100, cat="user_annotation"),
        _span("fwd", 5, 50, cat="user_annotation"),
        _span("aten::empty", 10, 2),
        _mem(10, addr=0xA, nbytes=3 * MIB, total=13 * MIB),  # 10 MiB allocated before
        _mem(20, addr=0xB, nbytes=-4 * MIB, total=9 * MIB),  # freed: allocated before
        _mem(30, addr=0xC, nbytes=-1 * MIB, total=8 * MIB),
        _span("aten::mm", 39, 2),
        _mem(40, addr=0xD, nbytes=2 * MIB, total=10 * MIB),
        _mem(60, addr=0xA, nbytes=-3 * MIB, total=7 * MIB),
        {"ph": "i", "name": "[memory]", "ts": 61, "args": {"Bytes": "many"}},  # malformed
    ]
    out = memory_timeline(events)
    assert out is not None and out["skipped_events"] == 1
    gpu = out["devices"]["cuda:0"]
    assert gpu["unknown_frees"] == {"count": 2, "mib": 5.0}
    assert gpu["peak_allocated_mib"] == 13.0 and gpu["peak_time_ms"] == 0.01
    assert gpu["peak_region"] == "fwd" and gpu["peak_op"] == "aten::empty"
    assert gpu["peak_step"] == 4 and gpu["peak_reserved_mib"] == 26.0
    live = gpu["live_at_peak"]
    assert live["mib"] == 3.0 and live["unattributed_mib"] == 10.0
    assert live["sites"] == [
        {"region": "fwd", "op": "aten::empty", "mib": 3.0, "count": 1, "largest_mib": 3.0}
    ]
    assert gpu["replayed_peak_mib"] == 5.0  # 3 + 2 MiB live at t=40; the frees at 20, 30 ignored
    assert gpu["growth"]["growth_mib"] == -6.0


def test_sites_are_innermost_spans_on_the_allocating_thread() -> None:
    events = [
        _span("outer", 0, 100, cat="user_annotation"),
        _span("inner", 10, 20, cat="user_annotation"),
        _span("aten::linear", 10, 15),
        _span("aten::addmm", 12, 5),
        _span("other_thread_region", 0, 100, cat="user_annotation", tid=2),
        _mem(13, addr=1, nbytes=MIB, total=MIB),  # inner / aten::addmm
        _mem(20, addr=2, nbytes=MIB, total=2 * MIB),  # inner / aten::linear (after addmm ended)
        _mem(40, addr=3, nbytes=4 * MIB, total=6 * MIB),  # outer / no op
        _mem(45, addr=4, nbytes=MIB, total=7 * MIB, tid=2),  # the other thread's region
        _mem(50, addr=5, nbytes=MIB, total=8 * MIB),
        _mem(200, addr=5, nbytes=-MIB, total=7 * MIB),  # after every span
        _mem(201, addr=6, nbytes=MIB, total=8 * MIB),  # the same peak, later: not the peak
    ]
    out = memory_timeline(events, top=3)
    assert out is not None
    gpu = out["devices"]["cuda:0"]
    assert gpu["peak_time_ms"] == 0.05
    assert out["not_applicable"] == {"steps": "the trace has no ProfilerStep#N spans"}
    assert "peak_step" in gpu["not_applicable"] and gpu["peak_step"] is None
    sites = gpu["live_at_peak"]["sites"]
    assert [(s["region"], s["op"], s["mib"], s["count"]) for s in sites] == [
        ("outer", None, 5.0, 2),
        ("inner", "aten::addmm", 1.0, 1),
        ("inner", "aten::linear", 1.0, 1),
    ]
    assert gpu["live_at_peak"]["site_count"] == 4 and gpu["live_at_peak"]["other_mib"] == 1.0
    assert sites[0]["largest_mib"] == 4.0


def _alternating(n: int) -> list[dict]:
    """1 MiB allocated and freed in turn, once 65 MiB (at event 12,344, in aten::op3); each
    allocation inside an operator."""
    events = []
    total = 0
    for i in range(n):
        size = 65 * MIB if i // 2 == 6172 else MIB
        nbytes = size if i % 2 == 0 else -size
        total += nbytes
        events.append(_mem(i, addr=i // 2 + 1, nbytes=nbytes, total=total))
        if i % 2 == 0:
            events.append(_span(f"aten::op{i % 7}", i, 0.5))
    return events


def test_downsampling_keeps_the_peak_and_the_ends() -> None:
    n = 20_000
    events = _alternating(n)
    out = memory_timeline(events, max_points=101)
    assert out is not None
    curve = out["devices"]["cuda:0"]["curve"]
    assert curve["downsampled"] and len(curve["time_ms"]) <= 101
    assert max(curve["allocated_mib"]) == out["devices"]["cuda:0"]["peak_allocated_mib"] == 65.0
    assert 12.344 in curve["time_ms"]
    assert curve["time_ms"][0] == 0.0 and curve["time_ms"][-1] == (n - 1) / 1000
    assert min(curve["allocated_mib"]) == 0.0
    full = memory_timeline(events, max_points=n)
    assert full is not None and not full["devices"]["cuda:0"]["curve"]["downsampled"]


def test_a_file_read_in_slices_gives_the_figures_of_its_events(tmp_path: Path) -> None:
    events = _alternating(20_000)  # ~5 MB of JSON: several slices of ~1 MB
    doc = {"schemaVersion": 1, "traceEvents": events, "deviceProperties": []}
    plain, packed = tmp_path / "t.json", tmp_path / "t.json.gz"
    plain.write_text(json.dumps(doc))
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert plain.stat().st_size > 4 * MIB
    expected = memory_timeline(events, top=3)
    assert expected is not None
    assert memory_timeline(plain, top=3) == memory_timeline(packed, top=3) == expected
    assert expected["devices"]["cuda:0"]["live_at_peak"]["sites"] == [
        {"region": None, "op": "aten::op3", "mib": 65.0, "count": 1, "largest_mib": 65.0}
    ]


def test_an_unreadable_file_is_one_trace_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": [{"name": "[memory]", "ts": 1, "args": {"Bytes": [1]}}]}')
    with pytest.raises(TraceError, match=r"bad\.json"):
        memory_timeline(bad)
    with pytest.raises(TraceError, match="no such file"):
        memory_timeline(tmp_path / "missing.json")


def test_events_without_addr_give_a_curve_but_no_sites() -> None:
    events = [_mem(0, None, 2 * MIB, None), _mem(1, None, -MIB, None), _mem(2, None, 3 * MIB, None)]
    out = memory_timeline(events)
    assert out is not None
    gpu = out["devices"]["cuda:0"]
    assert gpu["curve"]["basis"] == "sum_of_bytes" and gpu["peak_allocated_mib"] == 4.0
    assert gpu["live_at_peak"] is None and "live_at_peak" in gpu["not_applicable"]
    assert "peak_reserved_mib" in gpu["not_applicable"]


def test_misuse_is_refused() -> None:
    with pytest.raises(ValueError):
        memory_timeline([], max_points=2)
    with pytest.raises(TypeError):
        memory_timeline(42)  # type: ignore[arg-type]


def test_the_module_imports_without_torch(tmp_path: Path) -> None:
    code = textwrap.dedent(
        """
        import sys
        sys.modules["torch"] = None
        from mgprof.analyze.memory.events import memory_timeline
        ev = [{"ph": "i", "name": "[memory]", "ts": 1, "tid": 1,
               "args": {"Addr": 5, "Bytes": 1048576, "Device Type": 0}}]
        out = memory_timeline(ev)
        assert out["devices"]["cpu"]["peak_allocated_mib"] == 1.0, out
        print("ok")
        """
    )
    result = run(python_args("-c", code), cwd=ROOT)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.explain()


def test_a_2021_gpu_trace_gives_curves_per_device() -> None:
    out = memory_timeline(OLD_SCHEMA)
    assert out is not None and set(out["devices"]) == {"cpu", "cuda:0"}
    gpu = out["devices"]["cuda:0"]
    assert gpu["curve"]["basis"] == "sum_of_bytes" and gpu["live_at_peak"] is None
    assert gpu["peak_allocated_mib"] > 1000  # ResNet-50 activations at batch 32
    assert gpu["peak_step"] in {s["step"] for s in out["steps"]}


# --- a real 2-rank run ----------------------------------------------------------------------


# The 2-rank run (rank 1's extra region named as its top site, against RSS) is in
# tests/test_memory_runs.py, which shares one run among its tests.
