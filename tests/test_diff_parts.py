"""``mgprof diff``'s parts of a traced step on real GPU traces: they partition the step.

The parts (kernels by name, other kernels, exposed communication, other device work, GPU idle,
host time before the first device event, data loading) must add up to the mean step span, or a
change in step time would be explained twice or not at all. Copies that overlap a kernel were
once counted again as "other device work".
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from _data import GPU, TRACES

from mgprof.analyze.diff.inputs import trace_buckets
from mgprof.analyze.trace.summary import analyze_trace_file

CASES = [
    TRACES / "gpu-nccl-a100-rank0of2" / "rank-0.json.gz",
    *sorted((GPU / "traces").glob("*/*.json*")),
]


@pytest.mark.parametrize("path", CASES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_the_parts_add_up_to_the_traced_step(path: Path) -> None:
    summary = msgspec.to_builtins(analyze_trace_file(path, top=200))
    steps = summary["steps"]
    assert steps, "each of these traces has ProfilerStep spans"
    spans = [
        max(st["extended_us"] or 0.0, st["totals"]["window_us"] or 0.0) / 1000.0 for st in steps
    ]
    parts = trace_buckets(summary)
    assert sum(parts.values()) == pytest.approx(sum(spans) / len(spans), rel=1e-9, abs=1e-9)
    assert all(v >= -1e-9 for k, v in parts.items() if not k.startswith("other kernels"))
