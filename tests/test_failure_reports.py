"""Failures are reported so a user can act on them: per-rank logs, the first failing rank with
its exception, a short failure report, and "no optimizer step" said as such.

Three real ``mgprof analyze`` launches (a DDP crash on rank 1, a script that resumes a finished
checkpoint, a single process that fails before its first step after flooding its log); the rest
runs in-process on synthetic records and logs.
"""

from __future__ import annotations

import io
import re
import sys
from pathlib import Path

import msgspec
import pytest
from _spawn import Result, clean_env, python_args, run, write_script
from rich.console import Console

from mgprof.analyze.run.analysis import analyze_run
from mgprof.analyze.run.schema import RunAnalysis, decode_analysis
from mgprof.records import RankExit, RankRecord, RunRecord, StepRecord, read_run
from mgprof.report import failure_summary as fs
from mgprof.report.run.markdown import run_to_markdown
from mgprof.report.run.terminal import render_run
from mgprof.run import launcher as launch
from mgprof.run import ranklog

SCRIPTS = Path(__file__).resolve().parent / "scripts"
TIMEOUT_S = 240

VALUE_ERROR_TB = """Traceback (most recent call last):
  File "/site/mgprof/run/bootstrap.py", line 204, in main
    runpy.run_path(str(script), run_name="__main__")
  File "<frozen runpy>", line 291, in run_path
  File "<frozen runpy>", line 98, in _run_module_code
  File "<frozen runpy>", line 88, in _run_code
  File "/home/user/train.py", line 23, in <module>
    raise ValueError("bad batch shape on purpose")
ValueError: bad batch shape on purpose
"""
PEER_TB = """Traceback (most recent call last):
  File "/home/user/train.py", line 18, in <module>
    model(x).sum().backward()
RuntimeError: [../gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:1234
"""


def record_error(tb: str) -> str:
    """A rank record's ``error`` as bootstrap writes it: last line, then the traceback."""
    return tb.strip().splitlines()[-1] + "\n" + tb


def mgprof_analyze(tmp_path: Path, *args: str) -> tuple[Result, Path, RunRecord]:
    result = run(
        python_args("-m", "mgprof", "analyze", "--out", "runs", *args),
        cwd=tmp_path,
        env=clean_env(COLUMNS="100"),
        timeout_s=TIMEOUT_S,
    )
    dirs = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()]
    assert len(dirs) == 1, result.explain()
    return result, dirs[0], read_run(dirs[0])


# -- real launches ------------------------------------------------------------------------------


ABORT_MID_TRAINING = """
import os
import torch
from torch import nn

model = nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(8):
    optimizer.zero_grad()
    model(torch.randn(4, 8)).pow(2).mean().backward()
    optimizer.step()
    if step == 5:
        os.abort()
"""


@pytest.mark.slow
@pytest.mark.parametrize("gpus", ["2", "1"])
def test_a_crash_after_the_script_finished_is_not_a_failed_training(
    tmp_path: Path, gpus: str
) -> None:
    """torch's gloo can abort a rank at interpreter exit, after the training is done; the run's
    records are complete, so the run is complete, with the exit code and a note saying where
    the crash came (``atexit_abort.py`` aborts in an atexit handler)."""
    result, run_dir, run_record = mgprof_analyze(
        tmp_path, str(SCRIPTS / "atexit_abort.py"), "--gpus", gpus, "--quiet"
    )
    assert result.returncode == 128 + 6, result.explain()  # the process's, as a shell says it
    assert run_record.status == "complete" and run_record.error is None
    assert run_record.exit_note is not None and "SIGABRT" in run_record.exit_note
    assert "after the script had finished" in run_record.exit_note
    assert len(run_record.ranks) == int(gpus)
    assert not (run_dir / ".finished").exists()
    assert "interpreter teardown" in (run_dir / "report.md").read_text()


@pytest.mark.slow
def test_a_crash_during_training_is_still_a_failure(tmp_path: Path) -> None:
    script = write_script(tmp_path, "abort_mid.py", ABORT_MID_TRAINING)
    result, _, run_record = mgprof_analyze(tmp_path, str(script), "--gpus", "2", "--quiet")
    assert result.returncode == 128 + 6, result.explain()
    assert run_record.status == "incomplete" and run_record.exit_note is None
    assert run_record.error is not None and "SIGABRT" in run_record.error


