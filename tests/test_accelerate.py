"""An ``accelerate`` loop in real processes: two CPU ranks over gloo, a tiny MLP, a few updates.

- unmodified under ``mgprof analyze --gpus 2``: accelerate wraps the model in DDP itself, and
  the automatic session must see that DDP (gradient sync on every update), count one step per
  optimizer update (the micro-batches of ``accelerator.accumulate`` are not steps) and the
  samples all of a step's micro-batches trained;
- under ``accelerate launch`` with ``mgprof.integrations.accelerate.profile``: one complete run
  directory written by rank 0, as many steps per rank as the script's own update counter.

Skipped when accelerate is not installed (``pip install -e ".[accelerate]"``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _spawn import clean_env, python_args, run, run_dirs

SCRIPTS = Path(__file__).resolve().parent / "scripts"
SCRIPT = SCRIPTS / "accelerate_tiny.py"
TIMEOUT_S = 240
UPDATES, MICRO_BATCH, ACCUM = 5, 4, 2


def _state(root: Path) -> dict[str, Any]:
    """What the script's rank 0 wrote: its own update counter and its model's class."""
    state: dict[str, Any] = json.loads((root / "runs" / "accelerate_state.json").read_text())
    assert state["updates"] == UPDATES
    assert state["model"] == "DistributedDataParallel"  # accelerate wrapped it, not mgprof
    return state


def _run_json(run_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((run_dir / "run.json").read_text())
    assert data["status"] == "complete" and data["missing_ranks"] == []
    assert data["world_size"] == 2 and [r["rank"] for r in data["ranks"]] == [0, 1]
    assert data["strategy"] == "ddp"
    assert (run_dir / "report.md").read_text().strip()
    traces = sorted(p.name for p in (run_dir / "traces").iterdir())
    assert traces == ["rank0.pt.trace.json.gz", "rank1.pt.trace.json.gz"]
    return data


def test_the_helper_imports_no_accelerate() -> None:
    code = (
        "import sys, mgprof.integrations.accelerate; "
        "assert 'accelerate' not in sys.modules, 'accelerate imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env=clean_env(), timeout=120)


def test_profile_refuses_what_is_not_an_accelerator() -> None:
    # the helper imports no accelerate: this runs without it installed
    from mgprof.integrations.accelerate import profile

    with pytest.raises(TypeError, match=r"accelerate\.Accelerator.*got object"):
        profile(object())


@pytest.mark.slow
def test_unmodified_accelerate_script_under_mgprof_analyze(tmp_path: Path) -> None:
    pytest.importorskip("accelerate", reason="accelerate is not installed")
    args = python_args(
        "-m", "mgprof", "analyze", SCRIPT, "--gpus", "2", "--quiet", "--out", "mgprof-runs",
        "--", "--steps", str(UPDATES), "--batch-size", str(MICRO_BATCH), "--accum", str(ACCUM),
    )  # fmt: skip
    result = run(
        args, cwd=tmp_path, env=clean_env(HF_HOME=str(tmp_path / "hf")), timeout_s=TIMEOUT_S
    )
    assert result.returncode == 0, result.explain()
    _state(tmp_path)
    (run_dir,) = run_dirs(tmp_path / "mgprof-runs", "accelerate_tiny")
    data = _run_json(run_dir)
    for rank, figures in zip(data["ranks"], data["analysis"]["ranks"]):
        assert rank["step_form"] == "auto" and rank["warnings"] == []
        training = rank["training"]
        assert training["auto_wrap"]["reason"] == "the script wraps its model itself"
        # DDP seen synchronising once per update: accelerate.accumulate's no_sync micro-batches
        # are forwards without sync
        assert training["ddp_sync_forwards"] == UPDATES
        # the automatic session opens at the first update: one step fewer than the updates
        assert len(rank["steps"]) == UPDATES - 1
        assert [s["batch_size"] for s in rank["steps"]] == [MICRO_BATCH * ACCUM] * (UPDATES - 1)
        assert training["batch_source"] == "forward"
        assert figures["steps_measured"] > 0 and figures["samples_per_s"] > 0


@pytest.mark.slow
def test_accelerate_launch_with_the_helper_writes_one_complete_run(tmp_path: Path) -> None:
    pytest.importorskip("accelerate", reason="accelerate is not installed")
    # --multi_gpu is accelerate's torchrun launcher; on a machine without CUDA its ranks train
    # on the CPU over gloo (`--cpu` would start one process). HF_HOME keeps any saved
    # `accelerate config` of this machine out of the test.
    args = python_args(
        "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
        SCRIPT, "--profile", "--steps", str(UPDATES), "--batch-size", str(MICRO_BATCH),
        "--accum", str(ACCUM),
    )  # fmt: skip
    env = clean_env(HF_HOME=str(tmp_path / "hf"), CUDA_VISIBLE_DEVICES="")
    result = run(args, cwd=tmp_path, env=env, timeout_s=TIMEOUT_S)
    assert result.returncode == 0, result.explain()
    state = _state(tmp_path)
    (run_dir,) = run_dirs(tmp_path / "runs", "accelerate_tiny")
    assert Path(state["run_dir"]).name == run_dir.name  # the helper's run_dir, on rank 0
    data = _run_json(run_dir)
    assert (run_dir / "report.html").read_text().lstrip().lower().startswith("<!doctype html")
    for rank, figures in zip(data["ranks"], data["analysis"]["ranks"]):
        assert rank["step_form"] == "call" and rank["warnings"] == []
        assert rank["backend"] == "gloo" and rank["training"]["ddp_sync_forwards"] == UPDATES
        # one step per update, its batch all the micro-batches of the update
        assert len(rank["steps"]) == state["updates"]
        assert [s["batch_size"] for s in rank["steps"]] == [MICRO_BATCH * ACCUM] * UPDATES
        assert figures["steps_total"] == UPDATES
        assert 0 < figures["steps_measured"] < UPDATES  # the first step is warm-up
