"""The statistics behind ``mgprof diff``: checked against brute force and known answers."""

from __future__ import annotations

import itertools
import random

import pytest

from mgprof.analyze.diff.changes import FailSpec, diff_sides, parse_fail_on
from mgprof.analyze.diff.inputs import Component, Side
from mgprof.analyze.diff.stats import bootstrap_ratio, mann_whitney


def _brute_force_p(a: list[float], b: list[float]) -> float:
    """Two-sided permutation p of the rank-sum statistic over every split of the pooled values."""
    pooled = a + b
    n1 = len(a)

    def u(first: tuple[float, ...], second: list[float]) -> float:
        return sum((x > y) + 0.5 * (x == y) for x in first for y in second)

    observed = u(tuple(a), b)
    centre = n1 * len(b) / 2.0
    extreme = total = 0
    for idx in itertools.combinations(range(len(pooled)), n1):
        first = tuple(pooled[i] for i in idx)
        second = [pooled[i] for i in range(len(pooled)) if i not in idx]
        total += 1
        if abs(u(first, second) - centre) >= abs(observed - centre) - 1e-12:
            extreme += 1
    return extreme / total


@pytest.mark.parametrize("seed", range(6))
def test_exact_mann_whitney_matches_permutation(seed: int) -> None:
    rng = random.Random(seed)
    a = [rng.gauss(10, 1) for _ in range(5)]
    b = [rng.gauss(10 + seed * 0.4, 1) for _ in range(6)]
    assert mann_whitney(a, b) == pytest.approx(_brute_force_p(a, b), abs=1e-9)


def test_normal_approximation_with_ties_is_close_to_permutation() -> None:
    a = [1.0, 2.0, 2.0, 3.0, 3.0, 3.0, 4.0, 5.0]
    b = [3.0, 4.0, 4.0, 5.0, 5.0, 6.0, 6.0, 7.0]
    assert mann_whitney(a, b) == pytest.approx(_brute_force_p(a, b), abs=0.02)


def test_mann_whitney_needs_two_values_each() -> None:
    assert mann_whitney([1.0], [1.0, 2.0]) is None
    assert mann_whitney([2.0, 2.0], [2.0, 2.0]) == 1.0


def test_bootstrap_interval_covers_the_true_ratio_and_is_deterministic() -> None:
    rng = random.Random(1)
    base = [rng.gauss(100, 5) for _ in range(40)]
    new = [rng.gauss(110, 5) for _ in range(40)]
    first = bootstrap_ratio(base, new)
    assert first == bootstrap_ratio(base, new)  # seeded: a CI job never flips on its own
    assert first.low < 1.10 < first.high
    assert first.low > 1.0  # a 10 % shift with 5 % noise over 40 steps is not noise
    same = bootstrap_ratio(base, base)
    assert same.ratio == 1.0 and same.low < 1.0 < same.high


def test_parse_fail_on_forms_and_errors() -> None:
    assert parse_fail_on("5%") == FailSpec("5%", "time", 5.0)
    assert parse_fail_on("step_time:7.5%").limit_pct == 7.5
    assert parse_fail_on("throughput:-5%") == FailSpec("throughput:-5%", "throughput", -5.0)
    assert parse_fail_on("throughput:5%").limit_pct == -5.0  # unsigned throughput: a fall
    assert parse_fail_on("memory:10").metric == "peak_memory_mib"
    assert parse_fail_on("comm:+20%").metric == "exposed_comm_ms_per_step"
    for bad in ("fast", "latency:5%", "0%", "5%%", ""):
        with pytest.raises(ValueError, match="--fail-on"):
            parse_fail_on(bad)


def _side(label: str, steps: list[float], comps: dict[str, float], **figures: float) -> Side:
    return Side(
        path=label,
        kind="run",
        label=label,
        step_ms=steps,
        step_indices=list(range(len(steps))),
        step_batch=[64] * len(steps),
        global_batch=64,
        facts={"world size": "2", "strategy": "ddp", "global batch": "64"},
        figures=dict(figures),
        components=[Component("region", k, v) for k, v in comps.items()],
    )


