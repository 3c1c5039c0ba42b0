"""``mgprof compare``: batch plan, arithmetic, rendering, bad flags, and a real 2-rank gloo run.

The end-to-end part runs one comparison (single + DDP on 2 gloo ranks, strong scaling, with the
sync A/B) and one plain DDP run, and checks the table against the records in each run.json.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _spawn import write_script
from rich.console import Console

from mgprof.analyze.compare.scaling import (
    Comparison,
    NotApplicable,
    add_round,
    add_speedups,
    build_row,
    observed_mode,
    read_comparison,
    trial_batches,
)
from mgprof.analyze.compare.verdict import verdict
from mgprof.cli import main
from mgprof.records import RankRecord, RunRecord, StepRecord, read_run
from mgprof.report.compare_view import (
    COLUMNS,
    comparison_to_markdown,
    render_comparison,
)

# -- the batch plan ---------------------------------------------------------------------------


def test_weak_scaling_keeps_the_per_device_batch() -> None:
    plan = trial_batches("weak", 8, 4)
    assert plan == {
        "single": (8, 8),
        "ddp": (8, 8),
        "dp": (32, 8),
        "fsdp": (8, 8),
        "fsdp-noreshard": (8, 8),
    }


def test_global_batch_is_divided_over_ddp_ranks() -> None:
    plan = trial_batches("strong", 8, 4)
    assert plan == {
        "single": (8, 8),
        "ddp": (2, 2),
        "dp": (8, 2),
        "fsdp": (2, 2),
        "fsdp-noreshard": (2, 2),
    }
    with pytest.raises(ValueError, match="does not divide"):
        trial_batches("strong", 9, 4)


# -- rows and arithmetic on synthetic records ------------------------------------------------


def _run(strategy: str, world: int, step_ms: float, batch: int) -> RunRecord:
    ranks = [
        RankRecord(
            rank=r,
            world_size=world,
            strategy=strategy,
            steps=[StepRecord(index=i, duration_ms=step_ms, batch_size=batch) for i in range(5)],
        )
        for r in range(world)
    ]
    return RunRecord(strategy=strategy, world_size=world, ranks=ranks, status="complete")


def _analysis(run: RunRecord) -> dict[str, Any]:
    from mgprof.analyze.run.analysis import analyze_run

    return dict(analyze_run(run, None))


def test_speedup_and_efficiency_follow_the_throughputs() -> None:
    single = _run("single", 1, 10.0, 8)  # 800 samples/s
    ddp = _run("ddp", 2, 16.0, 8)  # 2 x 500 = 1000 samples/s
    rows = [
        build_row("single", single, _analysis(single), "s", 8),
        build_row("ddp", ddp, _analysis(ddp), "d", 8, {"available": False, "reason": "x"}),
    ]
    intervals = add_speedups(rows)
    assert rows[0].speedup == pytest.approx(1.0)
    assert rows[1].samples_per_s == pytest.approx(1000.0)
    assert rows[1].speedup == pytest.approx(1000.0 / 800.0)
    assert rows[1].efficiency_pct == pytest.approx(100.0 * 1.25 / 2)
    assert rows[1].step_time_ms == pytest.approx(16.0)
    assert rows[1].batch_controlled and rows[1].global_batch == 16
    assert any("sync A/B not available: x" in n for n in rows[1].notes)
    # constant step times: the interval is the point itself, and the verdict names the winner
    assert (rows[1].speedup_low, rows[1].speedup_high) == pytest.approx((1.25, 1.25))
    text = verdict(rows, cpu_fallback=False, mode="weak", intervals=intervals)
    assert text.startswith("best: ddp") and "1.25x" in text and "62% scaling efficiency" in text
    assert "95 % interval 1.25–1.25x" in text
    # without intervals nothing is measurably different
    assert verdict(rows, False, "weak").startswith("no measurable difference")


def test_superlinear_efficiency_is_questioned_and_a_thread_mismatch_named() -> None:
    single = _run("single", 1, 10.0, 8)  # 800 samples/s
    ddp = _run("ddp", 2, 4.0, 8)  # 2 x 2000 = 4000 samples/s: 250 % efficiency
    for rec in single.ranks:
        rec.training.cpu_threads = 2
    for rec in ddp.ranks:
        rec.training.cpu_threads = 1
        rec.training.ddp_sync_forwards = 5  # the ranks synchronised (else: no speedup at all)
    rows = [
        build_row("single", single, _analysis(single), "s", 8),
        build_row("ddp", ddp, _analysis(ddp), "d", 8, ab_asked=False),
    ]
    intervals = add_speedups(rows)
    assert rows[1].efficiency_pct == pytest.approx(250.0)
    [note] = [n for n in rows[1].notes if n.startswith("superlinear")]
    assert "250 % efficiency" in note and "single 2, ddp 1" in note
    text = verdict(rows, cpu_fallback=True, mode="weak", intervals=intervals)
    assert "treat the speedup with care" in text
    # at or below 110 % nothing is said
    ddp2 = _run("ddp", 2, 10.0 / 1.05, 8)
    for rec in ddp2.ranks:
        rec.training.ddp_sync_forwards = 5
    rows = [rows[0], build_row("ddp", ddp2, _analysis(ddp2), "d", 8, ab_asked=False)]
    add_speedups(rows)
    assert rows[1].efficiency_pct == pytest.approx(105.0)
    assert not any(n.startswith("superlinear") for n in rows[1].notes)


def _synced(run: RunRecord) -> RunRecord:
    for rec in run.ranks:
        rec.training.ddp_sync_forwards = 5
    return run


def test_verdict_says_when_more_devices_are_slower() -> None:
    single = _run("single", 1, 10.0, 8)  # 800 samples/s
    ddp = _synced(_run("ddp", 2, 20.0 / 0.7, 4))  # global 8 per 28.6 ms: 280 samples/s
    rows = [
        build_row("single", single, _analysis(single), "s", 8),
        build_row("ddp", ddp, _analysis(ddp), "d", 4, ab_asked=False),
    ]
    intervals = add_speedups(rows)
    text = verdict(rows, cpu_fallback=True, mode="strong", intervals=intervals)
    assert text.startswith("best: single") and "0.35x" in text and "did not pay off" in text
    assert "CPU ranks over gloo" in text


def _noisy_run(strategy: str, world: int, times: list[float], batch: int) -> RunRecord:
    ranks = [
        RankRecord(
            rank=r,
            world_size=world,
            strategy=strategy,
            steps=[
                StepRecord(index=i, duration_ms=t, batch_size=batch) for i, t in enumerate(times)
            ],
        )
        for r in range(world)
    ]
    return _synced(RunRecord(strategy=strategy, world_size=world, ranks=ranks, status="complete"))


def test_overlapping_intervals_say_no_measurable_difference() -> None:
    """Two rows whose step times overlap: the verdict names no winner and gives the interval;
    the same rows give the same words every time (the bootstrap is seeded)."""
    a = [10.0, 9.0, 11.5, 8.5, 12.0, 10.5, 9.5, 11.0]
    b = [10.5, 8.8, 12.0, 9.0, 11.0, 10.0, 9.2, 11.8]
    single = _noisy_run("single", 1, a, 8)
    ddp = _noisy_run("ddp", 2, [2 * t for t in b], 8)  # twice the samples in twice the time
    texts = set()
    for _ in range(3):
        rows = [
            build_row("single", single, _analysis(single), "s", 8),
            build_row("ddp", ddp, _analysis(ddp), "d", 8, ab_asked=False),
        ]
        intervals = add_speedups(rows)
        texts.add(verdict(rows, False, "weak", intervals=intervals, rounds=2))
    (text,) = texts
    assert text.startswith("no measurable difference: ")
    low, high = rows[1].speedup_low, rows[1].speedup_high
    assert low is not None and high is not None and low < 1.0 < high


def test_a_later_round_joins_the_pool_and_the_busy_machine_is_said() -> None:
    single = _noisy_run("single", 1, [10.0] * 6, 8)
    later = _noisy_run("single", 1, [12.0] * 6, 8)
    row = build_row("single", single, _analysis(single), "s", 8)
    add_round(row, later, "s-round2")
    assert row.round_step_ms == [[10.0] * 5, [12.0] * 5] and row.steps_measured == 10
    assert row.step_time_ms == pytest.approx(11.0)
    text = verdict([row], False, "unknown", busy=["single: other processes used 1.2 cores"])
    assert "the machine was busy: single: other processes used 1.2 cores" in text


def test_traced_and_post_trace_steps_are_set_apart() -> None:
    times = [30.0, 12.0, 15.0, 15.0, 15.0, 48.0, 10.0, 10.0, 10.0]
    run = _noisy_run("single", 1, times, 8)
    for rec in run.ranks:
        for s in rec.steps:
            s.traced = s.index in (2, 3, 4)
    row = build_row("single", run, _analysis(run), "s", 8)
    # step 0 warms up, 1 is the profiler's warm-up, 2-4 are traced, 5 writes the trace
    assert row.round_step_ms == [[10.0, 10.0, 10.0]]
    assert row.traced_step_ms == pytest.approx(15.0) and row.post_trace_step_ms == 48.0
    assert row.samples_per_s == pytest.approx(800.0)


@pytest.mark.parametrize(
    ("single_batch", "ddp_batch", "mode"),
    [(8, 8, "weak"), (8, 4, "strong"), (8, 6, "mixed")],
)
def test_the_scaling_mode_is_read_off_the_trained_batches(
    single_batch: int, ddp_batch: int, mode: str
) -> None:
    single = _noisy_run("single", 1, [10.0] * 5, single_batch)
    ddp = _noisy_run("ddp", 2, [10.0] * 5, ddp_batch)
    rows = [
        build_row("single", single, _analysis(single), "s", None),
        build_row("ddp", ddp, _analysis(ddp), "d", None, ab_asked=False),
    ]
    assert observed_mode(rows)[0] == mode


def test_uncontrolled_batch_is_said_and_read_from_the_records() -> None:
    run = _run("single", 1, 10.0, 12)
    row = build_row("single", run, _analysis(run), "s", 8)
    assert not row.batch_controlled and row.batch_per_device == 12
    assert any("batch not controlled" in n for n in row.notes)


def _comparison() -> Comparison:
    single = _run("single", 1, 10.0, 8)  # 800 samples/s
    ddp = _synced(_run("ddp", 2, 10.0 / 0.9, 8))  # 1,440 samples/s: 1.80x, 90 %
    rows = [
        build_row("single", single, _analysis(single), "s", 8),
        build_row("ddp", ddp, _analysis(ddp), "d", 8, ab_asked=False),
    ]
    intervals = add_speedups(rows)
    return Comparison(
        rows=rows,
        not_applicable=[NotApplicable(strategy="dp", reason="DataParallel needs CUDA GPUs")],
        verdict=verdict(rows, False, "weak", intervals=intervals),
    )


def test_renderers_show_every_column_and_the_not_applicable_reason() -> None:
    comp = _comparison()
    md = comparison_to_markdown(comp)
    for col in COLUMNS:
        assert col in md
    assert "dp: not applicable: DataParallel needs CUDA GPUs" in md
    assert "1.80x" in md and "90%" in md
    buf = io.StringIO()
    render_comparison(comp, Console(file=buf, width=100))
    out = buf.getvalue()
    assert "verdict: best: ddp" in out and "not applicable" in out


# -- bad flags ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--strategies", "foo"], "unknown strategy 'foo'"),
        (["--gpus", "0"], "--gpus must be at least 1"),
        (["--gpus", "2", "--batch-size", "7", "--global-batch"], "does not divide"),
        (["--gpus", "2", "--global-batch"], "needs --batch-size"),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    script = write_script(tmp_path, "s.py", "print('never run')\n")
    code = main(["compare", str(script), "--out", str(tmp_path / "out"), *flags])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


# -- a real comparison on 2 gloo ranks ---------------------------------------------------------

SCRIPT = """
import atexit, os, sys
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
import mgprof

