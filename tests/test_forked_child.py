"""A child the script forks and leaves running is ended with the run, and it never writes the
rank's record: it used to inherit mgprof's SIGTERM path and, when mgprof ended it, rewrite rank
0's record as "exited with code 143" with no traces, although the training finished."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from _spawn import write_script
from test_reliability import analyze, finish, the_run

pytestmark = pytest.mark.slow

SCRIPT = """
import os, sys, time
import torch

model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(8):
    loss = model(torch.randn(16, 8)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
pid = os.fork()
if pid == 0:  # the child lives on: a logger, a data server
    open(sys.argv[1], "w").write(str(os.getpid()))
    time.sleep(600)
    sys.exit(0)
time.sleep(1)
print("parent done")
"""


def test_a_forked_child_neither_outlives_the_run_nor_rewrites_its_record(tmp_path: Path) -> None:
    script = write_script(tmp_path, "forks.py", SCRIPT)
    pid_file = tmp_path / "child.pid"
    code, err, _ = finish(*analyze(tmp_path, script, "--gpus", "1", "--", str(pid_file)))
    assert code == 0, err[-3000:]
    _, run = the_run(tmp_path)
    assert run.status == "complete", run.error
    assert run.ranks and run.ranks[0].traces, "rank 0's record lost its traces"
    assert not run.error
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"the script's child {child} outlived the run")
