"""CPU-only traces at scale: the vectorised reduction gives the contract's figures, per step too,
in memory that grows with the trace's events, not with events × steps; and the start-up of
``mgprof trace`` stays lean. Timings are in ``benchmarks/bench_cpu_trace.py``; these tests
assert behaviour only.

The scaled traces repeat the real gloo DDP fixture's ``ProfilerStep`` block with shifted
timestamps and new step numbers, so the event mix is a real one.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from _data import TRACES

import mgprof.analyze.intervals as iv
from mgprof.analyze.trace.summary import analyze_trace_file
from mgprof.analyze.tracefile.load import load_trace

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = TRACES / "cpu-gloo-ddp-mlp-2ranks"
COMM_PREFIXES = ("gloo:", "nccl:", "c10d::", "record_param_comms")


def _source() -> dict[str, Any]:
    path = sorted(FIXTURE.glob("rank0.*.json.gz"))[0]
    return json.loads(gzip.decompress(path.read_bytes()))


def _is_step(e: dict[str, Any]) -> bool:
    return str(e.get("name", "")).startswith("ProfilerStep#")


def scaled(copies: int, drop_steps: bool = False) -> dict[str, Any]:
    """The fixture with its step block repeated ``copies`` times (steps renumbered)."""
    doc = _source()
    events = doc["traceEvents"]
    steps = [e for e in events if _is_step(e)]
    lo = min(e["ts"] for e in steps)
    hi = max(e["ts"] + e["dur"] for e in steps)
    period = hi - lo + 500.0

    def inside(e: dict[str, Any]) -> bool:
        return e.get("ph") != "M" and "ts" in e and lo <= e["ts"] < hi and e.get("cat") != "Trace"

    out = [e for e in events if not inside(e)]
    for k in range(copies):
        for e in filter(inside, events):
            e2 = dict(e, ts=e["ts"] + k * period)
            if _is_step(e):
                e2["name"] = f"ProfilerStep#{int(e['name'][13:]) + k * len(steps)}"
            out.append(e2)
    if drop_steps:
        out = [e for e in out if not _is_step(e)]
    doc["traceEvents"] = out
    return doc


def write(doc: dict[str, Any], folder: Path) -> Path:
    path = folder / "rank0.pt.trace.json"
    path.write_text(json.dumps(doc))
    return path


# --- an independent computation of the DESIGN.md CPU-only rules ---------------------------


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for s, e in sorted(spans):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def _cut(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """∪a ∩ ∪b."""
    out = []
    for s, e in _union(a):
        for bs, be in _union(b):
            lo, hi = max(s, bs), min(e, be)
            if hi > lo:
                out.append((lo, hi))
    return _union(out)


def _minus(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out = []
    for s, e in _union(a):
        pos = s
        for bs, be in _union(b):
            if be <= pos or bs >= e:
                continue
            if bs > pos:
                out.append((pos, bs))
            pos = max(pos, be)
        if pos < e:
            out.append((pos, e))
    return out


def _length(spans: list[tuple[float, float]]) -> float:
    return sum(e - s for s, e in _union(spans))


def expected(doc: dict[str, Any]) -> tuple[dict[str, float], list[dict[str, float]]]:
    """(trace totals, per-step totals) by the contract, from the JSON alone, in plain Python."""
    xs = [e for e in doc["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    base = xs[0]["ts"]

    def span(e: dict[str, Any]) -> tuple[float, float]:
        s = e["ts"] - base
        return s, s + e["dur"]

    host = [e for e in xs if e.get("cat") != "Trace"]
    steps = [e for e in host if _is_step(e)]
    main = steps[0]["tid"]
    comm_names = [e for e in host if e["tid"] == main and e["name"].startswith(COMM_PREFIXES)]
    ops = [
        e
        for e in host
        if e["tid"] == main and e.get("cat") == "cpu_op" and not e["name"].startswith(COMM_PREFIXES)
    ]
    compute = _minus([span(e) for e in ops], [span(e) for e in comm_names])
    gloo = [span(e) for e in host if e["name"].startswith("gloo:")]

    def totals(window: list[tuple[float, float]]) -> dict[str, float]:
        c, m = _cut(compute, window), _cut(gloo, window)
        busy = _length(c + m)
        return {
            "window_us": _length(window),
            "compute_us": _length(c),
            "comm_us": _length(m),
            "busy_us": busy,
            "overlap_us": _length(c) + _length(m) - busy,
        }

    windows = [[span(e)] for e in sorted(steps, key=lambda e: e["ts"])]
    return totals([w[0] for w in windows]), [totals(w) for w in windows]


KEYS = ("window_us", "compute_us", "comm_us", "busy_us", "overlap_us")


def test_scaled_cpu_trace_gives_the_contract_figures(tmp_path: Path) -> None:
    doc = scaled(12)
    want, want_steps = expected(doc)
    got = analyze_trace_file(write(doc, tmp_path))
    assert got.kind == "cpu" and len(got.steps) == len(want_steps) == 36
    for key in KEYS:
        assert getattr(got.totals, key) == pytest.approx(want[key], rel=1e-9, abs=1e-6), key
    for step, ref in zip(got.steps, want_steps):
        for key in KEYS:
            assert getattr(step.totals, key) == pytest.approx(ref[key], rel=1e-9, abs=1e-6)
    # The block repeats, so each copy's steps read as the original's (to float rounding).
    first = got.steps[:3]
    for k, step in enumerate(got.steps):
        for key in KEYS:
            ref = getattr(first[k % 3].totals, key)
            assert getattr(step.totals, key) == pytest.approx(ref, rel=1e-6, abs=1e-3)
    assert got.totals.comm_pct is not None and 0 < got.totals.comm_pct < 100


def test_without_steps_the_busiest_thread_is_main(tmp_path: Path) -> None:
    doc = scaled(4, drop_steps=True)
    got = load_trace(write(doc, tmp_path))
    complete = [e for e in doc["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    base = complete[0]["ts"]  # times are relative to the file's first complete event
    xs = [e for e in complete if e.get("cat") != "Trace"]  # the profiler's own span is no work
    per_thread: dict[str, float] = {}
    for e in xs:
        per_thread[str(e["tid"])] = per_thread.get(str(e["tid"]), 0.0) + e["dur"]
    assert got.main_tid == max(per_thread, key=lambda t: per_thread[t])
    assert not got.steps and got.cpu_window_all is not None
    lo = min(e["ts"] for e in xs) - base
    hi = max(e["ts"] + e["dur"] for e in xs) - base
    assert got.cpu_window_all == pytest.approx((lo, hi), abs=1e-3)


def test_per_step_figures_reuse_the_merged_intervals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Per-step figures must not sort the whole trace once per step (quadratic in long traces):
    the elements merged over the whole analysis stay a small multiple of the events."""
    path = write(scaled(20), tmp_path)
    rt = load_trace(path)
    merged = 0
    real_merge = iv.merge

    def counting(starts: Any, ends: Any) -> Any:
        nonlocal merged
        merged += len(starts)
        return real_merge(starts, ends)

    monkeypatch.setattr(iv, "merge", counting)
    monkeypatch.setattr("mgprof.analyze.trace.summary.load_trace", lambda _p, _n=1: rt)
    summary = analyze_trace_file(path)
    assert len(summary.steps) == 60
    assert merged < 10 * rt.n_events, (merged, rt.n_events)


