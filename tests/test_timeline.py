"""``mgprof timeline``: one Chrome/Perfetto JSON per job, every rank on one clock.

Checked on real traces (a 2-rank CPU DDP over gloo, ranks 0 and 1 of an NCCL job, and a real
2-rank CPU run made by ``mgprof analyze``): the file is valid Chrome trace JSON, each rank keeps
its events in order with one uniform shift, matched collectives end together within the
offset error the file states, and a copy of a rank whose clock is moved by 5 s is moved back.
"""

from __future__ import annotations

import errno
import gzip
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from _data import TRACES

from mgprof import atomic
from mgprof.analyze.timeline.build import (
    DEFAULT_NAME,
    build_timeline,
    find_inputs,
    parse_steps,
    read_timeline_facts,
    summary_lines,
)
from mgprof.analyze.timeline.clock import Anchor, estimate_offset
from mgprof.cli import main
from mgprof.errors import UsageError

CPU = TRACES / "cpu-gloo-ddp-mlp-2ranks"
GPU = TRACES / "gpu-nccl-128ranks-sampled"
PHASES = set("BEXiIbneCsftPONDMRc") | {"(", ")"}
SHIFT_US = 5_000_000.0


# ------------------------------------------------------------------------------- helpers


def load(path: Path) -> dict[str, Any]:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    doc = json.loads(raw)
    assert isinstance(doc, dict)
    return doc


def is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def check_chrome(doc: dict[str, Any]) -> dict[int, int]:
    """The Chrome trace format's object form, as Perfetto and chrome://tracing read it; returns
    rank -> pid from the file's own facts."""
    assert doc["displayTimeUnit"] == "ms"
    facts = doc["otherData"]
    assert facts["generator"] == "mgprof timeline"
    events = doc["traceEvents"]
    assert isinstance(events, list) and events
    names: dict[tuple[str, int, int], str] = {}
    used: set[tuple[int, int]] = set()
    flows: dict[tuple[str, int], set[str]] = defaultdict(set)
    for ev in events:
        assert ev["ph"] in PHASES, ev
        for key in ("pid", "tid"):
            assert isinstance(ev[key], int) and not isinstance(ev[key], bool) and ev[key] > 0, ev
        assert is_num(ev["ts"]) and ev["ts"] >= 0, ev
        if ev["ph"] == "M":
            names[(ev["name"], ev["pid"], ev["tid"])] = ev["args"].get("name", "")
            continue
        used.add((ev["pid"], ev["tid"]))
        if ev["ph"] == "X":
            assert is_num(ev["dur"]) and ev["dur"] >= 0, ev
            assert isinstance(ev["name"], str), ev
        if ev["ph"] in ("s", "t", "f"):
            assert isinstance(ev["id"], int) and 0 <= ev["id"] < 2**53, ev
            flows[(ev.get("cat", ""), ev["id"])].add(ev["ph"])
    for phases in flows.values():
        assert {"s", "f"} <= phases  # both ends or neither
    pids = {r["rank"]: r["pid"] for r in facts["ranks"]}
    assert len(set(pids.values())) == len(pids)  # one pid per rank
    tids_seen: dict[int, int] = {}
    for pid, tid in used:
        assert pid in pids.values()
        assert names.get(("thread_name", pid, tid)), (pid, tid)
        assert tids_seen.setdefault(tid, pid) == pid  # a tid belongs to one process
    for rank, pid in pids.items():
        proc = [n for (kind, p, _t), n in names.items() if kind == "process_name" and p == pid]
        assert proc and proc[0].startswith(f"rank {rank}")
        (sort,) = [
            e["args"]["sort_index"]
            for e in events
            if e["ph"] == "M" and e["name"] == "process_sort_index" and e["pid"] == pid
        ]
        assert sort == rank
    return pids


def rank_files(folder: Path) -> dict[int, Path]:
    out = {}
    for path in sorted(folder.glob("*.json.gz")):
        out[int(load(path)["distributedInfo"]["rank"])] = path
    return out


def timeline(inputs: list[Path], out: Path, **kw: Any) -> tuple[dict[str, Any], Any]:
    result = build_timeline(find_inputs(inputs), out, **kw)
    return load(out), result


