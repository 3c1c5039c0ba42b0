"""Helpers for tests that run real Python processes: scripts in tmp_path, torchrun over gloo.

Kept out of conftest.py on purpose; tests import what they need from here.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TIMEOUT_S = 120


@dataclass
class Result:
    """A finished process: exit code and its output, torch's ``USDT:`` noise removed."""

    args: list[str]
    returncode: int
    stdout: str
    stderr: str

    def explain(self) -> str:
        head = f"{' '.join(self.args)} -> exit code {self.returncode}"
        return f"{head}\n--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"


def quiet(text: str) -> str:
    """Output without the ``USDT:`` lines torch prints on some machines."""
    return "\n".join(line for line in text.splitlines() if not line.startswith("USDT:"))


def clean_env(**extra: str) -> dict[str, str]:
    """The current environment without mgprof's or torchrun's variables, one thread per process."""
    drop = ("MGPROF_", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_")
    keep = ("MGPROF_CACHE_DIR",)  # the tests' private trace cache (conftest)
    env = {k: v for k, v in os.environ.items() if k in keep or not k.startswith(drop)}
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def write_script(folder: Path, name: str, source: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(source).lstrip())
    return path


def python_args(*args: str | os.PathLike[str]) -> list[str]:
    return [sys.executable, *(str(a) for a in args)]


def torchrun_args(script: Path, *args: str | os.PathLike[str], nproc: int = 2) -> list[str]:
    """``python -m torch.distributed.run --standalone --nproc-per-node N script args``."""
    return python_args(
        "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc), script, *args
    )


def run(
    args: Sequence[str],
    cwd: Path,
    env: Mapping[str, str] | None = None,
    timeout_s: float = TIMEOUT_S,
) -> Result:
    proc = subprocess.run(
        list(args),
        cwd=cwd,
        env=dict(env) if env is not None else clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    return Result(list(args), proc.returncode, quiet(proc.stdout), quiet(proc.stderr))


def run_many(
    jobs: Sequence[tuple[Sequence[str], Path, Mapping[str, str]]],
    parallel: int = 2,
    timeout_s: float = TIMEOUT_S,
) -> list[Result]:
    """Run the jobs, at most ``parallel`` at a time (the test machine has 2 cores)."""
    results: list[Result | None] = [None] * len(jobs)
    pending = list(enumerate(jobs))
    while pending:
        batch, pending = pending[:parallel], pending[parallel:]
        procs = [
            (i, subprocess.Popen(
                list(args), cwd=cwd, env=dict(env), stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True,
            ))
            for i, (args, cwd, env) in batch
        ]  # fmt: skip
        for i, proc in procs:
            try:
                out, err = proc.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
            results[i] = Result(list(jobs[i][0]), proc.returncode, quiet(out), quiet(err))
    return [r for r in results if r is not None]


def read_trace(path: Path) -> dict[str, Any]:
    """A gzip'd Chrome trace as a dict (fails loudly if it is not gzip or not JSON)."""
    with gzip.open(path, "rb") as fh:
        return json.loads(fh.read())


def profiler_steps(trace: Mapping[str, Any]) -> dict[int, tuple[float, float]]:
    """``ProfilerStep#N`` complete events: N -> (start_us, end_us)."""
    steps: dict[int, tuple[float, float]] = {}
    for ev in trace.get("traceEvents", []):
        name = ev.get("name", "")
        if ev.get("ph") == "X" and name.startswith("ProfilerStep#"):
            steps[int(name.split("#", 1)[1])] = (ev["ts"], ev["ts"] + ev.get("dur", 0))
    return steps


def run_dirs(root: Path, name: str) -> list[Path]:
    """Run directories named ``<UTC stamp>-<name>`` (with any ``-N`` suffix) under ``root``."""
    pattern = re.compile(rf"\d{{8}}T\d{{6}}Z-{re.escape(name)}(-\d+)?")
    return sorted(p for p in root.iterdir() if p.is_dir() and pattern.fullmatch(p.name))