torch.manual_seed(0)
model = mgprof.wrap(nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 4)))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
bs = mgprof.batch_size(16)
rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
g = torch.Generator().manual_seed(1 + rank)
data = TensorDataset(torch.randn(bs, 64, generator=g), torch.randint(0, 4, (bs,), generator=g))
loader = DataLoader(data, batch_size=bs)  # one fixed batch: every step sees the same data

def save():
    out = os.environ.get("AB_PARAMS_OUT")
    if out == "run-dir":  # each run its own file: a comparison runs every row twice
        out = os.path.join(os.environ["MGPROF_RUN_DIR"], "params.pt")
    if out and rank == 0:
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, out)

atexit.register(save)
for _ in range(1000):
    for x, y in loader:
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
"""

STEPS, WARMUP, NOSYNC = 4, 1, 3


@pytest.fixture(scope="module")
def compared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Comparison]]:
    import mgprof

    tmp = tmp_path_factory.mktemp("compare")
    script = write_script(tmp, "ab.py", SCRIPT)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMP_NUM_THREADS", "1")
        mp.setenv("AB_PARAMS_OUT", "run-dir")
        comp = mgprof.compare(
            script,
            gpus=2,
            steps=STEPS,
            warmup=WARMUP,
            batch_size=8,
            global_batch=True,
            out=tmp / "out",
            nosync_steps=NOSYNC,
        )
    yield tmp / "out" / comp.comparison_id, comp


def _untraced_steps(run: RunRecord) -> tuple[list[float], int]:
    """Recomputed from run.json alone: per step index the slowest rank's time, leaving out the
    first step, the profiler's warm-up and traced steps and the step after them; and the
    samples per step summed over ranks."""
    by_rank = [{s.index: s for s in rank.steps} for rank in run.ranks]
    traced = sorted({i for d in by_rank for i, s in d.items() if s.traced})
    skip = {0}
    if traced:
        skip |= set(range(traced[0] - 1, traced[-1] + 2))
    common = sorted(set.intersection(*(set(d) for d in by_rank)) - skip)
    times = [max(d[i].duration_ms for d in by_rank) for i in common]
    samples = sum(d[1].batch_size or 0 for d in by_rank)  # the same in every step here
    return times, samples


def _rate(comp_dir: Path, names: list[str]) -> float:
    """samples/s over the untraced steps of every round, pooled."""
    times: list[float] = []
    samples = 0
    for name in names:
        t, samples = _untraced_steps(read_run(comp_dir / name))
        times += t
    assert times, "no untraced step in any round"
    return samples * 1000.0 / (sum(times) / len(times))


@pytest.mark.slow
def test_table_has_rows_columns_and_dp_not_applicable(compared: tuple[Path, Comparison]) -> None:
    comp_dir, comp = compared
    assert comp.mode == "strong" and comp.cpu_fallback
    assert [r.strategy for r in comp.rows] == ["single", "ddp"]
    assert [n.strategy for n in comp.not_applicable] == ["dp"]
    assert "CUDA" in comp.not_applicable[0].reason
    for row in comp.rows:
        assert row.status == "complete", row.notes
        for field in ("step_time_ms", "samples_per_s", "speedup", "efficiency_pct"):
            assert getattr(row, field) is not None, (row.strategy, field, row.notes)
        assert row.peak_mem_kind == "cpu rss" and len(row.peak_mem_mib) == row.devices
    ddp = comp.rows[1]
    assert ddp.exposed_comm_pct is not None and ddp.exposed_comm_pct > 0
    assert ddp.ab_sync_ms is not None and ddp.ab_nosync_ms is not None
    assert ddp.ab_comm_pct is not None
    # a winner only when the interval excludes the other row, else no measurable difference
    if ddp.speedup_low is not None and ddp.speedup_high is not None:
        clear = ddp.speedup_low > 1.0 or ddp.speedup_high < 1.0
        assert comp.verdict.startswith("best: " if clear else "no measurable difference")
    # like for like: the rows ran with the same CPU threads per process
    assert len({r.cpu_threads for r in comp.rows}) == 1
    assert comp.cpu_threads_setting == "OMP_NUM_THREADS=1 for every row (set by you)"
    assert comp.rounds == 2 and all(len(r.rounds_run) == 1 for r in comp.rows)
    on_disk = read_comparison(comp_dir)
    assert on_disk.rows == comp.rows and set(on_disk.runs) == {"single", "ddp"}
    for name in on_disk.runs.values():
        linked = read_run(comp_dir / name).analysis or {}
        assert linked["comparison"]["verdict"] == comp.verdict  # for the HTML report


@pytest.mark.slow
def test_speedup_and_efficiency_match_the_records(compared: tuple[Path, Comparison]) -> None:
    comp_dir, comp = compared
    base, row = comp.rows
    thr_single = _rate(comp_dir, [base.run, *base.rounds_run])
    thr_ddp = _rate(comp_dir, [row.run, *row.rounds_run])
    assert row.samples_per_s == pytest.approx(thr_ddp, rel=1e-9)
    assert row.speedup == pytest.approx(thr_ddp / thr_single, rel=1e-9)
    assert row.efficiency_pct == pytest.approx(100.0 * thr_ddp / thr_single / 2, rel=1e-9)
    # the interval holds the ratio of the untraced step times measured here
    assert row.speedup_low is not None and row.speedup_high is not None
    assert row.speedup_low <= thr_ddp / thr_single <= row.speedup_high
    # same measured steps after warm-up for every strategy and round
    for r in comp.rows:
        for name in (r.run, *r.rounds_run):
            assert {len(rank.steps) for rank in read_run(comp_dir / name).ranks} == {WARMUP + STEPS}


@pytest.mark.slow
def test_global_batch_is_divided_in_the_records(compared: tuple[Path, Comparison]) -> None:
    comp_dir, comp = compared
    single = read_run(comp_dir / comp.runs["single"])
    ddp = read_run(comp_dir / comp.runs["ddp"])
    assert {s.batch_size for s in single.ranks[0].steps} == {8}
    assert {s.batch_size for r in ddp.ranks for s in r.steps} == {4}
    assert comp.rows[1].global_batch == 8 and comp.rows[1].batch_per_device == 4


@pytest.mark.slow
def test_nosync_ab_leaves_parameters_bit_identical(compared: tuple[Path, Comparison]) -> None:
    """The A/B run made NOSYNC synced updates after the measured steps (the B updates were
    undone); a plain run with NOSYNC more measured steps must end with the same bits."""
    import torch

    from mgprof.run.launcher import LaunchConfig, launch

    comp_dir, comp = compared
    tmp = comp_dir.parent.parent
    ab = json.loads((comp_dir / comp.runs["ddp"] / "nosync" / "rank0.json").read_text())
    assert ab["available"] and len(ab["sync_ms"]) == len(ab["nosync_ms"]) == NOSYNC
    config = LaunchConfig(
        script=tmp / "ab.py",
        gpus=2,
        strategy="ddp",
        steps=STEPS + NOSYNC,
        warmup=WARMUP,
        out=tmp / "plain",
        extra_env={"MGPROF_BATCH_SIZE": "4", "AB_PARAMS_OUT": str(tmp / "params_plain.pt")},
    )
    assert launch(config).exit_code == 0
    with_ab = torch.load(comp_dir / comp.runs["ddp"] / "params.pt")  # round 1 ran the A/B
    plain = torch.load(tmp / "params_plain.pt")
    assert with_ab.keys() == plain.keys()
    for key in plain:
        assert torch.equal(with_ab[key], plain[key]), key


@pytest.mark.slow
def test_report_renders_the_comparison_directory(
    compared: tuple[Path, Comparison], capsys: pytest.CaptureFixture[str]
) -> None:
    comp_dir, comp = compared
    assert main(["report", str(comp_dir), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"] == comp.verdict
    assert main(["report", str(comp_dir), "--format", "md"]) == 0
    assert "| ddp | 2 |" in capsys.readouterr().out
    assert main(["report", str(comp_dir)]) == 0
    assert "answer:" in capsys.readouterr().out  # the verdict opens the terminal form