def clocks(doc: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {r["rank"]: r["clock"] for r in doc["otherData"]["ranks"]}


def comm_ends(doc: dict[str, Any], pid: int) -> list[float]:
    """Ends of a rank's collectives in the output: gloo ops, or NCCL kernels."""
    out = []
    for ev in doc["traceEvents"]:
        if ev["ph"] != "X" or ev["pid"] != pid:
            continue
        name = ev["name"]
        if name.startswith("gloo:") or (ev.get("cat") == "kernel" and "nccl" in name.lower()):
            out.append(ev["ts"] + ev["dur"])
    return sorted(out)


def assert_collectives_line_up(doc: dict[str, Any]) -> None:
    """After alignment, at least as many collectives as the offset was estimated from end
    within the stated error of a collective on the reference rank; and the ones that do are
    centred on zero, to within that error."""
    pids = {r["rank"]: r["pid"] for r in doc["otherData"]["ranks"]}
    ref = min(pids)
    ref_ends = comm_ends(doc, pids[ref])
    for rank, clock in clocks(doc).items():
        if rank == ref:
            continue
        assert clock["method"] == "collectives", clock
        err = clock["error_us"] + 0.01  # ts are written to the ns
        diffs = [min((e - r for r in ref_ends), key=abs) for e in comm_ends(doc, pids[rank])]
        close = [d for d in diffs if abs(d) <= err]
        assert len(close) >= clock["calls_used"] >= 2, (diffs, clock)
        assert abs(statistics.median(close)) <= err


def shifted_copy(src: Path, dst: Path, shift_us: float = 0.0, base_ns: int = 0) -> Path:
    """A rank's trace with every ``ts`` moved by ``shift_us`` (and its clock base by
    ``base_ns``): what a host whose clock is off would have written."""
    doc = load(src)
    for ev in doc["traceEvents"]:
        if is_num(ev.get("ts")):
            ev["ts"] = ev["ts"] + shift_us
    if base_ns:
        doc["baseTimeNanoseconds"] = int(doc.get("baseTimeNanoseconds", 0)) + base_ns
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return dst


def input_events(path: Path) -> list[dict[str, Any]]:
    return [e for e in load(path)["traceEvents"] if e.get("ph") != "M" and is_num(e.get("ts"))]


# ------------------------------------------------------------------- real traces, valid JSON


@pytest.mark.parametrize("folder", [CPU, GPU], ids=["cpu-gloo", "gpu-nccl"])
def test_fixture_timeline_is_a_valid_chrome_trace(folder: Path, tmp_path: Path) -> None:
    doc, result = timeline([folder], tmp_path / "t.json.gz")
    pids = check_chrome(doc)
    assert sorted(pids) == [0, 1] and result.reference_rank == 0
    names = [e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "thread_name"]
    if folder == GPU:
        assert any(n.startswith("GPU 0 · stream") for n in names)
        assert any(n.startswith("GPU 1 · stream") for n in names)
        # device events land in their rank's process, next to its host threads
        kernel_pids = {e["pid"] for e in doc["traceEvents"] if e.get("cat") == "kernel"}
        assert kernel_pids == set(pids.values())
    else:
        assert any("pt_gloo_runloop" in n for n in names)
    assert result.events.written == sum(1 for e in doc["traceEvents"] if e["ph"] != "M")


@pytest.mark.parametrize("folder", [CPU, GPU], ids=["cpu-gloo", "gpu-nccl"])
def test_each_rank_keeps_its_events_in_order_shifted_by_one_offset(
    folder: Path, tmp_path: Path
) -> None:
    doc, _ = timeline([folder], tmp_path / "t.json.gz")
    facts = doc["otherData"]
    for rank, src in rank_files(folder).items():
        pid = next(r["pid"] for r in facts["ranks"] if r["rank"] == rank)
        # flows without both ends are left out by design; every other event stays, in order
        want = [e for e in input_events(src) if e["ph"] not in ("s", "t", "f")]
        got = [
            e for e in doc["traceEvents"] if e["pid"] == pid and e["ph"] not in ("M", "s", "t", "f")
        ]
        assert [(e["ph"], e["name"], e.get("dur")) for e in got] == [
            (e["ph"], e["name"], e.get("dur")) for e in want
        ]
        shifts = [g["ts"] - w["ts"] for g, w in zip(got, want)]
        assert max(shifts) - min(shifts) < 0.01  # one shift per rank (ts written to the ns)
        clock = clocks(doc)[rank]
        # that shift is the rank's offset minus the file's origin
        assert shifts[0] == pytest.approx(clock["offset_us"] - facts["origin_trace_us"], abs=0.01)


@pytest.mark.parametrize("folder", [CPU, GPU], ids=["cpu-gloo", "gpu-nccl"])
def test_matched_collectives_line_up_within_the_stated_error(folder: Path, tmp_path: Path) -> None:
    doc, _ = timeline([folder], tmp_path / "t.json.gz")
    assert_collectives_line_up(doc)


@pytest.mark.parametrize("folder", [CPU, GPU], ids=["cpu-gloo", "gpu-nccl"])
def test_a_rank_whose_clock_is_5s_off_is_moved_back(folder: Path, tmp_path: Path) -> None:
    files = rank_files(folder)
    base_doc, _ = timeline([folder], tmp_path / "base.json.gz")
    moved = shifted_copy(files[1], tmp_path / "in" / files[1].name, SHIFT_US)
    doc, _ = timeline([files[0], moved], tmp_path / "t.json.gz")
    check_chrome(doc)
    before, after = clocks(base_doc)[1], clocks(doc)[1]
    assert after["method"] == "collectives"
    # the recovered offset undoes the shift, to within the stated error
    assert abs(after["offset_us"] - (before["offset_us"] - SHIFT_US)) <= after["error_us"]
    assert after["clock_base_offset_us"] == 0.0  # the clock base knows nothing of the shift
    assert_collectives_line_up(doc)
    # and the whole job still spans what it spanned: nothing sits 5 s away
    span = max(e["ts"] for e in doc["traceEvents"]) - min(e["ts"] for e in doc["traceEvents"])
    assert span < 0.5 * SHIFT_US


def test_without_collectives_the_recorded_clock_base_is_used(tmp_path: Path) -> None:
    files = rank_files(CPU)
    one = load(files[1])
    for ev in one["traceEvents"]:
        if str(ev.get("name", "")).startswith("gloo:"):
            ev["name"] = "renamed_op"  # no collective left to match
    one["baseTimeNanoseconds"] += 1_000_000_000  # its clock base is 1 s later
    moved = tmp_path / "in" / files[1].name
    moved.parent.mkdir()
    moved.write_bytes(gzip.compress(json.dumps(one).encode()))
    doc, result = timeline([files[0], moved], tmp_path / "t.json.gz")
    check_chrome(doc)
    clock = clocks(doc)[1]
    assert clock["method"] == "clock base" and clock["offset_us"] == pytest.approx(1e6)
    assert clock["error_us"] is None and "no collective matched" in clock["note"]
    assert any("+1,000,000.0 µs from the recorded clock base" in s for s in summary_lines(result))


# ------------------------------------------------------------------------ --steps, --min-dur


def step_span(doc: dict[str, Any], pid: int, number: int) -> tuple[float, float]:
    (ev,) = [
        e
        for e in doc["traceEvents"]
        if e["pid"] == pid and e["ph"] == "X" and e["name"] == f"ProfilerStep#{number}"
    ]
    return ev["ts"], ev["ts"] + ev["dur"]


def test_steps_keep_host_events_of_those_steps_only(tmp_path: Path) -> None:
    full, _ = timeline([CPU], tmp_path / "full.json.gz")
    doc, result = timeline([CPU], tmp_path / "t.json.gz", steps=parse_steps("3"))
    check_chrome(doc)
    steps = {e["name"] for e in doc["traceEvents"] if e.get("name", "").startswith("ProfilerStep")}
    assert steps == {"ProfilerStep#3"}
    for rank in (0, 1):
        pid = rank + 1
        lo, hi = step_span(doc, pid, 3)
        kept = [e for e in doc["traceEvents"] if e["pid"] == pid and e["ph"] != "M"]
        assert kept and all(lo - 0.01 <= e["ts"] <= hi + 0.01 for e in kept)
        # and nothing of step 3 was lost: every event of the full timeline inside it is here
        flo, fhi = step_span(full, pid, 3)
        inside = [
            e
            for e in full["traceEvents"]
            if e["pid"] == pid and e["ph"] not in ("M", "s", "f") and flo <= e["ts"] <= fhi
        ]
        assert len([e for e in kept if e["ph"] not in ("s", "f")]) == len(inside)
    ev = result.events
    assert ev.dropped_steps > 0 and ev.written + ev.dropped_steps + ev.flows_dropped == ev.read


def test_steps_keep_device_work_launched_in_them(tmp_path: Path) -> None:
    doc, result = timeline([GPU], tmp_path / "t.json.gz", steps=parse_steps("552:552"))
    check_chrome(doc)
    assert result.events.dropped_steps > 0
    for pid in (1, 2):
        lo, hi = step_span(doc, pid, 552)
        launches = {
            e["args"]["correlation"]: e["ts"]
            for e in doc["traceEvents"]
            if e["pid"] == pid and e.get("cat") == "cuda_runtime" and "correlation" in e["args"]
        }
        kernels = [e for e in doc["traceEvents"] if e["pid"] == pid and e.get("cat") == "kernel"]
        assert kernels
        for k in kernels:
            corr = k["args"]["correlation"]
            assert lo - 0.01 <= launches[corr] <= hi + 0.01  # launched inside step 552


def test_min_dur_drops_only_shorter_complete_events(tmp_path: Path) -> None:
    floor = 20.0
    doc, result = timeline([CPU], tmp_path / "t.json.gz", min_dur_us=floor)
    check_chrome(doc)
    files = rank_files(CPU)
    dropped = 0
    for rank, src in files.items():
        pid = rank + 1
        src_x = [e for e in input_events(src) if e["ph"] == "X"]
        out_x = [e for e in doc["traceEvents"] if e["pid"] == pid and e["ph"] == "X"]
        assert all(e["dur"] >= floor for e in out_x)
        assert [e["name"] for e in out_x] == [e["name"] for e in src_x if e["dur"] >= floor]
        # instant events are no complete events: they all stay
        assert sum(1 for e in doc["traceEvents"] if e["pid"] == pid and e["ph"] == "i") == sum(
            1 for e in input_events(src) if e["ph"] == "i"
        )
        dropped += sum(1 for e in src_x if e["dur"] < floor)
    assert result.events.dropped_min_dur == dropped > 0
    assert doc["otherData"]["events"]["dropped_min_dur"] == dropped
    assert (tmp_path / "t.json.gz").stat().st_size < (
        build_timeline(find_inputs([CPU]), tmp_path / "f.json.gz").size_bytes
    )


# ---------------------------------------------------------------------- the command, exits


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("mgprof timeline: error: ")
    return lines[0]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["/no/such/run"], "no such file or folder"),
        ([str(CPU), "--steps", "5:3"], "comes after"),
        ([str(CPU), "--steps", "x"], "not a step range"),
        ([str(CPU), "--steps", "99"], "no such step in the traces (steps in the traces: 2..4)"),
        ([str(CPU), "--min-dur", "-1"], "0 or more"),
        ([str(CPU), "--out", "t.txt"], "*.json or *.json.gz"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    args: list[str],
    says: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["timeline", *args]) == 2
    assert says in one_error_line(capsys)
    assert list(tmp_path.iterdir()) == []  # nothing written, no temp file


