"""Findings core: the Finding type (defined with the analysis schema it is part of), severities
and the small readers every rule family shares."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from mgprof.analyze.run.results import RankAnalysis
from mgprof.analyze.run.schema import Finding, RunAnalysis, Severity
from mgprof.analyze.trace.summary import RankTraceSummary
from mgprof.records import RankRecord, RunRecord

__all__ = ["SEVERITY_ORDER", "Finding", "Rule", "Severity", "finding_id", "sort_key"]

SEVERITY_ORDER: dict[str, int] = {"high": 0, "medium": 1, "low": 2, "info": 3}
"""Report order: what costs most first; ``info`` is context, not a problem."""


def finding_id(rule: str, rank: int | None = None) -> str:
    """``rule`` or ``rule:rankN``: the subject is part of the id only when the rule has shown
    it is stable (the straggler), never a worst-of-N pick that can change between runs."""
    return rule if rank is None else f"{rule}:rank{rank}"


def sort_key(finding: Finding) -> tuple[int, str]:
    """Report order: most severe first, then by id, so the order never depends on rule order
    or on dict ordering."""
    return SEVERITY_ORDER[finding.severity], finding.id


# --------------------------------------------------------------------------------------------
# Small readers shared by the rule families


def _mean_step_ms(rank: RankAnalysis) -> float | None:
    return rank.step_time_ms.mean if rank.step_time_ms is not None else None


def _cuda_ranks(run: RunRecord) -> list[RankRecord]:
    return [r for r in run.ranks if r.device.kind == "cuda"]


def _rank_list(ranks: Sequence[int]) -> str:
    return ", ".join(str(r) for r in sorted(ranks))


def _trace_summaries(analysis: RunAnalysis, rank: int) -> list[RankTraceSummary]:
    return analysis.traces.ranks.get(str(rank), [])


def _facts(run: RunRecord, name: str) -> dict[int, Any]:
    """rank -> observed training fact, only for ranks where it was observed (not None), in rank
    order whatever the order of the records."""
    out: dict[int, Any] = {}
    for rec in sorted(run.ranks, key=lambda r: r.rank):
        value = getattr(rec.training, name, None)
        if value is not None:
            out[rec.rank] = value
    return out


Rule = Callable[[RunRecord, RunAnalysis], "Finding | None"]
