"""The pure batch-size search: planner, memory model, summary, OOM classifier (no torch)."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from mgprof.analyze.sweep.result import (
    SweepPlanner,
    Trial,
    fit_memory,
    is_oom_error,
    max_trials,
    summarize,
)
from mgprof.report.sweep_view import render_sweep, sweep_to_markdown

DATA = Path(__file__).parent / "data" / "gpu"


class Curve:
    """A synthetic job: memory a + b*x (OOM above capacity), saturating throughput."""

    def __init__(self, a: float, b: float, capacity: float, peak: float, half: float) -> None:
        self.a, self.b, self.capacity, self.peak, self.half = a, b, capacity, peak, half

    def memory(self, x: int) -> float:
        return self.a + self.b * x

    def trial(self, x: int) -> Trial:
        if self.memory(x) > self.capacity:
            return Trial(batch_size=x, status="oom", error="CUDA out of memory. Tried to allocate")
        rate = self.peak * x / (x + self.half)
        return Trial(
            batch_size=x,
            status="ok",
            samples_per_s=rate,
            peak_memory_mib=self.memory(x),
            global_batch=x,
            comm_pct=100.0 * self.half / (x + self.half),
        )


def drive(planner: SweepPlanner, curve: Curve) -> list[Trial]:
    while (x := planner.next_size()) is not None:
        planner.record(curve.trial(x))
    return planner.trials


def test_classifier_on_the_real_h200_message() -> None:
    oom = json.loads((DATA / "oom.json").read_text())
    assert is_oom_error(f"{oom['type']}: {oom['message']}")
    assert is_oom_error(oom["message"])  # the message alone, as rank errors may lose the type
    cpu = (
        "RuntimeError: [enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: "
        "can't allocate memory: you tried to allocate 16777216 bytes. Error code 12 "
        "(Cannot allocate memory)"
    )
    assert is_oom_error(cpu)
    assert is_oom_error("MemoryError")
    assert not is_oom_error("RuntimeError: Connection closed by peer [127.0.0.1]:1234")
    assert not is_oom_error(None)
    assert not is_oom_error("")


def test_memory_model_is_least_squares() -> None:
    trials = [
        Trial(batch_size=x, status="ok", peak_memory_mib=100.0 + 2.0 * x) for x in (8, 16, 64)
    ]
    model = fit_memory([*trials, Trial(batch_size=128, status="oom")])
    assert model is not None
    assert model.intercept_mib == pytest.approx(100.0)
    assert model.slope_mib_per_sample == pytest.approx(2.0)
    assert model.max_batch(300.0) == 100
    assert fit_memory(trials[:1]) is None


def test_grows_then_bisects_to_the_boundary() -> None:
    curve = Curve(a=1000.0, b=10.0, capacity=80_000.0, peak=1e9, half=1e6)  # never plateaus
    planner = SweepPlanner(8, 65536, capacity_mib=80_000.0, margin=0.0, resolution=0.1)
    trials = drive(planner, curve)
    ran = [t.batch_size for t in trials]
    assert ran[:4] == [8, 16, 32, 64]
    true_max = math.floor((80_000 - 1000) / 10.0)  # 7900
    result = summarize(trials, 80_000.0, 0.0, stop_reason=planner.stop_reason)
    assert result.largest_fit is not None
    assert result.largest_fit <= true_max
    assert true_max - result.largest_fit <= max(8, 0.1 * result.largest_fit)


def test_skips_sizes_predicted_not_to_fit() -> None:
    curve = Curve(a=500.0, b=4.0, capacity=10_000.0, peak=1e9, half=1e6)
    planner = SweepPlanner(64, 8192, capacity_mib=10_000.0, margin=0.1)
    trials = drive(planner, curve)
    skipped = [t for t in trials if t.status == "skipped"]
    assert skipped, "the memory model should have ruled out a size without running it"
    for t in skipped:
        assert t.predicted_memory_mib is not None and t.predicted_memory_mib > 9000.0
    assert not any(t.status == "oom" for t in trials)  # every doomed size was predicted
    result = summarize(trials, 10_000.0, 0.1)
    assert result.predicted_max_batch == math.floor((9000 - 500) / 4.0)


def test_plateau_stops_growth_and_sweet_spot_is_95_pct() -> None:
    curve = Curve(a=0.0, b=1.0, capacity=1e12, peak=1000.0, half=16.0)
    planner = SweepPlanner(8, 1 << 20, capacity_mib=1e12)
    trials = drive(planner, curve)
    assert planner.stop_reason and "plateau" in planner.stop_reason
    result = summarize(trials, 1e12, 0.1)
    rates = {t.batch_size: t.samples_per_s or 0.0 for t in trials}
    peak = max(rates.values())
    assert result.throughput_optimal == max(rates, key=lambda b: rates[b])
    assert result.sweet_spot == min(b for b, r in rates.items() if r >= 0.95 * peak)
    assert result.comm_trend and "amortised" in result.comm_trend


def test_list_mode_skips_sizes_above_an_oom() -> None:
    curve = Curve(a=0.0, b=1.0, capacity=100.0, peak=1e9, half=1.0)
    planner = SweepPlanner(batch_sizes=[256, 8, 32, 128, 512])
    trials = drive(planner, curve)
    assert [t.batch_size for t in trials] == [8, 32, 128]
    assert trials[-1].status == "oom"


def test_failed_trial_ends_the_sweep() -> None:
    planner = SweepPlanner(8, 64)
    assert planner.next_size() == 8
    planner.record(Trial(batch_size=8, status="failed", error="NameError: x"))
    assert planner.next_size() is None
    assert planner.stop_reason and "NameError" in planner.stop_reason


@pytest.mark.parametrize(
    ("lo", "hi", "sizes", "margin"),
    [(64, 8, None, 0.1), (0, 8, None, 0.1), (8, 64, [0], 0.1), (8, 64, None, 1.0)],
)
def test_bad_arguments(lo: int, hi: int, sizes: list[int] | None, margin: float) -> None:
    with pytest.raises(ValueError):
        SweepPlanner(lo, hi, batch_sizes=sizes, margin=margin)


@settings(max_examples=200, deadline=None)
@given(
    lo_exp=st.integers(0, 6),
    span_exp=st.integers(1, 14),
    a=st.floats(0.0, 5000.0),
    b=st.floats(0.01, 50.0),
    capacity=st.floats(100.0, 200_000.0),
    half=st.floats(0.5, 5000.0),
    resolution=st.sampled_from([0.05, 0.1, 0.25, 0.5]),
    margin=st.sampled_from([0.0, 0.1, 0.2]),
    until_oom=st.booleans(),
)
def test_trials_logarithmic_and_boundary_within_resolution(
    lo_exp: int,
    span_exp: int,
    a: float,
    b: float,
    capacity: float,
    half: float,
    resolution: float,
    margin: float,
    until_oom: bool,
) -> None:
    lo = 2**lo_exp
    hi = lo * 2**span_exp
    curve = Curve(a=a, b=b, capacity=capacity, peak=1e6, half=half)
    planner = SweepPlanner(
        lo,
        hi,
        capacity_mib=capacity,
        margin=margin,
        resolution=resolution,
        stop_on_plateau=not until_oom,
    )
    trials = drive(planner, curve)
    ran = [t for t in trials if t.status != "skipped"]
    assert len(ran) <= max_trials(lo, hi, resolution)
    assert len(trials) <= max_trials(lo, hi, resolution) + 2
    assert len({t.batch_size for t in trials}) == len(trials), "a size was tried twice"
    assert all(lo <= t.batch_size <= hi for t in trials)
    limit = (1 - margin) * capacity
    result = summarize(trials, capacity, margin)
    true_max = math.floor((limit - a) / b)  # largest size within the margin
    if result.largest_fit is not None:
        assert curve.memory(result.largest_fit) <= limit
    if planner.bad is not None and planner.good is not None:
        # a boundary was found: it brackets the truth within the resolution
        assert planner.good <= true_max < planner.bad
        assert planner.bad - planner.good <= max(8, resolution * planner.good)
    elif planner.good is None:
        assert true_max < lo  # nothing fits
    elif until_oom:
        assert planner.good == hi  # grew to the top without meeting the boundary


def test_rendering_term_and_markdown() -> None:
    curve = Curve(a=100.0, b=2.0, capacity=1000.0, peak=5000.0, half=32.0)
    planner = SweepPlanner(8, 1024, capacity_mib=1000.0, stop_on_plateau=False)
    trials = drive(planner, curve)
    result = summarize(trials, 1000.0, 0.1, stop_reason=planner.stop_reason)
    result.script = "[bold]train.py"
    buf = io.StringIO()
    render_sweep(result, Console(file=buf, width=120))
    text = buf.getvalue()
    assert "[bold]train.py" in text
    assert "sweet spot" in text and "largest fit" in text
    assert "A larger batch changes optimisation" in text
    md = sweep_to_markdown(result)
    assert md.count("\n| ") >= len(trials) + 1
    assert "lr x" in md
