"""A script's own FSDP2 read as what it is (2 CPU ranks over gloo, which torch 2.13 supports).

An unmodified ``fully_shard`` script (per block and on the root, AdamW) was reported as
"independent replicas (launched as ddp)": FSDP synchronises gradients by a reduce-scatter in
backward, not by DDP's all-reduce, and auto-wrap tried to put the sharded model under DDP. Here
its ranks are read as sharded and synchronised, with their units, settings and throughput.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from _spawn import clean_env

SCRIPTS = Path(__file__).resolve().parent / "scripts"

pytestmark = pytest.mark.slow


def _analyze(out: Path, *script_args: str) -> Path:
    args = ["analyze", str(SCRIPTS / "fsdp2_blocks.py"), "--gpus", "2", "--quiet"]
    proc = subprocess.run(
        [sys.executable, "-m", "mgprof", *args, "--out", str(out), "--", *script_args],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_json,) = out.glob("*/run.json")
    return run_json.parent


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _analyze(tmp_path_factory.mktemp("fsdp"), "--steps", "10")


def test_a_scripts_own_fsdp2_is_sharded_and_synchronised(fsdp_run: Path) -> None:
    run = json.loads((fsdp_run / "run.json").read_text())
    job = run["analysis"]["job"]
    sync = job["grad_sync"]
    assert (sync["status"], sync["how"]) == ("synchronised", "fsdp"), sync
    assert sync["detail"].startswith("sharded (FSDP: reduce-scatter)")
    assert job["strategy_label"] == "fsdp (the script's own; launched as ddp)"
    assert sync["auto_wrap"]["wrapper"] is None  # auto-wrap left the sharded model alone
    for rank in run["ranks"]:
        training = rank["training"]
        assert training["fsdp_forwards"] >= 10  # one per update, the nested units not counted
        assert training["ddp_sync_forwards"] in (None, 0)
        fsdp = training["fsdp"]
        assert fsdp["api"] == "fully_shard"
        assert fsdp["units"] == 5 and list(fsdp["unit_classes"].items()) == [
            ("Block", 4),
            ("Net", 1),
        ]
        assert fsdp["mesh_shape"] == [2] and fsdp["world"] == 2
        assert fsdp["reshard_after_forward"] == [False, True]  # the root keeps its parameters
        assert fsdp["param_dtype"] is None and fsdp["reduce_dtype"] is None
        assert {s["batch_size"] for s in rank["steps"]} == {16}  # the root's inputs
    assert job["samples_per_s"] is not None


def test_the_report_names_the_fsdp_setup(fsdp_run: Path) -> None:
    report = (fsdp_run / "report.md").read_text().replace("\\_", "_")
    assert "independent replicas" not in report
    assert "| FSDP | fully_shard (FSDP2): 5 units (Block x4, Net x1)" in report
    assert "reshard_after_forward False/True, no mixed-precision policy, mesh 2" in report


def test_checkpointed_blocks_rerun_in_backward_are_not_steps(tmp_path: Path) -> None:
    """Activation checkpointing runs each block's forward again inside backward: those are
    not steps, and their inputs are not samples (counted, they gave 5x the steps and batch)."""
    run = json.loads((_analyze(tmp_path, "--steps", "10", "--checkpoint") / "run.json").read_text())
    assert run["analysis"]["job"]["grad_sync"]["how"] == "fsdp"
    for rank in run["ranks"]:
        steps = rank["steps"]
        assert {s["batch_size"] for s in steps} == {16}
        assert rank["training"]["fsdp_forwards"] == len(steps) + 1  # + the unrecorded first
