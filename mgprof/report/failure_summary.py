"""What a failed (or empty) run's report says first: what failed, where, and what was measured.

A run that failed after a step or two has nothing to show in the report's tables but ``n/a``;
what the user needs is the failing rank, its exception, the last lines of its traceback, where
each rank's full output is (``logs/rank<N>.log`` in the run directory, written by
``mgprof.run.ranklog``) and how many steps each rank recorded before the end. This module builds
that summary once for every renderer (terminal, Markdown, HTML), as ``run_sections`` does for the
full report, and reads tracebacks for the launcher's one-line error too.

The full report follows the summary only when some rank recorded ``FULL_REPORT_MIN_STEPS``
steps (from three steps the first is dropped as warm-up and the figures are steady-state ones);
below that its tables would hold warm-up or ``n/a`` only and are left out.

Pure: no torch, no file access; a ``RunRecord`` and its analysis in, plain text out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import msgspec

from mgprof.analyze.run.schema import RunAnalysis
from mgprof.records import RankExit, RunRecord
from mgprof.report.run.sections import Section, Table, build_sections

FULL_REPORT_MIN_STEPS = 3
TRACEBACK_LINES = 12
"""Lines of the failing rank's traceback shown (its end: last frames and the exception)."""
MESSAGE_CHARS = 240
"""An exception message longer than this is cut (``…``) in one-line summaries."""
NO_STEP = "the script made no optimizer step; nothing to measure"

TRACEBACK_HEAD = "Traceback (most recent call last):"
_EXC_LINE = re.compile(r"^[A-Za-z_][\w.]*(:\s|:$|$)")
_FRAME = re.compile(r'^\s*File "([^"]*)", line \d+')
_FIRST_FAILED = re.compile(r"\brank (\d+) failed first: (.*?)(?: \(log: [^)]*\)|; then |$)")
"""The launcher's words (``mgprof.run.launcher``): it read the rank's log when its record
held no traceback, so its line may know the exception when the record does not."""
_SYMPTOM = re.compile(
    r"closed by peer|reset by peer|remote worker|broken pipe|communicator was aborted"
    r"|exited with code (?:130|143)\b",
    re.IGNORECASE,
)
"""Errors that follow another rank's failure (its socket closed, torchrun's SIGTERM), so a rank
dying of one was not the first to fail even when torchrun observed it first."""


def log_name(rank: int) -> str:
    """Where a rank's output is kept, relative to the run directory (``mgprof.run.ranklog``)."""
    return f"logs/rank{rank}.log"


# --------------------------------------------------------------------------------------------
# Reading tracebacks


def _last_traceback(text: str) -> list[str]:
    """The lines of the last ``Traceback (most recent call last):`` block to the end."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip() == TRACEBACK_HEAD]
    return lines[starts[-1] :] if starts else []


def _clip(text: str, limit: int = MESSAGE_CHARS) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def exception_text(text: str | None, limit: int = MESSAGE_CHARS) -> str | None:
    """``ValueError: bad batch`` from a traceback (a rank's ``error``, a log's tail): the
    exception the last traceback ended with, its message's first line, cut at ``limit``.

    None when the text holds no traceback (``exited with code 3``) or it cannot be read.
    """
    block = _last_traceback(text or "")
    for i, line in enumerate(block[1:], start=1):
        if not line.strip() or line.startswith((" ", "\t")):
            continue  # frames, source lines, carets
        if not _EXC_LINE.match(line):
            return None
        head = line.strip()
        more = [x for x in block[i + 1 :] if x.strip()]
        if head.endswith(":") and more:  # the message starts on the next line
            head = f"{head} {more.pop(0).strip()}"
        return _clip(head + (" …" if more else ""), limit)
    return None


def traceback_tail(text: str | None, lines: int = TRACEBACK_LINES) -> list[str]:
    """The end of the last traceback in ``text``, without mgprof's own frames (bootstrap,
    runpy) that start every script's traceback; ``…`` first when lines were left out."""
    block = _last_traceback(text or "")
    if not block:
        return []
    kept: list[str] = []
    skipping = False
    for line in block[1:]:
        frame = _FRAME.match(line)
        if frame:
            path = frame.group(1)
            skipping = path.startswith("<frozen runpy>") or path.replace("\\", "/").endswith(
                "mgprof/run/bootstrap.py"
            )
        elif not line.startswith("    "):
            skipping = False
        if not skipping:
            kept.append(line.rstrip())
    while kept and not kept[-1].strip():
        kept.pop()
    if len(kept) + 1 > lines:
        return ["…", *kept[-(lines - 1) :]]
    return [TRACEBACK_HEAD, *kept]


