"""Collective vocabulary: type names, nccl-tests bus-bandwidth factors, call and per-type records.

Split out of :mod:`mgprof.analyze.trace.comm`, which re-exports every name here and whose docstring
defines each figure (type normalisation, bytes, algbw/busbw).
"""

from __future__ import annotations

import re

import msgspec

__all__ = [
    "CollectiveCall",
    "CollectiveStats",
    "busbw_factor",
    "collective_type",
    "has_busbw",
]

# Order matters: the specific names before their substrings (reduce_scatter before reduce).
_TYPE_PATTERNS: tuple[tuple[str, str], ...] = (
    ("allreduce", "all_reduce"),
    ("allgather", "all_gather"),
    ("reducescatter", "reduce_scatter"),
    ("alltoall", "all_to_all"),
    ("broadcast", "broadcast"),
    ("bcast", "broadcast"),
    ("sendrecv", "send_recv"),
    ("barrier", "barrier"),
    ("send", "send"),
    ("recv", "recv"),
    ("reduce", "reduce"),
    ("gather", "gather"),
    ("scatter", "scatter"),
)
_NON_ALNUM = re.compile(r"[^a-z0-9]")


def collective_type(name: str) -> str:
    """Normalise a kernel / op / ``Collective name`` to one type; ``other`` when unknown."""
    low = name.lower()
    for prefix in ("nccl:", "gloo:", "c10d::"):
        low = low.removeprefix(prefix)
    # Kernel names carry their collective before the argument list.
    key = _NON_ALNUM.sub("", low.split("(", 1)[0])
    for needle, kind in _TYPE_PATTERNS:
        if needle in key:
            return kind
    return "other"


_FACTORS = {
    "all_reduce": lambda n: 2.0 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send": lambda n: 1.0,
    "recv": lambda n: 1.0,
    "send_recv": lambda n: 1.0,
}


def busbw_factor(kind: str, n: int | None) -> float | None:
    """nccl-tests bus-bandwidth factor, or None when it does not apply / n is unknown."""
    f = _FACTORS.get(kind)
    if f is None:
        return None
    if kind in ("broadcast", "reduce", "send", "recv", "send_recv"):
        return 1.0
    if n is None or n < 1:
        return None
    return float(f(n))


def has_busbw(kind: str) -> bool:
    """True when nccl-tests defines a bus bandwidth for collectives of type ``kind``."""
    return kind in _FACTORS


class CollectiveCall(msgspec.Struct, frozen=True):
    """One collective call on one rank (kept so ranks can be matched after analysis)."""

    type: str
    start_us: float
    dur_us: float
    exposed_us: float
    bytes: int | None
    group_size: int | None
    pg: str | None
    seq: str | None
    launch_only: bool = False
    """An ``nccl:*`` CPU op in a trace without device events: the host-side launch of an
    asynchronous GPU collective. Its count and size are real; its span is not a transfer."""


class CollectiveStats(msgspec.Struct):
    """Per-type totals on one rank; bandwidths are total bytes / total time of the type.

    ``total_us``/``exposed_us`` are None for launch-only calls (``not_applicable`` says why).
    """

    type: str
    count: int
    total_us: float | None
    exposed_us: float | None
    bytes: int | None
    group_size: int | None
    algbw_gbps: float | None
    busbw_gbps: float | None
    not_applicable: str | None = None
    sizes: list[tuple[int, int]] = msgspec.field(default_factory=list)
    """Per-call message sizes: ``[bytes, calls]`` for each distinct size, largest first."""
