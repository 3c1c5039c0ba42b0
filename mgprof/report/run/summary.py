"""The run report's summary: the few lines every format opens with.

A run report is long (Setup, a dozen sections, the findings at the end); what a reader wants
first fits in a handful of lines::

    CPU run      no CUDA device visible; shows the wiring, not GPU performance
    step time    41.28 ± 1.92 ms mean, rank 1 (slowest of 2); p95 65.78 ms
    throughput   3,178.6 samples/s (job; 95 % interval 3,034.2 to 3,337.9)
    utilisation  trace busy 87.1–93.6 %, CPU 34.0–42.1 % (lowest–highest rank)
    comm         exposed 58.2–63.8 % of the window; overlap 10.3–13.2 % of comm
    memory       peak RSS 332–334 MiB (lowest–highest rank)
    [high] Communication is not hidden behind compute: up to 23.98 ms per step

Every figure is one the sections below show, formatted as they format it (``fixed(2)`` ms,
``fixed(1)`` percentages and samples/s, whole MiB), so the summary and the section it sums up
never disagree: a range is the lowest and highest of the ranks' cells, the step time is the
slowest rank's row. A figure the analysis does not have is left out, or said to be n/a with its
reason, never made up; nothing is computed here that the analysis does not hold (the step
time's ``±`` is half the 95 % interval of the mean the analysis holds, and the job's throughput
interval is the analysis's ``samples_per_s_ci95``).

``SummaryLine.quoted`` lists the formatted figures a line quotes and ``section`` the title of
the section they come from (``tests/test_report_first_lines.py`` checks the two agree); the JSON
report carries the same figures under ``summary`` (:meth:`RunSummary.as_json`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from mgprof.analyze.run.results import RankAnalysis
from mgprof.analyze.run.schema import Finding, RunAnalysis, given
from mgprof.records import RunRecord
from mgprof.report.failure_summary import failure_summary
from mgprof.report.run.figures import halfwidth
from mgprof.report.run.section_model import Fmt, cpu_only, fixed

MAX_LINES = 8
"""Lines the summary holds at most: the figures' lines, then as many findings as fit."""
MAX_FINDINGS = 3
"""Findings named at most (more are counted: ``+2 more below``)."""

STEP = "Step time per rank"
UTILISATION = "Utilisation"
COMMUNICATION = "Communication"
MEMORY = "Memory & headroom"
FINDINGS = "Findings"
SETUP = "Setup"

_TWO = fixed(2)
_ONE = fixed(1)
_ZERO = fixed(0)


@dataclass
class SummaryLine:
    """One line: a label in words, its text, and what it rests on."""

    key: str
    """Its key in the JSON report's ``summary``."""
    label: str
    text: str
    section: str
    """Title of the section whose figures it quotes."""
    quoted: list[str] = field(default_factory=list)
    """The formatted figures the text quotes, each as that section shows it."""
    figures: dict[str, Any] = field(default_factory=dict)
    """The same figures as numbers (rounded as shown), for the JSON report."""


@dataclass
class SummaryFinding:
    severity: str
    title: str
    id: str
    saving: str | None
    """The first clause of the finding's saving (``up to 23.98 ms per step``), as it says it."""


@dataclass
class RunSummary:
    lines: list[SummaryLine] = field(default_factory=list)
    findings: list[SummaryFinding] = field(default_factory=list)
    findings_total: int = 0

    def finding_rows(self) -> list[tuple[str, str]]:
        """(severity, ``title: saving``) per finding named, ``(+N more below)`` after the last;
        one ("", "none") when the analysis has none."""
        rows = [
            (f.severity, f.title + (f": {f.saving}" if f.saving else "")) for f in self.findings
        ]
        more = self.findings_total - len(self.findings)
        if rows and more > 0:
            rows[-1] = (rows[-1][0], f"{rows[-1][1]} (+{more} more below)")
        return rows or [("", "none")]

    def finding_texts(self) -> list[str]:
        """``[high] title: saving`` per finding named (``finding_rows``)."""
        return [f"[{sev}] {text}" if sev else text for sev, text in self.finding_rows()]

    def text_lines(self) -> list[str]:
        """The summary as plain lines: ``label: text`` per figure, then the findings."""
        return [f"{line.label}: {line.text}" for line in self.lines] + self.finding_texts()

    def as_json(self) -> dict[str, Any]:
        """The JSON report's ``summary``: ``text`` (the lines as the text reports print them,
        ``text_lines``), each line's figures under its key, then the findings named."""
        out: dict[str, Any] = {"text": self.text_lines()}
        for line in self.lines:
            out[line.key] = line.figures
        out["findings"] = [
            {"id": f.id, "severity": f.severity, "title": f.title, "saving": f.saving}
            for f in self.findings
        ]
        out["findings_total"] = self.findings_total
        return out


