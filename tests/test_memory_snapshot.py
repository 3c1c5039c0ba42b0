"""Per-rank summary of a CUDA allocator snapshot and the cross-rank comparison.

No CUDA here (torch's CPU build has no ``torch._C._cuda_memorySnapshot``), so the snapshot is
hand-made in the format PyTorch writes: key names from ``torch/csrc/cuda/memory_snapshot.cpp``
(``_memory_snapshot_pickled``), the ``_snapshot`` docstring in ``torch/cuda/memory.py`` and
``torch/utils/viz/MemoryViz.js`` (``annotate_snapshot``, ``process_alloc_data``); sizes as
``CUDACachingAllocator.cpp`` records them (``alloc``: the requested size; ``free_completed``:
the block's ``requested_size``).

tests/data/memory/handmade_snapshot.json, device 0, times T0 + µs:
  before the ring: a 2 MiB block (no stack), a 400 B block (train.py:30 build_model), a
  4 MiB block freed at +1010; segments A (20 MiB) and B (2 MiB): 6 MiB + 400 B, 22 MiB
  +1100 alloc 8 MiB  train.py:42 forward (live at the snapshot)
  +1200 segment_alloc 64 MiB; +1201 alloc 30 MiB train.py:42; +1202 alloc 20 MiB train.py:50
  +1300 oom: 100 MiB requested, 1 MiB free on the device
  +1400..1403 both freed; +1500 segment_free 64 MiB; +1600 snapshot
So the peak is 60 MiB + 400 B at +1202 with 86 MiB reserved; the snapshot holds 10 MiB + 400 B
in 22 MiB, its largest free block 10 MiB.
"""

from __future__ import annotations

import copy
import json
import re
import textwrap
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from mgprof.analyze.memory.replay import replay
from mgprof.analyze.memory.snapshot import (
    SnapshotSummary,
    describe_device0_imbalance,
    load_snapshot,
    summarize_snapshot,
)
from mgprof.errors import UsageError
from tests._spawn import python_args, run

MIB = 1 << 20
ROOT = Path(__file__).resolve().parents[1]
HANDMADE = ROOT / "tests" / "data" / "memory" / "handmade_snapshot.json"
T0 = 1_700_000_000_000_000
STEPS = [(3, T0 + 1050, T0 + 1350), (4, T0 + 1350, T0 + 1700)]
PHASES = [
    ("forward", T0 + 1090, T0 + 1250),
    ("forward / attn", T0 + 1195, T0 + 1210),
    ("backward", T0 + 1250, T0 + 1450),
]
USER = "/home/user/proj/train.py"


def _snapshot() -> dict[str, Any]:
    return json.loads(HANDMADE.read_text())


def _summary(snapshot: dict[str, Any] | None = None, **kw: Any) -> SnapshotSummary:
    return summarize_snapshot(
        snapshot if snapshot is not None else _snapshot(),
        step_marks=STEPS,
        phase_marks=PHASES,
        **kw,
    )


# --- the hand-made snapshot -----------------------------------------------------------------


def test_the_handmade_snapshot_has_the_keys_pytorch_writes() -> None:
    snap = _snapshot()
    assert set(snap) == {"segments", "device_traces", "allocator_settings"}
    seg = snap["segments"][0]
    assert {"device", "address", "total_size", "allocated_size", "active_size"} <= set(seg)
    assert {"requested_size", "stream", "segment_type", "blocks"} <= set(seg)
    assert set(seg["blocks"][0]) == {"address", "size", "requested_size", "state", "frames"}
    oom = next(e for e in snap["device_traces"][0] if e["action"] == "oom")
    assert "device_free" in oom and "addr" not in oom


def test_peak_allocated_and_reserved_come_from_the_replay_and_its_baseline() -> None:
    s = _summary()
    assert s.device == 0 and s.entries == 13 and s.timed
    assert s.baseline_allocated_mib == pytest.approx(6 + 400 / MIB, abs=1e-6)
    assert s.baseline_reserved_mib == 22.0
    assert s.peak_allocated_mib == pytest.approx(60 + 400 / MIB, abs=1e-6)
    assert s.peak_entry == 5 and s.peak_time_us == T0 + 1202
    assert s.reserved_at_peak_mib == 86.0 and s.pending_free_at_peak_mib == 0.0
    assert s.peak_reserved_mib == 86.0
    assert s.peak_reserved_entry == 3 and s.peak_reserved_time_us == T0 + 1200
    assert [(d.device, d.peak_reserved_mib) for d in s.devices] == [(0, 86.0)]


