"""mgprof's figures on the peer tools' own test traces, against the figures their suites assert.

The traces and the asserted figures are in ``shared/fixtures/traces/peers/`` (README there,
with file:line in the peer's repository). Where mgprof defines a figure differently, the peer's
figure is rebuilt from mgprof's output and the difference is named.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mgprof.analyze.trace_summary import analyze_trace_file

PEERS = Path(__file__).parents[1].parent / "shared" / "fixtures" / "traces" / "peers"
pytestmark = pytest.mark.skipif(not PEERS.is_dir(), reason=f"peer traces not found at {PEERS}")


def _collectives(path: Path) -> dict[str, tuple[int, float, int | None]]:
    s = analyze_trace_file(path)
    return {c.type: (c.count, c.total_us, c.bytes) for c in s.collectives}


@pytest.mark.parametrize(
    ("worker", "compute_only", "overlap", "comm_only"),
    [("worker0.case1.json", 31, 70, 39), ("worker1.case2.json", 16, 54, 44)],
)
def test_gloo_collectives_in_a_trace_with_device_kernels(
    worker: str, compute_only: float, overlap: float, comm_only: float
) -> None:
    """tb-test_distributed_gloo_gpu: DDP over gloo on a CUDA job. The plugin asserts
    communication 39 / 44 us and steps_to_overlap [compute-only, overlap, comm-only]; the gloo
    CPU collectives were ignored before (comm 0, no collectives)."""
    s = analyze_trace_file(PEERS / "tb-test_distributed_gloo_gpu" / worker)
    t = s.totals
    assert s.kind == "gpu"
    assert t.exposed_comm_us == pytest.approx(comm_only)  # the plugin's "communication" figure
    assert t.overlap_us == pytest.approx(overlap)
    assert t.compute_us - t.overlap_us == pytest.approx(compute_only)
    assert t.comm_us - t.overlap_us == pytest.approx(comm_only)
    types = {c.type: c for c in s.collectives}
    assert types["broadcast"].count == 3 and types["broadcast"].bytes == 637440
    assert types["all_reduce"].count == 2 and types["all_reduce"].bytes == 16392000


def test_gloo_collectives_are_seen_across_ranks_with_device_kernels() -> None:
    from mgprof.analyze.trace_summary import analyze_job

    folder = PEERS / "tb-test_distributed_gloo_gpu"
    job = analyze_job(sorted(folder.glob("*.json")), workers=1)
    assert job.cross_rank is not None, job.not_applicable
    assert job.cross_rank.slowest_rank in (0, 1)


def test_per_type_totals_are_unions_of_overlapping_calls() -> None:
    """tb-test_distributed_gloo_cpu: two gloo threads run calls of one type at once; the plugin
    asserts total latency broadcast 63 and all_reduce 46 (interval unions), 3 and 2 calls, and
    637440 / 16392000 bytes. Summing durations gave 92 and 54."""
    got = _collectives(PEERS / "tb-test_distributed_gloo_cpu" / "worker0.case1.json")
    assert got["broadcast"] == (3, pytest.approx(63.0), 637440)
    assert got["all_reduce"] == (2, pytest.approx(46.0), 16392000)


@pytest.mark.parametrize(
    ("worker", "compute_only", "overlap", "comm_only"),
    [("worker0.case1.json", 47, 74, 35), ("worker1.case2.json", 36, 64, 34)],
)
def test_cpu_gloo_overlap_matches_the_plugin(
    worker: str, compute_only: float, overlap: float, comm_only: float
) -> None:
    """tb-test_distributed_gloo_cpu steps_to_overlap (compute-only, overlap, comm-only)."""
    t = analyze_trace_file(PEERS / "tb-test_distributed_gloo_cpu" / worker).totals
    assert t.overlap_us == pytest.approx(overlap)
    assert t.compute_us - t.overlap_us == pytest.approx(compute_only)
    assert t.exposed_comm_us == pytest.approx(comm_only)


def test_collective_totals_never_exceed_the_window() -> None:
    """hta-cpu_only: its gloo all_reduce calls run far longer than the profiled window."""
    files = sorted((PEERS / "hta-cpu_only").glob("*.json*"))
    assert files
    for path in files:
        s = analyze_trace_file(path)
        for c in s.collectives:
            assert c.total_us <= s.totals.window_us + 1e-6, (path.name, c.type)


def test_fixture_readme_still_names_the_figures() -> None:
    """The figures above are the README's; a changed fixture set must be re-read."""
    text = (PEERS / "README.md").read_text()
    for figure in ("39 / 44", "broadcast 63, all_reduce 46", "[47, 74, 35, 0]", "[16, 54, 44, 32]"):
        assert figure in text