# --------------------------------------------------------------------------------------------
# figures


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def _span(values: Sequence[float], fmt: Fmt) -> tuple[str, list[str], list[float]]:
    """``87.1–93.6`` (lowest–highest, as ``fmt`` shows them) or ``87.1`` when they agree."""
    shown = sorted({fmt(v) for v in values}, key=_number)
    low, high = shown[0], shown[-1]
    if low == high:
        return low, [low], [_number(low)]
    return f"{low}–{high}", [low, high], [_number(low), _number(high)]


def slowest_step(ranks: Sequence[RankAnalysis]) -> RankAnalysis | None:
    """The rank with the highest mean step time, whose step time a summary quotes (the pace
    of a synchronised job; the in-code API's lines quote the same rank)."""
    timed = [r for r in ranks if r.step_time_ms is not None]
    return max(timed, key=lambda r: r.step_time_ms.mean if r.step_time_ms else 0.0, default=None)


def _na(reason: str | None) -> str:
    return f"n/a: {reason}" if reason else "n/a"


def _step_line(analysis: RunAnalysis) -> SummaryLine | None:
    ranks = analysis.ranks
    if not ranks:
        return None
    slow = slowest_step(ranks)
    if slow is None or slow.step_time_ms is None:
        why = next((r.not_applicable.get("step_time_ms") for r in ranks), None)
        if why is None and all(r.steps_total == 0 for r in ranks):
            why = "no step recorded"
        figures = {"mean": None, "p95": None, "interval": None}
        return SummaryLine("step_time_ms", "step time", _na(why), STEP, figures=figures)
    st = slow.step_time_ms
    mean, p95 = _TWO(st.mean), _TWO(st.p95)
    half = halfwidth(st)
    where = f", rank {slow.rank} (slowest of {len(ranks)})" if len(ranks) > 1 else ""
    quoted = [mean, p95]
    spread = ""
    if half is not None:
        quoted.append(_TWO(half))
        spread = f" ± {_TWO(half)}"
    return SummaryLine(
        "step_time_ms",
        "step time",
        f"{mean}{spread} ms mean{where}; p95 {p95} ms",
        STEP,
        quoted=quoted,
        figures={
            "mean": _number(mean),
            "p95": _number(p95),
            "rank": slow.rank,
            "ranks": len(ranks),
            "ci95_halfwidth": _number(_TWO(half)) if half is not None else None,
        },
    )


def _throughput_line(analysis: RunAnalysis) -> SummaryLine | None:
    job = analysis.job
    if job is None:
        return None
    if job.samples_per_s is None:
        why = job.not_applicable.get("samples_per_s")
        figures = {"job": None, "interval": None}
        return SummaryLine("samples_per_s", "throughput", _na(why), STEP, figures=figures)
    rate = _ONE(job.samples_per_s)
    if not job.samples_per_s_ci95:
        return SummaryLine(
            "samples_per_s",
            "throughput",
            f"{rate} samples/s (job)",
            STEP,
            quoted=[rate],
            figures={"job": _number(rate), "interval": None},
        )
    low, high = (_ONE(v) for v in job.samples_per_s_ci95)
    return SummaryLine(
        "samples_per_s",
        "throughput",
        f"{rate} samples/s (job; 95 % interval {low} to {high})",
        STEP,
        quoted=[rate, low, high],
        figures={"job": _number(rate), "interval": [_number(low), _number(high)]},
    )


