"""``--memory`` on real 2-rank CPU runs of an unmodified script: curves, peaks, sites, OOM.

``tests/scripts/memory_hog.py`` keeps an extra 64 MiB alive inside region ``hog`` on rank 1
every step; with ``HOG_OOM=1`` rank 1 asks for 4 GiB under a 1 GiB address-space cap
(``MGPROF_MEMORY_BUDGET_MIB``, as ``mgprof sweep`` sets it on CPU) and fails as a real
out-of-memory error would.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from tests._spawn import Result, clean_env, python_args, run_many

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parent / "scripts" / "memory_hog.py"


def _only_run(root: Path) -> Path:
    (run,) = [p for p in root.iterdir() if (p / "run.json").exists()]
    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Result, Path]]:
    root = tmp_path_factory.mktemp("memory")
    jobs = {
        "tracked": ({}, ["--memory"]),
        "oom": ({"HOG_OOM": "1", "MGPROF_MEMORY_BUDGET_MIB": "1024"}, ["--memory"]),
    }
    args = []
    for name, (extra, flags) in jobs.items():
        out = root / name
        out.mkdir()
        cmd = python_args(
            "-m", "mgprof", "analyze", SCRIPT, "--gpus", "2", "--quiet", "--out", out, *flags
        )
        args.append((cmd, root, clean_env(**extra)))
    results = run_many(args, timeout_s=300)
    return {
        name: (result, _only_run(root / name)) for name, result in zip(jobs, results, strict=True)
    }


def _run_json(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "run.json").read_text())


def test_memory_tracking_records_profiler_memory_events(
    runs: dict[str, tuple[Result, Path]],
) -> None:
    result, run_dir = runs["tracked"]
    assert result.returncode == 0, result.explain()
    record = _run_json(run_dir)
    for rank in record["ranks"]:
        memory = rank["memory"]
        assert memory["tracked"] is True and memory["oom"] is False
        assert memory["snapshots"] == []  # allocator snapshots are CUDA-only
        (trace,) = rank["traces"]
        events = json.loads(gzip.decompress((run_dir / trace).read_bytes()))["traceEvents"]
        sizes = [e["args"]["Bytes"] for e in events if e.get("name") == "[memory]"]
        assert sizes, "profile_memory was not on in the traced steps"
        if rank["rank"] == 1:  # the 64 MiB block of region "hog"
            assert 64 * 2**20 in sizes


def test_out_of_memory_is_recorded_and_the_exit_code_is_the_scripts(
    runs: dict[str, tuple[Result, Path]],
) -> None:
    result, run_dir = runs["oom"]
    assert result.returncode == 1, result.explain()  # Python's code for the uncaught error
    record = _run_json(run_dir)
    assert record["status"] == "incomplete" and record["exit_code"] == 1
    ranks = {r["rank"]: r for r in record["ranks"]}
    assert ranks[1]["memory"]["oom"] is True
    assert "can't allocate memory" in ranks[1]["error"]
    assert ranks[0]["memory"]["oom"] is False  # rank 0 failed of its peer, not of memory


def test_curves_peaks_and_the_site_of_rank_1s_extra_memory(
    runs: dict[str, tuple[Result, Path]],
) -> None:
    from mgprof.analyze.run.schema import given
    from mgprof.commands.report import analysis_data
    from mgprof.records import read_run

    _, run_dir = runs["tracked"]
    run = read_run(run_dir)
    data, analysis = analysis_data(run, run_dir)
    # the memory block decodes and encodes back to the JSON it was (key order included)
    assert_round_trip(data)
    memory = given(analysis.memory)
    assert memory is not None
    profiles = {p.rank: p for p in memory.ranks}
    assert set(profiles) == {0, 1}
    for p in profiles.values():
        assert p.source == "profiler memory events"
        curve = given(p.curve)
        assert curve is not None
        assert curve.time_ms and len(curve.time_ms) == len(curve.allocated_mib)
        assert max(curve.allocated_mib) == p.peak_allocated_mib
    hog = (given(profiles[1].top_sites) or [])[0]
    assert hog.site.startswith("hog") and hog.mib == pytest.approx(64.0, abs=0.5)
    peak1, peak0 = given(profiles[1].peak_allocated_mib), given(profiles[0].peak_allocated_mib)
    assert peak1 is not None and peak0 is not None and peak1 >= 64.0 > peak0
    # consistent with the processes' resident memory: rank 1 holds the extra block
    rss = {r.rank: r.memory.peak_rss_mib for r in run.ranks if r.memory}
    extra = peak1 - peak0
    assert rss[1] - rss[0] >= 0.8 * extra
    assert memory.comparison is not None and memory.comparison.differs is not None
    differs = memory.comparison.differs
    assert differs.rank == 1 and differs.delta_mib == pytest.approx(extra, abs=0.5)
    from mgprof.report.run.memory_profile import memory_profile_section

    section = memory_profile_section(analysis)
    assert section is not None and any("inside the traced steps" in n for n in section.notes)
    finding = next(f for f in given(analysis.findings) or [] if f.rule == "memory_imbalance")
    assert finding.id == "memory_imbalance:rank1" and "hog" in finding.evidence


def test_the_oom_run_analysis_round_trips(runs: dict[str, tuple[Result, Path]]) -> None:
    from mgprof.commands.report import analysis_data
    from mgprof.records import read_run

    _, run_dir = runs["oom"]
    data, analysis = analysis_data(read_run(run_dir), run_dir)
    assert "memory" in data and analysis.warnings == data["warnings"]
    assert_round_trip(data)


def assert_round_trip(data: dict[str, Any]) -> None:
    import msgspec

    from mgprof.analyze.run.schema import decode_analysis

    back = msgspec.to_builtins(decode_analysis(data))
    assert json.dumps(back) == json.dumps(data)


def test_untracked_runs_have_no_memory_profile(cpu_run_dir: Path) -> None:
    from mgprof.analyze.run.schema import given
    from mgprof.commands.report import build_analysis
    from mgprof.records import read_run

    run = read_run(cpu_run_dir)
    assert all(r.memory is not None and not r.memory.tracked for r in run.ranks)
    analysis = build_analysis(run, cpu_run_dir)
    assert given(analysis.memory) is None
    assert not any(f.rule.startswith("memory_imb") for f in given(analysis.findings) or [])


def test_a_cuda_snapshot_gives_the_profile_and_the_oom(tmp_path: Path) -> None:
    """The CUDA path, on the hand-made snapshot in PyTorch's format (no GPU here): the run
    analysis reads the rank's snapshot file with its step and region marks."""
    import shutil

    from mgprof.analyze.run.memory import memory_analysis
    from mgprof.records import DeviceInfo, MemoryRecord, RankRecord, RunRecord
    from tests.test_memory_snapshot import HANDMADE, PHASES, STEPS

    (tmp_path / "memory").mkdir()
    shutil.copy(HANDMADE, tmp_path / "memory" / "rank0.oom.json")
    memory = MemoryRecord(
        kind="cuda",
        tracked=True,
        oom=True,
        total_mib=81_559.0,
        snapshots=["memory/rank0.oom.json"],
        step_marks=STEPS,
        phase_marks=PHASES,
    )
    rank = RankRecord(rank=0, world_size=1, device=DeviceInfo(kind="cuda", index=0), memory=memory)
    analysis = memory_analysis(RunRecord(ranks=[rank], world_size=1), tmp_path)
    assert analysis is not None
    (profile,) = analysis["ranks"]
    assert profile["source"] == "allocator snapshot"
    assert profile["peak_step"] == 3 and profile["peak_phase"] == "forward / attn"
    assert profile["top_sites"][0]["site"].startswith("train.py:42")
    assert profile["fragmentation_mib"] is not None
    assert "failed" in profile["oom"]["text"]
    # the snapshot shape of a profile and its OOM decode and encode back to the same JSON
    import msgspec

    from mgprof.analyze.run.schema import decode_analysis

    typed = decode_analysis({"memory": analysis})
    assert typed.warnings == []
    assert json.dumps(msgspec.to_builtins(typed.memory)) == json.dumps(analysis)
