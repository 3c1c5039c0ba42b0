"""A script that compiles its model and trains it unwrapped, under ``mgprof analyze --gpus 2``.

Auto-wrap used to build ``DDP(compiled)``, the order PyTorch advises against; it now wraps the
original module and compiles the DDP wrapper with the script's own options, and the rank
records what dynamo compiled (graphs, graph breaks) from dynamo's counters.
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


def test_a_compiled_model_is_compiled_around_ddp(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable, "-m", "mgprof", "analyze", str(SCRIPTS / "compiled_mlp.py"),
            "--gpus", "2", "--steps", "8", "--trace-steps", "1", "--out", str(tmp_path),
            "--", "--backend", "aot_eager",
        ],
        env=clean_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_json,) = tmp_path.glob("*/run.json")
    run = json.loads(run_json.read_text())
    sync = run["analysis"]["job"]["grad_sync"]
    assert (sync["status"], sync["how"]) == ("synchronised", "ddp")
    wrap = sync["auto_wrap"]
    assert wrap["wrapper"] == "ddp"
    assert wrap["compile_order"] == "compile(ddp(model)) with the script's compile options"
    for rank in run["ranks"]:
        compiled = rank["training"]["compile"]
        assert compiled["graphs"] >= 1 and compiled["frames_ok"] >= 1
        assert all("/" not in r.split(" ", 1)[0] for r in compiled["break_reasons"])
    report = " ".join(proc.stdout.split())
    assert "compiled as compile(ddp(model))" in report and "torch.compile" in report


def test_torchs_own_container_keeps_the_scripts_order() -> None:
    import torch
    from torch import nn

    from mgprof.collect.wrapping import compile_watch

    compile_watch.patch()
    try:
        sequential = torch.compile(nn.Sequential(nn.Linear(2, 2)), backend="aot_eager")
        options = compile_watch.options_of(sequential)
        assert options == {"backend": "aot_eager"}
        why = compile_watch.why_not_around_ddp(sequential, options)
        assert why is not None and "Sequential" in why  # compile(DDP(seq)) would compile nothing

        class Mine(nn.Linear):
            pass

        mine = torch.compile(Mine(2, 2), backend="aot_eager")
        assert compile_watch.why_not_around_ddp(mine, compile_watch.options_of(mine)) is None
        assert compile_watch.why_not_around_ddp(mine, None) == "the compile options were not seen"
    finally:
        compile_watch.unpatch()
