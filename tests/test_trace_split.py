"""One trace read by two processes (trace_split): the same summary, byte for byte, as one reader,
wherever the cut falls; failures fall back to the single reader; used only where safe."""

from __future__ import annotations

import gzip
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

import msgspec
import pytest
from _data import TRACES

from mgprof.analyze.trace.summary import analyze_trace_file
from mgprof.analyze.tracefile import split as trace_split
from mgprof.analyze.tracefile.load import load_trace
from mgprof.analyze.tracefile.merge import MERGED_ATTRIBUTES
from mgprof.analyze.tracefile.reduce import _Reducer

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(
    not (sys.platform == "linux" and hasattr(os, "fork")), reason="the split forks: Linux only"
)


@pytest.fixture(autouse=True)
def _alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """The split is used only from a process with no other thread; the test process may hold
    some (a Dask client of another test), none of which the child touches."""
    monkeypatch.setattr(trace_split, "_threads_running", lambda: 1)


REAL = [
    "gpu-nccl-a100-rank0of2/rank-0.json.gz",  # current schema, NCCL kernels, launches
    "gpu-resnet50-v100-old-schema/worker0.1623143089861.pt.trace.json.gz",  # 2021 schema
    "gpu-v100-single/rank-0.pt.trace.json.gz",  # fractional timestamps
    "cpu-gloo-ddp-mlp-2ranks/rank0.1795996389335482514.pt.trace.json.gz",  # host columns
    "amd-mi250/rank-0.json.gz",
    "misc/a100-triton.json.gz",
]


def _summary_bytes(path: Path, monkeypatch: pytest.MonkeyPatch, at: float | None) -> bytes:
    """The rank summary as msgpack: one reader (``at`` None) or split at ``at``."""
    if at is None:
        return msgspec.msgpack.encode(analyze_trace_file(path, top=10))
    real = trace_split.load_split

    def forced(p: Path) -> Any:
        got = real(p, at=at, min_bytes=0)
        assert got is not None, "the split did not apply"
        return got

    with monkeypatch.context() as patch:
        patch.setattr(trace_split, "load_split", forced)
        return msgspec.msgpack.encode(analyze_trace_file(path, top=10, processes=2))


