"""Tolerant readers for analysis dicts: "absent or of the wrong type" becomes None or empty.

An analysis may come from a run.json written by another version, or edited by hand; renderers
and rules read it through these so a surprise is a missing figure, never a crash.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def num(value: Any) -> float | None:
    """A real number as float; None for anything else (bool, str, None, containers)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def as_dict(value: Any) -> dict[str, Any]:
    """``value`` when it is a dict, else an empty one."""
    return value if isinstance(value, dict) else {}


def rank_dicts(analysis: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The per-rank entries of an analysis (``analysis["ranks"]``), dicts only."""
    ranks = analysis.get("ranks")
    return [r for r in ranks if isinstance(r, dict)] if isinstance(ranks, list) else []
