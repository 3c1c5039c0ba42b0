"""Unmodified training scripts in the styles people write, under every command, checked for truth.

The scripts in ``tests/scripts/`` know nothing of mgprof: a plain single-device loop, the
torchrun DDP tutorial (argparse, DistributedSampler, checkpoints), the DataParallel tutorial, an
MNIST-style CNN with loader workers, and an iterable dataset. Each prints a checksum of its final
parameters (and, where its data is random per process, of its first batch), so the tests can see
what really happened on each rank: auto-wrapped ranks end bit-identical from different data;
ranks left unwrapped do not, and are labelled independent replicas, never ddp.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests._spawn import Result, clean_env, python_args, run_dirs, run_many

pytestmark = pytest.mark.slow

SCRIPTS = Path(__file__).resolve().parent / "scripts"
TIMEOUT_S = 300


def mgprof(*args: str) -> list[str]:
    return python_args("-m", "mgprof", *args)


def checksums(root: Path, what: str = "param-checksum") -> list[str]:
    """The figure each rank printed, read from its own log (``logs/rank<N>.log``): the ranks
    share one stdout pipe, where their lines can interleave mid-line."""
    found = []
    for log in sorted((only_run(root) / "logs").glob("rank*.log")):
        found += re.findall(rf"^{what} (\S+)$", log.read_text(), flags=re.MULTILINE)
    return found


def only_run(root: Path) -> Path:
    runs = [p for p in root.iterdir() if (p / "run.json").exists()]
    assert len(runs) == 1, runs
    return runs[0]


def run_json(root: Path) -> dict[str, Any]:
    return json.loads((only_run(root) / "run.json").read_text())


ANALYZE = {
    # name: (script, mgprof args, script args)
    "plain-2": ("plain_loop.py", ["--gpus", "2"], []),
    "plain-2-nowrap": ("plain_loop.py", ["--gpus", "2", "--no-auto-wrap"], []),
    "plain-1": ("plain_loop.py", ["--gpus", "1"], []),
    "ddp-2": ("ddp_tutorial.py", ["--gpus", "2"], ["--epochs", "1"]),
    "ddp-1": ("ddp_tutorial.py", ["--gpus", "1"], ["--epochs", "1"]),
    "dp-2": ("dp_tutorial.py", ["--gpus", "2"], []),
    "dp-1": ("dp_tutorial.py", ["--gpus", "1"], []),
    "cnn-2": ("cnn_loader.py", ["--gpus", "2"], []),
    "cnn-1": ("cnn_loader.py", ["--gpus", "1"], []),
    "iter-2": ("iterable_loader.py", ["--gpus", "2"], []),
    "iter-1": ("iterable_loader.py", ["--gpus", "1"], []),
}


@pytest.fixture(scope="module")
def analyzed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Result, Path]]:
    """Every ``mgprof analyze`` case, run once (two at a time) for the whole module."""
    jobs = []
    roots = {}
    for name, (script, flags, script_args) in ANALYZE.items():
        root = tmp_path_factory.mktemp(name)
        roots[name] = root
        args = mgprof("analyze", str(SCRIPTS / script), *flags, "--quiet", "--out", str(root))
        if script_args:
            args += ["--", *script_args]
        jobs.append((args, root, clean_env()))
    results = run_many(jobs, parallel=2, timeout_s=TIMEOUT_S)
    return {name: (res, roots[name]) for name, res in zip(ANALYZE, results, strict=True)}


@pytest.mark.parametrize("name", ["plain-2", "ddp-2", "dp-2", "cnn-2", "iter-2"])
def test_two_ranks_train_one_model(analyzed: dict[str, tuple[Result, Path]], name: str) -> None:
    result, root = analyzed[name]
    assert result.returncode == 0, result.explain()
    params = checksums(root)
    assert len(params) == 2 and params[0] == params[1], result.explain()
    firsts = checksums(root, "first-batch-checksum")
    if firsts:  # scripts whose data is random per process: the ranks really saw other data
        assert len(firsts) == 2 and firsts[0] != firsts[1]
    run = run_json(root)
    assert run["status"] == "complete"
    job = run["analysis"]["job"]
    assert job["grad_sync"]["status"] == "synchronised"
    assert job["grad_sync"]["how"] == "ddp"
    _throughput_or_reason(name, job)
    for rank in run["ranks"]:
        assert rank["training"]["ddp_sync_forwards"] >= 1


def _throughput_or_reason(name: str, job: dict[str, Any]) -> None:
    """Every style has a measured batch, so a throughput: the plain loop draws its tensors
    itself, and the trained module's inputs give its batch (it had none before)."""
    assert job["samples_per_s"] is not None, job["not_applicable"]