def test_the_peak_is_placed_in_its_step_and_innermost_phase() -> None:
    s = _summary()
    assert s.peak_step == 3 and s.peak_phase == "forward / attn"
    bare = summarize_snapshot(_snapshot())
    assert bare.peak_step is None and bare.peak_phase is None


def test_top_sites_at_the_peak_are_the_first_user_frames() -> None:
    s = _summary()
    assert s.live_at_peak_count == 5 and s.site_count == 4
    first, second, third, fourth = s.top_sites
    assert first.site == "train.py:42 forward" and first.file == USER and first.line == 42
    assert first.stack == ["train.py:42 forward", "train.py:71 train_step", "train.py:90 main"]
    assert (first.mib, first.count, first.largest_mib) == (38.0, 2, 30.0)
    assert (second.site, second.mib, second.count) == ("train.py:50 compute_loss", 20.0, 1)
    assert (third.site, third.mib) == ("(no stack recorded)", 2.0)
    assert fourth.site == "train.py:30 build_model"
    assert fourth.mib == pytest.approx(400 / MIB, abs=1e-6)
    one = _summary(top=1)
    assert [r.site for r in one.top_sites] == ["train.py:42 forward"]
    assert one.other_sites_mib == pytest.approx(22 + 400 / MIB, abs=1e-6)


def test_fragmentation_at_the_peak_and_at_snapshot_time() -> None:
    s = _summary()
    peak, end = s.fragmentation_at_peak, s.fragmentation_at_snapshot
    assert peak.reserved_mib == 86.0
    assert peak.free_mib == pytest.approx(26 - 400 / MIB, abs=1e-6)
    assert peak.free_pct == pytest.approx(100 * (26 - 400 / MIB) / 86, abs=1e-3)
    assert peak.largest_free_block_mib is None
    assert end.reserved_mib == 22.0
    assert end.allocated_mib == pytest.approx(10 + 400 / MIB, abs=1e-6)
    assert end.free_mib == pytest.approx(12 - 400 / MIB, abs=1e-6)
    assert end.largest_free_block_mib == 10.0
    assert s.expandable_segments is False


def test_the_oom_entry_is_reported_with_what_was_live() -> None:
    s = _summary(device_total_mib=100.0)
    oom = s.oom
    assert oom is not None and oom.count == 1 and oom.entry == 6
    assert oom.time_us == T0 + 1300 and oom.step == 3 and oom.phase == "backward"
    assert oom.requested_mib == 100.0 and oom.device_free_mib == 1.0
    assert oom.allocated_mib == pytest.approx(60 + 400 / MIB, abs=1e-6)
    assert oom.reserved_mib == 86.0
    assert (oom.top_sites[0].site, oom.top_sites[0].mib) == ("train.py:42 forward", 38.0)
    assert s.device_total_mib == 100.0 and s.headroom_mib == 14.0
    snap = _snapshot()
    snap["device_traces"][0] = [e for e in snap["device_traces"][0] if e["action"] != "oom"]
    assert summarize_snapshot(snap).oom is None


def test_the_summary_is_json() -> None:
    s = _summary()
    back = msgspec.json.decode(msgspec.json.encode(s), type=SnapshotSummary)
    assert back == s
    assert json.loads(msgspec.json.encode(s))["top_sites"][0]["site"] == "train.py:42 forward"


def test_load_snapshot_reads_json_and_msgpack(tmp_path: Path) -> None:
    assert load_snapshot(HANDMADE) == _snapshot()
    packed = tmp_path / "rank0.window.msgpack"
    packed.write_bytes(msgspec.msgpack.encode(_snapshot()))
    assert load_snapshot(packed) == _snapshot()
    bad = tmp_path / "not.json"
    bad.write_text('{"traceEvents": []}')
    with pytest.raises(UsageError, match="not a snapshot"):
        load_snapshot(bad)
    bad.write_text("{")
    with pytest.raises(UsageError, match="not a readable allocator snapshot"):
        load_snapshot(bad)


# --- the ring's start, older formats, odd input ---------------------------------------------