@pytest.mark.parametrize("name", REAL)
def test_split_anywhere_gives_the_single_readers_summary(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = TRACES / name
    want = _summary_bytes(path, monkeypatch, None)
    # 0: the child reads everything; 1.5: past the end, the child reads only the tail
    for at in (0.0, 0.1, 0.37, 0.55, 0.9, 1.5):
        assert _summary_bytes(path, monkeypatch, at) == want, f"cut at {at}"


def _scaled_cpu_trace(tmp_path: Path, copies: int) -> Path:
    """The gloo DDP fixture's events repeated with shifted times and new step numbers, so the
    second part meets threads, names and shapes the first part has met, and new ones."""
    src = sorted((TRACES / "cpu-gloo-ddp-mlp-2ranks").glob("rank0.*.json.gz"))[0]
    doc = json.loads(gzip.decompress(src.read_bytes()))
    events = doc["traceEvents"]
    span = max(e.get("ts", 0) + e.get("dur", 0) for e in events) + 10
    out = []
    for k in range(copies):
        for e in events:
            e2 = dict(e)
            if "ts" in e2:
                e2["ts"] = e2["ts"] + k * span
            if str(e2.get("name", "")).startswith("ProfilerStep#"):
                e2["name"] = f"ProfilerStep#{1000 * k + int(e2['name'].split('#')[1])}"
            if k % 2 and e2.get("cat") == "cpu_op":
                e2["tid"] = f"{e2.get('tid')}-{k}"  # new threads in later copies
                e2["args"] = {**e2.get("args", {}), "flops": 1.0 / (k + 3)}
            out.append(e2)
    doc["traceEvents"] = out
    path = tmp_path / "rank0.pt.trace.json"
    path.write_text(json.dumps(doc))
    return path


def test_split_of_a_plain_multi_slice_cpu_trace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Several MB of a CPU trace (many 1 MB slices, flops summed in file order, threads and
    shapes first seen after the cut), not gzipped."""
    path = _scaled_cpu_trace(tmp_path, 9)
    want = _summary_bytes(path, monkeypatch, None)
    for at in (0.2, 0.5, 0.8):
        assert _summary_bytes(path, monkeypatch, at) == want, f"cut at {at}"


def test_a_file_the_split_cannot_read_goes_to_the_single_reader(tmp_path: Path) -> None:
    """A truncated gzip: the split gives up (None) and load_trace's error is the single
    reader's, word for word."""
    src = TRACES / REAL[0]
    bad = tmp_path / "rank-0.json.gz"
    bad.write_bytes(src.read_bytes()[:-5000])
    assert trace_split.load_split(bad, min_bytes=0) is None
    with pytest.raises(Exception) as alone:
        load_trace(bad)
    with pytest.raises(Exception) as split:
        load_trace(bad, processes=2)
    assert type(split.value) is type(alone.value) and str(split.value) == str(alone.value)


def test_a_killed_second_reader_leaves_one_reader_and_a_bug_in_it_is_raised(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The child killed (the kernel's OOM killer, say): None, and load_trace reads alone. An
    exception of mgprof's own in the child is a bug: raised here with its text."""
    path = TRACES / REAL[0]
    want = load_trace(path)
    real = trace_split._reduce_part

    def _killed_when_later(path: Path, cut: int, later: bool) -> Any:
        if later:
            os.kill(os.getpid(), 9)
        return real(path, cut, later)

    monkeypatch.setattr(trace_split, "_reduce_part", _killed_when_later)
    assert trace_split.load_split(path, min_bytes=0) is None
    monkeypatch.setattr(trace_split, "SPLIT_MIN_BYTES", 0)
    assert load_trace(path, processes=2).dev_start.tolist() == want.dev_start.tolist()

    def bug(path: Path, cut: int, later: bool) -> Any:
        if later:
            raise KeyError("a bug")
        return real(path, cut, later)

    monkeypatch.setattr(trace_split, "_reduce_part", bug)
    with pytest.raises(RuntimeError, match=r"second reader .* failed: KeyError"):
        trace_split.load_split(path, min_bytes=0)


def test_a_thread_spelled_two_ways_across_the_cut_is_read_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tid 5 before the cut and 5.0 after it are one thread, named "5" by one reader; the
    later part would have named it "5.0", so the parts are not joined."""
    events: list[dict[str, Any]] = [
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 10 + i, "dur": 1,
         "tid": 5, "args": {"correlation": i}}
        for i in range(20000)
    ]  # fmt: skip
    events += [
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": 30000 + i, "dur": 1, "tid": 5.0}
        for i in range(20000)
    ]
    events.append({"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 9,
                   "dur": 60000, "tid": 5.0})  # fmt: skip
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps({"traceEvents": events}))
    assert trace_split.load_split(path, at=0.5, min_bytes=0) is None
    monkeypatch.setattr(trace_split, "SPLIT_MIN_BYTES", 0)
    one, two = load_trace(path), load_trace(path, processes=2)
    assert [s.tid for s in two.steps] == [s.tid for s in one.steps] == ["5"]
    assert two.main_thread[0].size == one.main_thread[0].size == 20000


def test_a_child_out_of_memory_leaves_one_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    real = trace_split.pickle.dumps

    def no_memory(obj: Any, protocol: int | None = None) -> bytes:
        if protocol == 5:  # the reducer's hand-over
            raise MemoryError
        return real(obj, protocol)

    monkeypatch.setattr(trace_split.pickle, "dumps", no_memory)
    assert trace_split.load_split(TRACES / REAL[0], min_bytes=0) is None


def test_a_fifo_is_not_opened(tmp_path: Path) -> None:
    fifo = tmp_path / "rank0.json"
    os.mkfifo(fifo)
    assert trace_split.load_split(fifo, min_bytes=0) is None  # and it did not block


def test_not_used_below_the_size_or_beside_another_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    small = TRACES / REAL[0]  # 9.8 MB of JSON
    assert trace_split.json_size(small) == 9_778_890
    assert trace_split.load_split(small) is None
    assert trace_split.load_split(small, min_bytes=0) is not None
    monkeypatch.setattr(trace_split, "_threads_running", threading.active_count)
    hold = threading.Event()
    t = threading.Thread(target=hold.wait)
    t.start()
    try:
        assert not trace_split.can_split()
        assert trace_split.load_split(small, min_bytes=0) is None
    finally:
        hold.set()
        t.join()


@pytest.mark.parametrize(
    ("workers", "files", "split"), [(2, 1, True), (1, 1, False), (2, 2, False)]
)
def test_a_job_of_one_rank_with_spare_processes_splits_it(
    workers: int, files: int, split: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``mgprof trace FILE`` (one rank, every core allowed) reads it with two processes;
    ``--workers 1`` or a job of several ranks (each process has a rank) does not."""
    from mgprof.analyze.execution.executor import ProcessExecutor
    from mgprof.analyze.trace.job import analyze_job
    from mgprof.analyze.tracefile import merge as reducer_merge

    joined = []
    real = reducer_merge.absorb
    monkeypatch.setattr(trace_split, "SPLIT_MIN_BYTES", 0)
    monkeypatch.setattr(trace_split, "absorb", lambda a, b: joined.append(1) or real(a, b))
    job = sorted((TRACES / "gpu-nccl-128ranks-sampled").glob("*.json.gz"))[:files]
    got = analyze_job(job, executor=ProcessExecutor(workers), cache=False)
    assert bool(joined) is split and len(got.ranks) == files


def test_every_reducer_attribute_has_a_join_rule() -> None:
    assert set(vars(_Reducer())) == MERGED_ATTRIBUTES