def is_symptom(error: str | None) -> bool:
    """Whether a rank's error reads as the consequence of another rank's failure."""
    return bool(error and _SYMPTOM.search(exception_text(error) or error.splitlines()[0]))


def first_failure(exits: Sequence[RankExit], errors: Mapping[int, str | None]) -> RankExit | None:
    """The rank that failed first: torchrun's root cause, unless that rank died of a peer's
    failure (``Connection closed by peer``) while another failed rank did not."""
    ranked = sorted((e for e in exits if e.rank is not None), key=lambda e: not e.root_cause)
    if not ranked:
        return None
    for e in ranked:  # root cause first, then in torchrun's order
        if e.rank is not None and not is_symptom(errors.get(e.rank)):
            return e
    return ranked[0]


def rank_outcome(error: str | None, exit_: RankExit | None) -> str:
    """How one rank ended, in a few words: its exception, its exit, or its first error line."""
    exc = exception_text(error, limit=120)
    if exc:
        return exc
    if exit_ is not None:
        if exit_.exit_code < 0 and exit_.signal:
            return f"killed by {exit_.signal} (exit code {exit_.exit_code})"
        return f"exit code {exit_.exit_code}" + (f" ({exit_.signal})" if exit_.signal else "")
    if error and error.strip():
        return _clip(error.strip().splitlines()[0], 120)
    return "-"


# --------------------------------------------------------------------------------------------
# The summary


@dataclass
class FailureSummary:
    """The failure section (facts, per-rank table, notes) and the failing rank's traceback."""

    section: Section
    traceback: list[str] = field(default_factory=list)
    traceback_title: str = ""
    full_report: bool = False
    """Whether the normal report's sections follow (enough steps were measured)."""


def failed(run: RunRecord) -> bool:
    """Whether the run's report starts with a failure summary."""
    return run.status != "complete" or bool(run.error)


def _steps_recorded(run: RunRecord, analysis: RunAnalysis) -> dict[int, int]:
    steps = {r.rank: len(r.steps) for r in run.ranks}
    for a in analysis.ranks:  # a saved run's analysis may know ranks the record lacks
        steps.setdefault(a.rank, a.steps_total)
    return steps


def rank_ranges(ranks: Sequence[int]) -> str:
    """``0, 2-7``: sorted ranks with runs of consecutive ones joined."""
    parts: list[str] = []
    ordered = sorted(set(ranks))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ", ".join(parts)


def _rank_rows(
    run: RunRecord,
    steps: Mapping[int, int],
    errors: Mapping[int, str | None],
    exits: Mapping[int, RankExit],
) -> list[list[str]]:
    """One row per (steps recorded, how it ended), ranks with the same joined (``0, 2-7``), so
    a large job's failure stays a few lines."""
    known = set(steps) | set(errors) | set(exits) | set(run.missing_ranks)
    groups: dict[tuple[str, str], list[int]] = {}
    for rank in sorted(known):
        recorded = str(steps[rank]) if rank in steps else "no record"
        outcome = rank_outcome(errors.get(rank), exits.get(rank))
        if outcome == "-":
            outcome = "no error recorded" if rank in steps else "no record"
        groups.setdefault((recorded, outcome), []).append(rank)
    rows = [[rank_ranges(ranks), *key] for key, ranks in groups.items()]
    return sorted(rows, key=lambda row: min(groups[(row[1], row[2])]))