def _load_peak(path: Path) -> int:
    tracemalloc.start()
    try:
        load_trace(path)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_memory_grows_with_events_not_objects_per_event(tmp_path: Path) -> None:
    """Host events are kept as numpy columns (about 30 bytes each), not as a tuple of Python
    objects per event (about 150 bytes): doubling the trace adds well under a fifth of the
    added JSON to the peak."""
    small, big = tmp_path / "small", tmp_path / "big"
    small.mkdir()
    big.mkdir()
    a, b = write(scaled(10), small), write(scaled(40), big)
    load_trace(a)  # first use: imports and caches are not the trace's
    grow = _load_peak(b) - _load_peak(a)
    added = b.stat().st_size - a.stat().st_size
    assert grow < 0.2 * added, (grow, added)


def _run(code: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    env["MGPROF_NO_CACHE"] = "1"  # no summary cache written outside the test
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, check=True
    )
    return out.stdout.strip()


def test_json_rendering_loads_no_rich() -> None:
    """``mgprof trace --json`` draws no table: rendering the JSON needs no rich."""
    out = _run(
        "import sys, mgprof.report.trace_terminal as t; "
        "from mgprof.analyze.trace.job import JobTraceSummary; "
        "print(sorted(m for m in sys.modules if m == 'rich' or m.startswith('rich.')))"
    )
    assert out == "[]"


