"""Findings core: the Finding type, severities and the small readers every rule family shares."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import msgspec

from mgprof.analyze.readers import as_dict as _dict
from mgprof.analyze.readers import num as _num
from mgprof.records import RankRecord, RunRecord

Severity = Literal["high", "medium", "low", "info"]
SEVERITY_ORDER: dict[str, int] = {"high": 0, "medium": 1, "low": 2, "info": 3}
"""Report order: what costs most first; ``info`` is context, not a problem."""


class Finding(msgspec.Struct, kw_only=True):
    """One piece of advice: what was measured, why it matters, what to change, what it may save.

    ``id`` is stable: the rule, plus ``:rankN`` when the finding names one rank the rule itself
    established (see ``finding_id``); two identical runs give the same ids. ``figures`` holds
    every number ``evidence`` cites, under keys that carry their unit (``_ms``, ``_pct``...).
    """

    id: str
    rule: str
    severity: Severity
    title: str
    evidence: str
    """The measured figures, with units, that made the rule fire, and the thresholds."""
    cause: str
    change: str
    """The concrete change: code or a flag the user can apply."""
    fix: list[str]
    """The change as short code fragments, flags or commands, one per item, for tools."""
    saving: str | None = None
    """Estimated gain with its basis, when the figures allow an estimate."""
    figures: dict[str, Any] = msgspec.field(default_factory=dict)
    """Every number behind ``evidence`` (unit in the key name), for JSON consumers."""


def finding_id(rule: str, rank: int | None = None) -> str:
    """``rule`` or ``rule:rankN``: the subject is part of the id only when the rule has shown
    it is stable (the straggler), never a worst-of-N pick that can change between runs."""
    return rule if rank is None else f"{rule}:rank{rank}"


def sort_key(finding: Finding) -> tuple[int, str]:
    """Report order: most severe first, then by id, so the order never depends on rule order
    or on dict ordering."""
    return SEVERITY_ORDER[finding.severity], finding.id


# --------------------------------------------------------------------------------------------
# Small readers that turn "absent or wrong type" into None


def _job(figures: Mapping[str, Any]) -> dict[str, Any]:
    return _dict(figures.get("job"))


def _mean_step_ms(rank: Mapping[str, Any]) -> float | None:
    return _num(_dict(rank.get("step_time_ms")).get("mean"))


def _cuda_ranks(run: RunRecord) -> list[RankRecord]:
    return [r for r in run.ranks if r.device.kind == "cuda"]


def _rank_list(ranks: Sequence[int]) -> str:
    return ", ".join(str(r) for r in sorted(ranks))


def _trace_summaries(figures: Mapping[str, Any], rank: int) -> list[dict[str, Any]]:
    per_rank = _dict(_dict(figures.get("traces")).get("ranks"))
    raw = per_rank.get(str(rank), per_rank.get(rank))  # type: ignore[call-overload]
    return [s for s in raw if isinstance(s, dict)] if isinstance(raw, list) else []


def _facts(run: RunRecord, name: str) -> dict[int, Any]:
    """rank -> observed training fact, only for ranks where it was observed (not None), in rank
    order whatever the order of the records."""
    out: dict[int, Any] = {}
    for rec in sorted(run.ranks, key=lambda r: r.rank):
        value = getattr(rec.training, name, None)
        if value is not None:
            out[rec.rank] = value
    return out


Rule = Callable[[RunRecord, Mapping[str, Any]], "Finding | None"]
