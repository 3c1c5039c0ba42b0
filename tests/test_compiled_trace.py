"""``torch.compile`` in a trace: the share of each step inside compiled graphs and how often the
compiled code was entered, on a recorded CPU trace of an inductor-compiled model, and none of it
on a trace without compiled code."""

from __future__ import annotations

import gzip
import json

from _data import TRACES

from mgprof.analyze.trace.compiled import compiled_regions
from mgprof.analyze.tracefile.load import load_trace

COMPILED = TRACES / "cpu-compiled-mlp" / "rank0.pt.trace.json.gz"


def _raw_spans(name_prefix: str) -> list[tuple[float, float]]:
    events = json.loads(gzip.decompress(COMPILED.read_bytes()))["traceEvents"]
    return [
        (float(e["ts"]), float(e["ts"]) + float(e["dur"]))
        for e in events
        if e.get("ph") == "X" and str(e.get("name", "")).startswith(name_prefix)
    ]


def test_the_compiled_share_of_each_step() -> None:
    found = compiled_regions(load_trace(COMPILED))
    assert found is not None
    assert found.frames == ["0/1"] and found.recompiled_frames == 1  # compiled twice
    assert found.steps == 3 and found.regions == 3 and found.regions_per_step == 1.0
    assert found.nested == 0
    # one region and one backward per step: their durations, recounted from the raw JSON
    forward = sum(e - s for s, e in _raw_spans("Torch-Compiled Region"))
    backward = sum(e - s for s, e in _raw_spans("CompiledFunctionBackward"))
    assert abs(found.forward_us - forward) < 1.0
    assert abs(found.backward_us - backward) < 1.0
    assert found.compiled_pct is not None
    assert 0 < found.compiled_pct <= 100.0
    both = 100.0 * (found.forward_us + found.backward_us) / found.window_us
    assert found.compiled_pct <= both + 1e-9  # a union, never more than the sum


def test_a_trace_without_compiled_code_has_none() -> None:
    plain = sorted((TRACES / "cpu-gloo-ddp-mlp-2ranks").glob("*.json.gz"))[0]
    assert compiled_regions(load_trace(plain)) is None
