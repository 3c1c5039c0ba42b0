"""Findings that hold: a rule fires only on evidence stronger than the run's own noise, its
advice fits the device and the machine, its cause matches what was measured, and each finding
carries a stable id, its numbers and a machine-readable fix.

Inputs start from a real 2-rank CPU run (``mgprof analyze examples/mlp_context.py --gpus 2``,
made once per session by ``cpu_run_dir``: DDP over gloo, 2 usable cores, a 1.5 MiB model),
edited with ``msgspec.structs.replace`` into each fires / does-not-fire pair.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest

from mgprof.analyze.findings import SEVERITY_ORDER, evaluate_findings
from mgprof.analyze.run.analysis import analyze_run
from mgprof.analyze.run.job_figures import job_analysis
from mgprof.analyze.run.rank_figures import analyze_rank
from mgprof.analyze.run.traces import RunTraces
from mgprof.records import RankRecord, RunRecord, StepRecord, TrainingFacts, read_run

pytestmark = pytest.mark.slow  # the real run spawns two ranks (once per session)

GPU_ONLY_WORDS = ("nvidia-smi", "NVML", "GPU", "CUDA", "cuda", "pin_memory=True", "tensor core")


@pytest.fixture(scope="module")
def real(cpu_run_dir: Path) -> RunRecord:
    run = read_run(cpu_run_dir)
    # What the tests below rely on: a CPU fallback over gloo, DDP-synchronised, 2 cores, 1 host.
    assert run.cpu_fallback and run.world_size == 2
    assert {r.host for r in run.ranks} == {run.ranks[0].host}
    assert all(r.training.cpu_cores == 2 for r in run.ranks)
    assert all(r.training.ddp_sync_forwards for r in run.ranks)
    return run


def with_ranks(run: RunRecord, **per_rank: Any) -> RunRecord:
    """``run`` with fields of every rank replaced; a list value gives one value per rank."""
    ranks = []
    for i, rec in enumerate(sorted(run.ranks, key=lambda r: r.rank)):
        changes = {k: (v[i] if isinstance(v, list) else v) for k, v in per_rank.items()}
        ranks.append(msgspec.structs.replace(rec, **changes))
    return msgspec.structs.replace(run, ranks=ranks)


def with_training(run: RunRecord, **facts: Any) -> RunRecord:
    return with_ranks(
        run, training=[msgspec.structs.replace(r.training, **facts) for r in run.ranks]
    )


def timed(durations_ms: Sequence[float], **kw: Any) -> list[StepRecord]:
    """Steps with these durations after a 50 ms warm-up step (left out of steady state)."""
    return [
        StepRecord(index=i, duration_ms=ms, batch_size=64, **kw)
        for i, ms in enumerate([50.0, *durations_ms])
    ]


def findings(run: RunRecord, analysis: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    found = evaluate_findings(run, analysis if analysis is not None else analyze_run(run, None))
    return {f["rule"]: f for f in found}


def text_of(finding: dict[str, Any]) -> str:
    keys = ("title", "evidence", "cause", "change", "saving")
    return " ".join(str(finding.get(k) or "") for k in keys) + " " + " ".join(finding["fix"])


# ------------------------------------------------------------------ the straggler and the noise

STEADY = [10.0, 10.4, 9.8, 10.2, 10.1, 9.9, 10.3, 10.0]


def straggler_run(real: RunRecord, rank0: Sequence[float], rank1: Sequence[float]) -> RunRecord:
    return with_ranks(real, steps=[timed(rank0), timed(rank1)])


def test_straggler_quiet_when_ranks_alternate(real: RunRecord) -> None:
    """Rank 0's mean is 40 % higher, but each rank is the slowest in half the steps and rank 0's
    own steps scatter by 100 %: noise, not a straggler."""
    run = straggler_run(real, [10.0, 20.0] * 4, [12.0, 9.0] * 4)
    assert "rank_imbalance" not in findings(run)


def test_straggler_quiet_when_the_spread_is_within_the_scatter(real: RunRecord) -> None:
    """Rank 1 is 12 % slower in every step, but both ranks' steps scatter far more than that
    (a common slow step every few steps): the spread is within the run's own noise."""
    base = [10.0, 10.0, 10.0, 30.0] * 2
    run = straggler_run(real, base, [1.12 * ms for ms in base])
    assert "rank_imbalance" not in findings(run)


def test_straggler_quiet_below_the_floor(real: RunRecord) -> None:
    run = straggler_run(real, STEADY, [1.05 * ms for ms in STEADY])
    assert "rank_imbalance" not in findings(run)