@pytest.mark.slow
def test_ddp_crash_on_rank1_names_it_keeps_logs_and_reports_briefly(tmp_path: Path) -> None:
    result, run_dir, rec = mgprof_analyze(
        tmp_path, str(SCRIPTS / "crash_rank1.py"), "--gpus", "2", "--quiet"
    )
    assert result.returncode != 0, result.explain()
    error = rec.error or ""
    assert rec.status == "incomplete"
    assert "rank 1 failed first: ValueError: bad batch shape on purpose" in error, error
    assert "logs/rank1.log" in error and "\n" not in error
    # each rank's output is kept apart, traceback included
    log1 = (run_dir / "logs" / "rank1.log").read_text()
    assert "Traceback (most recent call last):" in log1
    assert 'raise ValueError("bad batch shape on purpose")' in log1
    assert "rank 1 step 1 done" in log1 and "rank 0 step" not in log1
    assert "rank 0 step 0 done" in (run_dir / "logs" / "rank0.log").read_text()
    # the terminal report: a short failure summary, no empty tables
    out = result.stdout
    assert "rank 1 failed first: ValueError: bad batch shape on purpose" in out, out
    assert "Run failed" in out and "end of rank 1's traceback" in out
    assert 'raise ValueError("bad batch shape on purpose")' in out
    assert "Step time per rank" not in out and "n/a [" not in out
    report = out[out.index("Run failed") :]
    assert len(report.splitlines()) < 60, report
    after_setup = report[report.index("Setup") :]
    assert len(after_setup.splitlines()) < 40, after_setup
    md = (run_dir / "report.md").read_text()
    assert "## Run failed" in md and "## Step time per rank" not in md
    assert "ValueError: bad batch shape on purpose" in md


@pytest.mark.slow
def test_resumed_finished_run_says_no_optimizer_step_and_exits_0(tmp_path: Path) -> None:
    import torch

    torch.save({"epoch": 3, "model": torch.nn.Linear(8, 2).state_dict()}, tmp_path / "ckpt.pt")
    result, run_dir, rec = mgprof_analyze(
        tmp_path,
        str(SCRIPTS / "resume_finished.py"),
        "--quiet",
        "--",
        "--resume",
        "ckpt.pt",
        "--epochs",
        "3",
    )
    # mgprof analyze exits with the script's code: it trained nothing, but it did not fail
    assert result.returncode == 0, result.explain()
    assert rec.error == "the script made no optimizer step; nothing to measure (exit code 0)"
    assert rec.missing_ranks == [] and rec.exit_code == 0
    assert "made no optimizer step" in result.stdout
    assert "no record from rank" not in result.stdout + result.stderr
    assert "missing ranks" not in result.stdout
    assert "Step time per rank" not in result.stdout
    assert "resumed at epoch 3 of 3" in (run_dir / "logs" / "rank0.log").read_text()


@pytest.mark.slow
def test_failure_before_any_step_is_read_from_a_bounded_log(tmp_path: Path) -> None:
    """No record (no optimizer step yet): the exception comes from the rank's log, which keeps
    its first and last MiB of a 3 MiB flood."""
    script = write_script(
        tmp_path,
        "flood.py",
        """
        import sys
        line = "x" * 1023 + "\\n"
        print("first line of the flood")
        for _ in range(3 * 1024):
            sys.stdout.write(line)
        print("last line of the flood")
        raise KeyError("no such column: 'label'")
        """,
    )
    result, run_dir, rec = mgprof_analyze(tmp_path, str(script), "--quiet")
    assert result.returncode == 1, result.stderr[-3000:]
    error = rec.error or ""
    assert error.startswith("script exited with code 1: KeyError: \"no such column: 'label'\"")
    assert "logs/rank0.log" in error and not rec.ranks
    log = (run_dir / "logs" / "rank0.log").read_bytes()
    assert len(log) <= ranklog.HEAD_BYTES + ranklog.TAIL_BYTES + 100
    assert log.startswith(b"first line of the flood\n")
    assert re.search(rb"\n\[\xe2\x80\xa6 \d+ bytes cut \xe2\x80\xa6\]\n", log)
    assert b"last line of the flood" in log and log.rstrip().endswith(b"'label'\"")
    assert "KeyError" in result.stdout and "logs/rank0.log" in result.stdout


