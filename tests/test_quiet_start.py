"""What a user sees first: mgprof's own line at once, no torch noise, a status line that owns the
terminal's last line (and none in a pipe), the noise kept in the rank logs.

The real runs start without OMP_NUM_THREADS, so torchrun prints its banner about it; the script
writes a line in the format of torch's ``USDT:`` profiler lines straight to file descriptor 2
(as the C++ profiler does, past Python's ``sys.stderr``), so the test does not depend on the torch
build printing its own.
"""

from __future__ import annotations

import io
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mgprof.report.progress import LaunchDisplay, LaunchFacts, start_line, step_status
from mgprof.run import relay
from tests._spawn import clean_env, write_script

SCRIPT = """
    import os
    import threading

    import torch
    from torch import nn

    print(f"script-start rank {os.environ.get('RANK', '0')} pid {os.getpid()}", flush=True)
    tid = threading.get_native_id()
    os.write(2, (
        f"USDT:2026-01-01 00:00:00 {os.getpid()}:{tid} SyncActivityProfilerHandler.cpp:52] "
        "profiler_start\\n"
    ).encode())
    model = nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(8):
        optimizer.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        optimizer.step()
    print("script-end", flush=True)
"""
NOISE = re.compile(r"USDT:|Setting OMP_NUM_THREADS environment variable|run\.py:\d+\] \*{5}")
SPINNER = set("⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏")
FIRST_LINE_S = 5.0
"""mgprof's first line comes well within this (about 0.3-0.7 s measured on a busy 2-core
machine; before, the first line was torchrun's banner after the torch import, 6-18 s)."""


def _env() -> dict[str, str]:
    env = clean_env()
    env.pop("OMP_NUM_THREADS")  # torchrun then prints its banner, which must not show
    return env


@pytest.mark.slow
def test_first_line_is_mgprofs_and_the_noise_goes_to_the_rank_logs(tmp_path: Path) -> None:
    script = write_script(tmp_path, "loop.py", SCRIPT)
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "mgprof", "analyze", str(script), "--gpus", "2", "--out", "runs"],
        cwd=tmp_path,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # one stream, in the order the terminal would show it
    )
    assert proc.stdout is not None
    lines: list[tuple[float, str]] = []
    for raw in iter(proc.stdout.readline, b""):
        lines.append((time.monotonic() - t0, raw.decode("utf-8", "replace")))
    assert proc.wait(timeout=300) == 0
    text = "".join(line for _, line in lines)
    first_at, first = lines[0]
    assert first.startswith("mgprof analyze: running "), text
    assert "loop.py" in first and "run directory runs/" in first and "2 " in first, first
    assert "CPU ranks over gloo" in first or "GPUs" in first, first
    assert first_at < FIRST_LINE_S, f"first line after {first_at:.2f} s"
    script_at = next(i for i, (_, line) in enumerate(lines) if line.startswith("script-start"))
    assert script_at > 0
    noise = [line for _, line in lines if NOISE.search(line)]
    assert not noise, noise
    # a pipe: no animation, no cursor movement
    assert "\r" not in text and "\x1b[" not in text, text
    assert not SPINNER & set(text) and "waiting for the first step" not in text

    run_dir = tmp_path / first.rsplit("run directory ", 1)[1].strip()
    pids = dict(re.findall(r"^script-start rank (\d+) pid (\d+)$", text, re.M))  # rank -> pid
    assert set(pids) == {"0", "1"}, text
    for rank, pid in pids.items():
        log = (run_dir / "logs" / f"rank{rank}.log").read_text()
        assert "Setting OMP_NUM_THREADS environment variable" in log, log  # torchrun's banner
        usdt = [ln for ln in log.splitlines() if ln.startswith("USDT:")]
        assert any(f" {pid}:" in ln for ln in usdt), log  # this rank's own line, in its log
        others = [ln for ln in usdt for o in pids if o != rank and f" {pids[o]}:" in ln]
        assert not others, log
        assert "script-start" in log and "script-end" in log  # the rank's own output still