def _first_rank(run: RunRecord, errors: Mapping[int, str | None]) -> tuple[int | None, str]:
    """The rank that failed first and what the launcher's line says it died of ("" if none)."""
    match = _FIRST_FAILED.search(run.error or "")
    if match:
        return int(match.group(1)), match.group(2).strip()
    first = first_failure(run.rank_exits, errors)
    if first is not None:
        return first.rank, ""
    if run.world_size == 1 and (run.exit_code or errors.get(0)):
        return 0, ""
    with_tb = [r for r, e in sorted(errors.items()) if exception_text(e)]
    return (with_tb[0] if len(with_tb) == 1 else None), ""


def failure_summary(run: RunRecord, analysis: RunAnalysis) -> FailureSummary | None:
    """The summary a failed or empty run's report opens with; None for a complete run."""
    if not failed(run):
        return None
    launched = run.exit_code is not None  # made by the launcher: per-rank logs exist
    errors = {r.rank: r.error for r in run.ranks if r.error}
    steps = _steps_recorded(run, analysis)
    exits = {e.rank: e for e in run.rank_exits if e.rank is not None}
    nothing = not run.ranks and (run.error or "").startswith(NO_STEP)
    sec = Section("Nothing measured" if nothing else "Run failed")
    sec.facts.append(("error", run.error or f"run {run.status}, no error recorded"))
    first, said = (None, "") if nothing else _first_rank(run, errors)
    summary = FailureSummary(section=sec)
    if first is not None:
        exit_ = exits.get(first)
        how = rank_outcome(errors.get(first), exit_)
        if said and not exception_text(errors.get(first)):
            how = said  # read from the rank's log by the launcher
        sec.facts.append(("failed first", f"rank {first}" + (f": {how}" if how != "-" else "")))
        tail = traceback_tail(errors.get(first))
        if tail:
            summary.traceback = tail
            summary.traceback_title = f"end of rank {first}'s traceback"
        elif launched:
            sec.notes.append(
                f"rank {first}'s traceback is not in the run record (it failed before mgprof "
                f"recorded a step, or was killed): see {log_name(first)}"
            )
    if launched:
        where = log_name(first) if first is not None else log_name(0)
        sec.facts.append(("logs", f"{where} in the run directory (one logs/rank<N>.log per rank)"))
    if nothing:
        sec.notes.append(
            "mgprof measures from the first optimizer.step(); a script that resumed from a "
            "finished checkpoint, got an empty dataset or stopped on its own arguments makes "
            "none. Check the script's output in the log."
        )
    else:
        table = Table(["rank", "steps recorded", "ended with"], numeric_from=3)
        table.rows = _rank_rows(run, steps, errors, exits)
        sec.tables.append(table)
        best = max(steps.values(), default=0)
        summary.full_report = best >= FULL_REPORT_MIN_STEPS
        if best == 0:
            sec.notes.append("no rank recorded a step before the end: nothing was measured")
        elif not summary.full_report:
            sec.notes.append(
                f"too few steps for figures (fewer than {FULL_REPORT_MIN_STEPS} on every rank): "
                "the report's tables are left out"
            )
        else:
            sec.notes.append("the figures below cover the steps recorded before the failure")
    return summary


def sections_after(summary: FailureSummary, run: RunRecord, analysis: RunAnalysis) -> list[Section]:
    """The report's sections under a failure summary: Setup, without the error line and the
    ranks' tracebacks (the summary gives them) or an empty rank table; then the rest of the
    report only when enough steps were recorded (``full_report``)."""
    shown = msgspec.structs.replace(
        run, error=None, ranks=[msgspec.structs.replace(r, error=None) for r in run.ranks]
    )
    sections = build_sections(shown, analysis)
    if not summary.full_report:
        sections = sections[:1]
    sections[0].tables = [t for t in sections[0].tables if t.rows]
    return sections
