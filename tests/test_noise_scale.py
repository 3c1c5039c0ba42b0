"""The gradient noise scale: estimators with exact inputs, real DDP over gloo on a problem whose
B_simple is known in closed form, bit-identical training with the hook, the report and the sweep.

The synthetic problem (``scripts/linreg_noise.py``): linear regression with Gaussian inputs and
noise, where B_simple = ((d + 1)|δ|² + dσ²)/|δ|² at w = w* + δ (the script derives it). With
lr = 0 the weights stay at w* + δ, so every step samples the same known value.
"""

from __future__ import annotations

import io
import json
import math
import random
from pathlib import Path
from typing import Any

import msgspec
import pytest
from _spawn import clean_env, python_args, run, run_dirs, torchrun_args
from rich.console import Console

from mgprof.analyze.run.noise_scale import (
    NoiseSweepResult,
    StepNoise,
    estimate_pair,
    noise_scale_analysis,
    summarize_steps,
    sweep_noise_scale,
)
from mgprof.analyze.run.schema import RunAnalysis, decode_analysis
from mgprof.analyze.sweep.result import Trial, summarize
from mgprof.collect.noise_scale import ONE_RANK_REASON
from mgprof.records import (
    NoiseScaleRecord,
    RankRecord,
    RunRecord,
    StepRecord,
    decode_run,
    encode_run,
    read_run,
)
from mgprof.report.html.charts import chart_figures
from mgprof.report.run.markdown import run_to_markdown
from mgprof.report.run.noise_scale import noise_scale_section
from mgprof.report.run.sections import build_sections
from mgprof.report.sweep_view import render_sweep, sweep_to_markdown
from mgprof.studies.sweep import read_sweep, write_sweep

SCRIPT = Path(__file__).parent / "scripts" / "linreg_noise.py"


# -- estimators with exact inputs ---------------------------------------------------------------


def _expected(g2: float, trace: float, b: float) -> float:
    """E|G_b|² = |G|² + tr(Σ)/b: what a batch of b samples' squared gradient norm averages to."""
    return g2 + trace / b


def test_estimators_invert_the_expected_norms_exactly() -> None:
    g2, trace = 0.7, 12.0
    pair = estimate_pair(_expected(g2, trace, 8), _expected(g2, trace, 32), 8, 32)
    assert pair == pytest.approx((g2, trace), rel=1e-12)
    assert estimate_pair(1.0, 0.5, 8, 8) is None  # equal sizes tell nothing
    assert estimate_pair(1.0, 0.5, 0, 8) is None
    assert estimate_pair(math.inf, 0.5, 4, 8) is None


def _steps(pairs: list[tuple[float, float]], b: float = 8.0, big: float = 16.0) -> list[StepNoise]:
    return [StepNoise(i, g, t, b, big, big) for i, (g, t) in enumerate(pairs)]


def test_window_is_the_ratio_of_the_means_not_the_mean_of_ratios() -> None:
    # per-step ratios 2 and 100; the paper smooths numerator and denominator apart: 102/11
    est = summarize_steps(_steps([(10.0, 20.0), (1.0, 100.0), (10.0, 20.0), (1.0, 100.0)]))
    assert est.b_simple == pytest.approx(240.0 / 22.0)
    assert est.steps == 4 and (est.first_step, est.last_step) == (0, 3)
    assert est.band_low is not None and est.band_high is not None
    assert est.band_low <= est.b_simple <= est.band_high


def test_constant_steps_give_a_point_band_and_too_few_steps_give_a_reason() -> None:
    est = summarize_steps(_steps([(2.0, 50.0)] * 30))
    assert est.b_simple == est.band_low == est.band_high == pytest.approx(25.0)
    assert est.first_half == est.second_half == pytest.approx(25.0)
    assert est.latest_b_simple == pytest.approx(25.0)
    few = summarize_steps(_steps([(2.0, 50.0)] * 2))
    assert few.b_simple is None and few.reason and "at least 3" in few.reason


def test_noise_swamping_the_signal_is_said_not_divided() -> None:
    est = summarize_steps(_steps([(-1.0, 40.0), (0.5, 40.0), (-0.2, 40.0), (0.1, 40.0)]))
    assert est.b_simple is None
    assert est.reason and "not positive" in est.reason
    assert est.band_unbounded and est.band_high is None