def test_straggler_fires_consistently_with_a_stable_id_and_severity(real: RunRecord) -> None:
    run = straggler_run(real, STEADY, [1.4 * ms for ms in STEADY])
    first = findings(run)["rank_imbalance"]
    assert first["id"] == "rank_imbalance:rank1" and first["severity"] == "high"
    ev = first["evidence"]
    assert "rank 1 is the slowest in 8/8 steady-state steps (100 %; needs ≥ 75 %)" in ev
    assert "spread 40.0 % > 10.0 %" in ev and "median per-step excess 40.0 % (high ≥ 25 %)" in ev
    figs = first["figures"]
    assert figs["steps_slowest"] == 8 and figs["steps_compared"] == 8
    assert figs["threshold_slowest_steps_pct"] == 75.0 and figs["threshold_spread_pct"] == 10.0
    assert figs["step_time_spread_pct"] == pytest.approx(40.0)
    # The same run evaluated again, and a second "identical run" whose steps differ by noise
    # (±3 %, rank order and step order in the record shuffled): the same finding.
    assert findings(run)["rank_imbalance"] == first
    rng = random.Random(7)
    rerun = straggler_run(
        real,
        [ms * rng.uniform(0.97, 1.03) for ms in STEADY],
        [1.4 * ms * rng.uniform(0.97, 1.03) for ms in STEADY],
    )
    shuffled = msgspec.structs.replace(
        rerun,
        ranks=[
            msgspec.structs.replace(r, steps=list(reversed(r.steps))) for r in reversed(rerun.ranks)
        ],
    )
    again = findings(shuffled)["rank_imbalance"]
    assert (again["id"], again["severity"]) == (first["id"], first["severity"])


def test_straggler_medium_for_a_smaller_consistent_excess(real: RunRecord) -> None:
    run = straggler_run(real, STEADY, [1.15 * ms for ms in STEADY])
    f = findings(run)["rank_imbalance"]
    assert f["severity"] == "medium" and f["id"] == "rank_imbalance:rank1"


def test_straggler_on_cpu_gives_cpu_advice(real: RunRecord) -> None:
    run = with_training(straggler_run(real, STEADY, [1.4 * ms for ms in STEADY]), cpu_threads=2)
    f = findings(run)["rank_imbalance"]
    assert "nvidia-smi" not in text_of(f) and "GPU" not in text_of(f)
    # 2 ranks x 2 threads on 2 cores: oversubscribed; one thread per rank fits.
    assert "2 ranks x 2 thread(s) on 2 cores, oversubscribed" in f["cause"]
    assert "OMP_NUM_THREADS=1" in f["fix"]


# ------------------------------------------------------------------ the fastest and the slowest


def job_of(run: RunRecord, trace_job: dict[str, Any] | None) -> Any:
    ranks = [analyze_rank(r, RunTraces()) for r in run.ranks]
    return job_analysis(run, ranks, trace_job)


def test_fastest_and_slowest_are_never_the_same_rank(real: RunRecord) -> None:
    """The reported bug: rank 1 last to arrive at collectives but with the lowest mean step was
    named both the slowest and the fastest."""
    run = straggler_run(real, [10.96] * 8, [9.61] * 8)
    job = job_of(run, {"slowest_rank": 1})
    assert job.slowest_rank == 1 and job.slowest_mean_step_ms == pytest.approx(9.61)
    assert job.fastest_rank is None and job.fastest_mean_step_ms is None
    assert "disagree" in job.not_applicable["fastest_rank"]
    by_means = job_of(run, None)
    assert (by_means.slowest_rank, by_means.fastest_rank) == (0, 1)
    assert by_means.slowest_rank_basis == "highest mean step time"
    agree = job_of(run, {"slowest_rank": 0})
    assert (agree.slowest_rank, agree.fastest_rank) == (0, 1)
    assert agree.fastest_mean_step_ms == pytest.approx(9.61)


def test_fastest_is_the_lowest_mean_among_the_other_ranks(real: RunRecord) -> None:
    three = msgspec.structs.replace(
        real,
        world_size=3,
        ranks=[
            msgspec.structs.replace(real.ranks[0], rank=0, steps=timed([12.0] * 4)),
            msgspec.structs.replace(real.ranks[1], rank=1, steps=timed([10.0] * 4)),
            msgspec.structs.replace(real.ranks[1], rank=2, steps=timed([11.0] * 4)),
        ],
    )
    job = job_of(three, {"slowest_rank": 2})
    assert (job.slowest_rank, job.fastest_rank) == (2, 1)
    assert job.fastest_mean_step_ms <= job.slowest_mean_step_ms


# ------------------------------------------------------------------ advice fits the machine


def stalled(real: RunRecord, **facts: Any) -> RunRecord:
    run = with_ranks(real, steps=[timed(STEADY, dataloader_ms=4.0)] * 2)
    return with_training(run, **facts) if facts else run