@pytest.mark.slow
def test_on_a_terminal_a_status_line_owns_the_last_line(tmp_path: Path) -> None:
    script = write_script(tmp_path, "loop.py", SCRIPT)
    leader, follower = pty.openpty()
    env = {**_env(), "COLUMNS": "100", "LINES": "40", "TERM": "xterm-256color"}
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "mgprof", "analyze", str(script), "--steps", "3", "--out", "runs"],
        cwd=tmp_path,
        env=env,
        stdin=follower,
        stdout=follower,
        stderr=follower,
    )
    os.close(follower)
    data = bytearray()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the other end closed
                break
            if not chunk:
                break
            data += chunk
        elif proc.poll() is not None:
            break
    os.close(leader)
    assert proc.wait(timeout=60) == 0, data.decode("utf-8", "replace")[-3000:]
    out = data.decode("utf-8", "replace").replace("\r\n", "\n")
    assert out.startswith("mgprof analyze: running "), out[:500]
    assert "\r\x1b[2K" in out and "loop.py" in out  # the status line, drawn and redrawn
    assert not NOISE.search(out), out
    # the script's line comes whole, after the status line was cleared (--steps 3 stops the
    # script before its last line)
    at = out.index("script-start")
    assert out[at - 5 : at] == "\r\x1b[2K", out[at - 80 : at + 40]
    assert "script-end" not in out
    # the status line is gone before the report starts
    report = out.index("Setup")
    assert out.rfind("\r\x1b[2K", 0, report) > out.rfind("steps", 0, report), out[-4000:]


# -- the pieces, without processes ---------------------------------------------------------------


def _facts(**over: object) -> LaunchFacts:
    base: dict[str, object] = {
        "script": "train.py",
        "strategy": "ddp",
        "world_size": 2,
        "nproc_per_node": 2,
        "nnodes": 1,
        "node_rank": 0,
        "cuda": False,
        "backend": "gloo",
        "cpu_fallback_reason": "no CUDA device visible",
        "run_dir": "mgprof-runs/20260101T000000Z-train",
        "warmup": 2,
        "steps": None,
        "active": 3,
        "label": "train.py",
    }
    base.update(over)
    return LaunchFacts(**base)  # type: ignore[arg-type]


def test_start_line_says_what_runs_where_and_the_run_directory() -> None:
    line = start_line("analyze", _facts())
    assert line == (
        "mgprof analyze: running train.py under DDP on 2 CPU ranks over gloo (no CUDA device "
        "visible); 2 warm-up + 3 traced steps, then the script runs to its end; run directory "
        "mgprof-runs/20260101T000000Z-train"
    )
    gpu = start_line("analyze", _facts(cuda=True, backend="nccl", nproc_per_node=4, steps=10))
    assert "under DDP on 4 GPUs (nccl)" in gpu and "2 warm-up + 10 measured steps" in gpu
    assert "on 1 GPU" in start_line("analyze", _facts(strategy="single", cuda=True))
    assert "\x1b" not in start_line("analyze", _facts(script="evil\x1b[2J.py"))


def test_step_status_counts_to_the_expected_steps_with_the_time_left() -> None:
    facts = _facts(steps=10)
    assert step_status(facts, {}, 3.0, None).detail == "starting 2 ranks · 0:00:03"
    waiting = step_status(facts, {}, 4.0, None, started=2)
    assert waiting.detail.startswith("2/2 ranks running the script, waiting for the first step")
    status = step_status(facts, {0: 4, 1: 6}, 10.0, rate=2.0)
    assert (status.done, status.total) == (4, 12)  # the slowest rank; warm-up + measured
    assert "4/12 steps (ranks at 4-6) · about 0:00:04 left" in status.detail
    tracing = step_status(_facts(), {0: 3, 1: 3}, 5.0, None)
    assert (tracing.total, tracing.detail[:20]) == (5, "3/5 steps to trace, ")
    after = step_status(_facts(), {0: 9, 1: 9}, 8.0, None)
    assert after.total is None and "trace done, the script runs to its end" in after.detail
    ended = step_status(facts, {0: 12, 1: 12}, 9.0, None, started=2, finished=2)
    assert "2/2 ranks ended, records written" in ended.detail