def test_a_block_allocated_before_the_ring_is_live_at_its_start() -> None:
    """The ring begins with the free of a 64 MiB block it never saw allocated: the peak is
    the start of the ring, and the block is listed with the stack of its free."""
    free = [{"filename": USER, "line": 60, "name": "backward_step"}]
    snap = {
        "segments": [
            {"device": 0, "address": 0, "total_size": 64 * MIB, "stream": 0, "blocks": []}
        ],
        "device_traces": [
            [
                {"action": "free_requested", "addr": 0, "size": 64 * MIB, "frames": free},
                {"action": "free_completed", "addr": 0, "size": 64 * MIB, "frames": free},
                {"action": "alloc", "addr": 0, "size": MIB, "frames": []},
                {"action": "free_completed", "addr": 0, "size": MIB, "frames": []},
            ]
        ],
    }
    s = summarize_snapshot(snap)
    assert s.peak_entry == -1 and s.peak_allocated_mib == 64.0 and s.baseline_allocated_mib == 64
    assert s.peak_time_us is None and not s.timed
    (row,) = s.top_sites
    assert row.site == "(allocated before the trace window)" and row.file is None
    assert row.stack == ["train.py:60 backward_step"] and row.mib == 64.0
    assert any("no time_us" in n for n in s.notes)
    assert any("before the trace window" in n for n in s.notes)


def test_pending_frees_hold_memory_until_completed() -> None:
    trace = [
        {"action": "alloc", "addr": 0, "size": 10 * MIB},
        {"action": "free_requested", "addr": 0, "size": 10 * MIB},
        {"action": "alloc", "addr": 16 * MIB, "size": 5 * MIB},
        {"action": "free_completed", "addr": 0, "size": 10 * MIB},
    ]
    r = replay(trace, {16 * MIB: (5 * MIB, [], False)}, 0)
    assert r.peak_allocated == 15 * MIB and r.peak_index == 2 and r.pending_at_peak == 10 * MIB
    assert [b[0] for b in r.live_at(1)] == [10 * MIB]
    assert r.baseline_allocated == 0 and r.stale_blocks == 0


def test_older_snapshots_without_addresses_times_or_frames_on_blocks() -> None:
    """PyTorch 2.0: blocks carry ``history`` (frames, real_size), no address; entries have no
    ``time_us``; a bare list is segments only."""
    frames = [{"filename": USER, "line": 42, "name": "forward"}]
    seg = {
        "device": 0,
        "address": 4096,
        "total_size": 4 * MIB,
        "stream": 0,
        "segment_type": "large",
        "blocks": [
            {"size": MIB, "state": "active_allocated", "history": [
                {"addr": 4096, "real_size": MIB - 8, "frames": frames}]},
            {"size": 3 * MIB, "state": "inactive", "history": []},
        ],
    }  # fmt: skip
    s = summarize_snapshot({"segments": [seg], "device_traces": [[
        {"action": "alloc", "addr": 4096, "size": MIB - 8, "stream": 0},
    ]]})  # fmt: skip
    assert s.peak_allocated_mib == pytest.approx(1 - 8 / MIB, abs=1e-6)
    assert s.baseline_allocated_mib == 0 and s.peak_step is None and not s.timed
    assert s.fragmentation_at_snapshot.largest_free_block_mib == 3.0
    bare = summarize_snapshot([seg])  # type: ignore[arg-type]
    assert bare.entries == 0 and bare.peak_entry is None
    assert bare.top_sites[0].site == "train.py:42 forward"
    assert any("no allocator history" in n for n in bare.notes)


