"""The launcher and its processes under faults an adversarial probe found (docs/reliability.md):
a rank left running after its peer ended, a daemon the script double-forks, a gigantic line of
output, records lost to a full disk, the exit code after a stop, and torchrun's tracebacks.

Every test runs real ``mgprof analyze`` launches (torchrun + gloo CPU ranks) and asserts what
mgprof did, in bounded time.
"""

from __future__ import annotations

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
