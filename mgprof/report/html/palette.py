"""One colour per category in every chart mgprof draws: the run report's views, the comparison
and the sweep pages. A category (idle, exposed communication, peak memory, ...) keeps its colour
from chart to chart, so a reader who learned it once never reads it again; ranks have theirs
(Plotly's default colours, rank N the same in every chart of a page).
"""

from __future__ import annotations

__all__ = ["COLORS", "RANK_COLORS", "color", "rank_color"]

COLORS: dict[str, str] = {
    # where a step's time went (trace windows)
    "compute": "#1565c0",
    "exposed communication": "#ef6c00",
    "other device work": "#8e24aa",
    "idle": "#9e9e9e",
    "untraced step": "#cfd8dc",
    # the timeline's rows above the device work: the steps, mgprof.region blocks
    "step": "#546e7a",
    "region": "#00897b",
    # kernel classes
    "tensor cores": "#2e7d32",
    "FP32 GEMM": "#f9a825",
    "other kernels": "#90a4ae",
    # memory
    "peak memory": "#00838f",
    "reserved": "#80cbc4",
    "process RSS": "#a1887f",
    "parameters": "#5c6bc0",
    "gradients": "#26a69a",
    "optimizer state": "#ffb74d",
    "capacity": "#616161",
    "out of memory": "#b71c1c",
    # operators: time on the host thread that ran them, time of the device work they launched
    "host time": "#6d4c41",
    "device time": "#1565c0",
    # collectives matched across ranks
    "transfer": "#3949ab",
    "wait": "#c62828",
    # studies: throughput, scaling, the marked batches
    "throughput": "#263238",
    "ideal": "#9e9e9e",
    "communication": "#ef6c00",
    "sweet spot": "#d81b60",
    "B_simple": "#827717",
    "recommended": "#00acc1",
}
"""Category -> colour. ``communication`` is ``exposed communication``'s colour: a share of the
step spent communicating, whichever way it was measured."""

RANK_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
               "#7f7f7f", "#bcbd22", "#17becf")  # fmt: skip
"""Plotly's default colours: rank N (or device N) has the same colour in every chart."""


def color(category: str) -> str:
    """The category's colour; a KeyError for a category the palette does not know (a typo
    would otherwise draw in Plotly's next default colour, which is what this module stops)."""
    return COLORS[category]


def rank_color(rank: int) -> str:
    return RANK_COLORS[rank % len(RANK_COLORS)]
