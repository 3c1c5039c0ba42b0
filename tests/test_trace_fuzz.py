"""Fuzz the loader: broken bytes and random JSON give TraceError or a result, nothing else."""

from __future__ import annotations

import gzip
import json
import tempfile
from pathlib import Path

from _data import TRACES, need
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mgprof.analyze.trace.summary import analyze_trace_file
from mgprof.errors import TraceError

SMALL = TRACES / "amd-mi250" / "rank-0.json.gz"
SEED_JSON = gzip.decompress(need(SMALL).read_bytes())
FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))


def _check(data: bytes, suffix: str = ".json") -> None:
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / f"rank-0{suffix}"
        p.write_bytes(data)
        try:
            analyze_trace_file(p)
        except TraceError as exc:
            assert "\n" not in str(exc)


@FUZZ
@given(
    cut=st.integers(min_value=0),
    edits=st.lists(st.tuples(st.integers(0), st.binary(max_size=4)), max_size=4),
)
def test_mutated_real_trace(cut: int, edits: list[tuple[int, bytes]]) -> None:
    data = bytearray(SEED_JSON[: cut % (len(SEED_JSON) + 1)] if cut % 3 else SEED_JSON)
    for pos, new in edits:
        if data:
            i = pos % len(data)
            data[i : i + len(new)] = new
    _check(bytes(data))
    _check(gzip.compress(bytes(data))[: max(1, cut % 200)], ".json.gz")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=6), c, max_size=4),
    max_leaves=20,
)
event = st.fixed_dictionaries(
    {},
    optional={
        "ph": st.sampled_from(["X", "M", "i", 3]),
        "cat": st.sampled_from(["kernel", "Kernel", "gpu_memcpy", "cpu_op", "cuda_runtime", None]),
        "name": st.sampled_from(
            [
                "ProfilerStep#1",
                "ncclKernel_AllReduce",
                "gloo:all_reduce",
                "ProfilerStep#x",
                "record_param_comms",
                "",
            ]
        ),
        "ts": st.one_of(st.floats(allow_nan=False), st.integers(), st.text(max_size=3)),
        "dur": st.one_of(st.floats(allow_nan=False), st.integers(-5, 100), st.none()),
        "tid": json_values,
        "args": json_values,
    },
)


@FUZZ
@given(
    doc=st.one_of(
        json_values,
        st.fixed_dictionaries(
            {"traceEvents": st.lists(event, max_size=8)},
            optional={"distributedInfo": json_values, "deviceProperties": json_values},
        ),
    )
)
def test_random_json(doc: object) -> None:
    _check(json.dumps(doc).encode())
