"""Tolerant readers for free-form dicts: "absent or of the wrong type" becomes None or empty.

For what has no schema of its own: the sampler's facts and summaries in the records, trace
summaries a custom trace engine returns, the dicts ``mgprof compare`` and ``mgprof diff`` read.
The run analysis itself is read typed (``mgprof.analyze.run.schema.decode_analysis``): its
renderers and finding rules read attributes, not keys.
"""

from __future__ import annotations

from typing import Any


def num(value: Any) -> float | None:
    """A real number as float; None for anything else (bool, str, None, containers)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def as_dict(value: Any) -> dict[str, Any]:
    """``value`` when it is a dict, else an empty one."""
    return value if isinstance(value, dict) else {}
