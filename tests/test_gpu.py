"""Checks that need a real CUDA device and NVML; skipped on machines without one.

Run on the GPU machine (see docs/benchmarks.md for what ran there and what it showed).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import mgprof
from mgprof.records import read_run

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

ROOT = Path(__file__).resolve().parents[1]


def _train(prof: mgprof.Session, steps: int) -> None:
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)
    ).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(256, 1024, device="cuda")
    for _ in range(steps):
        with prof.step(batch=x):
            loss = model(x).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()


def test_cuda_session_records_device_memory_nvml_and_traces(tmp_path: Path) -> None:
    with mgprof.profile(out=tmp_path, name="gpu", sample_interval_s=0.02) as prof:
        _train(prof, 30)
    run = read_run(next(tmp_path.glob("*-gpu")))
    rank = run.ranks[0]
    assert rank.device.kind == "cuda" and rank.device.name
    assert rank.memory is not None and rank.memory.peak_allocated_mib > 10
    assert rank.memory.total_mib and rank.memory.total_mib > rank.memory.peak_reserved_mib
    assert len(rank.steps) == 30 and all(s.duration_ms > 0 for s in rank.steps)
    assert rank.sampler.kind == "nvml", rank.sampler.reason
    dev = rank.sampler.devices[0]
    assert len(dev.t_s) >= 2
    assert dev.facts.get("uuid", "").startswith("GPU-")
    # the sampled GPU is the one torch used: same UUID
    assert dev.facts["uuid"] == rank.device.uuid
    trace = next((tmp_path / run.run_id / "traces").glob("rank0*.pt.trace.json.gz"))
    from mgprof.analyze.trace.summary import analyze_trace_file

    summary = analyze_trace_file(trace)
    assert summary.kind == "gpu"
    assert summary.totals.busy_pct is not None and summary.totals.busy_pct > 0


def test_analyze_cli_on_cuda(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mgprof",
            "analyze",
            str(ROOT / "examples" / "mlp_context.py"),
            "--gpus",
            "1",
            "--quiet",
            "--format",
            "json",
            "--out",
            str(tmp_path),
            "--",
            "--steps",
            "10",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = json.loads(proc.stdout)
    assert run["status"] == "complete" and not run["cpu_fallback"]
    assert run["ranks"][0]["device"]["kind"] == "cuda"
    assert run["ranks"][0]["sampler"]["kind"] == "nvml"


def test_more_gpus_than_visible_fails_before_start(tmp_path: Path) -> None:
    n = torch.cuda.device_count() + 1
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mgprof",
            "analyze",
            str(ROOT / "examples" / "mlp_context.py"),
            "--gpus",
            str(n),
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "visible" in proc.stderr and "Traceback" not in proc.stderr
    assert not any(tmp_path.iterdir())
