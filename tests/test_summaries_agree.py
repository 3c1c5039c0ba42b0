"""Say the same thing everywhere: each summary line against the table it summarises.

A sweep summary read "communication share 2.6 % at batch 8 -> 16.1 % at batch 512" beside a
table whose comm % went 41.5 -> 26.2 (the summary used another rank's figure), and "stopped
because throughput rose less than 3 % (plateau)" when it fell from 8,710 to 5,668. Here every
summary line is rendered next to its table, from the same result, and read back.
"""

from __future__ import annotations

import re

from mgprof.analyze.compare.scaling import add_speedups, build_row
from mgprof.analyze.compare.verdict import verdict
from mgprof.analyze.sweep.planner import SweepPlanner
from mgprof.analyze.sweep.result import summarize
from mgprof.analyze.sweep.trials import Trial
from mgprof.records import RankRecord, RunRecord, StepRecord
from mgprof.report.compare_view import table_cells
from mgprof.report.sweep_view import facts, rows


def _trial(batch: int, rate: float, comm: float, least: float) -> Trial:
    return Trial(
        batch_size=batch,
        status="ok",
        world_size=2,
        global_batch=2 * batch,
        samples_per_s=rate,
        samples_per_s_per_device=rate / 2,
        step_time_ms=2000.0 * batch / rate,
        step_times_ms=[2000.0 * batch / rate * f for f in (0.98, 1.0, 1.02, 0.99, 1.01)],
        comm_pct=comm,
        comm_pct_least_waiting=least,
    )


def _cell(table: list[list[str]], batch: int, column: int) -> str:
    return next(r for r in table if r[0] == str(batch))[column]


def test_the_communication_line_quotes_the_tables_comm_column() -> None:
    trials = [_trial(8, 1000.0, 41.5, 2.6), _trial(512, 8000.0, 26.2, 16.1)]
    result = summarize(trials, capacity_mib=None)
    line = dict(facts(result))["communication"]
    table = rows(result)
    comm = 7  # COLUMNS: batch, global, status, samples/s, per device, step ms, mem MiB, comm %
    first, last = (float(x) for x in re.findall(r"([\d.]+) % at batch", line))
    assert f"{first:.1f}" == _cell(table, 8, comm) and f"{last:.1f}" == _cell(table, 512, comm)
    assert "amortised" in line  # 41.5 -> 26.2 fell, as the table shows
    assert "least-waiting rank 2.6 % -> 16.1 %" in line  # the other figure, named as such


def test_the_communication_verdict_reads_the_exposed_share_when_both_ends_have_it() -> None:
    # the total rises (an all-reduce overlapping a longer backward) while the exposed part falls
    first, last = _trial(8, 1000.0, 41.5, 40.0), _trial(512, 8000.0, 50.0, 48.0)
    first.exposed_comm_pct, last.exposed_comm_pct = 30.0, 5.0
    line = dict(facts(summarize([first, last], capacity_mib=None)))["communication"]
    assert "(exposed 30.0 % -> 5.0 %)" in line
    assert "exposed all-reduce is amortised" in line and "its total rises" in line
    last.exposed_comm_pct = 31.0
    line = dict(facts(summarize([first, last], capacity_mib=None)))["communication"]
    assert line.endswith("exposed communication takes a larger share as the batch grows")


def test_plateau_is_said_only_when_throughput_stopped_rising() -> None:
    for second, word in ((5668.0, "throughput fell"), (8800.0, "a plateau")):
        planner = SweepPlanner(lo=8, hi=1024, capacity_mib=None)
        planner.record(_trial(8, 8710.0, 10.0, 10.0))
        planner.record(_trial(16, second, 10.0, 10.0))
        reason = planner.stop_reason or ""
        assert word in reason, reason
        table = rows(summarize(planner.trials, None, stop_reason=reason))
        shown = [float(x.replace(",", "")) for x in re.findall(r"([\d,]+) -> ([\d,]+)", reason)[0]]
        assert shown == [round(float(_cell(table, b, 3).replace(",", ""))) for b in (8, 16)]


def test_the_sweet_spot_line_and_the_table_mark_the_same_batch() -> None:
    trials = [_trial(8, 1000.0, 10.0, 10.0), _trial(16, 1900.0, 8.0, 8.0)]
    trials.append(_trial(32, 1950.0, 6.0, 6.0))
    result = summarize(trials, capacity_mib=None)
    spot = dict(facts(result))["sweet spot"]
    marked = [r[0] for r in rows(result) if "sweet spot" in r[-1]]
    assert marked == [spot.split(" ")[0]] == [str(result.sweet_spot)]


def _run(strategy: str, world: int, times: list[float], batch: int) -> RunRecord:
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
    for rec in ranks:
        rec.training.ddp_sync_forwards = len(times)
    return RunRecord(strategy=strategy, world_size=world, ranks=ranks, status="complete")


def test_the_compare_verdict_quotes_the_tables_speedup() -> None:
    from mgprof.analyze.run.analysis import analyze_run

    single = _run("single", 1, [10.0, 9.8, 10.1, 10.0, 9.9, 10.2], 8)
    ddp = _run("ddp", 2, [31.0, 30.5, 31.2, 30.8, 31.1, 30.9], 8)
    rows_ = [
        build_row("single", single, dict(analyze_run(single, None)), "s", 8),
        build_row("ddp", ddp, dict(analyze_run(ddp, None)), "d", 8, ab_asked=False),
    ]
    intervals = add_speedups(rows_)
    text = verdict(rows_, False, "weak", intervals=intervals)
    table = {r[0]: r for r in table_cells_for(rows_)}
    reached = re.search(r"reached ([\d.]+)x \(95 % interval ([\d.]+)–([\d.]+)x\)", text)
    assert reached is not None, text
    assert table["ddp"][6] == f"{reached.group(1)}x"
    assert table["ddp"][7] == f"{reached.group(2)}–{reached.group(3)}x"


def table_cells_for(rows_: list) -> list[list[str]]:  # type: ignore[type-arg]
    from mgprof.analyze.compare.scaling import Comparison

    return table_cells(Comparison(rows=rows_))


def test_a_verdict_without_a_single_row_claims_no_speedup() -> None:
    """dp vs ddp alone: the winner has no single-device baseline, so no speedup, and it is not
    told that more devices did not pay off."""
    from mgprof.analyze.run.analysis import analyze_run

    fast = _run("ddp", 2, [10.0, 9.9, 10.1, 10.0, 9.8, 10.2], 8)
    slow = _run("dp", 2, [20.0, 19.8, 20.3, 20.1, 19.9, 20.2], 8)
    rows_ = [
        build_row(name, run, dict(analyze_run(run, None)), name[0], 8, ab_asked=False)
        for name, run in (("ddp", fast), ("dp", slow))
    ]
    intervals = add_speedups(rows_)
    text = verdict(rows_, False, "weak", intervals=intervals)
    assert text.startswith("best: ddp (") and "no single-device baseline, so no speedup" in text
    assert "did not pay off" not in text
    assert all(r.speedup is None for r in rows_)
