"""``mgprof doctor --bandwidth`` (gloo ranks): nccl-tests' bus bandwidth; bad input exits 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mgprof.analyze.comm import busbw_factor
from tests._spawn import clean_env, python_args, run


def doctor(tmp_path: Path, *args: str):  # type: ignore[no-untyped-def]
    return run(python_args("-m", "mgprof", "doctor", *args), tmp_path, clean_env(), 300)


@pytest.mark.slow
def test_bandwidth_probe_measures_every_collective(tmp_path: Path) -> None:
    result = doctor(tmp_path, "--bandwidth", "--gpus", "2", "--sizes", "64K", "--iters", "2",
                    "--json")  # fmt: skip
    assert result.returncode == 0, result.explain()
    data = json.loads(result.stdout[result.stdout.index("{") :])
    assert data["backend"] == "gloo" and data["world_size"] == 2
    rows = {r["op"]: r for r in data["rows"]}
    assert set(rows) == {"all_reduce", "all_gather", "reduce_scatter"}
    for op, row in rows.items():
        assert "error" not in row, row
        assert row["bytes"] == 65536 and row["time_us"] > 0
        assert row["algbw_gbps"] == pytest.approx(row["bytes"] / (row["time_us"] * 1e-6) / 1e9)
        assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * busbw_factor(op, 2))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpus", "1"], "needs --gpus 2 or more"),
        (["--sizes", "12Q"], "is not a size"),
        (["--sizes", ","], "--sizes is empty"),
    ],
)
def test_bad_bandwidth_input_is_one_line_and_exit_2(
    tmp_path: Path, args: list[str], message: str
) -> None:
    result = doctor(tmp_path, "--bandwidth", *args)
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