def _utilisation_parts(analysis: RunAnalysis) -> list[tuple[str, str, list[float]]]:
    """(name, JSON key, the values the Utilisation table shows) per figure it has."""
    ranks = analysis.ranks
    busy = [r.trace_busy_pct for r in ranks if r.trace_busy_pct is not None]
    if cpu_only(analysis):
        cpu = [
            v
            for r in ranks
            if (v := next((d.cpu_pct for d in r.devices if d.cpu_pct is not None), None))
            is not None
        ]
        return [("trace busy", "trace_busy_pct", busy), ("CPU", "cpu_pct", cpu)]
    nvml: list[float] = []
    for r in ranks:
        if len(r.devices) > 1:  # DataParallel: the table's rows are the devices
            nvml.extend(d.gpu_util_pct for d in r.devices if d.gpu_util_pct is not None)
        elif r.nvml_gpu_util_pct is not None:
            nvml.append(r.nvml_gpu_util_pct)
    mfu = [r.mfu_pct for r in ranks if r.mfu_pct is not None]
    return [
        ("NVML GPU util", "nvml_gpu_util_pct", nvml),
        ("trace busy", "trace_busy_pct", busy),
        ("MFU", "mfu_pct", mfu),
    ]


def _utilisation_line(analysis: RunAnalysis) -> SummaryLine | None:
    if not analysis.ranks:
        return None
    parts, quoted, figures = [], [], {}
    ranged = False
    for name, key, values in _utilisation_parts(analysis):
        if not values:
            continue
        text, shown, numbers = _span(values, _ONE)
        ranged = ranged or len(shown) > 1
        parts.append(f"{name} {text} %")
        quoted += shown
        figures[key] = numbers
    if not parts:
        return SummaryLine("utilisation", "utilisation", "n/a (see Utilisation)", UTILISATION)
    tail = " (lowest–highest rank)" if ranged else ""
    return SummaryLine(
        "utilisation", "utilisation", ", ".join(parts) + tail, UTILISATION, quoted, figures
    )


def _communication_line(analysis: RunAnalysis) -> SummaryLine | None:
    ranks = analysis.ranks
    comms = [r.comm for r in ranks if r.comm is not None]
    if len(ranks) == 1 and comms and not comms[0].comm_us and not comms[0].collectives:
        return None  # one process, no collective: the section says so in one line
    if not comms:
        if len(ranks) < 2:
            return None
        why = next((r.not_applicable.get("comm") for r in ranks if r.comm is None), None)
        return SummaryLine("communication", "comm", _na(why), COMMUNICATION)
    exposed = [c.exposed_comm_pct for c in comms if c.exposed_comm_pct is not None]
    overlap = [c.comm_overlap_pct for c in comms if c.comm_overlap_pct is not None]
    parts, quoted, figures = [], [], {}
    if exposed:
        text, shown, numbers = _span(exposed, _ONE)
        parts.append(f"exposed {text} % of the window")
        quoted += shown
        figures["exposed_comm_pct"] = numbers
    if overlap:
        text, shown, numbers = _span(overlap, _ONE)
        parts.append(f"overlap {text} % of comm")
        quoted += shown
        figures["comm_overlap_pct"] = numbers
    if not parts:
        return SummaryLine("communication", "comm", "n/a (see Communication)", COMMUNICATION)
    return SummaryLine("communication", "comm", "; ".join(parts), COMMUNICATION, quoted, figures)