def test_num_workers_never_above_the_cores_per_rank(real: RunRecord) -> None:
    """2 usable cores shared by 2 ranks: at most one worker per rank."""
    f = findings(stalled(real, dataloader_num_workers=0))["dataloader_stall"]
    assert f["figures"]["cores_per_rank"] == 1 and f["figures"]["advised_num_workers"] == 1
    assert "num_workers=1" in f["change"] and "num_workers=4" not in f["change"]
    # One worker takes the rank's only core: if the wait remains, the loading must get cheaper.
    assert f["fix"] == [
        "DataLoader(num_workers=1, persistent_workers=True)",
        "cache pre-processed samples",
    ]
    assert "1 CPU core(s) per rank" in f["evidence"]


def test_no_more_workers_when_the_cores_are_taken(real: RunRecord) -> None:
    f = findings(stalled(real, dataloader_num_workers=1))["dataloader_stall"]
    assert "num_workers=" not in f["change"] and "cache" in f["change"]
    assert "advised_num_workers" not in f["figures"]


def test_num_workers_grows_with_the_cores(real: RunRecord) -> None:
    f = findings(stalled(real, dataloader_num_workers=0, cpu_cores=16))["dataloader_stall"]
    assert f["figures"]["cores_per_rank"] == 8 and "num_workers=4" in f["change"]
    on_two_hosts = with_ranks(
        msgspec.structs.replace(stalled(real, cpu_cores=4), nnodes=2), host=["a", "b"]
    )
    g = findings(on_two_hosts)["dataloader_stall"]
    assert g["figures"]["cores_per_rank"] == 4 and "num_workers=4" in g["change"]


def test_dataloader_quiet_without_a_wait(real: RunRecord) -> None:
    run = with_ranks(real, steps=[timed(STEADY, dataloader_ms=0.1)] * 2)
    assert "dataloader_stall" not in findings(run)


def exposed(run: RunRecord, pct: float = 30.0) -> dict[str, Any]:
    """The run's figures with every rank's communication ``pct`` % exposed."""
    analysis = analyze_run(run, None)
    for rank in analysis["ranks"]:
        rank["comm"] = {  # 1.25x the exposed time communicating, 20 % of it overlapped
            "window_us": 20_000.0,
            "comm_us": 250.0 * pct,
            "comm_overlap_us": 50.0 * pct,
            "exposed_comm_us": 200.0 * pct,
            "comm_pct": 1.25 * pct,
            "comm_overlap_pct": 20.0,
            "exposed_comm_pct": pct,
        }
    return analysis


def test_bucket_advice_absent_for_a_21_parameter_model(real: RunRecord) -> None:
    run = with_training(real, ddp_gradient_mib=21 * 4 / 2**20)
    f = findings(run, exposed(run))["exposed_comm"]
    assert "bucket_cap_mb=" not in f["change"] and not any("bucket" in x for x in f["fix"])
    assert "fit within one bucket" in f["evidence"] and "no_sync" in f["change"]
    unknown = with_training(real, ddp_gradient_mib=None)
    g = findings(unknown, exposed(unknown))["exposed_comm"]
    assert "bucket" not in g["change"] and "bucket" not in g["evidence"]


def test_bucket_advice_when_gradients_exceed_the_bucket(real: RunRecord) -> None:
    run = with_training(real, ddp_gradient_mib=180.0, ddp_bucket_cap_mb=25.0)
    f = findings(run, exposed(run))["exposed_comm"]
    assert "DDP gradients 180.0 MiB, bucket_cap_mb=25" in f["evidence"]
    assert "bucket_cap_mb=50" in f["change"] and f["figures"]["ddp_gradient_mib"] == 180.0


def test_exposed_comm_quiet_below_the_threshold(real: RunRecord) -> None:
    assert "exposed_comm" not in findings(real, exposed(real, pct=4.0))


def test_exposed_comm_from_the_scripts_own_all_reduce(real: RunRecord) -> None:
    """Communication the script issued itself is not DDP's: no bucket advice, DDP suggested."""
    run = with_training(real, ddp_sync_forwards=0, script_all_reduces=8, ddp_gradient_mib=None)
    analysis = exposed(run)
    assert analysis["job"]["grad_sync"]["how"] == "script all_reduce"
    f = findings(run, analysis)["exposed_comm"]
    assert "script's own all_reduce" in f["evidence"] and "bucket" not in f["change"]
    assert "DistributedDataParallel(model)" in f["fix"]