class _Terminal(io.StringIO):
    """A text stream with a byte buffer, as sys.stderr is."""

    def __init__(self) -> None:
        super().__init__()
        self.buffer = io.BytesIO()

    def isatty(self) -> bool:
        return True


def test_display_prints_the_script_above_its_status_line_and_clears_it() -> None:
    term = _Terminal()
    now = [0.0]
    display = LaunchDisplay("analyze", stream=term, live=True, clock=lambda: now[0])
    display.started(_facts(steps=3))
    now[0] = 1.0
    display.progress({0: 1, 1: 1}, started=2)
    dest = io.BytesIO()
    display.relay(b"loss 0.5\n", dest)
    display.ended()
    drawn = term.buffer.getvalue()
    assert drawn.startswith(b"mgprof analyze: running train.py")
    assert b"1/5 steps" in drawn  # the status line
    assert dest.getvalue() == b"loss 0.5\n"  # the script's line, as it was
    assert drawn.endswith(b"\r\x1b[2K")  # cleared at the end
    # the line was cleared before the script's line and drawn again after it
    assert drawn.count(b"\r\x1b[2K") >= 4


def test_display_in_a_pipe_prints_the_first_line_only_and_quiet_prints_nothing() -> None:
    for enabled, want_first in ((True, True), (False, False)):
        term = io.StringIO()
        display = LaunchDisplay("analyze", enabled=enabled, stream=term)
        assert not display.live  # not a terminal
        display.started(_facts())
        display.progress({0: 3, 1: 3}, started=2)
        dest = io.BytesIO()
        display.relay(b"epoch 1\n", dest)
        display.message("mgprof: warning: crowded")  # warnings print even with --quiet
        display.ended()
        assert dest.getvalue() == b"epoch 1\n"
        shown = term.getvalue()
        assert shown.startswith("mgprof analyze: running ") == want_first, shown
        assert "mgprof: warning: crowded" in shown
        assert "\r" not in shown and "\x1b" not in shown


def test_noise_kinds() -> None:
    kind = relay.noise_kind
    line = b"USDT:2026-12-02 06:09:19 19965:19965 SyncActivityProfilerHandler.cpp:52] "
    line += b"profiler_start\n"
    assert kind(line) == "profiler" and relay.profiler_pid(line) == 19965
    assert kind(b"STAGE:2024-01-01 10:00:00 77:77 ActivityProfilerController.cpp:314] x\n")
    prefix = b"W1202 06:08:46.382000 19225 torch/distributed/run.py:874] "
    assert kind(prefix + b"\n") == "banner"
    assert kind(prefix + b"*****************************************\n") == "banner"
    assert kind(prefix + b"Setting OMP_NUM_THREADS environment variable for each process\n")
    # everything else reaches the terminal: torchrun's other lines, the script's
    assert kind(prefix + b"failed (exitcode: 1) local_rank: 0 (pid: 7) of binary\n") is None
    assert kind(b"E1202 06:08:46.382000 19225 torch/distributed/elastic/x.py:1] ***\n") is None
    assert kind(b"epoch 1 loss 0.3 USDT: in the middle\n") is None
    assert kind(b"Setting OMP_NUM_THREADS environment variable, said the script\n") is None


def test_rank_log_notes_wait_for_the_log_and_never_make_one(tmp_path: Path) -> None:
    from mgprof.run.ranklog import BoundedLog

    notes = relay.RankLogNotes(tmp_path)
    notes.add(None, b"banner for every rank\n")
    notes.add(1, b"USDT: rank 1's\n")
    assert not (tmp_path / "logs").exists()  # no rank started: nothing written, nothing made
    log = BoundedLog(tmp_path / "logs" / "rank1.log")  # rank 1 starts: its own log
    log.write(b"rank 1 says hi\n")
    notes.flush()
    log.write(b"rank 1 again\n")  # opened for appending: the launcher's lines stay
    log.sync()
    assert (tmp_path / "logs" / "rank1.log").read_bytes() == (
        b"rank 1 says hi\nUSDT: rank 1's\nbanner for every rank\nrank 1 again\n"
    )
    assert not (tmp_path / "logs" / "rank0.log").exists()


