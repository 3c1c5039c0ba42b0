"""A model that does not learn is said to: zero gradients on real ranks (2 CPU ranks over gloo).

The pytorch/examples DDP tutorial's loss is cross-entropy over one class, identically 0, so every
gradient is 0; its report read like any healthy run's, and the noise scale said "gradient noise
swamps the signal ... B_simple > inf". Here an unmodified script with that loss is analysed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from _spawn import clean_env

from mgprof.analyze.run.noise_scale import StepNoise, summarize_steps

SCRIPTS = Path(__file__).resolve().parent / "scripts"


@pytest.mark.slow
def test_zero_gradients_are_a_finding_and_leave_the_noise_scale_undefined(tmp_path: Path) -> None:
    args = ["analyze", str(SCRIPTS / "constant_loss.py"), "--gpus", "2", "--quiet"]
    proc = subprocess.run(
        [sys.executable, "-m", "mgprof", *args, "--out", str(tmp_path)],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_json,) = tmp_path.glob("*/run.json")
    run = json.loads(run_json.read_text())
    for rank in run["ranks"]:
        norms = rank["training"]["grad_norms"]
        assert norms and set(norms) == {0.0}
        assert rank["training"]["grad_check_updates"][:2] == [0, 1]
    found = {f["rule"]: f for f in run["analysis"]["findings"]}
    assert "exactly 0 on ranks 0, 1" in found["zero_gradients"]["evidence"]
    noise = run["analysis"]["noise_scale"]
    assert noise["measured"] and noise["b_simple"] is None
    assert noise["reason"].startswith("not defined: gradients are zero")
    report = (run_json.parent / "report.md").read_text()
    assert "The model does not learn" in report
    assert "B_simple > inf" not in report and "swamps" not in report


def test_a_window_of_zero_norms_is_not_noise() -> None:
    zero = [StepNoise(i, 0.0, 0.0, 8.0, 16.0, 16.0) for i in range(12)]
    est = summarize_steps(zero)
    assert est.b_simple is None and est.band_low is None
    assert est.reason is not None and est.reason.startswith("not defined: gradients are zero")
    # one step with signal: an ordinary window, not "zero"
    est = summarize_steps([*zero, StepNoise(12, 1.0, 2.0, 8.0, 16.0, 16.0)])
    assert est.reason is None or "gradients are zero" not in est.reason