def test_cpu_run_gets_no_gpu_advice_from_any_rule(real: RunRecord) -> None:
    """Every rule that can fire on this CPU run fires, and none names a GPU tool or setting;
    the GPU-only rules stay quiet even with GPU-looking figures."""
    run = with_training(
        with_ranks(
            real,
            steps=[
                timed(STEADY, dataloader_ms=4.0, fingerprint="same"),
                timed([1.4 * ms for ms in STEADY], dataloader_ms=4.0, fingerprint="same"),
            ],
        ),
        dataloader_num_workers=0,
        dataloader_pin_memory=False,
        set_epoch_called=False,
        find_unused_parameters=True,
        autocast_used=False,
        ddp_gradient_mib=180.0,
    )
    analysis = exposed(run)
    for rank in analysis["ranks"]:
        rank["trace_busy_pct"] = rank["nvml_gpu_util_pct"] = 5.0
        rank["memory"] = {"kind": "cuda", "headroom_pct": 1.0, "total_mib": 80_000.0}
    found = findings(run, analysis)
    assert set(found) == {
        "rank_imbalance",
        "exposed_comm",
        "dataloader_stall",
        "identical_batches",
        "set_epoch_missing",
        "find_unused_parameters",
    }
    for f in found.values():
        text = text_of(f)
        assert not [w for w in GPU_ONLY_WORDS if w in text], (f["rule"], text)
    assert "per-rank batch" in found["exposed_comm"]["change"]


# ------------------------------------------------------------------ causes match the measurement


def same_batches(run: RunRecord) -> RunRecord:
    return with_ranks(run, steps=[timed(STEADY, fingerprint="same")] * 2)


def test_identical_batches_with_synchronised_gradients(real: RunRecord) -> None:
    run = same_batches(real)
    analysis = analyze_run(run, None)
    assert analysis["job"]["grad_sync"]["status"] == "synchronised"
    f = findings(run, analysis)["identical_batches"]
    assert "averaged over copies of one batch" in f["cause"]
    assert "gradients synchronised" in f["evidence"]
    assert "DistributedDataParallel(model)" not in f["fix"]


def test_identical_batches_on_independent_replicas(real: RunRecord) -> None:
    run = with_training(same_batches(real), ddp_sync_forwards=0)
    analysis = analyze_run(run, None)
    assert analysis["job"]["grad_sync"]["status"] == "independent"
    f = findings(run, analysis)["identical_batches"]
    assert "averaged" not in f["cause"]
    assert "never synchronised" in f["cause"] and "the extra ranks add nothing" in f["cause"]
    assert "DistributedDataParallel(model)" in f["fix"]
    assert "1 extra rank(s) add nothing" in (f["saving"] or "")


def test_identical_batches_quiet_on_distinct_shards(real: RunRecord) -> None:
    assert "identical_batches" not in findings(real, analyze_run(real, None))


# ------------------------------------------------------------------ ids, order, JSON


def test_findings_are_deterministic_machine_readable_json(real: RunRecord) -> None:
    run = with_training(
        with_ranks(
            real,
            steps=[
                timed(STEADY, dataloader_ms=4.0, fingerprint="same"),
                timed([1.4 * ms for ms in STEADY], dataloader_ms=4.0, fingerprint="same"),
            ],
        ),
        set_epoch_called=False,
        find_unused_parameters=True,
    )
    analysis = exposed(run)
    found = evaluate_findings(run, analysis)
    # Reversed rank order and reversed dict order give the same list.
    backwards = msgspec.structs.replace(run, ranks=list(reversed(run.ranks)))
    flipped = json.loads(json.dumps(analysis), object_pairs_hook=lambda p: dict(reversed(p)))
    assert evaluate_findings(backwards, flipped) == found
    order = [(SEVERITY_ORDER[f["severity"]], f["id"]) for f in found]
    assert order == sorted(order) and len({f["id"] for f in found}) == len(found)
    for f in json.loads(json.dumps(found)):
        assert f["severity"] in ("high", "medium", "low", "info")
        assert f["id"] == f["rule"] or f["id"].startswith(f["rule"] + ":rank")
        assert f["fix"] and all(isinstance(x, str) and x for x in f["fix"])
        assert isinstance(f["figures"], dict) and f["evidence"]


def test_rank_record_defaults_do_not_trip_the_fit_helpers() -> None:
    """Records from before the new facts (no cores, no gradient size, no host) still work."""
    old = RunRecord(
        world_size=2,
        strategy="ddp",
        ranks=[
            RankRecord(
                rank=r,
                world_size=2,
                steps=timed(STEADY, dataloader_ms=4.0),
                training=TrainingFacts(dataloader_num_workers=0),
            )
            for r in range(2)
        ],
    )
    f = findings(old)["dataloader_stall"]
    assert "num_workers=min(4, os.cpu_count() // 2)" in f["change"]
    assert "pin_memory" not in f["change"]
