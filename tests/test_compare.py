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
    Row,
    add_speedups,
    build_row,
    read_comparison,
    trial_batches,
    verdict,
)
from mgprof.analyze.run.analysis import steady_state_steps
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
    assert plan == {"single": (8, 8), "ddp": (8, 8), "dp": (32, 8)}


def test_global_batch_is_divided_over_ddp_ranks() -> None:
    plan = trial_batches("strong", 8, 4)
    assert plan == {"single": (8, 8), "ddp": (2, 2), "dp": (8, 2)}
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
    add_speedups(rows)
    assert rows[0].speedup == pytest.approx(1.0)
    assert rows[1].samples_per_s == pytest.approx(1000.0)
    assert rows[1].speedup == pytest.approx(1000.0 / 800.0)
    assert rows[1].efficiency_pct == pytest.approx(100.0 * 1.25 / 2)
    assert rows[1].step_time_ms == pytest.approx(16.0)
    assert rows[1].batch_controlled and rows[1].global_batch == 16
    assert any("sync A/B not available: x" in n for n in rows[1].notes)
    text = verdict(rows, cpu_fallback=False, mode="weak")
    assert text.startswith("best: ddp") and "1.25x" in text and "62% scaling efficiency" in text


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
    add_speedups(rows)
    assert rows[1].efficiency_pct == pytest.approx(250.0)
    [note] = [n for n in rows[1].notes if n.startswith("superlinear")]
    assert "250 % efficiency" in note and "single 2, ddp 1" in note
    assert "treat the speedup with care" in verdict(rows, cpu_fallback=True, mode="weak")
    # at or below 110 % nothing is said
    ddp2 = _run("ddp", 2, 10.0 / 1.05, 8)
    for rec in ddp2.ranks:
        rec.training.ddp_sync_forwards = 5
    rows = [rows[0], build_row("ddp", ddp2, _analysis(ddp2), "d", 8, ab_asked=False)]
    add_speedups(rows)
    assert rows[1].efficiency_pct == pytest.approx(105.0)
    assert not any(n.startswith("superlinear") for n in rows[1].notes)


def test_verdict_says_when_more_devices_are_slower() -> None:
    rows = [Row(strategy="single", devices=1, run="s", status="complete", samples_per_s=100.0)]
    rows.append(Row(strategy="ddp", devices=2, run="d", status="complete", samples_per_s=70.0))
    add_speedups(rows)
    text = verdict(rows, cpu_fallback=True, mode="strong")
    assert text.startswith("best: single") and "0.70x" in text and "did not pay off" in text
    assert "CPU ranks over gloo" in text


def test_uncontrolled_batch_is_said_and_read_from_the_records() -> None:
    run = _run("single", 1, 10.0, 12)
    row = build_row("single", run, _analysis(run), "s", 8)
    assert not row.batch_controlled and row.batch_per_device == 12
    assert any("batch not controlled" in n for n in row.notes)


def _comparison() -> Comparison:
    rows = [
        Row(strategy="single", devices=1, run="s", status="complete", samples_per_s=100.0),
        Row(strategy="ddp", devices=2, run="d", status="complete", samples_per_s=180.0),
    ]
    add_speedups(rows)
    return Comparison(
        rows=rows,
        not_applicable=[NotApplicable(strategy="dp", reason="DataParallel needs CUDA GPUs")],
        verdict=verdict(rows, False, "weak"),
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
        mp.setenv("AB_PARAMS_OUT", str(tmp / "params_ab.pt"))
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


def _samples_per_s(run: RunRecord) -> float:
    """Recomputed from run.json alone: per rank sum(batch)/sum(time), summed over ranks."""
    total = 0.0
    for rank in run.ranks:
        steps = steady_state_steps(rank.steps)
        total += sum(s.batch_size or 0 for s in steps) / (sum(s.duration_ms for s in steps) / 1e3)
    return total


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
    assert comp.verdict.startswith("best: ")
    on_disk = read_comparison(comp_dir)
    assert on_disk.rows == comp.rows and set(on_disk.runs) == {"single", "ddp"}
    for name in on_disk.runs.values():
        linked = read_run(comp_dir / name).analysis or {}
        assert linked["comparison"]["verdict"] == comp.verdict  # for the HTML report


@pytest.mark.slow
def test_speedup_and_efficiency_match_the_records(compared: tuple[Path, Comparison]) -> None:
    comp_dir, comp = compared
    single = read_run(comp_dir / comp.runs["single"])
    ddp = read_run(comp_dir / comp.runs["ddp"])
    thr_single, thr_ddp = _samples_per_s(single), _samples_per_s(ddp)
    row = comp.rows[1]
    assert row.samples_per_s == pytest.approx(thr_ddp, rel=1e-9)
    assert row.speedup == pytest.approx(thr_ddp / thr_single, rel=1e-9)
    assert row.efficiency_pct == pytest.approx(100.0 * thr_ddp / thr_single / 2, rel=1e-9)
    # same measured steps after warm-up for every strategy
    assert {len(r.steps) for r in single.ranks + ddp.ranks} == {WARMUP + STEPS}


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
    with_ab = torch.load(tmp / "params_ab.pt")
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
    assert "verdict:" in capsys.readouterr().out