def test_progress_file_writes_the_count_the_throttle_held_back(tmp_path: Path) -> None:
    from mgprof.collect.session.progress import ProgressFile, read_progress

    progress = ProgressFile(str(tmp_path), 0, interval_s=0.2)
    progress.update(1)
    progress.update(2)  # within the interval: held back...
    assert read_progress(tmp_path) == {0: 1}
    time.sleep(0.5)  # ...and written when the interval is over
    assert read_progress(tmp_path) == {0: 2}
    progress.update(3)
    progress.flush()  # at exit
    assert read_progress(tmp_path) == {0: 3}


def test_a_study_prints_its_own_first_line_once_at_its_first_launch() -> None:
    term = io.StringIO()
    display = LaunchDisplay(
        "compare", stream=term, first_line=lambda facts: f"mgprof compare: {facts.label} first"
    )
    display.line("mgprof compare: running single ...")  # a study's lines print as they come
    for label in ("single-train", "ddp-train"):
        display.started(_facts(label=label))
        display.ended()
    assert term.getvalue().splitlines() == [
        "mgprof compare: running single ...",
        "mgprof compare: single-train first",
    ]


def test_a_profiler_line_read_after_its_process_ended_still_finds_its_rank() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)"], env={**os.environ, "RANK": "3"}
    )
    try:
        rank_of = relay.RankOfPid(one_process=False)
        time.sleep(0.3)
        rank_of.learn([child.pid, os.getpid()])  # the launcher's scan, while it runs
    finally:
        child.kill()
        child.wait()
    assert rank_of(child.pid) == 3  # gone now: remembered
    assert relay.RankOfPid(one_process=True)(12345) == 0  # one process: always rank 0


def test_profiler_lines_merged_by_two_ranks_are_split_and_their_newlines_not_relayed(
    tmp_path: Path,
) -> None:
    """The C++ logger writes a line and its newline apart: two ranks' lines arrive as one."""
    usdt = b"USDT:2026-12-02 07:21:39 %d:%d SyncActivityProfilerHandler.cpp:59] profiler_stop"
    merged = usdt % (11, 11) + usdt % (22, 22) + b"\n"
    noise, rest = relay.split_noise(merged)
    assert [relay.profiler_pid(text) for _, text in noise] == [11, 22] and rest == b""
    inside = b"epoch 3 loss 0.25" + usdt % (11, 11) + b"\n"
    noise, rest = relay.split_noise(inside)
    assert rest == b"epoch 3 loss 0.25\n" and len(noise) == 1
    assert relay.split_noise(b"epoch 4\n") == ([], b"epoch 4\n")

    read_end, write_end = os.pipe()
    os.write(write_end, merged + b"\n" + inside + b"\n" + b"\nafter a blank line\n")
    os.close(write_end)
    notes = relay.RankLogNotes(tmp_path)
    (tmp_path / "logs").mkdir()
    for rank in (1, 2):
        (tmp_path / "logs" / f"rank{rank}.log").write_bytes(b"")
    dest = io.BytesIO()
    tail = relay.Tail(os.fdopen(read_end, "rb"), dest, 10, notes=notes, rank_of={11: 1, 22: 2}.get)
    tail.join()
    # the two newlines owed are swallowed; a blank line of the script's own still shows
    assert dest.getvalue() == b"epoch 3 loss 0.25\n\nafter a blank line\n"
    assert tail.hidden == 3
    assert (tmp_path / "logs" / "rank1.log").read_bytes().count(b"profiler_stop") == 2
    assert (tmp_path / "logs" / "rank2.log").read_bytes().count(b"profiler_stop") == 1