def test_band_covers_the_truth_in_a_monte_carlo_of_the_estimators() -> None:
    """Per-example gradients g = x(x·δ − ε) of the linear-regression problem, drawn in pure
    Python: the window's estimate over 400 steps lies within its band of the analytic value."""
    rng = random.Random(7)
    d, sigma, ranks, b = 6, 1.0, 2, 4
    delta = [1.0 / math.sqrt(d)] * d  # |δ|² = 1
    truth = (d + 1) * 1.0 + d * sigma**2
    steps = []
    for i in range(400):
        grads = []
        for _ in range(ranks):
            acc = [0.0] * d
            for _ in range(b):
                x = [rng.gauss(0, 1) for _ in range(d)]
                err = sum(xi * di for xi, di in zip(x, delta)) - rng.gauss(0, sigma)
                acc = [a + xi * err / b for a, xi in zip(acc, x)]
            grads.append(acc)
        small = sum(sum(v * v for v in g) for g in grads) / ranks
        avg = [sum(g[j] for g in grads) / ranks for j in range(d)]
        big = sum(v * v for v in avg)
        pair = estimate_pair(small, big, b, ranks * b)
        assert pair is not None
        steps.append(StepNoise(i, pair[0], pair[1], b, ranks * b, ranks * b))
    est = summarize_steps(steps)
    assert est.band_low is not None and est.band_high is not None
    assert est.band_low <= truth <= est.band_high, (est.band_low, truth, est.band_high)


def _rank(rank: int, rec: NoiseScaleRecord | None, batch: int | None = None) -> RankRecord:
    steps = [StepRecord(index=i, duration_ms=1.0, batch_size=batch) for i in range(5)]
    return RankRecord(rank=rank, world_size=2, strategy="ddp", steps=steps, noise_scale=rec)


def _ddp_record(local: list[float], avg: list[float], batch: list[int | None]) -> NoiseScaleRecord:
    n = len(local)
    return NoiseScaleRecord(
        source="ddp", group_size=2, index=list(range(n)), local_sq=local, avg_sq=avg,
        batch_size=batch, micro_batches=[1] * n,
    )  # fmt: skip


def test_unequal_rank_batches_use_their_harmonic_mean() -> None:
    g2, trace, steps = 0.5, 30.0, 5
    b0, b1 = 4, 12
    harmonic = 2 / (1 / b0 + 1 / b1)  # DDP averages the ranks with equal weight
    avg = _expected(g2, trace, 2 * harmonic)
    run = RunRecord(
        world_size=2,
        ranks=[
            _rank(0, _ddp_record([_expected(g2, trace, b0)] * steps, [avg] * steps, [b0] * steps)),
            _rank(1, _ddp_record([_expected(g2, trace, b1)] * steps, [avg] * steps, [b1] * steps)),
        ],
    )
    out = noise_scale_analysis(run)
    assert out["measured"] and out["source"] == "ddp" and out["ranks"] == 2
    assert out["b_simple"] == pytest.approx(trace / g2)
    assert out["global_batch"] == pytest.approx(b0 + b1)


def test_sum_reduced_loss_gives_the_same_b_simple() -> None:
    """A sum over b samples is b times the mean: every norm gains b², the ratio does not."""
    g2, trace, b, steps = 0.5, 30.0, 8, 4
    local, avg = _expected(g2, trace, b), _expected(g2, trace, 2 * b)

    def analysed(scale: float) -> dict[str, Any]:
        rec = _ddp_record([scale * local] * steps, [scale * avg] * steps, [b] * steps)
        return noise_scale_analysis(RunRecord(world_size=2, ranks=[_rank(0, rec), _rank(1, rec)]))

    assert analysed(b * b)["b_simple"] == pytest.approx(analysed(1.0)["b_simple"])
    assert analysed(b * b)["g2_mean"] == pytest.approx(b * b * g2)