def test_existing_out_needs_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    mine = tmp_path / DEFAULT_NAME
    mine.write_text("the user's own file")
    assert main(["timeline", str(CPU)]) == 2  # the default name in the current folder
    assert "pass --force" in one_error_line(capsys)
    assert mine.read_text() == "the user's own file"
    out = tmp_path / "job.json"
    assert main(["timeline", str(CPU), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {out}" in printed and "ui.perfetto.dev" in printed
    assert "rank 1  +" in printed and "from collectives" in printed
    check_chrome(load(out))  # plain JSON by its name
    assert main(["timeline", str(CPU), "--out", str(out)]) == 2
    assert "exists" in one_error_line(capsys)
    assert main(["timeline", str(CPU), "--out", str(mine), "--force"]) == 0
    check_chrome(load(mine))


def test_two_files_of_one_rank_and_an_earlier_timeline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = rank_files(CPU)
    folder = tmp_path / "traces"
    folder.mkdir()
    for path in files.values():
        shutil.copy(path, folder / path.name)
    # a timeline written into the trace folder is not read back as a rank
    assert main(["timeline", str(folder), "--out", str(folder / "all.json.gz")]) == 0
    capsys.readouterr()
    assert main(["timeline", str(folder), "--out", str(tmp_path / "again.json.gz")]) == 0
    out = capsys.readouterr().out
    assert "2 ranks" in out and "all.json.gz: a timeline mgprof wrote" in out
    shutil.copy(files[0], folder / "copy-of-rank0.json.gz")
    assert main(["timeline", str(folder), "--out", str(tmp_path / "x.json.gz")]) == 2
    assert "are both rank 0" in one_error_line(capsys)


def test_a_full_disk_is_one_line_and_leaves_no_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(fd: int, data: Any) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(atomic, "_write", full)
    out = tmp_path / "t.json.gz"
    assert main(["timeline", str(CPU), "--out", str(out)]) == 2
    assert "No space left on device" in one_error_line(capsys)
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------- a real run: analyze, report


def test_real_run_has_a_timeline_and_its_report_links_it(cpu_run_dir: Path) -> None:
    """``mgprof analyze`` wrote RUN/timeline.json.gz: both ranks of one host, where the true
    offset is what the clock bases say (one clock), so the estimate must cover it."""
    doc = load(cpu_run_dir / DEFAULT_NAME)
    pids = check_chrome(doc)
    assert sorted(pids) == [0, 1]
    names = [e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "process_name"]
    assert [n.split(" · ")[:2] for n in names] == [["rank 0", "cpu"], ["rank 1", "cpu"]]
    assert_collectives_line_up(doc)
    clock = clocks(doc)[1]
    truth = clock["clock_base_offset_us"]
    lo, hi = clock["bounds_us"]
    assert lo <= truth <= hi  # causality: holds whatever the noise
    # error_us says how well the calls line up after alignment (assert_collectives_line_up),
    # not how far the truth can be: on a loaded CPU one rank's gloo ends can lag the other's
    # every time, so only the causal interval bounds the true offset
    # each rank's events in the order its trace had them
    facts = doc["otherData"]
    for rank in (0, 1):
        src = cpu_run_dir / "traces" / f"rank{rank}.pt.trace.json.gz"
        want = [e["name"] for e in input_events(src) if e["ph"] == "X"]
        got = [e["name"] for e in doc["traceEvents"] if e["pid"] == pids[rank] and e["ph"] == "X"]
        assert got == want
    assert facts["ranks"][1]["clock"]["method"] == "collectives"
    html = (cpu_run_dir / "report.html").read_text()
    assert f'<a href="{DEFAULT_NAME}">' in html
    assert "rank 1: " in html and "from collectives" in html
    assert read_timeline_facts(cpu_run_dir / DEFAULT_NAME) == facts


def test_run_dir_default_output_is_replaced_and_report_names_the_command(
    cpu_run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    shutil.copytree(cpu_run_dir, run)
    (run / DEFAULT_NAME).unlink()
    proc = subprocess.run(
        [sys.executable, "-m", "mgprof", "report", str(run), "--format", "html"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    html = (run / "report.html").read_text()
    assert f"make it with <code>mgprof timeline {run}</code>" in html
    assert f'href="{DEFAULT_NAME}"' not in html
    assert main(["timeline", str(run), "--steps", "3:4", "--min-dur", "5"]) == 0  # none there
    assert f"wrote {run / DEFAULT_NAME}" in capsys.readouterr().out
    for _ in range(2):  # the file is there now: replaced with --force only
        assert main(["timeline", str(run), "--steps", "3:4", "--min-dur", "5", "--force"]) == 0
        assert f"wrote {run / DEFAULT_NAME}" in capsys.readouterr().out
    doc = load(run / DEFAULT_NAME)
    check_chrome(doc)
    facts = doc["otherData"]
    assert facts["steps"] == "3:4" and facts["min_dur_us"] == 5.0
    assert {r["rank"]: r["steps_found"] for r in facts["ranks"]} == {0: [3, 4], 1: [3, 4]}
    assert [p.name for p in run.iterdir() if p.name.endswith(".tmp")] == []


def test_a_timeline_failure_at_the_end_of_a_run_is_one_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from mgprof.records import RankRecord, RunRecord
    from mgprof.run.finalize import write_timeline

    run_dir = tmp_path / "run"
    (run_dir / "traces").mkdir(parents=True)
    (run_dir / "traces" / "rank0.pt.trace.json.gz").write_bytes(gzip.compress(b"not json"))
    (run_dir / "run.json").write_text("{}")
    run = RunRecord(ranks=[RankRecord(rank=0, world_size=1, traces=["traces/rank0.x"])])
    write_timeline(run_dir, run)  # must not raise
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mgprof: warning: no timeline.json.gz")
    assert f"mgprof timeline {run_dir}" in err[0]
    assert not (run_dir / DEFAULT_NAME).exists()
    assert [p.name for p in run_dir.iterdir() if p.name.endswith(".tmp")] == []


# --------------------------------------------------------------------------- the estimator


def pair(ref_end: float, skew: float, dur: float = 100.0, off: float = 0.0) -> tuple[Any, Any]:
    """The same call on two ranks: ends ``skew`` apart; the second rank's clock is ``off``
    behind (its ts + off = the reference's)."""
    a = Anchor("device", "all_reduce", None, None, 1, ref_end - dur, ref_end)
    b = Anchor(
        "device", "all_reduce", None, None, 1, ref_end - dur - off - 40, ref_end - off - skew
    )
    return a, b


def test_estimate_recovers_the_offset_despite_wrongly_matched_calls() -> None:
    off = -1234.5
    good = [pair(1000.0 * i, skew, off=off) for i, skew in enumerate([3, -2, 5, 0, -4, 1])]
    # calls matched wrongly (another group's call, a lost call): ends tens of ms apart
    bad = [pair(1000.0 * i + 500, 25_000 * (-1) ** i, off=off) for i in range(7)]
    est = estimate_offset(good + bad)
    assert est is not None and est.used == 6
    assert abs(est.offset_us - off) <= est.error_us <= 5.0
    assert est.bounds[0] <= off <= est.bounds[1]


def test_estimate_gives_up_when_no_two_calls_agree() -> None:
    calls = [pair(1e6 * i, 0.0, off=50_000.0 * i * i) for i in range(4)]
    assert estimate_offset(calls) is None
    one = estimate_offset([pair(0.0, 2.0, dur=10.0, off=7.0)])
    # one call: no spread to measure; the error is the causal interval's far end
    assert one is not None and one.used == 1
    assert one.bounds[0] <= 7.0 <= one.bounds[1] and one.error_us >= abs(one.offset_us - 7.0)


@pytest.mark.parametrize(
    ("text", "first", "last"),
    [("3:5", 3, 5), ("4", 4, 4), ("3:", 3, None), (":5", None, 5), (" 2 : 2 ", 2, 2)],
)
def test_parse_steps(text: str, first: int | None, last: int | None) -> None:
    got = parse_steps(text)
    assert (got.first, got.last) == (first, last)


@pytest.mark.parametrize("text", ["", ":", "a", "5:3", "-1", "1:2:3", "1.5"])
def test_parse_steps_refuses(text: str) -> None:
    with pytest.raises(UsageError):
        parse_steps(text)


def test_flows_keep_both_ends_and_the_slices_they_bind_to(tmp_path: Path) -> None:
    """Launch -> kernel arrows of a GPU trace, cut by steps and a duration floor: a flow is
    written with both ends, each on a slice that is written too, or not at all."""
    v100 = TRACES / "gpu-v100-single"
    doc, result = timeline([v100], tmp_path / "t.json.gz", steps=parse_steps("102:103"),
                           min_dur_us=3.0)  # fmt: skip
    check_chrome(doc)
    starts = {(e["tid"], e["ts"]) for e in doc["traceEvents"] if e["ph"] == "X"}
    flows = [e for e in doc["traceEvents"] if e["ph"] in ("s", "f")]
    assert flows and result.events.flows_dropped > 0
    for ev in flows:
        assert (ev["tid"], ev["ts"]) in starts, ev
    src = [e for e in input_events(next(v100.glob("*.json.gz"))) if e["ph"] in ("s", "f")]
    assert len(flows) + result.events.flows_dropped == len(src)
