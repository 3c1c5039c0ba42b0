"""``python -m mgprof.run.bootstrap`` on unmodified scripts: steps found, exit codes kept."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from _spawn import Result, clean_env, python_args, run_many, write_script

from mgprof.records import RunRecord, read_run

pytestmark = pytest.mark.slow

LOOP = """
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

data = TensorDataset(torch.randn(15, 4), torch.randn(15, 1))
loader = DataLoader(data, batch_size=6)  # batches of 6, 6, 3 each epoch
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
updates = 0


def train(x, y):
    global updates
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    updates += 1
"""

SCRIPTS = {
    "plain": LOOP
    + """
print("args", sys.argv[1:])
for epoch in range(5):
    for x, y in loader:
        train(x, y)
print("finished all epochs")
""",
    "raises": LOOP
    + """
for x, y in loader:
    train(x, y)
    if updates == 3:
        raise ValueError("boom 42")
""",
    "exits": LOOP
    + """
for x, y in loader:
    train(x, y)
    if updates == 2:
        sys.exit(3)
""",
    "own": LOOP
    + """
import mgprof

for x, y in loader:  # updates before the script's own session starts
    train(x, y)
with mgprof.profile(name="own", trace=False, sample=False) as prof:
    for i in range(3):
        x = torch.randn(5, 4)
        with prof.step(x):
            train(x, torch.randn(5, 1))
for x, y in loader:
    train(x, y)
print("done", updates)
""",
}


@dataclass
class Outcome:
    result: Result
    run_dir: Path

    def run(self) -> RunRecord:
        return read_run(self.run_dir)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    folder = tmp_path_factory.mktemp("bootstrap")
    jobs, dirs = [], []
    for name, source in SCRIPTS.items():
        script = write_script(folder, f"{name}.py", source)
        run_dir = folder / f"run-{name}"
        env = clean_env(MGPROF_RUN_DIR=str(run_dir), MGPROF_WARMUP="1", MGPROF_STEPS="3")
        jobs.append((python_args("-m", "mgprof.run.bootstrap", script, "--lr", "0.1"), folder, env))
        dirs.append(run_dir)
    results = run_many(jobs, parallel=2)
    return {name: Outcome(r, d) for name, r, d in zip(SCRIPTS, results, dirs)}


def test_unmodified_script_is_measured_and_stopped(outcomes: dict[str, Outcome]) -> None:
    out = outcomes["plain"]
    assert out.result.returncode == 0, out.result.explain()
    assert "args ['--lr', '0.1']" in out.result.stdout  # the script got its own arguments
    assert "finished all epochs" not in out.result.stdout  # stopped after warmup + steps
    run = out.run()
    assert (run.status, run.error, run.script_args) == ("complete", None, ["--lr", "0.1"])
    assert run.script is not None and run.script.endswith("plain.py")
    (rank,) = run.ranks
    # the first update starts the session; the next four loader batches are 6, 3, 6, 6
    assert [s.batch_size for s in rank.steps] == [6, 3, 6, 6]
    assert all(s.dataloader_ms is not None and s.dataloader_ms >= 0 for s in rank.steps)
    fps = [s.fingerprint for s in rank.steps]
    # no shuffling: step 3 (epoch 1, batch 1) sees the same data as step 0 (epoch 0, batch 1)
    assert fps[0] == fps[3] and len({fps[0], fps[1], fps[2]}) == 3
    assert [s.traced for s in rank.steps] == [False, True, True, True]
    assert rank.traces == ["traces/rank0.pt.trace.json.gz"]
    assert (out.run_dir / rank.traces[0]).is_file()
    assert rank.training.dataloader_num_workers == 0
    assert rank.training.distributed_sampler is False
    assert rank.warnings == []


def test_script_that_raises_keeps_its_traceback_and_exit_code(
    outcomes: dict[str, Outcome],
) -> None:
    out = outcomes["raises"]
    assert out.result.returncode == 1, out.result.explain()
    assert "Traceback (most recent call last)" in out.result.stderr
    assert "ValueError: boom 42" in out.result.stderr
    run = out.run()
    assert run.status == "incomplete"
    assert run.error is not None and run.error.startswith("ValueError: boom 42")
    assert run.ranks[0].error == run.error
    assert len(run.ranks[0].steps) == 2  # updates 2 and 3 closed steps 0 and 1


def test_script_exit_code_is_kept(outcomes: dict[str, Outcome]) -> None:
    out = outcomes["exits"]
    assert out.result.returncode == 3, out.result.explain()
    assert "Traceback" not in out.result.stderr
    run = out.run()
    assert run.status == "incomplete"
    assert run.error == "exited with code 3"


def test_script_with_its_own_session_is_not_instrumented_twice(
    outcomes: dict[str, Outcome],
) -> None:
    out = outcomes["own"]
    assert out.result.returncode == 0, out.result.explain()
    assert "done 9" in out.result.stdout  # 3 + 3 + 3 updates: never stopped by MGPROF_STEPS
    run = out.run()
    assert run.status == "complete"
    (rank,) = run.ranks
    assert [s.batch_size for s in rank.steps] == [5, 5, 5]
    assert [s.dataloader_ms for s in rank.steps] == [None, None, None]
    assert sorted(p.name for p in out.run_dir.iterdir() if p.name != "logs") == ["run.json"]
