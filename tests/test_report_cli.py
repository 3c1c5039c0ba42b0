"""``mgprof report``: every format from a saved run.json, one-line errors, no torch needed."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mgprof.cli import main
from mgprof.records import RankRecord, RunRecord, StepRecord, decode_run, encode_run

ROOT = Path(__file__).resolve().parents[1]
HAS_HTML = importlib.util.find_spec("mgprof.report.html.page") is not None
FORMATS = ["term", "json", "md"] + (["html"] if HAS_HTML else [])


def write_run(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    run = RunRecord(
        run_id="20250101T000000Z-train",
        world_size=2,
        strategy="ddp",
        backend="gloo",
        cpu_fallback=True,
        cpu_fallback_reason="no CUDA device",
        ranks=[
            RankRecord(
                rank=r,
                world_size=2,
                # the same fingerprints on both ranks: the identical-batches finding must fire
                steps=[
                    StepRecord(index=i, duration_ms=20.0, batch_size=16, fingerprint=f"fp{i}")
                    for i in range(4)
                ],
            )
            for r in range(2)
        ],
        analysis={
            "findings": [
                {"severity": "low", "title": "stale finding", "evidence": "e", "change": "c"}
            ]
        },
    )
    (folder / "run.json").write_bytes(encode_run(run))
    return folder


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_to_stdout(
    fmt: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = write_run(tmp_path / "run")
    assert main(["report", str(folder), "--format", fmt]) == 0
    out = capsys.readouterr().out
    assert out.strip()
    if fmt == "json":
        back = decode_run(out.encode())
        assert back.analysis is not None
        # 3 steady steps x 16 samples / 60 ms = 800 samples/s per rank, 1600 for the job.
        assert back.analysis["job"]["samples_per_s"] == pytest.approx(1600.0)
        rules = [f["rule"] for f in back.analysis["findings"]]
        assert "identical_batches" in rules  # evaluated afresh; the stored one is replaced
        assert all(f["title"] != "stale finding" for f in back.analysis["findings"])
    elif fmt == "md":
        assert "## Step time per rank" in out and "1,600.0" in out
    elif fmt == "term":
        assert "Slowest rank" in out and "stale finding" not in out
        assert "identical" in out.lower()
    elif fmt == "html":  # a page is not printed: it goes beside run.json, its path is printed
        page = folder / "report.html"
        assert out == f"wrote {page}\n"
        assert page.read_text().lstrip().lower().startswith("<!doctype html")


def test_html_to_the_run_dir_replaces_only_the_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = write_run(tmp_path / "run")
    (folder / "report.html").write_text("old")
    before = (folder / "run.json").read_bytes()
    assert main(["report", str(folder / "run.json"), "--format", "html"]) == 0
    assert (folder / "report.html").read_text() != "old"
    assert (folder / "run.json").read_bytes() == before
    assert "wrote" in capsys.readouterr().out


@pytest.mark.skipif(HAS_HTML, reason="mgprof.report.html.page exists: html is a real format")
def test_html_not_offered_without_the_html_module(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = write_run(tmp_path / "run")
    with pytest.raises(SystemExit) as exc:
        main(["report", str(folder), "--format", "html"])
    assert exc.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_run_json_path_accepted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = write_run(tmp_path / "run")
    assert main(["report", str(folder / "run.json"), "--format", "json"]) == 0
    assert decode_run(capsys.readouterr().out.encode()).run_id == "20250101T000000Z-train"


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    return err


def test_missing_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert "does not exist" in one_line_error(capsys)


def test_dir_without_run_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path)]) == 2
    assert "not found" in one_line_error(capsys)


def test_non_json_run_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "run.json").write_text("not json {")
    assert main(["report", str(tmp_path), "--format", "md"]) == 2
    assert "not valid JSON" in one_line_error(capsys)


def test_newer_schema_version(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "run.json").write_text(json.dumps({"schema_version": 999, "ranks": []}))
    assert main(["report", str(tmp_path), "--format", "json"]) == 2
    assert "schema_version 999" in one_line_error(capsys)


def test_out_refuses_to_overwrite_without_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = write_run(tmp_path / "run")
    out = tmp_path / "report.md"
    out.write_text("precious")
    assert main(["report", str(folder), "--format", "md", "--out", str(out)]) == 2
    assert "--force" in one_line_error(capsys)
    assert out.read_text() == "precious"
    assert main(["report", str(folder), "--format", "md", "--out", str(out), "--force"]) == 0
    assert out.read_text().startswith("# mgprof report")
    fresh = tmp_path / "sub" / "report.json"
    assert main(["report", str(folder), "--format", "json", "--out", str(fresh)]) == 0
    assert decode_run(fresh.read_bytes()).analysis is not None
    assert capsys.readouterr().out == ""


def test_out_with_terminal_format_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = write_run(tmp_path / "run")
    assert main(["report", str(folder), "--out", str(tmp_path / "x.txt")]) == 2
    one_line_error(capsys)
    assert not (tmp_path / "x.txt").exists()


def test_report_path_works_without_torch(tmp_path: Path) -> None:
    """analyze/ and report/ (and the report command) import neither torch nor pynvml."""
    folder = write_run(tmp_path / "run")
    code = textwrap.dedent(
        f"""
        import argparse, sys
        sys.modules["torch"] = None
        sys.modules["pynvml"] = None
        import mgprof.analyze.stats, mgprof.analyze.run.analysis
        import mgprof.report.run.sections, mgprof.report.run.terminal
        import mgprof.report.run.as_json, mgprof.report.run.markdown
        from mgprof.commands import report
        for fmt in ("term", "json", "md"):
            args = argparse.Namespace(run_dir={str(folder)!r}, format=fmt, out=None, force=False)
            assert report.run(args) == 0
        # the whole CLI too: building the parser imports every command module
        from mgprof.cli import main
        for fmt in ("term", "json", "md", "html"):
            assert main(["report", {str(folder)!r}, "--format", fmt]) == 0
        assert "torch" not in [m for m in sys.modules if sys.modules[m] is not None]
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert "Step time per rank" in proc.stdout


@pytest.mark.parametrize("fmt", ["term", "json", "md"])
def test_report_renders_a_sweep_directory(
    fmt: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``mgprof report`` on a sweep directory (sweep.json, no run.json) renders the sweep."""
    from mgprof.analyze.sweep.result import Trial, summarize
    from mgprof.studies.sweep import write_sweep

    trials = [
        Trial(
            batch_size=b,
            status="ok",
            step_time_ms=t,
            samples_per_s=b / t * 1000,
            samples_per_s_per_device=b / t * 1000,
            peak_memory_mib=100 + b,
            global_batch=b,
        )
        for b, t in ((8, 10.0), (16, 11.0), (32, 12.0))
    ] + [Trial(batch_size=64, status="oom", global_batch=64)]
    result = summarize(trials, capacity_mib=1000.0)
    write_sweep(tmp_path, result)
    assert main(["report", str(tmp_path), "--format", fmt]) == 0
    out = capsys.readouterr().out
    if fmt == "json":
        back = json.loads(out)
        assert [t["batch_size"] for t in back["trials"]] == [8, 16, 32, 64]
    else:
        assert "32" in out and "oom" in out.lower()
