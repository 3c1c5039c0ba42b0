"""Read the two sides of ``mgprof diff``: run directories (or their run.json) or trace folders.

A run is analysed afresh, as ``mgprof report`` does (the current rules, not the ones of the day
it was recorded), so a diff of two runs made months apart compares like with like. When one side
is a run and the other a folder of traces, the run is read as its traces (``run_as_traces``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from mgprof.analyze.diff.inputs import Side, run_as_traces, side_from_job, side_from_run
from mgprof.errors import TraceError, UsageError
from mgprof.records import RunRecord


@dataclass
class _Loaded:
    path: str
    run: RunRecord | None = None
    analysis: dict[str, Any] | None = None
    job: dict[str, Any] | None = None


def _is_run(path: Path) -> bool:
    if os.path.isdir(path):
        return (path / "run.json").is_file()
    return path.name == "run.json"


def _load(path: Path, workers: int | None) -> _Loaded:
    if not os.path.exists(path):
        raise UsageError(
            f"{path}: no such file or folder; give a run directory made by 'mgprof analyze' "
            "or a folder of torch.profiler traces"
        )
    if _is_run(path):
        from mgprof.analyze.findings import with_findings
        from mgprof.analyze.run.analysis import analyze_run
        from mgprof.records import read_run

        run = read_run(path)
        run_dir = path if os.path.isdir(path) else path.parent
        # decoded once for the rules; the sides read the dict (with the findings) as stored
        analysis, _typed = with_findings(run, {**(run.analysis or {}), **analyze_run(run, run_dir)})
        return _Loaded(str(path), run=run, analysis=analysis)
    from mgprof.analyze.trace.job import analyze_job, find_trace_files

    groups = find_trace_files([path])
    if len(groups) != 1:
        raise TraceError(f"{path}: holds traces of {len(groups)} folders; give one job's folder")
    (files,) = groups.values()
    job = analyze_job(files, top=200, workers=workers)
    return _Loaded(str(path), job=msgspec.to_builtins(job))


def load_sides(base: str | Path, new: str | Path, workers: int | None = None) -> tuple[Side, Side]:
    """Both sides, read the same way: two runs as runs, otherwise both as traces."""
    loaded = [_load(Path(p), workers) for p in (base, new)]
    both_runs = all(x.run is not None for x in loaded)
    sides = []
    for x in loaded:
        if x.run is not None and x.analysis is not None:
            sides.append(
                side_from_run(x.path, x.run, x.analysis)
                if both_runs
                else run_as_traces(x.path, x.run, x.analysis)
            )
        else:
            sides.append(side_from_job(x.path, x.job or {}))
    return sides[0], sides[1]