def test_missing_batch_falls_back_to_the_step_record_or_is_dropped() -> None:
    g2, trace = 1.0, 8.0
    rec = _ddp_record([_expected(g2, trace, 8)] * 5, [_expected(g2, trace, 16)] * 5, [None] * 5)
    with_steps = RunRecord(world_size=2, ranks=[_rank(0, rec, batch=8), _rank(1, rec, batch=8)])
    assert noise_scale_analysis(with_steps)["b_simple"] == pytest.approx(8.0)
    blind = noise_scale_analysis(RunRecord(world_size=2, ranks=[_rank(0, rec), _rank(1, rec)]))
    assert blind["steps"] == 0 and blind["b_simple"] is None
    assert any("batch size unknown" in k for k in blind["dropped"])


def test_old_run_json_loads_and_says_why_there_is_no_figure() -> None:
    rank = _rank(0, None)
    raw = msgspec.json.decode(encode_run(RunRecord(ranks=[rank])))
    del raw["ranks"][0]["noise_scale"]  # a run.json written before the field existed
    old = decode_run(msgspec.json.encode(raw))
    assert old.ranks[0].noise_scale is None
    out = noise_scale_analysis(old)
    assert out["measured"] is False and "no gradient norms recorded" in out["reason"]
    rec = _ddp_record([3.0, 4.0], [2.0, 2.5], [8, 8])
    again = decode_run(encode_run(RunRecord(ranks=[_rank(0, rec)])))
    assert again.ranks[0].noise_scale == rec


# -- the report section -------------------------------------------------------------------------


def test_section_measured_names_band_window_batch_and_caveats() -> None:
    g2, trace, b = 1.0, 510.0, 2048  # global batch 4096 = 8x B_simple
    local, avg = _expected(g2, trace, b), _expected(g2, trace, 2 * b)
    rec = _ddp_record([local] * 5, [avg] * 5, [b] * 5)
    run = RunRecord(world_size=2, strategy="ddp", ranks=[_rank(0, rec), _rank(1, rec)])
    figures = noise_scale_analysis(run)
    analysis = decode_analysis({"noise_scale": figures})
    # the measured block decodes and encodes back to the same JSON (key order included)
    assert json.dumps(msgspec.to_builtins(analysis.noise_scale)) == json.dumps(figures)
    sec = noise_scale_section(analysis)
    assert sec is not None and sec.brief is None
    facts = dict(sec.facts)
    assert facts["B_simple"].startswith("510 (95 % band 510–510)")
    assert "5 steps (steps 0–4)" in facts["measured over"]
    assert "b = 2,048 per rank, B = 4,096" in facts["measured over"]
    assert facts["global batch"].startswith("global batch 4,096 is 8.0x B_simple ≈ 510")
    assert "~1/9 of the progress it buys in a small batch" in facts["global batch"]
    assert "will mostly add cost" in facts["global batch"]
    notes = " ".join(sec.notes)
    assert "changes during training" in notes and "Adam" in notes and "B_crit" in notes
    md = run_to_markdown(run, analysis)
    assert "## Gradient noise scale" in md and "is 8.0x B\\_simple ≈ 510" in md


def test_section_not_measured_is_one_line_and_absent_for_old_analyses() -> None:
    run = RunRecord(ranks=[_rank(0, NoiseScaleRecord(reason=ONE_RANK_REASON))])
    figures = noise_scale_analysis(run)
    analysis = decode_analysis({"noise_scale": figures})
    assert json.dumps(msgspec.to_builtins(analysis.noise_scale)) == json.dumps(figures)
    sec = noise_scale_section(analysis)
    assert sec is not None and sec.brief == f"n/a: {ONE_RANK_REASON}"
    assert noise_scale_section(RunAnalysis()) is None
    titles = [s.title for s in build_sections(run, RunAnalysis())]
    assert "Gradient noise scale" not in titles


# -- the sweep ------------------------------------------------------------------------------------


def _trial(batch: int, rate: float) -> Trial:
    return Trial(
        batch_size=batch, status="ok", world_size=2, global_batch=2 * batch,
        samples_per_s=rate, step_time_ms=1000.0 * 2 * batch / rate,
    )  # fmt: skip


def _pooled(b_simple: float, n: int = 40) -> list[StepNoise]:
    return [StepNoise(i, 1.0, b_simple, 8.0, 16.0, 16.0) for i in range(n)]


