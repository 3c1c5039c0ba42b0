"""``torch.compile`` in the traced steps as one small table (rank | steps | compiled % |
regions/step | nested | frames | recompiled), shared by the run report's torch.compile section
and ``mgprof trace``: how much of each step ran inside compiled graphs is the figure that says
whether compiling paid off, and regions per step count the graph breaks the steps really ran.
"""

from __future__ import annotations

from collections.abc import Sequence

from mgprof.analyze.run.schema import RunAnalysis
from mgprof.analyze.trace.compiled import CompiledRegions
from mgprof.records import RunRecord
from mgprof.report.run.section_model import Section, Table, fixed
from mgprof.report.run.setup import compile_text

COLUMNS = [
    "rank",
    "steps",
    "compiled %",
    "regions /step",
    "nested",
    "frames",
    "recompiled",
]

NOTE = (
    "compiled % = the union of Torch-Compiled Region and CompiledFunctionBackward spans over the "
    "traced steps' windows; regions/step = top-level compiled regions per traced step (one per "
    "compiled frame run: more than one means graph breaks split the step); frames = distinct "
    "compiled frames seen, recompiled = frames dynamo compiled again."
)


def row(rank: str, c: CompiledRegions) -> list[str]:
    """One rank's cells."""
    return [
        rank,
        str(c.steps),
        fixed(1)(c.compiled_pct) if c.compiled_pct is not None else "n/a",
        f"{c.regions_per_step:.1f}",
        str(c.nested),
        str(len({f.split("/")[0] for f in c.frames})),
        str(c.recompiled_frames),
    ]


def rank_rows(found: Sequence[tuple[str, CompiledRegions]]) -> list[list[str]]:
    return [row(rank, c) for rank, c in found]


def _found(analysis: RunAnalysis) -> list[tuple[str, CompiledRegions]]:
    out = []
    traces = analysis.traces.ranks
    for key in sorted(traces, key=lambda k: (len(k), k)):
        for s in traces[key]:
            if s.compiled is not None:
                out.append((key, s.compiled))
    return out


def compiled_section(run: RunRecord, analysis: RunAnalysis) -> Section | None:
    """None for a run without compiled code (no dynamo counters, no compiled region traced)."""
    counters = next((r.training.compile for r in run.ranks if r.training.compile), None)
    found = _found(analysis)
    if counters is None and not found:
        return None
    sec = Section("torch.compile")
    if counters is not None:
        sec.facts.append(("dynamo", compile_text(counters)))
    if found:
        table = Table(list(COLUMNS), numeric_from=1)
        table.rows = rank_rows(found)
        sec.tables.append(table)
        sec.notes.append(NOTE)
    else:
        sec.notes.append(
            "No compiled region in the traced steps: the compiled code did not run while the "
            "profiler recorded (or the trace is from before compilation)."
        )
    return sec
