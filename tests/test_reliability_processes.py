"""The launcher and its processes under faults an adversarial probe found (docs/reliability.md):
a rank left running after its peer ended, a daemon the script double-forks, a gigantic line of
output, records lost to a full disk, the exit code after a stop, and torchrun's tracebacks.

Every test runs real ``mgprof analyze`` launches (torchrun + gloo CPU ranks) and asserts what
mgprof did, in bounded time.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import pytest
from _spawn import write_script
from test_reliability import DDP_PREAMBLE, analyze, finish, the_run

pytestmark = pytest.mark.slow


def test_a_rank_left_running_after_its_peer_ended_is_stopped_and_named(tmp_path: Path) -> None:
    """Rank 1 sleeps after its loop with no collective left: rank 0's record gather times out
    after --collective-timeout (5 s) and it exits; rank 1 then has 5 s more before mgprof stops
    it. It used to wait for ever with run.json ``running``."""
    script = write_script(
        tmp_path,
        "linger.py",
        DDP_PREAMBLE
        + """
for i in range(8):
    step()
if rank == 1:
    time.sleep(3600)
""",
    )
    args = ("--gpus", "2", "--collective-timeout", "5", "--trace-steps", "0")
    code, err, took = finish(*analyze(tmp_path, script, *args))
    assert took < 60, f"took {took:.0f} s"
    assert code != 0, err[-3000:]
    _, run = the_run(tmp_path)
    assert run.status == "incomplete", run.status
    error = run.error or ""
    assert error.startswith("rank 1 did not end within 5 s after rank 0 had ended"), error
    assert "mgprof stopped it" in error, error
    lines = script.read_text().splitlines()
    sleeping = next(i for i, ln in enumerate(lines, 1) if "time.sleep(3600)" in ln)
    assert f"when stopped: rank 1 at linger.py:{sleeping} in <module>" in error, error
    # what was recorded is kept: rank 0's steps are in the record
    zero = [r for r in run.ranks if r.rank == 0]
    assert zero and len(zero[0].steps) >= 4, [(r.rank, len(r.steps)) for r in run.ranks]
    assert run.exit_code == code


def _gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def test_a_double_forked_daemon_does_not_outlive_the_run(tmp_path: Path) -> None:
    """``fork; setsid; fork; exec sleep``: the middle process ends at once, so the daemon left
    the process tree before any scan could see it and ran on after mgprof. mgprof is the
    launch's child subreaper now: the daemon becomes its child and is ended with the run."""
    pid_file = tmp_path / "daemon.pid"
    script = write_script(
        tmp_path,
        "daemon.py",
        """
        import os, sys, time
        import torch
        model = torch.nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(4):
            model(torch.randn(4, 8)).sum().backward(); opt.step(); opt.zero_grad()
        middle = os.fork()
        if middle == 0:
            os.setsid()
            if os.fork() == 0:
                with open(sys.argv[1] + ".tmp", "w") as fh:
                    fh.write(str(os.getpid()))
                os.rename(sys.argv[1] + ".tmp", sys.argv[1])
                os.execvp("sleep", ["sleep", "600"])
            os._exit(0)
        os.waitpid(middle, 0)
        while not os.path.exists(sys.argv[1]):
            time.sleep(0.05)
        print("daemon started", flush=True)
        """,
    )
    code, err, _ = finish(*analyze(tmp_path, script, "--trace-steps", "0", "--", str(pid_file)))
    assert code == 0, err[-3000:]
    daemon = int(pid_file.read_text())
    try:
        assert _gone(daemon, within_s=5), f"the script's daemon {daemon} outlived the run"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(daemon, signal.SIGKILL)
    assert "ended 1 process(es) the script left running" in err, err[-3000:]
    _, run = the_run(tmp_path)
    assert run.status == "complete", run.error