def _sweep(rates: dict[int, float], b_simple: float) -> NoiseSweepResult:
    base = summarize([_trial(b, r) for b, r in rates.items()], None)
    per_trial = {b: (_pooled(b_simple), None) for b in rates}
    out = NoiseSweepResult(**msgspec.structs.asdict(base))
    out.noise_scale = sweep_noise_scale(base, per_trial)
    return out


def test_sweep_prefers_a_smaller_batch_when_the_knee_is_far_past_b_simple() -> None:
    # throughput still rises 10 % per doubling up to 512 (the knee at 95 %), B_simple = 32
    rates = {64: 1000.0, 128: 1400.0, 256: 1700.0, 512: 1790.0}
    result = _sweep(rates, 32.0)
    ns = result.noise_scale
    assert ns is not None and ns.estimate is not None
    assert result.sweet_spot == 512 and ns.knee_batch == 512 and ns.knee_global_batch == 1024
    # time to a given loss ∝ (G + B_simple) / rate: 64 -> 0.160, 512 -> 0.590
    assert ns.recommended_batch == 64
    expected = (1024 + 32) / 1790 / ((128 + 32) / 1000)
    assert ns.time_to_target["512"] == pytest.approx(expected, abs=1e-4)
    assert ns.knee_time_pct == pytest.approx(100 * (expected - 1))
    assert ns.recommendation and "rather than the hardware sweet spot 512" in ns.recommendation


def test_sweep_keeps_the_knee_when_b_simple_is_above_it() -> None:
    rates = {64: 1000.0, 128: 1900.0, 256: 2000.0}  # 128 reaches 95 % of the best: the knee
    ns = _sweep(rates, 4096.0).noise_scale
    assert ns is not None and ns.recommended_batch == ns.knee_batch == 128
    assert ns.recommendation and "also the least time" in ns.recommendation


def test_sweep_with_no_gradient_noise_recommends_nothing() -> None:
    """Every rank on the same batches: B_simple is 0 (once a ZeroDivisionError in the text)."""
    ns = _sweep({64: 1000.0, 128: 1400.0}, 0.0).noise_scale
    assert ns is not None and ns.estimate is not None and ns.estimate.b_simple == 0
    assert ns.recommended_batch is None and ns.recommendation is None
    assert ns.reason is not None and "B_simple is 0" in ns.reason


def test_sweep_json_round_trip_render_and_old_sweep_json(tmp_path: Path) -> None:
    result = _sweep({64: 1000.0, 128: 1400.0, 256: 1700.0, 512: 1790.0}, 32.0)
    write_sweep(tmp_path, result)
    back = read_sweep(tmp_path)
    assert back.noise_scale == result.noise_scale
    buf = io.StringIO()
    render_sweep(back, Console(file=buf, width=200))
    text = buf.getvalue()
    assert "B_simple ≈ 32" in text and "knee vs B_simple" in text
    assert "recommended" in text  # the verdict column marks the recommended batch
    assert "B_simple" in sweep_to_markdown(back)
    raw = json.loads((tmp_path / "sweep.json").read_text())
    del raw["noise_scale"]
    (tmp_path / "sweep.json").write_text(json.dumps(raw))
    old = read_sweep(tmp_path)
    assert old.noise_scale is None
    buf = io.StringIO()
    render_sweep(old, Console(file=buf, width=200))
    assert "B_simple" not in buf.getvalue()


def test_sweep_chart_puts_b_simple_and_the_knee_on_one_chart() -> None:
    result = _sweep({64: 1000.0, 128: 1400.0, 256: 1700.0, 512: 1790.0}, 256.0)
    sweep = msgspec.to_builtins(result)
    charts = chart_figures(RunRecord(), decode_analysis({"sweep": sweep}))
    names = [t.get("name", "") for t in charts["chart-sweep"]["data"]]
    line = next(t for t in charts["chart-sweep"]["data"] if str(t["name"]).startswith("B_simple ≈"))
    assert line["x"] == [128.0, 128.0]  # global 256 on 2 devices: 128 per device
    assert "hardware knee (sweet spot)" in names and "recommended (knee and B_simple)" in names


