"""Figures for one saved run: step time, throughput, utilisation, MFU, energy, communication,
memory headroom, data loading, slow ranks, identical batches and the gradient noise scale
(``noise_scale``).

Pure: a ``RunRecord`` (and the trace files beside it) in, a plain JSON-ready dict out, in the
layout ``mgprof.analyze.run.schema.RunAnalysis`` describes (``decode_analysis`` reads it back).
Every figure that cannot be computed is None with its reason in a ``not_applicable`` dict, and
every figure's definition is named in ``definitions``, so a report never shows a made-up number.
Trace analysis is delegated to ``mgprof.analyze.trace.summary``; its failures become reasons,
never exceptions, because a broken trace must not hide the figures the step timer and sampler
did record.

This module is the entry point: it assembles the figures and re-exports the public names. The
work lives in ``run_traces`` (trace files through the engine), ``run_rank_figures`` (per rank,
with ``run_steps`` and ``run_trace_figures``), ``run_job_figures`` (across ranks),
``run_results`` (result records, definitions) and ``device_peaks`` (peak FLOP/s for MFU).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from mgprof.analyze.run.device_peaks import device_peak_tflops
from mgprof.analyze.run.job_figures import job_analysis
from mgprof.analyze.run.memory import memory_analysis
from mgprof.analyze.run.noise_scale import DEFINITIONS as NOISE_DEFINITIONS
from mgprof.analyze.run.noise_scale import noise_scale_analysis
from mgprof.analyze.run.precision import DEFINITIONS as PRECISION_DEFINITIONS
from mgprof.analyze.run.precision import precision_analysis
from mgprof.analyze.run.rank_figures import analyze_rank
from mgprof.analyze.run.results import (
    DEFINITIONS,
    CommFigures,
    DeviceUtil,
    JobAnalysis,
    MemoryFigures,
    RankAnalysis,
    StepTimeStats,
)
from mgprof.analyze.run.schema import ANALYSIS_VERSION
from mgprof.analyze.run.steps import steady_state_steps, step_time_stats
from mgprof.analyze.run.traces import TraceAnalyzer, analyze_traces
from mgprof.records import RunRecord

__all__ = [
    "ANALYSIS_VERSION",
    "DEFINITIONS",
    "CommFigures",
    "DeviceUtil",
    "JobAnalysis",
    "MemoryFigures",
    "RankAnalysis",
    "StepTimeStats",
    "TraceAnalyzer",
    "analyze_run",
    "device_peak_tflops",
    "steady_state_steps",
    "step_time_stats",
]


def analyze_run(
    run: RunRecord,
    run_dir: Path | None,
    *,
    trace_analyzer: TraceAnalyzer | None = None,
) -> dict[str, Any]:
    """All run figures as a plain, JSON-ready dict: a ``RunAnalysis``
    (``mgprof.analyze.run.schema``, documented in ``docs/reports.md``) without its findings.

    ``run_dir`` locates the trace files named in each rank record; without it the trace figures
    are not applicable. ``trace_analyzer`` replaces the trace engine (tests, other engines).
    Never raises for bad or missing data: such figures are None with a reason.
    """
    traces = analyze_traces(run, run_dir, trace_analyzer)
    ranks = [analyze_rank(rec, traces) for rec in sorted(run.ranks, key=lambda r: r.rank)]
    job = job_analysis(run, ranks, traces.job if isinstance(traces.job, dict) else None)
    out = {
        "version": ANALYSIS_VERSION,
        "ranks": [msgspec.to_builtins(r) for r in ranks],
        "job": msgspec.to_builtins(job),
        "traces": {
            "ranks": {str(rank): summaries for rank, summaries in sorted(traces.per_rank.items())},
            "job": traces.job,
        },
        "definitions": {**DEFINITIONS, **NOISE_DEFINITIONS},
        "warnings": traces.warnings,
        "noise_scale": noise_scale_analysis(run),
    }
    precision = precision_analysis(run)
    if precision is not None:
        out["precision"] = precision
        out["definitions"].update(PRECISION_DEFINITIONS)
    memory = memory_analysis(run, run_dir)
    if memory is not None:
        out["memory"] = memory
    return out