def _headroom_line(analysis: RunAnalysis) -> SummaryLine | None:
    """GPU: the rank with the least headroom (Memory & headroom's row), its peak reserved."""
    measured = [
        (r.memory.headroom_pct, r.rank, r.memory)
        for r in analysis.ranks
        if r.memory is not None and r.memory.headroom_pct is not None
    ]
    if not measured:
        return None
    pct_value, rank, mem = min(measured, key=lambda t: (t[0], t[1]))
    pct = _ONE(pct_value)
    quoted = [pct]
    figures: dict[str, Any] = {"headroom_pct": _number(pct), "rank": rank}
    text = f"{pct} %"
    if mem.headroom_mib is not None:
        mib = _ZERO(mem.headroom_mib)
        text = f"{mib} MiB ({pct} %)"
        quoted.insert(0, mib)
        figures["headroom_mib"] = _number(mib)
    several = len(analysis.ranks) > 1
    text = f"headroom {text}" + (f" on rank {rank}, the least" if several else "")
    if mem.peak_reserved_mib is not None:
        resv = _ZERO(mem.peak_reserved_mib)
        text += f"; peak reserved {resv} MiB"
        quoted.append(resv)
        figures["peak_reserved_mib"] = _number(resv)
    return SummaryLine("memory", "memory", text, MEMORY, quoted, figures)


def _memory_line(analysis: RunAnalysis) -> SummaryLine | None:
    """Headroom on a GPU run; peak RSS on a CPU run (or a GPU run without headroom)."""
    ranks = analysis.ranks
    if not ranks:
        return None
    if not cpu_only(analysis):
        line = _headroom_line(analysis)
        if line is not None:
            return line
    rss = [r.memory.peak_rss_mib for r in ranks if r.memory and r.memory.peak_rss_mib is not None]
    if not rss:
        keys = ("memory", "headroom_pct", "peak_rss_mib")
        why = next(
            (r.not_applicable[k] for r in ranks for k in keys if k in r.not_applicable), None
        )
        return SummaryLine("memory", "memory", _na(why), MEMORY)
    text, shown, numbers = _span(rss, _ZERO)
    tail = " (lowest–highest rank)" if len(shown) > 1 else ""
    return SummaryLine(
        "memory", "memory", f"peak RSS {text} MiB{tail}", MEMORY, shown, {"peak_rss_mib": numbers}
    )


def _fallback_line(run: RunRecord) -> SummaryLine | None:
    if not run.cpu_fallback:
        return None
    reason = (run.cpu_fallback_reason or "no CUDA device").split(":")[0].split(";")[0].strip()
    return SummaryLine(
        "cpu_fallback",
        "CPU run",
        f"{reason}; shows the wiring, not GPU performance",
        SETUP,
        figures={"reason": run.cpu_fallback_reason},
    )


_CLAUSE = re.compile(r" \(|; |: ")


def _saving(finding: Finding) -> str | None:
    """The saving's first clause: ``up to 23.98 ms per step`` of ``up to 23.98 ms per step
    (61.0 % of the 39.31 ms mean step) if all of it were overlapped`` (cut before a bracket,
    a semicolon or a colon), word for word as the Findings section says it."""
    if not finding.saving:
        return None
    return _CLAUSE.split(finding.saving, maxsplit=1)[0].rstrip(" ,:")


def run_summary(run: RunRecord, analysis: RunAnalysis) -> RunSummary:
    """The summary of a run's analysis (module docstring)."""
    optional = [
        _fallback_line(run),
        _step_line(analysis),
        _throughput_line(analysis),
        _utilisation_line(analysis),
        _communication_line(analysis),
        _memory_line(analysis),
    ]
    summary = RunSummary(lines=[line for line in optional if line is not None])
    findings = list(given(analysis.findings) or [])
    room = max(1, min(MAX_FINDINGS, MAX_LINES - len(summary.lines)))
    summary.findings = [
        SummaryFinding(severity=f.severity, title=f.title, id=f.id, saving=_saving(f))
        for f in findings[:room]
    ]
    summary.findings_total = len(findings)
    return summary


def report_summary(run: RunRecord, analysis: RunAnalysis) -> RunSummary | None:
    """The summary a report opens with, or None where the report has no figures to sum up: a
    failed run with too few steps, whose failure summary is the whole report
    (``failure_summary``). A failed run with enough steps gets it under the failure summary."""
    failure = failure_summary(run, analysis)
    if failure is not None and not failure.full_report:
        return None
    return run_summary(run, analysis)


__all__ = [
    "RunSummary",
    "SummaryFinding",
    "SummaryLine",
    "report_summary",
    "run_summary",
    "slowest_step",
]
