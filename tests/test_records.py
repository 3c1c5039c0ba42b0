"""run.json schema: round trip, version checks, one-line errors; run directories and partials."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from mgprof import rundir
from mgprof.errors import RunRecordError, UsageError
from mgprof.records import (
    SCHEMA_VERSION,
    DeviceInfo,
    DeviceSamples,
    MemoryRecord,
    RankRecord,
    RegionRecord,
    RunRecord,
    SamplerRecord,
    StepRecord,
    TrainingFacts,
    decode_run,
    encode_run,
    read_run,
)


def full_rank(rank: int) -> RankRecord:
    """A rank record with every field set to something other than its default."""
    return RankRecord(
        rank=rank,
        world_size=2,
        local_rank=rank,
        host="node-a",
        pid=1000 + rank,
        strategy="ddp",
        backend="nccl",
        device=DeviceInfo(
            kind="cuda",
            index=rank,
            name="NVIDIA H200",
            total_memory_mib=143771.0,
            uuid=f"GPU-{rank:08d}",
            pci_bus_id=f"00000000:{rank + 1:02x}:00.0",
            capability="9.0",
        ),
        devices_used=1,
        steps=[
            StepRecord(
                index=i,
                duration_ms=10.5 + i,
                batch_size=32,
                fingerprint=f"{i:016x}",
                traced=i > 0,
                dataloader_ms=0.25,
            )
            for i in range(3)
        ],
        regions=[RegionRecord(name="forward", count=3, total_ms=12.0, max_ms=5.0)],
        sampler=SamplerRecord(
            kind="nvml",
            reason="NVML sampler on cuda:0",
            interval_s=0.1,
            devices=[
                DeviceSamples(
                    device=f"cuda:{rank}",
                    t_s=[0.0, 0.1],
                    columns={"util_pct": [90.0, None], "power_w": [300.5, 310.0]},
                    summary={"util_pct_mean": 90.0, "energy_j": None},
                    facts={"uuid": f"GPU-{rank:08d}", "throttle": ["power cap"], "nvlink": 18},
                )
            ],
            errors=["pcie throughput: not supported"],
        ),
        memory=MemoryRecord(
            kind="cuda",
            peak_allocated_mib=1024.5,
            peak_reserved_mib=2048.0,
            total_mib=143771.0,
            peak_rss_mib=900.25,
            per_device={f"cuda:{rank}": {"peak_allocated_mib": 1024.5, "total_mib": None}},
        ),
        training=TrainingFacts(
            dataloader_num_workers=4,
            dataloader_pin_memory=True,
            distributed_sampler=True,
            set_epoch_called=False,
            find_unused_parameters=False,
            autocast_used=True,
            ddp_bucket_cap_mb=25.0,
        ),
        traces=[f"traces/rank{rank}.pt.trace.json.gz"],
        versions={"torch": "2.13.0", "cuda": None},
        warnings=["sampler: RuntimeError: x"],
        error=None if rank == 0 else "RuntimeError: rank 1 failed",
    )


def full_run() -> RunRecord:
    return RunRecord(
        schema_version=SCHEMA_VERSION,
        run_id="20240101T000000Z-train",
        created_utc="2024-01-01T00:00:00+00:00",
        script="train.py",
        script_args=["--epochs", "1"],
        strategy="ddp",
        world_size=3,
        nnodes=1,
        backend="nccl",
        cpu_fallback=True,
        cpu_fallback_reason="no CUDA",
        status="incomplete",
        error="RuntimeError: rank 1 failed",
        exit_code=1,
        ranks=[full_rank(0), full_rank(1)],
        missing_ranks=[2],
        analysis={"trace": {"busy_pct": 55.5, "comm_pct": None}, "findings": ["a", "b"]},
    )


def test_round_trip_keeps_every_field() -> None:
    run = full_run()
    data = encode_run(run)
    assert decode_run(data) == run
    assert json.loads(data)["ranks"][1]["device"]["uuid"] == "GPU-00000001"
    assert encode_run(decode_run(data)) == data


def test_read_run_on_a_dir_and_on_a_file(tmp_path: Path) -> None:
    run = full_run()
    path = rundir.write_run(tmp_path, run)
    assert path == tmp_path / "run.json"
    assert read_run(tmp_path) == run
    assert read_run(path) == run
    assert read_run(str(path)) == run
    assert not [p for p in tmp_path.iterdir() if p.name != "run.json"]  # no temp files left


def test_read_run_on_a_missing_path_says_what_to_give(tmp_path: Path) -> None:
    with pytest.raises(RunRecordError, match="not found") as caught:
        read_run(tmp_path / "nope")
    assert "\n" not in str(caught.value)


def test_newer_schema_asks_for_an_upgrade() -> None:
    data = json.dumps({"schema_version": SCHEMA_VERSION + 1, "future_field": 1}).encode()
    with pytest.raises(RunRecordError, match="upgrade") as caught:
        decode_run(data)
    assert "pip install -U mgprof" in str(caught.value)
    assert isinstance(caught.value, UsageError)


def test_unknown_fields_of_the_same_version_are_tolerated() -> None:
    data = json.dumps({"schema_version": SCHEMA_VERSION, "added_later": {"x": 1}}).encode()
    assert decode_run(data) == RunRecord()


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"{not json", "not valid JSON"),
        (b"", "not valid JSON"),
        (b"[1, 2]", "no schema_version"),
        (b'{"run_id": "x"}', "no schema_version"),
        (b'{"schema_version": "1"}', "not an integer"),
        (b'{"schema_version": true}', "not an integer"),
        (b'{"schema_version": 0}', "unknown schema_version"),
        (b'{"schema_version": 1, "world_size": "two"}', "world_size"),
        (b'{"schema_version": 1, "status": "exploded"}', "status"),
        (b'{"schema_version": 1, "ranks": [{"rank": 0}]}', "world_size"),
        (b'{"schema_version": 1, "ranks": [{"rank": 0, "world_size": 1, "steps": [1]}]}', "steps"),
    ],
)
def test_bad_run_json_is_one_line_error(data: bytes, words: str) -> None:
    with pytest.raises(RunRecordError) as caught:
        decode_run(data, source="some/run.json")
    message = str(caught.value)
    assert words in message
    assert message.startswith("some/run.json")
    assert "\n" not in message


def test_new_run_dir_never_reuses_a_folder(tmp_path: Path) -> None:
    stamp = "20240102T030405Z"
    made = [rundir.new_run_dir(tmp_path / "out", "train.py", stamp=stamp) for _ in range(3)]
    assert [p.name for p in made] == [
        f"{stamp}-train",
        f"{stamp}-train-2",
        f"{stamp}-train-3",
    ]
    assert all(p.is_dir() for p in made)
    (tmp_path / "out" / f"{stamp}-train-4").write_text("a file in the way")
    assert rundir.new_run_dir(tmp_path / "out", "train", stamp=stamp).name == f"{stamp}-train-5"


def test_new_run_dir_names_are_safe_and_stamped(tmp_path: Path) -> None:
    path = rundir.new_run_dir(tmp_path, "../my script (v2)!.py")
    assert path.parent == tmp_path
    stamp, stem = path.name.split("-", 1)
    assert len(stamp) == 16 and stamp.endswith("Z") and stamp[8] == "T"
    assert stem == "my-script-v2"
    assert rundir.safe_stem("...") == "run"


def test_new_run_dir_in_an_unusable_place_is_a_usage_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(UsageError, match="--out"):
        rundir.new_run_dir(blocker, "train")


def test_merge_ranks_adds_new_ranks_and_computes_missing() -> None:
    run = RunRecord(world_size=4, ranks=[full_rank(0)], missing_ranks=[1, 2, 3])
    late = msgspec.structs.replace(full_rank(0), host="duplicate")
    merged = rundir.merge_ranks(run, [full_rank(2), late])
    assert [r.rank for r in merged.ranks] == [0, 2]
    assert merged.ranks[0].host == "node-a"  # a rank already present is kept
    assert merged.missing_ranks == [1, 3]
    assert rundir.merge_ranks(merged, [full_rank(3), full_rank(1)]).missing_ranks == []
    assert run.missing_ranks == [1, 2, 3]  # the input is not modified


def test_partials_round_trip_and_broken_ones_are_skipped(tmp_path: Path) -> None:
    for rank in (1, 0):
        rundir.write_partial(tmp_path, full_rank(rank))
    (tmp_path / rundir.PARTIALS / "rank2.json").write_bytes(b'{"rank": 2, "world_')
    partials = rundir.read_partials(tmp_path)
    assert partials == [full_rank(0), full_rank(1)]
    assert rundir.read_partials(tmp_path / "elsewhere") == []
    merged = rundir.merge_ranks(RunRecord(world_size=3), partials)
    assert merged.missing_ranks == [2]
    rundir.write_run(tmp_path, merged)
    assert read_run(tmp_path) == merged