# -- the bounded log and the tee ----------------------------------------------------------------


def test_bounded_log_keeps_head_and_tail_with_a_marker(tmp_path: Path) -> None:
    log = ranklog.BoundedLog(tmp_path / "logs" / "rank3.log", head_bytes=100, tail_bytes=60)
    lines = [f"line {i:04d}\n".encode() for i in range(500)]  # 10 bytes each, 5000 in all
    for line in lines:
        log.write(line)
        assert log.path.stat().st_size <= 100 + 2 * 60 + 40  # bounded while running, too
    log.sync()
    data = log.path.read_bytes()
    assert data == log.contents()
    assert data.startswith(b"".join(lines[:10]))  # the first 100 bytes
    assert data.endswith(b"".join(lines[-6:]))  # the last 60 bytes
    assert f"\n[… {5000 - 160} bytes cut …]\n".encode() in data
    assert len(data) == 160 + len(ranklog.cut_marker(5000 - 160))


def test_bounded_log_without_a_cut_is_the_output(tmp_path: Path) -> None:
    log = ranklog.BoundedLog(tmp_path / "r.log", head_bytes=1000, tail_bytes=1000)
    log.write(b"partial ")  # a partial line waits for its end...
    log.write(b"line\nnext")
    log.flush()  # ...or a flush
    assert log.path.read_bytes() == b"partial line\nnext"
    log.sync()
    assert log.path.read_bytes() == b"partial line\nnext" and log.cut == 0


def test_tee_fails_open_and_forwards(tmp_path: Path) -> None:
    log = ranklog.BoundedLog(tmp_path / "r.log")
    stream = io.StringIO()
    tee = ranklog.Tee(stream, log)
    assert tee.write("one\n") == 4
    assert tee.getvalue() == "one\n"  # anything else is the original stream's
    assert log._fh is not None
    log._fh.close()  # the log's file breaks (disk full, folder gone...)
    print("two", file=tee)
    tee.writelines(["three\n"])
    tee.flush()
    assert stream.getvalue() == "one\ntwo\nthree\n" and log.broken
    assert log.path.read_bytes() == b"one\n"


