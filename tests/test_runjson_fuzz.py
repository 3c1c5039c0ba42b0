"""Fuzz the run.json reader: broken bytes and random JSON give a RunRecord or RunRecordError.

A fixed budget runs with the suite; ``HYPOTHESIS_PROFILE=long`` (or ``MGPROF_FUZZ_EXAMPLES=N``)
runs longer, see docs/reliability.md.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mgprof.errors import RunRecordError
from mgprof.records import (
    SCHEMA_VERSION,
    RankRecord,
    RunRecord,
    StepRecord,
    decode_run,
    encode_run,
    read_run,
)

settings.register_profile(
    "ci",
    max_examples=int(os.environ.get("MGPROF_FUZZ_EXAMPLES", "300")),
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
settings.register_profile(
    "long",
    max_examples=int(os.environ.get("MGPROF_FUZZ_EXAMPLES", "200000")),
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
FUZZ = settings(settings.get_profile(PROFILE if PROFILE in ("ci", "long") else "ci"))

SEED = encode_run(
    RunRecord(
        run_id="20260101T000000Z-seed",
        script="train.py",
        strategy="ddp",
        world_size=2,
        status="incomplete",
        error="rank 1 was killed by SIGKILL (exit code -9)",
        ranks=[
            RankRecord(
                rank=0,
                world_size=2,
                steps=[StepRecord(index=i, duration_ms=1.5 * i, batch_size=8) for i in range(3)],
                warnings=["sampler: NVMLError_Unknown"],
            )
        ],
        missing_ranks=[1],
        analysis={"trace": {"window_us": 12.0}, "findings": []},
    )
)


def check(data: bytes) -> None:
    """Only RunRecordError may escape, with a one-line message; a success re-encodes."""
    try:
        run = decode_run(data)
    except RunRecordError as exc:
        message = str(exc)
        assert message and "\n" not in message
        return
    assert isinstance(run, RunRecord)
    assert run.schema_version <= SCHEMA_VERSION
    assert decode_run(encode_run(run)) == run  # what was accepted can be written back


def test_seed_is_valid() -> None:
    assert decode_run(SEED).missing_ranks == [1]


@FUZZ
@given(
    cut=st.integers(min_value=0),
    edits=st.lists(st.tuples(st.integers(min_value=0), st.binary(max_size=6)), max_size=5),
)
def test_mutated_real_run_json(cut: int, edits: list[tuple[int, bytes]]) -> None:
    data = bytearray(SEED[: cut % (len(SEED) + 1)] if cut % 3 else SEED)
    for where, blob in edits:
        at = where % (len(data) + 1)
        data[at : at + len(blob)] = blob
    check(bytes(data))


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=25,
)
FIELDS = st.sampled_from(
    ["schema_version", "run_id", "status", "world_size", "ranks", "missing_ranks", "analysis",
     "rank_exits", "error", "exit_code", "script_args", "cpu_fallback"]
)  # fmt: skip
RANK_FIELDS = st.sampled_from(["rank", "world_size", "steps", "device", "sampler", "memory"])


@FUZZ
@given(doc=JSON)
def test_random_json(doc: object) -> None:
    check(json.dumps(doc).encode())


@FUZZ
@given(
    fields=st.dictionaries(FIELDS, JSON, max_size=6),
    rank=st.dictionaries(RANK_FIELDS, JSON, max_size=4),
    version=st.one_of(st.integers(min_value=-3, max_value=SCHEMA_VERSION + 3), JSON),
)
def test_random_fields_on_a_real_record(
    fields: dict[str, object], rank: dict[str, object], version: object
) -> None:
    doc = json.loads(SEED)
    doc.update(fields)
    doc["schema_version"] = version
    if isinstance(doc.get("ranks"), list) and doc["ranks"] and isinstance(doc["ranks"][0], dict):
        doc["ranks"][0].update(rank)
    check(json.dumps(doc).encode())


@FUZZ
@given(data=st.binary(max_size=64))
def test_read_run_on_random_files(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "run.json").write_bytes(data)
        try:
            read_run(d)
        except RunRecordError as exc:
            assert "\n" not in str(exc)
