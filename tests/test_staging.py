"""Trace staging: inside the run folder (or the output folder), never leaked.

A session stages its trace in ``<run>/.staging-rank<N>/`` under a launcher, else in
``<out>/.mgprof-staging-*``, and removes it on every way out (a normal stop, an exception in the
user's code, KeyboardInterrupt, exit without stop); nothing goes to the system temp folder
unless no output folder can be written, and then it is removed too. A rank killed outright
leaves its staging folder, and ``recover_staged`` moves its complete traces where the analysis
finds them and discards unfinished ones.
"""

from __future__ import annotations

import gzip
import json
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import torch
from _spawn import clean_env, python_args, run, write_script

import mgprof
from mgprof import rundir
from mgprof.analyze.trace.job import find_trace_files
from mgprof.collect.failopen import MgprofWarning
from mgprof.collect.session import session as session_module
from mgprof.collect.session import staging as staging_module
from mgprof.collect.session.staging import (
    OUT_PREFIX,
    RESERVE_NAME,
    STAGING_PREFIX,
    TEMP_PREFIX,
    incomplete_trace_reason,
    recover_staged,
)
from mgprof.records import read_run

STEPS = 6


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A private system temp folder (so "nothing left there" is this test's own claim), no
    report files, no launcher."""
    systemp = tmp_path / "systemp"
    systemp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(systemp))
    monkeypatch.setattr(session_module, "report_run", lambda run_dir, run, **kw: run)
    monkeypatch.delenv(rundir.RUN_DIR_ENV, raising=False)
    return systemp


def systemp_entries() -> list[str]:
    """mgprof's entries in the system temp folder (torch keeps its own caches there)."""
    return sorted(p.name for p in Path(tempfile.gettempdir()).iterdir() if "mgprof" in p.name)


def _staged(part: str) -> bool:
    return "staging" in part or part.startswith(TEMP_PREFIX)


def staged_anywhere(root: Path) -> list[Path]:
    """Staging folders below ``root`` and everything in them (the system temp folder aside)."""
    found = []
    for path in sorted(root.rglob("*")):
        parts = path.relative_to(root).parts
        if parts[0] != "systemp" and any(_staged(part) for part in parts):
            found.append(path)
    return found


def staging_folders(paths: list[Path]) -> list[Path]:
    return [p for p in paths if _staged(p.name)]


def loop(prof: mgprof.Session, seen: list[list[Path]], root: Path, fail_at: int = -1) -> None:
    model = torch.nn.Linear(8, 8)
    for i in range(STEPS):
        with prof.step(torch.zeros(4)):
            model(torch.randn(4, 8)).sum().backward()
            if i == fail_at:
                raise ValueError("the user's bug")
        if i == STEPS - 2:
            seen.append(
                staged_anywhere(root) + [Path(tempfile.gettempdir(), n) for n in systemp_entries()]
            )


def profile(out: Path) -> mgprof.Session:
    return mgprof.profile(out=out, name="stage", sample=False, skip=1, warmup=1, active=2)


# -- where it stages, and that it cleans up ---------------------------------------------------


def test_normal_stop_leaves_no_staging_and_nothing_in_the_system_temp_folder(
    tmp_path: Path,
) -> None:
    before = systemp_entries()
    out = tmp_path / "out"
    seen: list[list[Path]] = []
    with profile(out) as prof:
        loop(prof, seen, tmp_path)
    (during,) = seen
    assert [p.parent for p in staging_folders(during)] == [out]  # staged in the output folder
    assert any(p.name == "rank0.pt.trace.json.gz" for p in during)
    assert systemp_entries() == before == []
    assert staged_anywhere(tmp_path) == []
    assert prof.run_dir is not None and [p.name for p in out.iterdir()] == [prof.run_dir.name]
    assert read_run(prof.run_dir).ranks[0].traces == ["traces/rank0.pt.trace.json.gz"]


def test_under_a_launcher_it_stages_inside_the_run_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    monkeypatch.setenv(rundir.RUN_DIR_ENV, str(run_dir))
    seen: list[list[Path]] = []
    with profile(tmp_path / "unused") as prof:
        loop(prof, seen, tmp_path)
    (during,) = seen
    staging = run_dir / f"{STAGING_PREFIX}0"
    assert staging in during and (staging / RESERVE_NAME) in during
    assert (staging / "rank0.pt.trace.json.gz") in during
    assert staged_anywhere(tmp_path) == [] and systemp_entries() == []
    assert sorted(p.name for p in run_dir.iterdir()) == ["run.json", "traces"]
    assert [p.name for p in (run_dir / "traces").iterdir()] == ["rank0.pt.trace.json.gz"]


@pytest.mark.parametrize("error", [ValueError, KeyboardInterrupt])
def test_an_exception_in_the_users_code_removes_the_staging(
    tmp_path: Path, error: type[BaseException]
) -> None:
    seen: list[list[Path]] = []
    model = torch.nn.Linear(8, 8)
    with pytest.raises(error), profile(tmp_path / "out") as prof:
        for i in range(STEPS):
            with prof.step(torch.zeros(4)):
                model(torch.randn(4, 8)).sum().backward()
            if i == STEPS - 2:
                seen.append(staged_anywhere(tmp_path))
                raise error("the user's")
    assert any(p.name == "rank0.pt.trace.json.gz" for p in seen[0])
    assert staged_anywhere(tmp_path) == [] and systemp_entries() == []
    assert prof.run_dir is not None and read_run(prof.run_dir).status == "incomplete"


def test_an_unwritable_output_folder_stages_in_the_system_temp_folder_and_removes_it(
    tmp_path: Path,
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    seen: list[list[Path]] = []
    with pytest.warns(MgprofWarning) as record, profile(blocker / "runs") as prof:
        loop(prof, seen, tmp_path)
    (staging,) = seen[0]  # not beside the blocked output folder, but in the system temp folder
    assert staging.parent == Path(tempfile.gettempdir())
    assert staging.name.startswith(TEMP_PREFIX)
    assert systemp_entries() == []
    lines = [str(w.message) for w in record if "could not save rank 0's record" in str(w.message)]
    assert len(lines) == 1 and "Not a directory" in lines[0]
    assert prof.record is not None and any(w.startswith("staging: ") for w in prof.record.warnings)


# -- real processes: exit without stop, killed ranks -------------------------------------------

UNSTOPPED = """
import sys, torch, mgprof
prof = mgprof.profile(out="out", sample=False, skip=1, warmup=1, active=2, quiet=True)
prof.start()
model = torch.nn.Linear(8, 8)
for i in range(6):
    with prof.step(torch.zeros(4)):
        model(torch.randn(4, 8)).sum().backward()
sys.exit(0)  # never stopped: the atexit handler cleans up
"""

KILLED = """
import os, sys, time, torch, mgprof
how = sys.argv[1]
model = torch.nn.Linear(8, 8)
with mgprof.profile(sample=False, skip=1, warmup=1, active=2, quiet=True) as prof:
    for i in range(1000):
        with prof.step(torch.zeros(4)):
            model(torch.randn(4, 8)).sum().backward()
        if i == 5:  # the trace window (steps 2 and 3) closed: the trace is staged
            if how == "exit":
                os._exit(1)
            open("ready", "w").close()
            time.sleep(120)
"""


@pytest.mark.slow
@pytest.mark.parametrize("launcher", [True, False])
def test_a_session_never_stopped_is_cleaned_up_at_exit(tmp_path: Path, launcher: bool) -> None:
    script = write_script(tmp_path, "unstopped.py", UNSTOPPED)
    run_dir = tmp_path / "run"
    env = clean_env(TMPDIR=str(tmp_path / "systemp"))
    if launcher:
        run_dir.mkdir()
        env[rundir.RUN_DIR_ENV] = str(run_dir)
    result = run(python_args(script), cwd=tmp_path, env=env)
    assert result.returncode == 0, result.explain()
    assert staged_anywhere(tmp_path) == [], result.explain()
    assert systemp_entries() == []
    if launcher:  # its complete trace is kept where the analysis finds it
        trace = run_dir / "traces" / "rank0.pt.trace.json.gz"
        assert incomplete_trace_reason(trace) is None


@pytest.mark.slow
@pytest.mark.parametrize("how", ["exit", "sigkill"])
def test_a_killed_rank_leaves_staging_that_recover_staged_recovers(
    tmp_path: Path, how: str
) -> None:
    script = write_script(tmp_path, "killed.py", KILLED)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    env = clean_env(TMPDIR=str(tmp_path / "systemp"), **{rundir.RUN_DIR_ENV: str(run_dir)})
    proc = subprocess.Popen(
        python_args(script, how), cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True
    )
    if how == "sigkill":
        deadline = time.monotonic() + 120
        while not (tmp_path / "ready").exists() and proc.poll() is None:
            assert time.monotonic() < deadline, "the script never reached its step 5"
            time.sleep(0.1)
        proc.send_signal(signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == (-signal.SIGKILL if how == "sigkill" else 1), err
    staging = run_dir / f"{STAGING_PREFIX}0"
    assert (staging / "rank0.pt.trace.json.gz").is_file()  # what the dead rank left

    notes = recover_staged(run_dir)
    assert notes == [
        "rank 0: trace recovered from staging into traces/rank0.pt.trace.json.gz "
        "(the rank ended before it delivered its record)"
    ]
    assert not staging.exists()
    (files,) = find_trace_files([run_dir]).values()
    assert [p.name for p in files] == ["rank0.pt.trace.json.gz"]
    assert incomplete_trace_reason(files[0]) is None
    assert recover_staged(run_dir) == []  # nothing left to do


# -- recover_staged on what a rank can leave ----------------------------------------------------


def trace_bytes(rank: int) -> bytes:
    return json.dumps({"traceEvents": [{"name": "x", "ph": "X", "ts": 1, "dur": 2}],
                       "distributedInfo": {"rank": rank}}).encode()  # fmt: skip


def test_recover_staged_moves_complete_traces_and_discards_unfinished_ones(
    tmp_path: Path,
) -> None:
    one = tmp_path / f"{STAGING_PREFIX}1"
    two = tmp_path / f"{STAGING_PREFIX}2"
    one.mkdir()
    two.mkdir()
    (one / "rank1.pt.trace.json.gz").write_bytes(gzip.compress(trace_bytes(1)))
    whole = gzip.compress(trace_bytes(1) * 50)
    (one / "rank1.1.pt.trace.json.gz").write_bytes(whole[: len(whole) // 2])  # cut gzip
    (one / "host_rank1.pt.trace.json.gz").write_bytes(gzip.compress(trace_bytes(1)[:-5]))
    (one / "tmpab12cd.json").write_bytes(trace_bytes(1)[:10])  # the writer's raw export
    (one / "tmpab12cd.json.tmp").write_bytes(b"{")  # torch's own temp file
    (one / RESERVE_NAME).write_bytes(b"\0" * 16)
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "rank2.pt.trace.json.gz").write_bytes(gzip.compress(trace_bytes(2)))
    (two / "rank2.pt.trace.json.gz").write_bytes(gzip.compress(trace_bytes(2)))

    notes = recover_staged(tmp_path)

    assert len(notes) == 6, notes
    assert (
        "rank 1: trace recovered from staging into traces/rank1.pt.trace.json.gz "
        "(the rank ended before it delivered its record)" in notes
    )
    assert any("rank1.1.pt.trace.json.gz discarded: not a complete gzip file" in n for n in notes)
    assert any(
        "host_rank1.pt.trace.json.gz discarded: truncated or invalid JSON" in n for n in notes
    )
    assert sum("unfinished trace export" in n for n in notes) == 2
    assert any(
        n.startswith("rank 2: staged trace")
        and "traces/rank2.pt.trace.json.gz is already saved" in n
        for n in notes
    )
    assert sorted(p.name for p in (tmp_path / "traces").iterdir()) == [
        "rank1.pt.trace.json.gz",
        "rank2.pt.trace.json.gz",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["systemp", "traces"]


def test_recover_staged_with_nothing_staged_is_quiet(tmp_path: Path) -> None:
    assert recover_staged(tmp_path) == []
    assert recover_staged(tmp_path / "missing") == []


def test_incomplete_trace_reason_tells_a_chrome_trace(tmp_path: Path) -> None:
    good = tmp_path / "a.pt.trace.json"
    good.write_bytes(trace_bytes(0))
    assert incomplete_trace_reason(good) is None
    other = tmp_path / "b.pt.trace.json"
    other.write_text('{"nodes": []}')
    assert incomplete_trace_reason(other) == "not a Chrome trace (no traceEvents list)"


def test_staging_module_constants_match_the_run_layout() -> None:
    assert STAGING_PREFIX.startswith(".") and OUT_PREFIX.startswith(".")
    assert staging_module.RESERVE_BYTES > 0
