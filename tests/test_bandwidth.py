"""``mgprof doctor --bandwidth`` (gloo ranks): nccl-tests' bus bandwidth; bad input exits 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mgprof.analyze.trace.comm import busbw_factor
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


def test_attainable_busbw_interpolates_in_log_size() -> None:
    from mgprof.analyze.trace.bandwidth import against_baseline, attainable_busbw

    baseline = {
        "rows": [
            {"op": "all_reduce", "bytes": 1024, "group_size": 2, "busbw_gbps": 1.0},
            {"op": "all_reduce", "bytes": 1024 * 1024, "group_size": 2, "busbw_gbps": 4.0},
        ]
    }
    mid = attainable_busbw(baseline, "all_reduce", 32 * 1024, 2)  # halfway in log(size)
    assert mid is not None and mid[0] == pytest.approx(2.5) and mid[1] is None
    low = attainable_busbw(baseline, "all_reduce", 10, 2)
    assert low is not None and low[0] == 1.0 and "outside the measured sizes" in (low[1] or "")
    assert attainable_busbw(baseline, "all_reduce", 1024, 8) is None  # other group size
    stats = [{"type": "all_reduce", "bytes": 2 * 32 * 1024, "count": 2, "busbw_gbps": 1.25,
              "group_size": 2}]  # fmt: skip
    (a,) = against_baseline(stats, baseline)
    assert a.mean_call_bytes == 32 * 1024 and a.pct_of_attainable == pytest.approx(50.0)


def test_trace_with_a_missing_baseline_exits_2(tmp_path: Path) -> None:
    trace = Path(__file__).parent / "data" / "gpu"
    result = run(
        python_args("-m", "mgprof", "trace", str(trace), "--bandwidth", str(tmp_path / "no.json")),
        tmp_path,
        clean_env(),
        120,
    )
    assert result.returncode == 2
    assert "mgprof doctor --bandwidth --out" in result.stderr and "Traceback" not in result.stderr