def test_start_tees_stdout_and_stderr_into_the_ranks_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setattr(ranklog, "_active", None)
    monkeypatch.delenv(ranklog.RUN_DIR_ENV, raising=False)
    assert ranklog.start() is None and sys.stdout is out  # no run directory: nothing to do
    monkeypatch.setenv(ranklog.RUN_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("RANK", "5")
    path = ranklog.start()
    assert path == tmp_path / "logs" / "rank5.log"
    print("to stdout")
    print("to stderr", file=sys.stderr)
    ranklog.flush()
    assert out.getvalue() == "to stdout\n" and err.getvalue() == "to stderr\n"
    assert path.read_text() == "to stdout\nto stderr\n"


# -- the one-line error -------------------------------------------------------------------------


def exits_rank1_first() -> list[RankExit]:
    return [
        RankExit(rank=1, local_rank=1, exit_code=1, root_cause=True),
        RankExit(rank=0, local_rank=0, exit_code=143, signal="SIGTERM"),
    ]


def test_error_line_names_the_first_rank_its_exception_and_log(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "rank1.log").write_text(VALUE_ERROR_TB)
    errors = {1: record_error(VALUE_ERROR_TB), 0: "exited with code 143"}
    line = launch._failure(1, exits_rank1_first(), [], errors, tmp_path, 2)
    assert line == (
        "script exited with code 1: rank 1 failed first: ValueError: bad batch shape on purpose "
        f"(log: {tmp_path / 'logs' / 'rank1.log'}); then rank 0 exited with code 143 (SIGTERM)"
    )


def test_a_rank_dying_of_its_peer_is_not_first(tmp_path: Path) -> None:
    """torchrun may observe the peer's socket error first; the real cause is the other rank."""
    exits = [
        RankExit(rank=0, local_rank=0, exit_code=1, root_cause=True),
        RankExit(rank=1, local_rank=1, exit_code=1),
    ]
    errors = {0: record_error(PEER_TB), 1: record_error(VALUE_ERROR_TB)}
    line = launch._failure(1, exits, [], errors, tmp_path, 2)
    assert "rank 1 failed first: ValueError: bad batch shape on purpose" in line
    assert "then rank 0 exited with code 1" in line and "(log:" not in line  # no log here


def test_rank_without_record_is_read_from_its_log(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "rank1.log").write_text("loading data\n" + VALUE_ERROR_TB)
    line = launch._failure(1, exits_rank1_first(), [], {}, tmp_path, 2)
    assert "rank 1 failed first: ValueError: bad batch shape on purpose (log: " in line


def test_killed_rank_and_single_process_fallbacks(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    # a handled traceback in a killed rank's log is not what killed it
    (tmp_path / "logs" / "rank1.log").write_text(VALUE_ERROR_TB)
    killed = [RankExit(rank=1, local_rank=1, exit_code=-9, signal="SIGKILL", root_cause=True)]
    line = launch._failure(1, killed, [], {}, tmp_path, 2)
    assert line.startswith("script exited with code 1: rank 1 was killed by SIGKILL (exit code -9)")
    assert "ValueError" not in line
    # one process: the script is rank 0, no "first" to name
    (tmp_path / "logs" / "rank0.log").write_text(VALUE_ERROR_TB)
    line = launch._failure(1, [], ["stderr tail"], {}, tmp_path, 1)
    assert line.startswith("script exited with code 1: ValueError: bad batch shape on purpose")
    # nothing to read: the last stderr line, as before
    assert launch._failure(3, [], ["", "bye"], {}, tmp_path / "none", 1) == (
        "script exited with code 3: bye"
    )


def test_exception_text_reads_chained_multiline_and_syntax_errors() -> None:
    chained = (
        VALUE_ERROR_TB
        + "\nDuring handling of the above exception, another exception occurred:\n\n"
        + 'Traceback (most recent call last):\n  File "x.py", line 3, in <module>\n'
        + "    f()\nRuntimeError: second\nwith more lines\n"
    )
    assert fs.exception_text(chained) == "RuntimeError: second …"
    assert fs.exception_text(record_error(VALUE_ERROR_TB)) == (
        "ValueError: bad batch shape on purpose"
    )
    syntax = (
        'Traceback (most recent call last):\n  File "t.py", line 2\n    def (\n        ^\n'
        "SyntaxError: invalid syntax\n"
    )
    assert fs.exception_text(syntax) == "SyntaxError: invalid syntax"
    assert fs.exception_text("exited with code 3") is None
    assert fs.exception_text(VALUE_ERROR_TB.replace("on purpose", "x" * 500), limit=40) == (
        "ValueError: bad batch shape " + "x" * 11 + "…"
    )
    tail = fs.traceback_tail(record_error(VALUE_ERROR_TB))
    assert tail[0] == "Traceback (most recent call last):" and tail[-1].startswith("ValueError")
    assert not any("bootstrap.py" in t or "runpy" in t for t in tail)


def test_finalize_says_no_optimizer_step_without_missing_ranks(tmp_path: Path) -> None:
    initial = RunRecord(run_id="r", world_size=2, strategy="ddp", status="running")
    rec = launch.finalize(tmp_path, initial, 0, [], False)
    assert rec.error == "the script made no optimizer step; nothing to measure (exit code 0)"
    assert rec.missing_ranks == [] and rec.status == "incomplete"
    failed = launch.finalize(tmp_path, initial, 2, ["usage: train.py"], False)
    assert failed.error is not None and failed.error.startswith("script exited with code 2")
    assert failed.missing_ranks == [0, 1] and "no record from rank(s) 0, 1" in failed.error


# -- the failure report -------------------------------------------------------------------------


def failed_run(tmp_path: Path, steps: int) -> tuple[RunRecord, RunAnalysis]:
    ranks = [
        RankRecord(
            rank=r,
            world_size=2,
            steps=[StepRecord(index=i, duration_ms=10.0 + i) for i in range(steps)],
            error=record_error(VALUE_ERROR_TB if r == 1 else PEER_TB),
        )
        for r in (0, 1)
    ]
    rec = RunRecord(
        run_id="crash",
        world_size=2,
        strategy="ddp",
        status="incomplete",
        exit_code=1,
        error="script exited with code 1: rank 1 failed first: ValueError: bad batch shape on "
        "purpose (log: runs/crash/logs/rank1.log); then rank 0 exited with code 1",
        ranks=ranks,
        rank_exits=exits_rank1_first(),
    )
    return rec, decode_analysis(analyze_run(rec, tmp_path))


def terminal(rec: RunRecord, analysis: RunAnalysis) -> str:
    console = Console(file=io.StringIO(), width=100, color_system=None)
    render_run(rec, analysis, console)
    out = console.file.getvalue()  # type: ignore[attr-defined]
    return str(out)


def test_failure_report_with_steps_puts_the_summary_before_the_full_report(
    tmp_path: Path,
) -> None:
    rec, analysis = failed_run(tmp_path, steps=6)
    out = terminal(rec, analysis)
    assert out.index("Run failed") < out.index("Setup") < out.index("Step time per rank")
    assert "the figures below cover the steps recorded before the failure" in out
    assert out.count("Connection closed by peer") == 1  # tracebacks are not repeated in Setup
    md = run_to_markdown(rec, analysis)
    assert md.index("## Run failed") < md.index("## Setup") < md.index("## Step time per rank")


def test_failure_report_with_too_few_steps_is_short(tmp_path: Path) -> None:
    rec, analysis = failed_run(tmp_path, steps=1)
    out = terminal(rec, analysis)
    assert "Step time per rank" not in out and "Findings" not in out
    assert "failed first  rank 1: ValueError: bad batch shape on purpose" in out
    assert "logs/rank1.log" in out and "too few steps for figures" in out
    assert len(out.splitlines()) < 40, out
    # one row per rank, with how it ended
    assert re.search(r"\n0\s+1\s+RuntimeError: .*Connection closed by peer", out), out
    assert re.search(r"\n1\s+1\s+ValueError: bad batch shape on purpose", out), out


def test_markdown_traceback_block_cannot_be_closed_from_inside(tmp_path: Path) -> None:
    rec, analysis = failed_run(tmp_path, steps=1)
    evil = VALUE_ERROR_TB.replace('"bad batch shape on purpose"', '"```\\n<img src=x>"')
    ranks = [msgspec.structs.replace(rec.ranks[0], error=record_error(evil)), rec.ranks[1]]
    rec = msgspec.structs.replace(rec, ranks=ranks, error="rank 0 failed first: boom")
    md = run_to_markdown(rec, analysis)
    assert "\n````text\n" in md and "<img" in md.split("````text")[1].split("````")[0]
    assert "<img" not in md.replace(md.split("````text")[1].split("````")[0], "")


def test_large_job_ranks_are_grouped() -> None:
    assert fs.rank_ranges([7, 0, 2, 3, 4, 5, 6]) == "0, 2-7"
    exits = {r: RankExit(rank=r, exit_code=143, signal="SIGTERM") for r in range(64) if r != 9}
    exits[9] = RankExit(rank=9, exit_code=-9, signal="SIGKILL", root_cause=True)
    rec = RunRecord(
        world_size=64,
        status="incomplete",
        exit_code=1,
        missing_ranks=list(range(64)),
        rank_exits=list(exits.values()),
    )
    summary = fs.failure_summary(rec, RunAnalysis())
    assert summary is not None
    rows = summary.section.tables[0].rows
    assert rows == [
        ["0-8, 10-63", "no record", "exit code 143 (SIGTERM)"],
        ["9", "no record", "killed by SIGKILL (exit code -9)"],
    ]
    assert ("failed first", "rank 9: killed by SIGKILL (exit code -9)") in summary.section.facts
