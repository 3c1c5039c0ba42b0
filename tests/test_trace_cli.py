"""``mgprof trace`` end to end through ``mgprof.cli.main``: JSON keys, files, and bad input."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest
from _data import TRACES

from mgprof.cli import main

CONTRACT = [
    "window_us",
    "busy_pct",
    "idle_pct",
    "compute_pct",
    "comm_pct",
    "comm_overlap_pct",
    "exposed_comm_pct",
]


@pytest.mark.parametrize("folder", ["cpu-gloo-ddp-mlp-2ranks", "gpu-nccl-128ranks-sampled"])
def test_json_keys_on_fixture_dirs(folder: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trace", "--json", "--workers", "1", str(TRACES / folder)]) == 0
    text = capsys.readouterr().out
    doc = json.loads(text)
    # the fast indenting writes what json.dumps(indent=2) writes, byte for byte
    assert text == json.dumps(doc, indent=2) + "\n"
    assert set(doc) == {"schema_version", "jobs"}
    (job,) = doc["jobs"]
    assert set(job) == {
        "directory",
        "ranks",
        "cross_rank",
        "slowest_rank",
        "not_applicable",
        "definitions",
    }
    assert [r["rank"] for r in job["ranks"]] == [0, 1]
    assert job["slowest_rank"] in (0, 1) and job["cross_rank"]["matched_calls"] > 0
    for r in job["ranks"]:
        assert list(r)[:3] == ["rank", "source", "kind"]
        assert list(r)[3:10] == CONTRACT
        assert {"definitions", "not_applicable", "steps", "collectives", "top_kernels"} <= set(r)
        for key in CONTRACT:
            assert r[key] is None or isinstance(r[key], float)
            if r[key] is None:
                assert key in r["not_applicable"]
            else:
                assert key in r["definitions"]


def test_json_text_is_json_dumps_indent_2() -> None:
    """Non-ASCII text (escaped), empty containers, small and large floats, nesting."""
    from mgprof.commands.trace import _dumps

    data = {
        "why": "first \u2026 last \u222a gloo:*",
        "none": None,
        "empty": [[], {}],
        "x": [1e-07, 1e16, 0.1, -3, 2.5e-300, True],
        "deep": {"a": [{"b": {"c": []}}]},
    }
    assert _dumps(data) == json.dumps(data, indent=2) + "\n"


def test_out_file_atomic_and_no_overwrite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "trace.json"
    src = str(TRACES / "amd-mi250")
    assert main(["trace", src, "--out", str(out)]) == 0
    first = json.loads(out.read_text())
    assert first["jobs"][0]["ranks"][0]["kind"] == "gpu"
    assert main(["trace", src, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--force" in err[0]
    assert main(["trace", src, "--out", str(out), "--force"]) == 0


def test_terminal_rendering(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trace", str(TRACES / "gpu-nccl-a100-rank0of2")]) == 0
    text = capsys.readouterr().out
    assert "Trace-window totals" in text and "all_reduce" in text and "one rank only" in text


def _bad_inputs(tmp: Path) -> dict[str, Path]:
    (tmp / "empty.json").write_bytes(b"")
    (tmp / "trunc.json.gz").write_bytes(gzip.compress(b'{"traceEvents": []}' * 50)[:-10])
    (tmp / "other.json").write_text('{"name": "package.json", "version": 1}')
    (tmp / "noevents.json").write_text('{"traceEvents": [{"ph": "i", "ts": 1, "name": "x"}]}')
    (tmp / "emptydir").mkdir()
    cases = {n: tmp / n for n in ("empty.json", "trunc.json.gz", "other.json", "noevents.json")}
    cases["emptydir"] = tmp / "emptydir"
    cases["missing"] = tmp / "does-not-exist"
    return cases


@pytest.mark.parametrize(
    "case", ["empty.json", "trunc.json.gz", "other.json", "noevents.json", "emptydir", "missing"]
)
def test_bad_input_exit_2_one_line_nothing_written(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _bad_inputs(tmp_path)[case]
    out = tmp_path / "out" / "result.json"
    assert main(["trace", str(path), "--json", "--out", str(out)]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mgprof trace: error: ")
    assert str(path) in lines[0]
    assert captured.out == ""
    assert not out.exists() and not (tmp_path / "out").exists()


def test_a_run_directory_is_read_as_its_traces(cpu_run_dir: Path) -> None:
    """``mgprof trace RUN_DIR``: the ranks of traces/, never run.json or the merged timeline
    (a valid Chrome trace of every rank at once) that mgprof wrote beside them."""
    assert (cpu_run_dir / "timeline.json.gz").is_file()
    proc = subprocess.run(
        [sys.executable, "-m", "mgprof", "trace", str(cpu_run_dir), "--json", "--workers", "1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    (job,) = json.loads(proc.stdout)["jobs"]
    assert [Path(r["source"]).name for r in job["ranks"]] == [
        "rank0.pt.trace.json.gz",
        "rank1.pt.trace.json.gz",
    ]
    assert [r["rank"] for r in job["ranks"]] == [0, 1]