def test_attribution_names_the_component_that_moved() -> None:
    rng = random.Random(3)
    base_steps = [10 + rng.random() for _ in range(20)]
    base = _side("a", base_steps, {"forward": 3.0, "backward": 6.0, "load": 0.5})
    new = _side("b", [s + 4.0 for s in base_steps], {"forward": 3.1, "backward": 6.0, "load": 4.4})
    diff = diff_sides(base, new, [parse_fail_on("5%")])
    assert diff["metrics"]["time"]["significant"] is True
    assert diff["change"] == "slower"
    assert [r["name"] for r in diff["attribution"]] == ["region load"]
    assert "mostly region `load` (+3.90 ms/step, 97 % of the change)" in diff["headline"]
    # the parts add up to the change: the regions that moved and the rest
    assert sum(r["delta_ms"] for r in diff["parts"]) == pytest.approx(4.0)
    assert diff["verdict"] == "fail" and diff["exit_code"] == 1


def test_mostly_only_when_one_part_is_more_than_half() -> None:
    rng = random.Random(4)
    base_steps = [10 + rng.random() for _ in range(20)]
    base = _side("a", base_steps, {"forward": 3.0, "backward": 6.0, "load": 0.5})
    new = _side("b", [s + 4.0 for s in base_steps], {"forward": 4.6, "backward": 7.4, "load": 1.7})
    diff = diff_sides(base, new)
    assert "mostly" not in diff["headline"]
    assert (
        "the largest part: region `forward` (+1.60 ms/step, 40 % of the change)" in diff["headline"]
    )


def test_the_p_value_and_significance_agree_by_construction() -> None:
    rng = random.Random(5)
    for shift in (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0):
        base_steps = [10 + rng.gauss(0, 1) for _ in range(12)]
        new_steps = [10 + shift * 10 + rng.gauss(0, 1) for _ in range(12)]
        m = diff_sides(_side("a", base_steps, {}), _side("b", new_steps, {}))["metrics"]["time"]
        low, high = m["ci_pct"]
        assert m["significant"] == (m["p_value"] <= 0.05) == (low > 0 or high < 0), shift


def test_within_limit_or_not_significant_passes() -> None:
    base = _side("a", [10.0, 12.0, 9.0, 11.0, 13.0, 8.0], {})
    noisy = _side("b", [10.5, 12.5, 9.5, 11.0, 13.0, 8.5], {})
    diff = diff_sides(base, noisy, [parse_fail_on("2%")])
    assert diff["metrics"]["time"]["significant"] is False
    check = diff["fail_on"][0]
    assert not check["failed"] and "not significant" in check["reason"]
    assert diff["exit_code"] == 0


def test_figures_without_interval_fail_on_the_value_and_missing_ones_fail_closed() -> None:
    base = _side("a", [10.0] * 5, {}, peak_memory_mib=1000.0)
    new = _side("b", [10.0] * 5, {}, peak_memory_mib=1200.0)
    diff = diff_sides(base, new, [parse_fail_on("memory:10%"), parse_fail_on("comm:5%")])
    memory, comm = diff["fail_on"]
    assert memory["failed"] and memory["change_pct"] == pytest.approx(20.0)
    assert comm["failed"] and comm["reason"].startswith("cannot check")
    assert diff["exit_code"] == 1


def test_a_changed_batch_compares_per_sample() -> None:
    base = _side("a", [10.0, 10.2, 9.8, 10.1], {})
    new = _side("b", [19.0, 19.4, 18.6, 19.2], {})
    new.step_batch = [128] * 4
    new.global_batch = 128
    new.facts["global batch"] = "128"
    diff = diff_sides(base, new)
    assert diff["basis"] == "sample"
    assert diff["metrics"]["time"]["label"] == "time per sample"
    assert diff["metrics"]["time"]["change_pct"] == pytest.approx(-5.0, abs=0.5)
    assert diff["metrics"]["throughput"]["change_pct"] == pytest.approx(5.3, abs=0.5)
    assert any(d["field"] == "global batch" for d in diff["differences"])
    assert diff["comparable"]  # a batch change is what per-sample figures are for


def test_setup_differences_make_the_runs_not_comparable() -> None:
    base = _side("a", [10.0] * 4, {})
    new = _side("b", [10.0] * 4, {})
    new.facts["world size"] = "4"
    diff = diff_sides(base, new)
    assert not diff["comparable"]
    (d,) = diff["differences"]
    assert d["kind"] == "setup" and d["base"] == "2" and d["new"] == "4"
