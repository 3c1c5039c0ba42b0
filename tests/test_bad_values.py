"""A value no one means (400 nines, 1e308) is one line and exit 2, never a traceback and never
a silently wrong result (reproducers from the reliability probe)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from _data import TRACES

from mgprof import rundir
from mgprof.records import RunRecord
from mgprof.safe_read import MAX_SIZE, parse_size

NINES = "9" * 400
TRACE_FOLDER = TRACES / "cpu-gloo-ddp-mlp-2ranks"


def _mgprof(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mgprof", *args],
        env={**os.environ, "MGPROF_NO_CACHE": "1", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def _one_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert len(lines[0]) < 300  # the 400 digits are not echoed back
    return lines[0]


@pytest.mark.parametrize("text", [NINES, "999999999999G", "2P", "inf", "1e308"])
def test_sizes_beyond_a_petabyte_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_size(text)
    assert parse_size("1P") == MAX_SIZE


def test_a_huge_trace_size_flag_or_variable_is_one_line() -> None:
    line = _one_line(_mgprof("trace", str(TRACE_FOLDER), "--max-trace-size", NINES))
    assert "--max-trace-size" in line and "1 PiB" in line
    line = _one_line(_mgprof("trace", str(TRACE_FOLDER), MGPROF_MAX_TRACE_BYTES=NINES))
    assert "MGPROF_MAX_TRACE_BYTES" in line


def test_a_huge_record_size_variable_is_one_line(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    rundir.write_run(run_dir, RunRecord(strategy="single", world_size=1))
    line = _one_line(_mgprof("report", str(run_dir), MGPROF_MAX_RECORD_BYTES=NINES))
    assert "MGPROF_MAX_RECORD_BYTES" in line


def test_a_run_json_with_a_rank_twice_is_one_line(tmp_path: Path) -> None:
    from mgprof.records import RankRecord

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    twice = [RankRecord(rank=0, world_size=2), RankRecord(rank=0, world_size=2)]
    rundir.write_run(run_dir, RunRecord(strategy="ddp", world_size=2, ranks=twice))
    line = _one_line(_mgprof("report", str(run_dir)))
    assert "rank 0's record twice" in line


def test_a_lone_surrogate_in_one_name_does_not_refuse_the_trace(tmp_path: Path) -> None:
    from mgprof.analyze.tracefile.load import load_trace

    src = sorted((TRACES / "gpu-v100-single").glob("*.json*"))[0]
    import gzip
    import json

    data = json.loads(gzip.decompress(src.read_bytes()) if src.suffix == ".gz" else src.read_text())
    kernel = next(e for e in data["traceEvents"] if e.get("cat") == "kernel")
    kernel["name"] = "odd\ud800kernel"
    path = tmp_path / "odd.json"
    path.write_text(json.dumps(data, ensure_ascii=True))  # the escape as a profiler writes it
    load_trace(path)  # raised "not valid JSON (... surrogate ...)" before
    proc = _mgprof("trace", "--json", "--top", "200", str(path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "odd\\\\ud800kernel" in proc.stdout  # shown as text, escaped, in the JSON


def test_view_refuses_a_fifo_named_like_a_trace(tmp_path: Path) -> None:
    traces = tmp_path / "run" / "traces"
    traces.mkdir(parents=True)
    os.mkfifo(traces / "rank0.pt.trace.json")
    line = _one_line(_mgprof("view", str(tmp_path / "run")))
    assert "is a FIFO" in line  # refused before TensorBoard starts and blocks in open()