def test_sweep_without_norms_says_why() -> None:
    base = summarize([_trial(64, 1000.0)], None)
    ns = sweep_noise_scale(base, {64: ([], ONE_RANK_REASON)})
    assert ns.estimate is None and ns.reason == ONE_RANK_REASON


# -- real runs: DDP over gloo, one process with accumulation --------------------------------------


def _torchrun(tmp: Path, nproc: int, *args: str, env: dict[str, str] | None = None) -> Path:
    out = tmp / f"out{nproc}-{len(list(tmp.iterdir()))}"
    out.mkdir()
    res = run(
        torchrun_args(SCRIPT, "--out", str(out), *args, nproc=nproc),
        cwd=tmp,
        env=env or clean_env(MGPROF_NOISE_SCALE="1"),
        timeout_s=300,
    )
    assert res.returncode == 0, res.explain()
    return out


def _analysed(out: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    (run_dir,) = run_dirs(out, "linreg")
    result = json.loads((out / "result0.json").read_text())
    return noise_scale_analysis(read_run(run_dir)), result


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [2, 4])
def test_ddp_estimate_converges_to_the_analytic_value(tmp_path: Path, ranks: int) -> None:
    out = _torchrun(tmp_path, ranks, "--steps", "200", "--bucket-cap-mb", "0.00001")
    ns, result = _analysed(out)
    analytic = result["analytic"]  # 17 for d = 8, |δ|² = 1, σ = 1
    assert ns["measured"] and ns["source"] == "ddp" and ns["ranks"] == ranks
    assert ns["steps"] == 200 and ns["dropped"] == {}
    assert (ns["b_small"], ns["b_big"]) == (8.0, 8.0 * ranks)
    assert ns["band_low"] <= analytic <= ns["band_high"], ns
    assert ns["band_high"] - ns["band_low"] < analytic  # a band that says something
    # the in-loop figure (this rank only, last ~20 updates) is the same quantity, noisier
    assert result["api"] is not None and analytic / 2 < result["api"] < analytic * 2


@pytest.mark.slow
def test_recording_leaves_training_bit_identical(tmp_path: Path) -> None:
    """3 ranks (1/3 is not exact in binary), several buckets, lr > 0: the parameters after 30
    steps are the same bits with mgprof's hook at every sync (``--noise-scale``), with the
    default sampled norms (DDP's own reducer, read on one sync in 16) and with the norms off
    (DDP's built-in averaging, mgprof installs nothing)."""
    args = ["--steps", "30", "--lr", "0.05", "--dim", "64", "--bucket-cap-mb", "0.0001"]
    with_hook = _torchrun(tmp_path, 3, *args)
    sampled_out = _torchrun(tmp_path, 3, *args, env=clean_env())  # the default
    without = _torchrun(tmp_path, 3, *args, env=clean_env(MGPROF_NOISE_SCALE="0"))
    ns, result = _analysed(with_hook)
    sampled, _ = _analysed(sampled_out)
    off, reference = _analysed(without)
    assert ns["measured"] and ns["steps"] == 30
    assert off["measured"] is False and "turned off" in off["reason"]
    assert sampled["measured"] and 1 <= sampled["steps"] <= 2  # syncs 0 and 16 of 30
    (run_dir,) = run_dirs(sampled_out, "linreg")
    assert {r.noise_scale.every for r in read_run(run_dir).ranks if r.noise_scale} == {16}
    for rank in range(3):
        a = json.loads((with_hook / f"result{rank}.json").read_text())["params"]
        b = json.loads((without / f"result{rank}.json").read_text())["params"]
        c = json.loads((sampled_out / f"result{rank}.json").read_text())["params"]
        assert a == b == c and a == reference["params"]
    assert result["params"] == reference["params"]


@pytest.mark.slow
def test_scripts_own_comm_hook_and_bucket_views_are_not_measured(tmp_path: Path) -> None:
    own = _torchrun(tmp_path, 2, "--steps", "4", "--own-hook")
    ns, _ = _analysed(own)
    assert ns["measured"] is False and "its own DDP comm hook (allreduce_hook)" in ns["reason"]
    views = _torchrun(tmp_path, 3, "--steps", "4", "--bucket-views")
    ns, _ = _analysed(views)
    assert ns["measured"] is False and "gradient_as_bucket_view=True on 3 ranks" in ns["reason"]


