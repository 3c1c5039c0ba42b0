"""Intervals of one timeline row cut down to a number of bars a page can carry.

A rank's compute row can hold hundreds of thousands of kernels or operators; a chart of them all
would make report.html as large as the trace. A row over its budget keeps its largest gaps and
closes the smallest ones: neighbouring intervals (same row, so same kind) that sit closer than
the gaps kept become one bar from the first start to the last end, which says how many intervals
it stands for and how much of it they cover. Short bursts stay apart from each other wherever a
real pause separates them, which is what a reader looks for at this scale; the events
themselves stay in the trace (and in ``timeline.json.gz``).

The budget of the whole chart is shared out by :func:`share_budget`: rows with few intervals
keep them all, and what they leave goes to the rows with many.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import numpy as np

from mgprof.analyze.intervals import FloatArray

__all__ = ["Segments", "coarsen", "share_budget"]


class Segments(msgspec.Struct):
    """The bars of one row: ``count[i]`` intervals drawn as bar i, covering ``busy_us[i]`` of
    it; ``labels`` for rows whose intervals have names (steps, regions)."""

    start_us: list[float]
    end_us: list[float]
    count: list[int]
    busy_us: list[float]
    labels: list[str] | None = None
    intervals: int = 0
    """Intervals the row held before it was cut down."""

    @property
    def merged(self) -> int:
        """Intervals drawn inside a bar with others."""
        return sum(c for c in self.count if c > 1)


def share_budget(counts: Sequence[int], total: int) -> list[int]:
    """Bars for each row: every non-empty row at least one, rows under an even share keep all
    their intervals, and what they leave is shared by the others in turn (water filling)."""
    shares = [0] * len(counts)
    left = max(total, sum(1 for c in counts if c > 0))
    todo = sorted((c, i) for i, c in enumerate(counts) if c > 0)
    for k, (count, i) in enumerate(todo):
        even = max(1, left // (len(todo) - k))
        shares[i] = min(count, even)
        left -= shares[i]
    return shares


def _names(labels: Sequence[str], noun: str) -> str:
    """``step 3`` (one), ``steps 3–7`` (steps), ``forward ×4``, ``12 regions (forward,
    backward)``."""
    first = labels[0]
    if len(labels) == 1:
        return first
    if all(label == first for label in labels):
        return f"{first} ×{len(labels)}"
    if noun == "steps" and all(label.startswith("step ") for label in labels):
        return f"steps {labels[0][5:]}–{labels[-1][5:]}"
    kinds = list(dict.fromkeys(labels))
    shown = ", ".join(kinds[:3]) + (", …" if len(kinds) > 3 else "")
    return f"{len(labels)} {noun} ({shown})"


def _covered(starts: FloatArray, ends: FloatArray) -> float:
    """Length of the union of intervals sorted by start (nested regions overlap)."""
    total, reach = 0.0, -np.inf
    for s, e in zip(starts.tolist(), ends.tolist()):
        if e > reach:
            total += e - max(s, reach)
            reach = e
    return total


def _widest(gaps: FloatArray, cuts: int) -> np.ndarray:
    """Positions (ascending) of the ``cuts`` widest gaps. Gaps equal to the ns (traces in whole
    µs have thousands alike) are chosen evenly along the row: picking among them by position
    would put one bar over most of a steady row and leave the rest as single intervals."""
    if cuts <= 0:
        return np.empty(0, dtype=np.int64)
    ns = np.round(gaps * 1e3)
    edge = np.partition(-ns, cuts - 1)[cuts - 1]  # minus the narrowest gap that is kept
    wider = np.flatnonzero(-ns < edge)
    tied = np.flatnonzero(-ns == edge)
    need = cuts - wider.size
    pick = tied[np.unique(np.linspace(0, tied.size - 1, need).round().astype(np.int64))]
    return np.sort(np.concatenate((wider, pick)))


def coarsen(
    starts: FloatArray,
    ends: FloatArray,
    budget: int,
    labels: Sequence[str] | None = None,
    noun: str = "intervals",
) -> Segments:
    """At most ``budget`` bars for the intervals (module docstring). Intervals may overlap
    (nested regions); empty and reversed ones are left out. ``noun`` names merged labels."""
    s = np.asarray(starts, dtype=np.float64)
    e = np.asarray(ends, dtype=np.float64)
    keep = e > s
    s, e = s[keep], e[keep]
    names = [labels[i] for i in np.flatnonzero(keep).tolist()] if labels is not None else None
    order = np.lexsort((-e, s))  # by start; an outer region before the ones inside it
    s, e = s[order], e[order]
    if names is not None:
        names = [names[i] for i in order.tolist()]
    n = int(s.size)
    if n <= max(budget, 1):
        return Segments(
            start_us=s.tolist(),
            end_us=e.tolist(),
            count=[1] * n,
            busy_us=(e - s).tolist(),
            labels=names,
            intervals=n,
        )
    reach = np.maximum.accumulate(e)
    gaps = s[1:] - reach[:-1]
    kept = _widest(gaps, max(budget, 1) - 1)
    firsts = np.concatenate(([0], kept + 1)).astype(np.int64)
    lasts = np.concatenate((kept + 1, [n])).astype(np.int64)
    disjoint = bool(np.all(gaps >= 0))
    out = Segments([], [], [], [], [] if names is not None else None, intervals=n)
    durations = e - s
    group_end = np.maximum.reduceat(e, firsts).tolist()
    if disjoint:
        busy = np.add.reduceat(durations, firsts).tolist()
    for k, (a, b) in enumerate(zip(firsts.tolist(), lasts.tolist())):
        out.start_us.append(float(s[a]))
        out.end_us.append(group_end[k])
        out.count.append(b - a)
        out.busy_us.append(busy[k] if disjoint else _covered(s[a:b], e[a:b]))
        if names is not None and out.labels is not None:
            out.labels.append(_names(names[a:b], noun))
    return out
