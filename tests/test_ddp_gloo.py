"""Real 2-rank DDP over gloo on CPU, launched by torchrun: records travel to rank 0.

One job runs every in-code surface the tests below look at (context manager, decorator,
seeding, identical vs sharded data), so the suite pays for one torchrun start.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _spawn import clean_env, read_trace, run, run_dirs, torchrun_args, write_script

from mgprof.records import RunRecord, read_run

pytestmark = pytest.mark.slow

JOB = """
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import mgprof

out = sys.argv[1]
model = mgprof.wrap(torch.nn.Linear(4, 2))  # strategy ddp from WORLD_SIZE: gloo on CPU
rank = dist.get_rank()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
seeds = {
    "per_rank": mgprof.seed_everything(0),
    "shared": mgprof.seed_everything(0, per_rank=False),
}
with open(os.path.join(out, f"seeds{rank}.json"), "w") as fh:
    json.dump(seeds, fh)


def train(x):
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()


# identical data on both ranks: same generator seed, no DistributedSampler
with mgprof.profile(out=out, name="same", skip=1, warmup=1, active=2, sample=False) as prof:
    gen = torch.Generator().manual_seed(123)
    for _ in range(5):
        x = torch.randn(8, 4, generator=gen)
        with prof.step(x):
            with mgprof.region("train"):
                train(x)

# each rank its own shard, the epoch set as the guides say
data = TensorDataset(torch.arange(64 * 4, dtype=torch.float32).reshape(64, 4))
sampler = DistributedSampler(data, shuffle=False)
loader = DataLoader(data, batch_size=8, sampler=sampler)
with mgprof.profile(out=out, name="sharded", trace=False, sample=False) as prof:
    sampler.set_epoch(0)
    for (x,) in loader:
        with prof.step(x):
            train(x)


# the decorator's session closes at interpreter exit, over the still-open process group
@mgprof.profile_step(out=out, name="deco", skip=0, warmup=1, active=1, sample=False)
def train_step(x):
    train(x)


for _ in range(4):
    train_step(torch.randn(4 + rank, 4))
"""

DESTROY = """
import sys

import torch
import torch.distributed as dist

import mgprof

model = mgprof.wrap(torch.nn.Linear(4, 2))


@mgprof.profile_step(out=sys.argv[1], name="deco", trace=False, sample=False)
def train_step(x):
    model(x).sum().backward()


for _ in range(3):
    train_step(torch.randn(4 + dist.get_rank(), 4))
dist.destroy_process_group()  # what every DDP tutorial ends with
"""


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("ddp")
    out = folder / "runs"
    out.mkdir()
    script = write_script(folder, "ddp_job.py", JOB)
    result = run(torchrun_args(script, out), cwd=folder, env=clean_env())
    assert result.returncode == 0, result.explain()
    return out


def only_run(out: Path, name: str) -> tuple[Path, RunRecord]:
    dirs = run_dirs(out, name)
    assert len(dirs) == 1, f"expected one run directory for {name}, found {dirs}"
    return dirs[0], read_run(dirs[0])


def check_gathered(run_dir: Path, run: RunRecord) -> None:
    """One run.json on rank 0 with both ranks' records; nothing left as a partial."""
    assert (run.world_size, run.status, run.strategy, run.backend) == (2, "complete", "ddp", "gloo")
    assert [r.rank for r in run.ranks] == [0, 1]
    assert run.missing_ranks == []
    assert all(r.world_size == 2 and r.warnings == [] for r in run.ranks)
    assert len({r.pid for r in run.ranks}) == 2
    assert not (run_dir / "ranks").exists()


def test_context_manager_gathers_both_ranks_and_their_traces(job: Path) -> None:
    run_dir, run = only_run(job, "same")
    check_gathered(run_dir, run)
    files = sorted(p.name for p in (run_dir / "traces").iterdir())
    assert files == ["rank0.pt.trace.json.gz", "rank1.pt.trace.json.gz"]
    for rank in run.ranks:
        assert rank.traces == [f"traces/rank{rank.rank}.pt.trace.json.gz"]
        assert [s.traced for s in rank.steps] == [False, False, True, True, False]
        assert [s.batch_size for s in rank.steps] == [8] * 5
        assert [(r.name, r.count) for r in rank.regions] == [("train", 5)]
        trace = read_trace(run_dir / rank.traces[0])
        assert trace["distributedInfo"]["rank"] == rank.rank
        assert trace["distributedInfo"]["world_size"] == 2
        names = {ev.get("name") for ev in trace["traceEvents"]}
        assert "gloo:all_reduce" in names  # DDP's gradient all-reduce is in the trace


def test_decorator_gathers_both_ranks_at_exit(job: Path) -> None:
    run_dir, run = only_run(job, "deco")
    check_gathered(run_dir, run)
    for rank in run.ranks:
        assert [s.batch_size for s in rank.steps] == [4 + rank.rank] * 4
        assert [s.traced for s in rank.steps] == [False, True, False, False]
        trace = read_trace(run_dir / "traces" / f"rank{rank.rank}.pt.trace.json.gz")
        assert trace["distributedInfo"]["rank"] == rank.rank


def test_identical_data_gives_equal_fingerprints_across_ranks(job: Path) -> None:
    _, run = only_run(job, "same")
    r0, r1 = ([s.fingerprint for s in r.steps] for r in run.ranks)
    assert all(r0) and r0 == r1
    assert len(set(r0)) == len(r0)  # a new batch each step
    assert run.ranks[0].training.distributed_sampler is None  # no DataLoader seen


def test_distributed_sampler_gives_distinct_fingerprints_and_notes_set_epoch(job: Path) -> None:
    run_dir, run = only_run(job, "sharded")
    check_gathered(run_dir, run)
    r0, r1 = run.ranks
    assert len(r0.steps) == len(r1.steps) == 4  # 64 samples / 2 ranks / batch 8
    for a, b in zip(r0.steps, r1.steps):
        assert a.index == b.index
        assert a.fingerprint and b.fingerprint and a.fingerprint != b.fingerprint
        assert a.dataloader_ms is not None and b.dataloader_ms is not None
    for rank in run.ranks:
        assert rank.training.distributed_sampler is True
        assert rank.training.set_epoch_called is True
        assert rank.training.dataloader_num_workers == 0
    assert not (run_dir / "traces").exists()


def test_seed_everything_is_rank_distinct_unless_shared(job: Path) -> None:
    seeds = [json.loads((job / f"seeds{r}.json").read_text()) for r in (0, 1)]
    assert [s["per_rank"] for s in seeds] == [0, 1]
    assert [s["shared"] for s in seeds] == [0, 0]


def test_decorator_survives_destroy_process_group(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    out.mkdir()
    script = write_script(tmp_path, "ddp_destroy.py", DESTROY)
    result = run(torchrun_args(script, out), cwd=tmp_path, env=clean_env())
    assert result.returncode == 0, result.explain()
    run_dir, run_record = only_run(out, "deco")
    check_gathered(run_dir, run_record)