def test_odd_input_is_tolerated_or_refused_clearly() -> None:
    empty = summarize_snapshot({})
    assert empty.device is None and empty.peak_allocated_mib == 0.0 and empty.top_sites == []
    junk = {"segments": [1, {"blocks": "x"}], "device_traces": [[{"action": "alloc"}, 3]]}
    assert summarize_snapshot(junk).peak_allocated_mib == 0.0
    with pytest.raises(TypeError):
        summarize_snapshot(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        summarize_snapshot({}, top=-1)


# --- across ranks ---------------------------------------------------------------------------


def _with_hog(snapshot: dict[str, Any], nbytes: int) -> dict[str, Any]:
    """The snapshot with one more segment and block of ``nbytes``, allocated at T0 + 1550 in
    train.py:99 hog and live at the snapshot."""
    snap = copy.deepcopy(snapshot)
    addr = 0x7F1000000000
    frames = [{"filename": USER, "line": 99, "name": "hog"}]
    trace = snap["device_traces"][0]
    trace[-1:-1] = [
        {"action": "segment_alloc", "addr": addr, "size": nbytes, "stream": 0,
         "frames": frames, "time_us": T0 + 1550},
        {"action": "alloc", "addr": addr, "size": nbytes, "stream": 0,
         "frames": frames, "time_us": T0 + 1551},
    ]  # fmt: skip
    snap["segments"].append({
        "device": 0, "address": addr, "total_size": nbytes, "allocated_size": nbytes,
        "active_size": nbytes, "requested_size": nbytes, "stream": 0, "segment_type": "large",
        "segment_pool_id": [0, 0], "is_expandable": False, "frames": frames,
        "blocks": [{"address": addr, "size": nbytes, "requested_size": nbytes,
                    "state": "active_allocated", "frames": frames}],
    })  # fmt: skip
    return snap


def test_the_rank_with_an_extra_2_gib_is_named() -> None:
    base = _summary()
    hog = _summary(_with_hog(_snapshot(), 2 << 30))
    assert hog.peak_reserved_mib == 22 + 2048 and hog.peak_entry == 13
    assert hog.top_sites[0].site == "train.py:99 hog" and hog.top_sites[0].mib == 2048.0
    assert hog.peak_step == 4 and hog.peak_phase is None
    out = _compare({0: base, 1: hog})
    assert out["differs"]["rank"] == 1
    assert out["differs"]["delta_mib"] == pytest.approx(2070 - 86)
    assert out["differs"]["delta_pct"] == pytest.approx(100 * (2070 - 86) / 86, abs=1e-3)
    assert out["text"].startswith("rank 1's peak reserved is 1,984.0 MiB (+2,307 %) above")
    assert out["peaks_mib"] == {"0": 86.0, "1": 2070.0}
    four = _compare({0: base, 1: hog, 2: base, 3: base})
    assert four["differs"]["rank"] == 1 and four["differs"]["median_others_mib"] == 86.0


def _compare(summaries: dict[int, SnapshotSummary]) -> dict[str, Any]:
    """The run analysis' rank comparison over these summaries, on 80 GB devices (its floor is
    then 1 % of the device, 816 MiB)."""
    from mgprof.analyze.run.memory import _comparison
    from mgprof.records import DeviceInfo, RankRecord, RunRecord

    profiles = [
        {"rank": r, "peak_allocated_mib": s.peak_allocated_mib,
         "peak_reserved_mib": s.peak_reserved_mib}
        for r, s in summaries.items()
    ]  # fmt: skip
    device = DeviceInfo(kind="cuda", index=0, total_memory_mib=81_559.0)
    ranks = [RankRecord(rank=r, world_size=len(summaries), device=device) for r in summaries]
    return _comparison(profiles, RunRecord(ranks=ranks, world_size=len(ranks)))


def test_equal_or_close_ranks_are_not_flagged() -> None:
    base = _summary()
    out = _compare(dict.fromkeys(range(4), base))
    assert out["differs"] is None and out["text"].startswith("no rank stands out")
    near = _summary(_with_hog(_snapshot(), 300 * MIB))  # 300 MiB: under the 816 MiB floor
    close = _compare({0: base, 1: near, 2: base})
    assert close["differs"] is None and close["threshold_mib"] == pytest.approx(815.59)
    assert _compare({0: base})["differs"] is None and _compare({})["peaks_mib"] == {}


def test_dataparallel_device_0_is_named() -> None:
    dp = describe_device0_imbalance({0: 5000.0, 1: 3000.0, 2: 3000.0})
    assert dp is not None and dp.excess_mib == 2000.0 and dp.excess_pct == pytest.approx(66.667)
    assert dp.text == (
        "device 0 peaks 2,000 MiB higher than the mean of the other devices: DataParallel "
        "gathers outputs and keeps the master copy on device 0"
    )
    assert describe_device0_imbalance({0: 100.0}) is None
    even = describe_device0_imbalance({0: 3000.0, 1: 3000.0})
    assert even is not None and even.excess_mib == 0.0 and even.text is None
    # one process, two devices in one snapshot (DataParallel): device 0 holds 1 GiB more
    snap = _with_hog(_snapshot(), 1 << 30)
    other = copy.deepcopy(_snapshot()["segments"])
    for seg in other:
        seg["device"] = 1
    snap["segments"] += other
    s = summarize_snapshot(snap)
    assert [(d.device, d.peak_reserved_mib) for d in s.devices] == [(0, 1046.0), (1, 22.0)]
    assert s.device == 0
    dp0 = describe_device0_imbalance({d.device: d.peak_reserved_mib for d in s.devices})
    assert dp0 is not None and dp0.excess_mib == 1024.0
    # the run analysis names it from a DataParallel rank's per-device peaks
    from mgprof.analyze.run.memory import _dp_imbalance
    from mgprof.records import MemoryRecord, RankRecord, RunRecord

    per_device = {"cuda:1": {"peak_reserved_mib": 3000.0}, "cuda:0": {"peak_reserved_mib": 5000.0}}
    rank = RankRecord(rank=0, world_size=1, memory=MemoryRecord(kind="cuda", per_device=per_device))
    text = _dp_imbalance(RunRecord(ranks=[rank], world_size=1))
    assert text is not None and text.startswith("device 0 peaks 2,000 MiB higher")
    assert summarize_snapshot(snap, device=1).peak_reserved_mib == 22.0


# --- no torch, and speed --------------------------------------------------------------------


def test_the_module_imports_and_runs_without_torch_or_numpy() -> None:
    code = textwrap.dedent(
        f"""
        import sys
        sys.modules["torch"] = None
        sys.modules["numpy"] = None
        from mgprof.analyze.memory.snapshot import load_snapshot, summarize_snapshot
        s = summarize_snapshot(load_snapshot({str(HANDMADE)!r}))
        assert s.top_sites[0].site == "train.py:42 forward", s
        print("ok")
        """
    )
    result = run(python_args("-c", code), cwd=ROOT)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.explain()


def _big_snapshot(n: int) -> dict[str, Any]:
    """``n`` entries: per iteration a temporary is allocated and freed, then an activation
    allocated; every 4th iteration frees an older activation, so ~n/10 blocks are live at the
    peak, from 50 sites (each a stack of 20 frames, its own list as JSON gives them)."""
    lib = "/usr/lib/python3.11/site-packages/torch/nn/modules/module.py"

    def frames(site: int) -> list[dict[str, Any]]:
        inner = [{"filename": lib, "line": 1700 + k, "name": "_call_impl"} for k in range(16)]
        user = [{"filename": f"/w/model_{site}.py", "line": 10 + k, "name": "f"} for k in range(4)]
        return inner + user

    trace: list[dict[str, Any]] = []
    live: list[int] = []
    addr = 1 << 40
    i = 0
    while len(trace) < n - 4:
        t = T0 + i * 10
        addr += 4096
        tmp = addr + (1 << 30)
        trace.append({"action": "alloc", "addr": tmp, "size": 512, "stream": 0,
                      "frames": frames(i % 7), "time_us": t})  # fmt: skip
        trace.append({"action": "free_requested", "addr": tmp, "size": 512, "time_us": t + 1})
        trace.append({"action": "free_completed", "addr": tmp, "size": 512, "time_us": t + 2})
        trace.append({"action": "alloc", "addr": addr, "size": 4096, "stream": 0,
                      "frames": frames(i % 50), "time_us": t + 3})  # fmt: skip
        live.append(addr)
        if i % 4 == 3:
            old = live.pop(0)
            trace.append({"action": "free_completed", "addr": old, "size": 4096, "time_us": t + 4})
        i += 1
    for a in live:
        trace.append({"action": "free_completed", "addr": a, "size": 4096, "time_us": T0 + i * 10})
    return {"segments": [], "device_traces": [trace]}


def test_a_100k_entry_trace_is_summarised_quickly() -> None:
    snap = _big_snapshot(100_000)
    entries = len(snap["device_traces"][0])
    assert entries >= 100_000
    started = time.perf_counter()
    s = summarize_snapshot(snap, step_marks=STEPS, phase_marks=PHASES * 1000)
    elapsed = time.perf_counter() - started
    assert elapsed < 3.0, f"{elapsed:.2f} s for {entries} entries"
    assert s.entries == entries and s.live_at_peak_count > 5000
    assert s.site_count == 50 and len(s.top_sites) == 10
    assert re.fullmatch(r"model_\d+\.py:10 f", s.top_sites[0].site), s.top_sites[0]
    assert len(s.top_sites[0].stack) == 3
    assert s.peak_allocated_mib == pytest.approx(s.live_at_peak_count * 4096 / MIB, abs=1e-5)