@pytest.mark.parametrize("name", ["plain-2", "dp-2", "cnn-2", "iter-2"])
def test_scripts_without_ddp_are_auto_wrapped(
    analyzed: dict[str, tuple[Result, Path]], name: str
) -> None:
    _, root = analyzed[name]
    run = run_json(root)
    wrap = run["analysis"]["job"]["grad_sync"]["auto_wrap"]
    assert wrap["wrapper"] == "ddp", wrap
    assert wrap["parameters"] > 0 and wrap["initialized_process_group"] is True
    assert run["analysis"]["job"]["strategy_label"] == "ddp (auto-wrapped)"
    report = (only_run(root) / "report.md").read_text()
    assert "auto-wrap" in report and "DistributedDataParallel" in report


def test_a_script_with_its_own_ddp_is_left_alone(
    analyzed: dict[str, tuple[Result, Path]],
) -> None:
    run = run_json(analyzed["ddp-2"][1])
    sync = run["analysis"]["job"]["grad_sync"]
    assert sync["auto_wrap"]["wrapper"] is None
    assert "wraps its model itself" in sync["auto_wrap"]["reason"]
    assert run["analysis"]["job"]["strategy_label"] == "ddp"


def test_independent_replicas_are_never_labelled_ddp(
    analyzed: dict[str, tuple[Result, Path]],
) -> None:
    result, root = analyzed["plain-2-nowrap"]
    assert result.returncode == 0, result.explain()
    params = checksums(root)
    assert len(params) == 2 and params[0] != params[1]  # two models, trained apart
    run = run_json(root)
    job = run["analysis"]["job"]
    assert job["grad_sync"]["status"] == "independent"
    assert job["strategy_label"].startswith("independent replicas")
    assert job["samples_per_s"] is None
    assert "not a job's" in job["not_applicable"]["samples_per_s"]
    report = (only_run(root) / "report.md").read_text()
    assert "independent replicas" in report
    assert not re.search(r"strategy\s*\|?\s*ddp\b", report)


@pytest.mark.parametrize("name", ["plain-1", "ddp-1", "dp-1", "cnn-1", "iter-1"])
def test_one_device_runs_every_style(analyzed: dict[str, tuple[Result, Path]], name: str) -> None:
    """``--gpus 1`` (single) also runs torchrun-style scripts: they get a world of one."""
    result, root = analyzed[name]
    assert result.returncode == 0, result.explain()
    run = run_json(root)
    assert run["status"] == "complete" and run["strategy"] == "single"
    _throughput_or_reason(name, run["analysis"]["job"])
    assert run["ranks"][0]["training"]["cpu_threads"] >= 1
    assert run["ranks"][0]["training"]["auto_wrap"] is None


# ---------------------------------------------------------------------------------------------
# compare and sweep

COMPARE = {
    "dp": ("dp_tutorial.py", []),
    "dp-nowrap": ("dp_tutorial.py", ["--no-auto-wrap"]),
    "ddp": ("ddp_tutorial.py", []),
}


