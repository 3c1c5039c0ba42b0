"""Fixtures shared by several test modules."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True, scope="session")
def _private_trace_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The tests' trace-summary cache lives in a temporary folder (inherited by every process a
    test starts), never in the user's ~/.cache/mgprof."""
    import os

    before = os.environ.get("MGPROF_CACHE_DIR")
    os.environ["MGPROF_CACHE_DIR"] = str(tmp_path_factory.mktemp("trace-cache"))
    yield
    if before is None:
        os.environ.pop("MGPROF_CACHE_DIR", None)
    else:
        os.environ["MGPROF_CACHE_DIR"] = before


@pytest.fixture(scope="session")
def cpu_run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real run directory: ``mgprof analyze examples/mlp_context.py --gpus 2`` (2 gloo ranks).

    Made once per test session; tests must only read it (write their outputs elsewhere).
    """
    out = tmp_path_factory.mktemp("runs")
    ex = ROOT / "examples" / "mlp_context.py"
    args = ["analyze", str(ex), "--gpus", "2", "--quiet", "--out", str(out), "--", "--steps", "8"]
    proc = subprocess.run(
        [sys.executable, "-m", "mgprof", *args], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    return run_dir
