"""The framework callbacks in real processes: two CPU ranks, a tiny model, a few steps.

- Hugging Face ``Trainer`` (a one-layer GPT-2 from a config, no download) under ``torchrun``;
- Lightning spawning its own two ranks (``Trainer(devices=2, strategy="ddp")``).

Each must leave one complete run directory written by rank 0 (both ranks' records, report.md,
report.html) with as many steps per rank as the trainer's ``global_step``: the record keeps every
optimizer step, and the analysis measures all but the first (mgprof's warm-up step). Skipped when
the framework is not installed (``pip install -e ".[hf]"`` / ``".[lightning]"``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _spawn import clean_env, python_args, run, run_dirs, torchrun_args

SCRIPTS = Path(__file__).resolve().parent / "scripts"
TIMEOUT_S = 300  # importing transformers or lightning takes most of it on a busy 2-core machine


def _check_run(
    root: Path, name: str, *, batch: int, regions: set[str], runs: Path | None = None
) -> dict[str, Any]:
    """The run directory under ``runs`` (default: ``root``) against ``root/trainer_state.json``."""
    state = json.loads((root / "trainer_state.json").read_text())
    global_step = state["global_step"]
    assert global_step == 6
    (run_dir,) = run_dirs(runs or root, name)
    assert Path(state["run_dir"]).name == run_dir.name  # the callback's run_dir, on rank 0
    data = json.loads((run_dir / "run.json").read_text())
    assert data["status"] == "complete" and data["missing_ranks"] == []
    assert data["world_size"] == 2 and [r["rank"] for r in data["ranks"]] == [0, 1]
    assert (run_dir / "report.md").read_text().strip()
    assert (run_dir / "report.html").read_text().lstrip().lower().startswith("<!doctype html")
    for rank, figures in zip(data["ranks"], data["analysis"]["ranks"]):
        assert len(rank["steps"]) == global_step, rank["steps"]
        assert [s["batch_size"] for s in rank["steps"]] == [batch] * global_step
        # the callback's own session, not mgprof analyze's automatic one ("auto")
        assert rank["step_form"] == "call" and rank["warnings"] == []
        assert {tuple(r["path"]) for r in rank["regions"]} == {(r,) for r in regions}
        assert figures["steps_total"] == global_step
        assert 0 < figures["steps_measured"] < global_step  # the first step is warm-up
    traces = sorted(p.name for p in (run_dir / "traces").iterdir())  # rank 1's came to rank 0
    assert traces == ["rank0.pt.trace.json.gz", "rank1.pt.trace.json.gz"]
    return data


def test_importing_mgprof_imports_no_framework() -> None:
    code = (
        "import sys, mgprof, mgprof.integrations; mgprof.profile; mgprof.region; "
        "bad = {'transformers', 'lightning', 'pytorch_lightning'} & set(sys.modules); "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env=clean_env(), timeout=120)


@pytest.mark.slow
def test_hf_trainer_under_torchrun_writes_one_complete_run(tmp_path: Path) -> None:
    pytest.importorskip("transformers", reason="the hf extra is not installed")
    pytest.importorskip("accelerate", reason="the hf extra is not installed (accelerate)")
    args = torchrun_args(
        SCRIPTS / "hf_trainer_tiny.py", "--steps", "6", "--batch-size", "4", "--accum", "2"
    )
    result = run(args, cwd=tmp_path, env=clean_env(), timeout_s=TIMEOUT_S)
    assert result.returncode == 0, result.explain()
    _check_run(tmp_path / "runs", "hf_tiny", batch=8, regions={"forward", "optimizer"})


@pytest.mark.slow
def test_lightning_spawning_two_ranks_writes_one_complete_run(tmp_path: Path) -> None:
    pytest.importorskip("lightning", reason="the lightning extra is not installed")
    args = python_args(
        SCRIPTS / "lightning_tiny.py", "--steps", "6", "--batch-size", "8", "--accum", "2"
    )
    result = run(args, cwd=tmp_path, env=clean_env(), timeout_s=TIMEOUT_S)
    assert result.returncode == 0, result.explain()
    _check_run(
        tmp_path / "runs", "lightning_tiny", batch=16, regions={"forward", "backward", "optimizer"}
    )


@pytest.mark.slow
def test_hf_trainer_under_mgprof_analyze_takes_over_the_automatic_session(tmp_path: Path) -> None:
    pytest.importorskip("transformers", reason="the hf extra is not installed")
    pytest.importorskip("accelerate", reason="the hf extra is not installed (accelerate)")
    script = SCRIPTS / "hf_trainer_tiny.py"
    args = python_args(
        "-m", "mgprof", "analyze", script, "--gpus", "2", "--quiet", "--out", "mgprof-runs",
        "--", "--steps", "6", "--batch-size", "4", "--accum", "2",
    )  # fmt: skip
    result = run(args, cwd=tmp_path, env=clean_env(), timeout_s=TIMEOUT_S)
    assert result.returncode == 0, result.explain()
    _check_run(
        tmp_path / "runs",
        "hf_trainer_tiny",
        batch=8,
        regions={"forward", "optimizer"},
        runs=tmp_path / "mgprof-runs",
    )
