"""The few lines the in-code API prints to stderr when a session ends (rank 0, no launcher).

``mgprof.profile`` / ``@mgprof.profile_step`` write their run directory and report files; these
lines say where they went and give the headline figures, so a plain ``python train.py`` shows
something without opening a file::

    mgprof: run saved to mgprof-runs/20260101T120000Z-train (report.md, report.html)
    mgprof: step 12.3 ms (p95 14.1, slowest of 4 ranks), 5,200 samples/s
    mgprof: mean of 4 ranks: GPU util 87% (NVML), busy 74% (trace); comm 18% exposed (worst: rank 2)
    mgprof: top finding [medium]: Communication is not hidden behind compute (+1 more in the report)
    mgprof: full report: mgprof report mgprof-runs/20260101T120000Z-train

Only figures that were measured are shown: a missing figure is left out, never printed as 0.
The step time is the slowest rank's, as in the run report's summary (``summary.slowest_step``);
these lines round to about three significant digits, the report as its tables do.
Pure: a ``RunRecord`` and its analysis in, strings out, ready for a plain ``write``: the path,
error and finding title they quote have their control characters shown escaped
(``safe_text.printable``; newlines of a multi-line error are kept).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Sequence

from mgprof.analyze.run.results import RankAnalysis
from mgprof.analyze.run.schema import RunAnalysis, given
from mgprof.records import RunRecord
from mgprof.report.run.summary import slowest_step
from mgprof.report.safe_text import printable

PREFIX = "mgprof: "


def _ms(value: float) -> str:
    """About three significant digits: 123 ms, 12.3 ms, 1.23 ms."""
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def _pct(value: float) -> str:
    return f"{value:.0f}%" if value >= 10 or value == 0 else f"{value:.1f}%"


def _rate(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _figures(
    ranks: Sequence[RankAnalysis], figure: Callable[[RankAnalysis], float | None]
) -> list[float]:
    return [v for v in (figure(r) for r in ranks) if v is not None]


def _status_line(run: RunRecord) -> str | None:
    parts = []
    if run.status != "complete":
        parts.append(f"run {run.status}" + (f": {run.error}" if run.error else ""))
    elif run.error:
        parts.append(f"error: {run.error}")
    if run.missing_ranks:
        missing = ", ".join(str(r) for r in sorted(run.missing_ranks))
        parts.append(f"ranks missing from the report: {missing}")
    return PREFIX + "; ".join(parts) if parts else None


def _step_line(run: RunRecord, analysis: RunAnalysis) -> str | None:
    ranks = analysis.ranks
    if not ranks:
        return None
    slowest = slowest_step(ranks)  # the rank the run report's summary quotes too
    if slowest is None or slowest.step_time_ms is None:
        if all(r.steps_total == 0 for r in ranks):
            return PREFIX + "no steps recorded: call prof.step() once per iteration"
        return None
    mean, p95 = slowest.step_time_ms.mean, slowest.step_time_ms.p95
    inner = [f"p95 {_ms(p95)}"]
    timed = sum(r.step_time_ms is not None for r in ranks)
    if timed > 1:
        inner.append(f"slowest of {timed} ranks")
    text = f"step {_ms(mean)} ms" + (f" ({', '.join(inner)})" if inner else "")
    rate = analysis.job.samples_per_s if analysis.job is not None else None
    if rate is not None:
        text += f", {_rate(rate)} samples/s"
    if run.cpu_fallback:
        text += " on CPU (the wiring, not GPU performance)"
    return PREFIX + text


def _utilisation_line(run: RunRecord, analysis: RunAnalysis) -> str | None:
    ranks = analysis.ranks
    groups = []
    util = []
    nvml = _mean(_figures(ranks, lambda r: r.nvml_gpu_util_pct))
    if nvml is not None:
        util.append(f"GPU util {_pct(nvml)} (NVML)")
    busy = _mean(_figures(ranks, lambda r: r.trace_busy_pct))
    if busy is not None:
        util.append(f"busy {_pct(busy)} (trace)")
    mfu = _mean(_figures(ranks, lambda r: r.mfu_pct))
    if mfu is not None:
        util.append(f"MFU {_pct(mfu)}")
    if util:
        several = f"mean of {len(ranks)} ranks: " if len(ranks) > 1 else ""
        groups.append(several + ", ".join(util))
    exposed = [
        (pct, r)
        for r in ranks
        if r.comm is not None and (pct := r.comm.exposed_comm_pct) is not None
    ]
    total_comm = sum((r.comm.comm_pct or 0.0) if r.comm is not None else 0.0 for r in ranks)
    if exposed and (run.world_size > 1 or total_comm > 0):
        pct, worst = max(exposed, key=lambda t: t[0])
        differ = len({p for p, _ in exposed}) > 1
        where = f" (worst: rank {worst.rank})" if differ else ""
        groups.append(f"comm {_pct(pct)} exposed{where}")
    return PREFIX + "; ".join(groups) if groups else None


def _finding_line(analysis: RunAnalysis) -> str | None:
    findings = given(analysis.findings) or []
    if not findings:
        return None
    top = findings[0]
    tag = f" [{top.severity}]" if top.severity else ""
    more = f" (+{len(findings) - 1} more in the report)" if len(findings) > 1 else ""
    return f"{PREFIX}top finding{tag}: {top.title}{more}"


def summary_lines(
    run: RunRecord,
    analysis: RunAnalysis | None,
    run_dir: str | os.PathLike[str],
    files: Sequence[str] = (),
) -> list[str]:
    """The end-of-session lines: where the run went, step time and throughput, utilisation and
    exposed communication when measured, the top finding, and how to see the full report.

    ``files`` are the report files written beside run.json (``report.md``, ``report.html``);
    ``analysis`` may be None or empty (the analysis failed): the lines then say where the run is.
    """
    where = os.fspath(run_dir)
    saved = f"{PREFIX}run saved to {where}" + (f" ({', '.join(files)})" if files else "")
    lines = [saved]
    figures = analysis if analysis is not None else RunAnalysis()
    for line in (
        _status_line(run),
        _step_line(run, figures),
        _utilisation_line(run, figures),
        _finding_line(figures),
    ):
        if line is not None:
            lines.append(line)
    lines.append(f"{PREFIX}full report: mgprof report {shlex.quote(where)}")
    return [printable(line, multiline=True) for line in lines]