@pytest.fixture(scope="module")
def compared(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Result, Path]]:
    jobs, roots = [], {}
    for name, (script, flags) in COMPARE.items():
        root = tmp_path_factory.mktemp(f"compare-{name}")
        roots[name] = root
        args = mgprof(
            "compare", str(SCRIPTS / script), "--gpus", "2", "--steps", "4", "--warmup", "1",
            "--rounds", "1", "--trace-steps", "1",  # the rows' truth here, not their intervals
            "--nosync-steps", "2", "--format", "json", "--quiet", "--out", str(root), *flags,
        )  # fmt: skip
        jobs.append((args, root, clean_env()))
    results = run_many(jobs, parallel=1, timeout_s=TIMEOUT_S)
    return {name: (res, roots[name]) for name, res in zip(COMPARE, results, strict=True)}


def _rows(result: Result) -> dict[str, dict[str, Any]]:
    assert result.returncode == 0, result.explain()
    comp = json.loads(result.stdout[result.stdout.index("{") :])
    return {row["strategy"]: row for row in comp["rows"]}


@pytest.mark.parametrize("name", ["dp", "ddp"])
def test_compare_has_a_single_baseline_and_a_real_ddp_row(
    compared: dict[str, tuple[Result, Path]], name: str
) -> None:
    rows = _rows(compared[name][0])
    assert rows["single"]["samples_per_s"] is not None
    assert rows["ddp"]["speedup"] is not None
    # the DDP row's all-reduce beside this machine's measured bus bandwidth at its size
    assert rows["ddp"]["busbw_pct_of_attainable"] is not None
    assert any("this machine reached" in note for note in rows["ddp"]["notes"])


def test_compare_gives_no_speedup_for_independent_replicas(
    compared: dict[str, tuple[Result, Path]],
) -> None:
    rows = _rows(compared["dp-nowrap"][0])
    assert rows["single"]["samples_per_s"] is not None
    ddp = rows["ddp"]
    assert ddp["speedup"] is None and ddp["efficiency_pct"] is None
    assert any("independent replicas" in note for note in ddp["notes"]), ddp["notes"]


SWEEPS = {
    "cnn": "cnn_loader.py",
    "iter": "iterable_loader.py",
    "ddp": "ddp_tutorial.py",
    "plain": "plain_loop.py",
}


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Result, Path]]:
    jobs, roots = [], {}
    for name, script in SWEEPS.items():
        root = tmp_path_factory.mktemp(f"sweep-{name}")
        roots[name] = root
        gpus = "2" if name == "ddp" else "1"
        args = mgprof(
            "sweep", str(SCRIPTS / script), "--gpus", gpus, "--batch-sizes", "8,16",
            "--steps", "6", "--warmup", "1", "--format", "json", "--quiet", "--out", str(root),
        )  # fmt: skip
        jobs.append((args, root, clean_env()))
    results = run_many(jobs, parallel=2, timeout_s=TIMEOUT_S)
    return {name: (res, roots[name]) for name, res in zip(SWEEPS, results, strict=True)}


@pytest.mark.parametrize("name", ["cnn", "iter", "ddp"])
def test_sweep_applies_each_size_through_the_scripts_dataloader(
    swept: dict[str, tuple[Result, Path]], name: str
) -> None:
    result, _ = swept[name]
    assert result.returncode == 0, result.explain()
    sweep = json.loads(result.stdout[result.stdout.index("{") :])
    trials = {t["batch_size"]: t for t in sweep["trials"]}
    assert sorted(trials) == [8, 16]
    for size, trial in trials.items():
        assert trial["status"] == "ok", trial
        assert trial["observed_batch_size"] == size
        assert (
            "DataLoader" in trial["batch_applied_by"] or "BatchSampler" in trial["batch_applied_by"]
        )
        assert trial["samples_per_s"] is not None


def test_sweep_of_a_script_whose_batch_cannot_be_set_exits_2(
    swept: dict[str, tuple[Result, Path]],
) -> None:
    result, root = swept["plain"]
    assert result.returncode == 2, result.explain()
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("mgprof sweep: error: cannot sweep plain_loop.py: batch size not")
    assert "Traceback" not in result.stderr
    sweep_dirs = run_dirs(root, "sweep-plain_loop")
    trials = json.loads((sweep_dirs[0] / "sweep.json").read_text())["trials"]
    assert len(trials) == 1  # stopped before spending the second size's trial
