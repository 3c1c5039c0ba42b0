"""``mgprof sweep`` for real: 2 gloo ranks under a real address-space budget, and the in-process
``find_sweet_spot`` under a real 2-rank gloo group where one rank runs out of memory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _spawn import clean_env, python_args, run, write_script

from mgprof.analyze.sweep.result import SweepResult, max_trials
from mgprof.cli import main
from mgprof.records import read_run
from mgprof.studies.sweep import read_sweep

# Memory grows by 1 MiB per sample (the input row), deterministic and far above the noise of
# peak RSS; a 4 MiB parameter that costs no per-sample compute is all-reduced every step, so the
# all-reduce is a fixed cost that a larger batch amortises.
WIDE = """
import torch
from torch import nn

import mgprof


class Wide(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(1 << 18, 1)
        self.table = nn.Parameter(torch.zeros(1 << 20))

    def forward(self, x):
        return self.inp(x) + self.table[:1]


model = mgprof.wrap(Wide())
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(mgprof.batch_size(32), 1 << 18)
for _ in range(100):
    loss = model(x).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""

COMMON = ["--gpus", "2", "--steps", "4", "--warmup", "1", "--trace-steps", "1", "--quiet"]
# Measured on the 2-core CI machine: peak RSS growth ~116 MiB + 1 MiB x batch, and the address
# space holds ~100 MiB more (threads, allocator). Under a 1050 MiB budget 512 fits, 1024 really
# fails to allocate (one fitted point: no memory model yet, so it is not skipped), and the
# bisection runs 768 in fresh processes, which fits; resolution 0.5 stops there: 3 trials.
BOUNDARY_ARGS = [
    *COMMON, "--range", "512:4096", "--memory-budget-mib", "1050", "--margin", "0",
    "--resolution", "0.5", "--until-oom", "--format", "json",
]  # fmt: skip


def _sweep(folder: Path, args: list[str], name: str) -> tuple[SweepResult, Path]:
    script = write_script(folder, f"{name}.py", WIDE)
    out = folder / "runs"
    result = run(
        python_args("-m", "mgprof", "sweep", script, *args, "--out", out),
        cwd=folder,
        env=clean_env(),
        timeout_s=240,
    )
    assert result.returncode == 0, result.explain()
    (sweep_dir,) = [p for p in out.iterdir() if p.name.endswith(f"-sweep-{name}")]
    saved = read_sweep(sweep_dir)
    if "json" in args:
        printed = json.loads(result.stdout)
        assert [t.batch_size for t in saved.trials] == [t["batch_size"] for t in printed["trials"]]
    return saved, sweep_dir


@pytest.fixture(scope="module")
def cli_sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[SweepResult, Path]:
    return _sweep(tmp_path_factory.mktemp("sweep"), BOUNDARY_ARGS, "wide")


@pytest.mark.slow
def test_cli_sweep_finds_the_memory_boundary(cli_sweep: tuple[SweepResult, Path]) -> None:
    result, sweep_dir = cli_sweep
    by_size = {t.batch_size: t for t in result.trials}
    assert result.world_size == 2 and result.device_kind == "cpu"
    assert result.capacity_mib == 1050.0
    oom = [t for t in result.trials if t.status == "oom"]
    assert oom, f"no trial ran out of memory: {[(t.batch_size, t.status) for t in result.trials]}"
    assert result.first_oom == oom[0].batch_size
    assert oom[0].error and "allocate" in oom[0].error
    assert result.largest_fit is not None and result.largest_fit < result.first_oom
    assert result.first_oom - result.largest_fit <= max(8, 0.5 * result.largest_fit)
    assert all(by_size[b].status == "ok" for b in by_size if b <= result.largest_fit)
    # every trial has its own run directory, renderable by 'mgprof report'
    for t in result.trials:
        if t.status == "skipped":
            continue
        assert t.run_dir and (sweep_dir / t.run_dir / "run.json").is_file()


@pytest.mark.slow
def test_trial_after_an_oom_is_not_inflated(cli_sweep: tuple[SweepResult, Path]) -> None:
    result, sweep_dir = cli_sweep
    order = [t for t in result.trials if t.status != "skipped"]
    i = next(i for i, t in enumerate(order) if t.status == "oom")
    assert i + 1 < len(order), "the sweep should bisect after the OOM"
    before, failed, after = order[:i], order[i], order[i + 1]
    assert after.status == "ok" and after.batch_size < failed.batch_size
    # fresh processes: the failed trial's ranks are not the next trial's ranks
    pids = lambda t: {r.pid for r in read_run(sweep_dir / str(t.run_dir)).ranks}  # noqa: E731
    assert pids(failed).isdisjoint(pids(after))
    # the script holds 1 MiB per sample: the next trial's memory grows by exactly its extra
    # samples over the fitted trial before the OOM, nothing carried over from the failed one
    ref = max((t for t in before if t.status == "ok"), key=lambda t: t.batch_size)
    assert after.peak_memory_mib is not None and ref.peak_memory_mib is not None
    extra_samples = after.batch_size - ref.batch_size
    growth = after.peak_memory_mib - ref.peak_memory_mib
    assert growth == pytest.approx(extra_samples * 1.0, rel=0.25)
    assert after.peak_memory_mib < failed.batch_size * 1.0  # below what the failed size needs


@pytest.mark.slow
def test_trials_stay_logarithmic(cli_sweep: tuple[SweepResult, Path]) -> None:
    result, _ = cli_sweep
    assert result.trial_count <= max_trials(512, 4096, 0.5)
    assert [p.batch_size for p in result.series] == sorted(p.batch_size for p in result.series)


@pytest.mark.slow
def test_comm_share_falls_as_the_batch_grows(tmp_path: Path) -> None:
    result, _ = _sweep(tmp_path, [*COMMON, "--batch-sizes", "32,512", "--format", "md"], "comm")
    fitted = sorted((t for t in result.trials if t.status == "ok"), key=lambda t: t.batch_size)
    assert len(fitted) >= 2
    first, last = fitted[0], fitted[-1]
    # the exposed share: what the step waits on. The total is no test on 2 busy cores: the
    # all-reduce overlapping the backward is stretched by the compute beside it, so it grows with
    # the batch now and then (a CI run: least-waiting rank 24.3 % -> 35.0 %); the exposed share
    # fell in 9 of 9 runs here (12.0 -> 4.3 % at the closest)
    assert first.exposed_comm_pct is not None and last.exposed_comm_pct is not None
    assert last.exposed_comm_pct < first.exposed_comm_pct
    assert result.comm_trend and "exposed all-reduce is amortised" in result.comm_trend
    assert all(t.samples_per_s and t.samples_per_s > 0 for t in fitted)


INPROCESS = """
import json
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn


def worker(rank, world, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from mgprof.studies.sweet_spot import find_sweet_spot

    def model_fn():
        net = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 1))
        return nn.parallel.DistributedDataParallel(net)

    def batch_fn(n):
        if rank == 1 and n >= 256:
            raise MemoryError(f"injected: rank 1 cannot hold a batch of {n}")
        return torch.randn(n, 32), torch.randn(n, 1)

    result = find_sweet_spot(
        model_fn, batch_fn, nn.MSELoss(), lo=16, hi=1024, steps=2, warmup=1,
        resolution=0.25, until_oom=True,
    )
    probe = torch.ones(1)
    dist.all_reduce(probe)  # no rank is left waiting in a collective
    trials = [[t.batch_size, t.status, t.error, t.exposed_comm_pct] for t in result.trials]
    with open(os.path.join(out, f"rank{rank}.json"), "w") as fh:
        json.dump({"trials": trials, "largest_fit": result.largest_fit,
                   "first_oom": result.first_oom, "sweet_spot": result.sweet_spot,
                   "after": probe.item(), "mode": result.mode}, fh)
    dist.destroy_process_group()
    # torch 2.13's gloo can abort a spawned rank at interpreter exit, after everything is done
    # ("terminate called without an active exception"; a plain DDP script without mgprof did so
    # in 4 of 20 runs here): leave without the interpreter's teardown
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(2, port, sys.argv[1]), nprocs=2)
"""


@pytest.mark.slow
def test_find_sweet_spot_agrees_on_one_ranks_oom(tmp_path: Path) -> None:
    script = write_script(tmp_path, "inproc.py", INPROCESS)
    result = run(python_args(script, tmp_path), cwd=tmp_path, env=clean_env(), timeout_s=60)
    assert result.returncode == 0, result.explain()
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    statuses = [[(b, s) for b, s, _, _ in r["trials"]] for r in ranks]
    assert statuses[0] == statuses[1], f"ranks took different decisions: {ranks}"
    assert 256 in dict(statuses[0]), f"the sweep never reached 256: {ranks}"
    by_size = dict(statuses[0])
    assert by_size[256] == "oom" and by_size[128] == "ok"
    assert ranks[0]["first_oom"] == ranks[1]["first_oom"] == 256
    assert 128 <= ranks[0]["largest_fit"] < 256
    assert all(by_size[b] == "oom" for b in by_size if b >= 256)
    errors = {r: {b: e for b, s, e, _ in ranks[r]["trials"] if s == "oom"} for r in (0, 1)}
    assert "injected" in errors[1][256]  # the rank that failed says why
    assert "another rank" in errors[0][256]  # the other rank knows it was not its own failure
    assert ranks[0]["after"] == 2.0 and ranks[0]["mode"] == "in-process"
    exposed = [e for _, s, _, e in ranks[0]["trials"] if s == "ok"]
    assert all(e is not None and 0.0 <= e <= 100.0 for e in exposed)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--range", "64:8"], "backwards"),
        (["--batch-sizes", "0"], "at least 1"),
        (["--batch-sizes", "8,16", "--range", "8:64"], "not both"),
        (["--range", "8-64"], "LO:HI"),
        (["--batch-sizes", "8,x"], "integers"),
        (["--margin", "1.5"], "margin"),
    ],
)
def test_bad_flags_are_one_line_usage_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    script = write_script(tmp_path, "s.py", "print('never runs')\n")
    code = main(["sweep", str(script), "--out", str(tmp_path / "runs"), *flags])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and message in err
    assert not (tmp_path / "runs").exists()


def test_accumulation_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    from mgprof.collect.accum import accumulation_steps

    monkeypatch.delenv("MGPROF_ACCUM_STEPS", raising=False)
    assert accumulation_steps(3) == 3
    monkeypatch.setenv("MGPROF_ACCUM_STEPS", "4")
    assert accumulation_steps() == 4
    monkeypatch.setenv("MGPROF_ACCUM_STEPS", "0")
    with pytest.raises(ValueError):
        accumulation_steps()
