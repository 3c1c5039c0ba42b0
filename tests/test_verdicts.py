"""Verdicts that hold, on real processes and unmodified scripts (2 CPU ranks over gloo).

The same ``mgprof compare`` gave "ddp 5.99x" on a busy machine and "single, 0.62x" on a quiet
one: the single row ran with every core's threads while each DDP rank had one, the rows were
measured on traced steps, and no interval said how sure a figure was. Here two identical
comparisons must agree, every row runs with the same threads, the speedup interval must hold the
ratio of untraced step times recomputed from run.json, the scaling mode must be the script's,
and a batch the script only peeked at must not count.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _spawn import clean_env

from mgprof.records import read_run

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "tests" / "scripts"

pytestmark = pytest.mark.slow


def _env() -> dict[str, str]:
    env = clean_env()
    env.pop("OMP_NUM_THREADS")  # mgprof chooses the threads itself when the user did not
    return env


def _compare(out: Path, script: str, *flags: str) -> dict[str, Any]:
    args = ["compare", str(SCRIPTS / script), "--gpus", "2", "--strategies", "single,ddp"]
    args += ["--nosync-steps", "0", "--quiet", "--format", "json", "--out", str(out), *flags]
    proc = subprocess.run(
        [sys.executable, "-m", "mgprof", *args],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def _first_clause(verdict: str) -> str:
    """``best: ddp`` or ``no measurable difference``: what the verdict decides."""
    if verdict.startswith("no measurable difference"):
        return "no measurable difference"
    return verdict.split(" —")[0].split(" (")[0]


@pytest.fixture(scope="module")
def twice(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[Path, dict[str, Any]]]:
    out = tmp_path_factory.mktemp("verdicts")
    runs = []
    for i in range(2):
        comp = _compare(out / f"c{i}", "compute_heavy.py", "--steps", "12")
        runs.append((out / f"c{i}" / comp["comparison_id"], comp))
    return runs


def test_two_identical_comparisons_give_the_same_verdict(
    twice: list[tuple[Path, dict[str, Any]]],
) -> None:
    (_, a), (_, b) = twice
    assert _first_clause(a["verdict"]) == _first_clause(b["verdict"]), (a["verdict"], b["verdict"])
    for comp in (a, b):
        ddp = comp["rows"][1]
        low, high = ddp["speedup_low"], ddp["speedup_high"]
        assert low is not None and high is not None and low <= ddp["speedup"] <= high
        clear = low > 1.0 or high < 1.0
        assert comp["verdict"].startswith("best: " if clear else "no measurable difference")


def test_every_row_runs_with_the_same_threads(twice: list[tuple[Path, dict[str, Any]]]) -> None:
    for comp_dir, comp in twice:
        threads = {r["cpu_threads"] for r in comp["rows"]}
        assert len(threads) == 1, comp["rows"]
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        want = max(1, (cores or 1) // 2)
        assert threads == {want}
        assert comp["cpu_threads_setting"].startswith(f"OMP_NUM_THREADS={want} for every row (")
        for row in comp["rows"]:
            for name in (row["run"], *row["rounds_run"]):
                for rank in read_run(comp_dir / name).ranks:
                    assert rank.training.omp_num_threads == str(want)


def _clean_steps(run_dir: Path) -> tuple[list[float], int]:
    """From run.json alone: the slowest rank's time at each step, without the first step, the
    profiler's steps and the one after them; the samples per step over all ranks."""
    run = read_run(run_dir)
    by_rank = [{s.index: s for s in r.steps} for r in run.ranks]
    traced = sorted({i for d in by_rank for i, s in d.items() if s.traced})
    skip = {0} | (set(range(traced[0] - 1, traced[-1] + 2)) if traced else set())
    common = sorted(set.intersection(*(set(d) for d in by_rank)) - skip)
    samples = sum(d[1].batch_size or 0 for d in by_rank)
    return [max(d[i].duration_ms for d in by_rank) for i in common], samples


def test_the_speedup_interval_holds_the_untraced_step_ratio(
    twice: list[tuple[Path, dict[str, Any]]],
) -> None:
    for comp_dir, comp in twice:
        rates = []
        for row in comp["rows"]:
            times: list[float] = []
            samples = 0
            for name in (row["run"], *row["rounds_run"]):
                t, samples = _clean_steps(comp_dir / name)
                times += t
            rates.append(samples * 1000.0 / (sum(times) / len(times)))
            assert row["traced_step_ms"] is not None and row["post_trace_step_ms"] is not None
        ratio = rates[1] / rates[0]
        ddp = comp["rows"][1]
        assert ddp["speedup"] == pytest.approx(ratio, rel=1e-9)
        assert ddp["speedup_low"] <= ratio <= ddp["speedup_high"]


def test_weak_scaling_is_read_off_the_batches(twice: list[tuple[Path, dict[str, Any]]]) -> None:
    _, comp = twice[0]
    assert comp["mode"] == "weak", comp["mode_basis"]
    assert [r["batch_per_device"] for r in comp["rows"]] == [1024, 1024]


def test_a_fixed_global_batch_without_a_dataloader_is_strong_scaling(tmp_path: Path) -> None:
    """nanoGPT's style: 16 sequences per iteration at any world size, no DataLoader. It read as
    weak scaling with no throughput; the trained module's inputs give both."""
    comp = _compare(tmp_path, "fixed_global_batch.py", "--steps", "8", "--rounds", "1")
    assert comp["mode"] == "strong", comp["mode_basis"]
    assert [r["global_batch"] for r in comp["rows"]] == [16, 16]
    assert [r["batch_per_device"] for r in comp["rows"]] == [16, 8]
    assert all(r["samples_per_s"] for r in comp["rows"])
    assert comp["rows"][1]["speedup"] is not None
    assert "one round per row" in comp["verdict"]


def test_a_batch_the_script_only_peeked_at_is_not_counted(tmp_path: Path) -> None:
    """The pytorch/examples DDP tutorial fetches one batch with next(iter(loader)) per epoch
    to print its size: it was added to a step (512, 512, 1024... at batch 512)."""
    args = ["analyze", str(SCRIPTS / "peek_loader.py"), "--gpus", "2", "--quiet"]
    proc = subprocess.run(
        [sys.executable, "-m", "mgprof", *args, "--out", str(tmp_path), "--format", "json"],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    run = read_run(run_dir)
    for rank in run.ranks:
        assert {s.batch_size for s in rank.steps} == {32}
        assert rank.training.batch_source == "forward"
        assert rank.training.untrained_samples == 3 * 32  # epochs 2-4 peek after step 0
    job = (run.analysis or {})["job"]
    assert job["samples_per_s"] is not None