def _single(tmp: Path, *args: str) -> tuple[dict[str, Any], dict[str, Any], Path]:
    out = tmp / f"single-{len(list(tmp.iterdir()))}"
    out.mkdir()
    env = clean_env(MGPROF_NOISE_SCALE="1")
    res = run(python_args(SCRIPT, "--out", str(out), *args), cwd=tmp, env=env)
    assert res.returncode == 0, res.explain()
    ns, result = _analysed(out)
    return ns, result, out


@pytest.mark.slow
def test_one_process_uses_its_accumulation_micro_batches(tmp_path: Path) -> None:
    ns, result, out = _single(tmp_path, "--steps", "200", "--accum", "4")
    assert ns["measured"] and ns["source"] == "accumulation"
    assert (ns["b_small"], ns["b_big"]) == (8.0, 32.0)
    assert ns["steps"] == 199  # the first update names the optimizer's parameters
    assert ns["band_low"] <= result["analytic"] <= ns["band_high"], ns
    (run_dir,) = run_dirs(out, "linreg")
    report = (run_dir / "report.md").read_text()  # the session's own report, written at exit
    assert "Gradient noise scale" in report and "first micro-batch" in report


@pytest.mark.slow
def test_one_process_without_accumulation_says_what_it_needs(tmp_path: Path) -> None:
    ns, result, _ = _single(tmp_path, "--steps", "6")
    assert ns["measured"] is False and ns["reason"] == ONE_RANK_REASON
    assert result["api"] is None


def test_env_knob_names_are_documented() -> None:
    from mgprof.collect.envknobs import NOISE_SCALE_ENV

    doc = (Path(__file__).parents[1] / "docs" / "noise-scale.md").read_text()
    assert NOISE_SCALE_ENV in doc and "mgprof.noise_scale()" in doc


@pytest.mark.slow
def test_the_noise_scale_flag_turns_it_on_from_the_cli(tmp_path: Path) -> None:
    """``mgprof analyze --noise-scale`` on an unmodified DDP script: every step's norms on both
    ranks, and a B_simple with its band in run.json; without the flag, the report says how."""
    script = Path(__file__).parent / "scripts" / "diff_target.py"
    env = clean_env()
    env.pop("MGPROF_NOISE_SCALE", None)
    on = run(
        python_args("-m", "mgprof", "analyze", script, "--gpus", "2", "--quiet", "--noise-scale",
                    "--out", tmp_path / "on", "--", "--steps", "12"),
        cwd=tmp_path, env=env,
    )  # fmt: skip
    assert on.returncode == 0, on.explain()
    (run_dir,) = (tmp_path / "on").iterdir()
    data = json.loads((run_dir / "run.json").read_text())
    assert [len(r["noise_scale"]["local_sq"]) for r in data["ranks"]] == [12, 12]
    figure = data["analysis"]["noise_scale"]
    assert figure["measured"] and figure["b_simple"] is not None
    assert figure["band_low"] <= figure["b_simple"] <= figure["band_high"]
    off = run(
        python_args("-m", "mgprof", "analyze", script, "--gpus", "2", "--out", tmp_path / "off",
                    "--no-noise-scale", "--", "--steps", "4"),
        cwd=tmp_path, env=env,
    )  # fmt: skip
    assert off.returncode == 0, off.explain()
    assert "turned off (--no-noise-scale" in " ".join(off.stdout.split())
    default = run(
        python_args("-m", "mgprof", "analyze", script, "--gpus", "2", "--quiet",
                    "--out", tmp_path / "default", "--", "--steps", "40"),
        cwd=tmp_path, env=env,
    )  # fmt: skip
    assert default.returncode == 0, default.explain()
    (run_dir,) = (tmp_path / "default").iterdir()
    ranks = json.loads((run_dir / "run.json").read_text())["ranks"]
    assert {r["noise_scale"]["every"] for r in ranks} == {16}
    assert all(1 <= len(r["noise_scale"]["local_sq"]) <= 3 for r in ranks)