def test_gpu_trace_analysis_loads_no_numpy_ma() -> None:
    """numpy.percentile's first call imports numpy.ma (~10 ms of a command's start); the
    launch-delay percentiles of a GPU trace are taken without it."""
    gpu = TRACES / "gpu-nccl-a100-rank0of2"
    out = _run(
        "import sys\n"
        "from mgprof.analyze.trace.summary import analyze_trace_file\n"
        f"s = analyze_trace_file({str(sorted(gpu.glob('*.json.gz'))[0])!r})\n"
        "print(s.launch_delay is not None, 'numpy.ma' in sys.modules)\n"
    )
    assert out == "True False"


def test_a_command_registers_alone() -> None:
    from mgprof import cli

    def commands(parser: Any) -> set[str]:
        (sub,) = (a for a in parser._actions if a.dest == "command")
        return set(sub.choices)

    assert commands(cli.build_parser("trace")) == {"trace"}
    assert "trace" in commands(cli.build_parser()) and len(commands(cli.build_parser())) > 1


def _blas_threads_after_trace(preload_numpy: bool) -> str:
    fixture = str(sorted(FIXTURE.glob("rank0.*"))[0])
    return _run(
        "import contextlib, io, os\n"
        + ("import numpy\n" if preload_numpy else "")
        + "from mgprof.cli import main\n"
        + "with contextlib.redirect_stdout(io.StringIO()):\n"
        + f"    rc = main(['trace', {fixture!r}, '--json', '--workers', '1'])\n"
        + "print(rc, os.environ.get('OPENBLAS_NUM_THREADS'))\n"
    )


def test_trace_starts_numpy_with_one_blas_thread() -> None:
    """Trace analysis never calls BLAS: ``mgprof trace`` loads numpy with one BLAS thread
    instead of a pool per core; where numpy is already loaded nothing is changed."""
    assert _blas_threads_after_trace(preload_numpy=False).splitlines()[-1] == "0 1"
    assert _blas_threads_after_trace(preload_numpy=True).splitlines()[-1] == "0 None"


def test_gzip_read_ahead_matches_the_plain_file(tmp_path: Path) -> None:
    """Gzipped traces are inflated by a read-ahead thread: one member, several members, zero
    padding (read again by GzipFile) and a truncated file all behave as GzipFile does."""
    from mgprof.errors import TraceError

    plain = write(scaled(3), tmp_path)
    want = analyze_trace_file(plain).totals
    data = plain.read_bytes()
    half = len(data) // 2
    variants = {
        "one.json.gz": gzip.compress(data),
        "two.json.gz": gzip.compress(data[:half]) + gzip.compress(data[half:]),
        "padded.json.gz": gzip.compress(data) + b"\0" * 64,
    }
    for name, blob in variants.items():
        path = tmp_path / name
        path.write_bytes(blob)
        assert analyze_trace_file(path).totals == want, name
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(variants["one.json.gz"][:-5000])
    with pytest.raises(TraceError, match="truncated or corrupt"):
        load_trace(cut)
