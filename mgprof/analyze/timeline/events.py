"""What both passes of ``mgprof timeline`` must decide alike about an event.

The writing pass finds its answers by position (the n-th device event, the n-th flow event of
the scan), so the two passes must agree exactly on what a usable time, a device event and a lane
are: both use these functions.
"""

from __future__ import annotations

from mgprof.analyze.tracefile.schema import _as_int

__all__ = ["DEVICE_CATS", "FLOW_PHASES", "is_device_cat", "lane_id", "num"]

DEVICE_CATS = frozenset(
    {"kernel", "gpu_memcpy", "memcpy", "gpu_memset", "memset", "mtia_ccp_events",
     "gpu_user_annotation"}
)  # fmt: skip
"""Events that run on a device (both Kineto schemas, compared in lower case)."""
FLOW_PHASES = frozenset({"s", "t", "f"})
_MAX_TS_US = 1e18
"""As the loader: |ts| past this is no time a profiler wrote (the event is counted invalid)."""


def num(v: object) -> float | None:
    """A finite number of microseconds within what a profiler writes, else None."""
    kind = type(v)
    if kind is float:
        return v if -_MAX_TS_US < v < _MAX_TS_US else None  # type: ignore[operator,return-value]
    if kind is int:
        return float(v) if -_MAX_TS_US < v < _MAX_TS_US else None  # type: ignore[operator,arg-type]
    return None


_DEVICE_CAT_SEEN: dict[str, bool] = {}


def is_device_cat(cat: object) -> bool:
    """Whether an event of category ``cat`` runs on a device (both passes decide alike)."""
    if type(cat) is not str:
        return False
    known = _DEVICE_CAT_SEEN.get(cat)
    if known is None:
        known = cat.lower() in DEVICE_CATS
        if len(_DEVICE_CAT_SEEN) < 4096:  # a trace with endless categories is not cached
            _DEVICE_CAT_SEEN[cat] = known
    return known


def lane_id(v: object) -> int | str:
    """A pid or tid as a lane key: ``"25738"`` and ``25738`` are one thread (the 2021 schema
    writes a thread's tid as text on its events and as a number on its flows)."""
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    text = str(v).strip() if v is not None else ""
    as_int = _as_int(text)
    return as_int if as_int is not None else text
