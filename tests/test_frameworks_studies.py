"""``mgprof compare`` and ``mgprof sweep`` on framework scripts, in real processes on CPU ranks.

The scripts profile themselves through mgprof's callbacks (Hugging Face ``Trainer``: a one-layer
GPT-2 from a config; Lightning: a module of one Linear whose ``devices`` is the launcher's world
size). Under compare the single row is one process and the DDP row two ranks where the framework
wraps the model in DDP itself; under sweep each trial's batch reaches the framework through the
DataLoader it builds. Each row and trial must measure throughput from untraced steps after the
launcher's warm-up (the callback takes the launcher's schedule), end after the launcher's steps
(the script's own session included) and leave a complete run (Lightning's ``on_exception`` sees
the stop as a clean exit). Skipped when the framework is not installed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from _spawn import clean_env, python_args, run

SCRIPTS = Path(__file__).resolve().parent / "scripts"
TIMEOUT_S = 300  # importing transformers or lightning takes most of it on a busy 2-core machine
WARMUP, STEPS = 2, 3
FLAGS = ["--warmup", str(WARMUP), "--steps", str(STEPS), "--trace-steps", "1", "--quiet"]
# the script's own arguments: far more steps than the launcher lets it run, a batch of 2
SCRIPT_ARGS = ["--steps", "200", "--batch-size", "2"]
# script, the modules it needs
FRAMEWORKS = {
    "hf": ("hf_trainer_tiny.py", ["transformers", "accelerate"]),
    "lightning": ("lightning_launched.py", ["lightning"]),
}


def _script(framework: str) -> tuple[Path, list[str]]:
    name, modules = FRAMEWORKS[framework]
    for module in modules:
        pytest.importorskip(module, reason=f"{module} is not installed (the {framework} extra)")
    return SCRIPTS / name, SCRIPT_ARGS


def _study(root: Path) -> Path:
    (folder,) = [p for p in root.iterdir() if p.is_dir()]
    return folder


def _check_run(run_dir: Path, world_size: int, batch: int) -> list[dict[str, Any]]:
    """A complete run whose ranks recorded the callback's steps: warm-up + measured, no more."""
    data = json.loads((run_dir / "run.json").read_text())
    assert data["status"] == "complete", data.get("error")
    assert data["world_size"] == world_size and data["missing_ranks"] == []
    for rank in data["ranks"]:
        assert rank["step_form"] == "call"  # the callback's session, not the automatic one
        assert rank["error"] is None and rank["warnings"] == []
        assert [s["batch_size"] for s in rank["steps"]] == [batch] * (WARMUP + STEPS)
        assert sum(s["traced"] for s in rank["steps"]) == 1  # --trace-steps 1, not the default 3
    ranks: list[dict[str, Any]] = data["ranks"]
    return ranks


def test_callbacks_take_the_launchers_schedule_unless_given_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from mgprof.integrations._common import launcher_schedule

    assert launcher_schedule({"quiet": True}) == {"quiet": True}  # no launcher: the defaults
    monkeypatch.setenv("MGPROF_WARMUP", "2")
    monkeypatch.setenv("MGPROF_ACTIVE", "1")
    assert launcher_schedule({"quiet": True}) == {
        "quiet": True, "skip": 1, "warmup": 1, "active": 1,
    }  # fmt: skip
    assert launcher_schedule({"active": 5}) == {"active": 5}  # the callback's own wins
    monkeypatch.setenv("MGPROF_WARMUP", "0")
    monkeypatch.setenv("MGPROF_ACTIVE", "three")  # not a count: left to the session's default
    assert launcher_schedule({}) == {"skip": 0, "warmup": 0}


def test_a_clean_exit_is_no_error() -> None:
    from mgprof.integrations._common import exception_error

    assert exception_error(SystemExit(0)) is None  # how compare and sweep stop a script
    assert exception_error(SystemExit()) is None
    assert exception_error(SystemExit(3)) == "exited with code 3"
    assert exception_error(ValueError("bad")) == "ValueError: bad"


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["hf", "lightning"])
def test_compare_single_and_ddp_on_a_framework_script(tmp_path: Path, framework: str) -> None:
    script, script_args = _script(framework)
    args = python_args(
        "-m", "mgprof", "compare", script, "--gpus", "2", "--strategies", "single,ddp",
        "--rounds", "1", "--nosync-steps", "0", *FLAGS, "--out", "studies", "--", *script_args,
    )  # fmt: skip
    result = run(
        args, cwd=tmp_path, env=clean_env(HF_HOME=str(tmp_path / "hf")), timeout_s=TIMEOUT_S
    )
    assert result.returncode == 0, result.explain()
    folder = _study(tmp_path / "studies")
    comparison = json.loads((folder / "comparison.json").read_text())
    rows = {row["strategy"]: row for row in comparison["rows"]}
    assert sorted(rows) == ["ddp", "single"]
    for strategy, devices in (("single", 1), ("ddp", 2)):
        row = rows[strategy]
        assert row["status"] == "complete" and row["devices"] == devices
        assert row["batch_per_device"] == 2  # the script's own batch, read off the records
        assert row["steps_measured"] >= 1 and row["samples_per_s"] > 0
    assert rows["ddp"]["grad_sync"] == "synchronised"
    assert rows["ddp"]["speedup"] is not None
    _check_run(folder / rows["single"]["run"], 1, 2)
    for rank in _check_run(folder / rows["ddp"]["run"], 2, 2):
        # the framework wrapped the model in DDP at world size 2, not mgprof's auto-wrap
        assert rank["training"]["auto_wrap"]["reason"] == "the script wraps its model itself"
        assert rank["training"]["ddp_sync_forwards"] >= WARMUP + STEPS


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["hf", "lightning"])
def test_sweep_sets_the_frameworks_batch(tmp_path: Path, framework: str) -> None:
    script, script_args = _script(framework)
    args = python_args(
        "-m", "mgprof", "sweep", script, "--gpus", "2", "--batch-sizes", "4,8", *FLAGS,
        "--out", "studies", "--", *script_args,
    )  # fmt: skip
    result = run(
        args, cwd=tmp_path, env=clean_env(HF_HOME=str(tmp_path / "hf")), timeout_s=TIMEOUT_S
    )
    assert result.returncode == 0, result.explain()
    folder = _study(tmp_path / "studies")
    sweep = json.loads((folder / "sweep.json").read_text())
    assert [t["batch_size"] for t in sweep["trials"]] == [4, 8]
    for trial in sweep["trials"]:
        batch = trial["batch_size"]
        assert trial["status"] == "ok", trial["error"]
        # what the ranks trained, checked against the request: the framework built its
        # DataLoader with the trial's batch instead of the script's 2
        assert trial["observed_batch_size"] == batch
        assert trial["batch_applied_by"] == f"DataLoader(batch_size=2) -> {batch}"
        assert trial["global_batch"] == 2 * batch and trial["samples_per_s"] > 0
        _check_run(folder / trial["run_dir"], 2, batch)
