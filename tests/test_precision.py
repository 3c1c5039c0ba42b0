"""``--precision``: precision rows in ``mgprof compare`` and ``--precision`` on ``analyze``.

Real 2-rank gloo runs of unmodified scripts: a DataLoader-driven CNN tutorial, the AMP tutorial
(its own autocast and GradScaler), and a model whose activations overflow float16. What the
rows claim is checked against the traces themselves (the GEMM ops' ``Input type``), and the
loss check against known outcomes (bf16 tracks fp32; fp16 on the overflowing model is inf).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from mgprof.analyze.compare.precision_rows import tensor_core_share_of_gemm
from mgprof.analyze.findings.compute import measured_precision
from mgprof.analyze.run.precision import LOSS_DEVIATION_PCT, loss_check
from mgprof.analyze.run.schema import RunAnalysis, decode_analysis
from mgprof.analyze.tracefile.flop_estimate import PREC_FP32, PREC_REDUCED, leaf_gemm_time
from tests._spawn import Result, clean_env, python_args, run_many

pytestmark = pytest.mark.slow

SCRIPTS = Path(__file__).resolve().parent / "scripts"


def updates(warmup: int, steps: int) -> int:
    """Optimizer updates a run makes: the first step starts at the first update, so the last
    measured step ends at update warmup + steps + 1."""
    return warmup + steps + 1


TIMEOUT_S = 300
GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::convolution", "aten::mkldnn_convolution")


# --- the loss check and the GEMM dtype figure, on known inputs -------------------------------


def test_loss_check_ok_within_rounding() -> None:
    base = [2.0, 1.8, 1.6, 1.5, 1.4, 1.3]
    bf16 = [2.001, 1.803, 1.59, 1.51, 1.41, 1.29]
    check = loss_check(bf16, base)
    assert check.status == "ok" and check.compared_updates == 6
    assert check.max_gap_pct is not None and 0.5 < check.max_gap_pct < 1.0


def test_loss_check_flags_divergence_but_not_an_early_wobble() -> None:
    base = [2.0, 1.8, 1.6, 1.5, 1.4, 1.3, 1.2, 1.1, 1.0, 0.9]
    wobble = [2.0, 2.2, 1.6, 1.5, 1.4, 1.3, 1.2, 1.1, 1.0, 0.9]  # one update 22 % off
    assert loss_check(wobble, base).status == "ok"
    drift = [2.0, 1.8, 1.7, 1.7, 1.7, 1.7, 1.7, 1.7, 1.7, 1.7]
    check = loss_check(drift, base)
    assert check.status == "diverged"
    assert check.tail_gap_pct is not None and check.tail_gap_pct > LOSS_DEVIATION_PCT


def test_loss_check_nonfinite_wins_and_names_the_first_update() -> None:
    check = loss_check([1.0, None, None], [1.0, 0.9, 0.8], nonfinite=[1, 2])
    assert check.status == "non-finite" and check.nonfinite_updates == 2
    assert "update 2" in check.detail
    assert loss_check([float("nan")], [1.0]).status == "non-finite"


def test_loss_check_refuses_runs_that_did_not_start_alike() -> None:
    check = loss_check([3.0, 2.0], [1.0, 0.9])
    assert check.status == "not comparable" and "same weights and data" in check.detail
    assert loss_check([], [1.0]).status == "not measured"


def test_leaf_gemm_time_counts_the_innermost_op_by_operand_dtype() -> None:
    ops = [
        ("t", 0.0, 10.0, PREC_FP32),  # aten::linear, fp32 operands before autocast's cast
        ("t", 1.0, 9.0, PREC_REDUCED),  # its aten::addmm, on bf16 operands
        ("t", 20.0, 24.0, PREC_FP32),  # a plain fp32 mm
        ("u", 0.0, 3.0, 0),  # mixed operands on another thread
    ]
    assert leaf_gemm_time(ops) == {"reduced": 8.0, "fp32": 4.0, "unknown": 3.0}


def test_the_amp_finding_cites_the_measured_rows_of_its_strategy() -> None:
    row = {"devices": 2, "status": "complete"}
    rows = [
        {**row, "strategy": "ddp", "precision": "fp32", "run": "a", "precision_speedup": None},
        {
            **row,
            "strategy": "ddp",
            "precision": "bf16",
            "run": "b",
            "precision_speedup": 1.9,
            "peak_mem_change_pct": -31.2,
            "loss_check": {"status": "ok", "detail": ""},
        },
        {
            **row,
            "strategy": "ddp",
            "precision": "fp16",
            "run": "c",
            "precision_speedup": 2.1,
            "loss_check": {"status": "non-finite", "detail": ""},
        },
        {**row, "strategy": "single", "precision": "bf16", "run": "d", "precision_speedup": 1.5},
    ]
    analysis = decode_analysis({"comparison": {"rows": rows}})
    assert analysis.warnings == []
    line = measured_precision(analysis, "ddp")
    assert line == (
        "measured by mgprof compare: bf16 1.90x, memory -31 % (run b); "
        "fp16 2.10x, loss non-finite (run c)"
    )
    assert measured_precision(RunAnalysis(), "ddp") is None


def test_tensor_core_share_is_of_gemm_kernel_time_over_all_ranks() -> None:
    summaries = [
        {"tensor_cores": {"tensor_core_us": 30.0, "fp32_gemm_us": 10.0}},
        {"tensor_cores": {"tensor_core_us": 10.0, "fp32_gemm_us": 0.0}},
        {"kind": "cpu"},
    ]
    assert tensor_core_share_of_gemm(summaries) == pytest.approx(80.0)
    assert tensor_core_share_of_gemm([{"kind": "cpu"}]) is None


# --- real runs --------------------------------------------------------------------------------


def _mgprof(*args: str) -> list[str]:
    return python_args("-m", "mgprof", *args)


CASES: dict[str, tuple[str, list[str], list[str]]] = {
    # name: (script, mgprof args after SCRIPT, script args)
    "cnn": (
        "cnn_loader.py",
        ["--gpus", "2", "--strategies", "ddp", "--precision", "fp32,bf16", "--steps", "4"],
        [],
    ),
    "amp": (
        "amp_tutorial.py",
        ["--gpus", "2", "--strategies", "ddp", "--precision", "fp32,bf16", "--steps", "3"],
        [],
    ),
    "fp16": (
        "fp16_overflow.py",
        ["--gpus", "2", "--strategies", "ddp", "--precision", "fp32,fp16", "--steps", "3"],
        [],
    ),
}


@pytest.fixture(scope="module")
def compared(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Result, Path]]:
    jobs, roots = [], {}
    for name, (script, flags, script_args) in CASES.items():
        root = roots[name] = tmp_path_factory.mktemp(f"precision-{name}")
        args = _mgprof(
            "compare",
            str(SCRIPTS / script),
            *flags,
            # one round and one traced step: these tests read precision, not the intervals
            # (tests/test_verdicts.py does), and a second round would double the launches
            "--rounds",
            "1",
            "--trace-steps",
            "1",
            "--nosync-steps",
            "0",
            "--format",
            "json",
            "--quiet",
            "--out",
            str(root),
        )
        if script_args:
            args += ["--", *script_args]
        jobs.append((args, root, clean_env()))
    results = run_many(jobs, parallel=2, timeout_s=TIMEOUT_S)
    return {name: (res, roots[name]) for name, res in zip(CASES, results, strict=True)}


def _comparison(compared: dict[str, tuple[Result, Path]], name: str) -> dict[str, Any]:
    result, _ = compared[name]
    assert result.returncode == 0, result.explain()
    return json.loads(result.stdout)


def _rows(comp: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["precision"]: r for r in comp["rows"]}


def _gemm_input_types(run_dir: Path) -> set[str]:
    """The ``Input type`` of the first operand of every GEMM/conv op in the run's traces."""
    found = set()
    for path in (run_dir / "traces").glob("*.json*"):
        opener: Any = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as fh:
            events = json.load(fh)["traceEvents"]
        for e in events:
            if e.get("name") in GEMM_OPS:
                types = (e.get("args") or {}).get("Input type") or []
                if types:
                    found.add(str(types[0]))
    return found


def test_plain_script_gets_both_rows_and_the_gemms_run_in_bf16(
    compared: dict[str, tuple[Result, Path]],
) -> None:
    comp = _comparison(compared, "cnn")
    _, root = compared["cnn"]
    assert comp["precisions"] == ["fp32", "bf16"]
    rows = _rows(comp)
    assert set(rows) == {"fp32", "bf16"}
    fp32, bf16 = rows["fp32"], rows["bf16"]
    for row in (fp32, bf16):
        assert row["status"] == "complete" and row["grad_sync"] == "synchronised"
        assert row["samples_per_s"] and row["step_time_ms"]
        assert row["precision_baseline"] == "fp32"
    # the traces themselves: bf16 operands in the bf16 row, float32 in the fp32 row
    comp_dir = root / comp["comparison_id"]
    assert _gemm_input_types(comp_dir / bf16["run"]) == {"c10::BFloat16"}
    assert _gemm_input_types(comp_dir / fp32["run"]) == {"float"}
    assert bf16["reduced_gemm_pct"] == pytest.approx(100.0)
    assert fp32["reduced_gemm_pct"] == pytest.approx(0.0)
    assert fp32["precision_setting"] == "fp32 (autocast off at the model)"
    assert bf16["precision_setting"] == "bf16 autocast"
    assert bf16["precision_speedup"] == pytest.approx(bf16["samples_per_s"] / fp32["samples_per_s"])
    # same seed, same data: bf16 tracks the fp32 loss update by update
    check = bf16["loss_check"]
    assert check["status"] == "ok", check
    # every update ran (2 warm-up, 4 measured, and the update that ends the last one)
    assert check["compared_updates"] == updates(2, 4) and check["first_gap_pct"] < 2.0
    assert "precision on ddp, against fp32" in comp["verdict"]
    assert "say nothing about a GPU" in comp["verdict"]
    run = json.loads((comp_dir / bf16["run"] / "run.json").read_text())
    precision = run["analysis"]["precision"]
    assert precision["requested"] == "bf16" and precision["applied_ranks"] == [0, 1]
    assert len(precision["losses"]) == updates(2, 4)
    # mgprof's autocast is not taken for the script's own
    assert all(not r["training"]["autocast_used"] for r in run["ranks"])
    assert "bf16 autocast" in (comp_dir / bf16["run"] / "report.md").read_text()


def test_a_script_with_its_own_amp_is_the_labelled_baseline(
    compared: dict[str, tuple[Result, Path]],
) -> None:
    comp = _comparison(compared, "amp")
    _, root = compared["amp"]
    assert comp["precisions"] == ["script", "fp32", "bf16"]
    rows = _rows(comp)
    script, fp32 = rows["script"], rows["fp32"]
    assert script["precision_setting"] == "the script's own: bfloat16 autocast + GradScaler"
    assert all(r["precision_baseline"] == "script" for r in rows.values())
    assert script["reduced_gemm_pct"] == pytest.approx(100.0)
    # fp32 overrides the script's autocast at the model, and says so
    comp_dir = root / comp["comparison_id"]
    assert _gemm_input_types(comp_dir / fp32["run"]) == {"float"}
    assert "replaces the script's own bfloat16 autocast" in fp32["precision_setting"]
    # bf16 is the script's own setting: the same losses, bit for bit
    assert rows["bf16"]["loss_check"]["max_gap_pct"] == 0.0
    assert fp32["loss_check"]["status"] == "ok"
    assert "against script" in comp["verdict"]


def test_fp16_overflow_is_flagged_not_praised(compared: dict[str, tuple[Result, Path]]) -> None:
    comp = _comparison(compared, "fp16")
    rows = _rows(comp)
    fp16 = rows["fp16"]
    assert fp16["loss_check"]["status"] == "non-finite"
    assert fp16["loss_check"]["nonfinite_updates"] == updates(2, 3)
    assert rows["fp32"]["loss_check"] is None  # the baseline
    assert "GradScaler (inserted by mgprof)" in fp16["precision_setting"]
    assert any("skipped" in n for n in fp16["notes"])  # every step's gradients were inf
    assert "loss non-finite (not a usable setting)" in comp["verdict"]
    assert "fastest usable" not in comp["verdict"]


def _analyze_bf16(out: Path, script: str, gpus: int, *script_args: str) -> dict[str, Any]:
    """``mgprof analyze SCRIPT --precision bf16 --steps 3``: its JSON report."""
    args = [str(SCRIPTS / script), "--gpus", str(gpus), "--precision", "bf16", "--steps", "3"]
    args += ["--quiet", "--format", "json", "--out", str(out)]
    if script_args:
        args += ["--", *script_args]
    [result] = run_many([(_mgprof("analyze", *args), out, clean_env())], timeout_s=TIMEOUT_S)
    assert result.returncode == 0, result.explain()
    report: dict[str, Any] = json.loads(result.stdout)
    return report


def test_analyze_precision_on_one_device(tmp_path: Path) -> None:
    """``analyze --precision bf16`` under single: no wrapper, the model still found."""
    report = _analyze_bf16(tmp_path, "plain_loop.py", 1)
    precision = report["analysis"]["precision"]
    assert precision["applied_ranks"] == [0]
    assert precision["module_class"] == "torch.nn.modules.container.Sequential"
    assert len(precision["losses"]) == updates(2, 3) and precision["nonfinite_updates"] == []
    run_dir = next(p for p in tmp_path.iterdir() if (p / "run.json").exists())
    assert _gemm_input_types(run_dir) == {"c10::BFloat16"}
    # one device: nothing is wrapped, and auto-wrap reports nothing about it
    assert report["ranks"][0]["training"]["auto_wrap"] is None


def test_bad_precision_is_one_line_and_exit_2(tmp_path: Path) -> None:
    [result] = run_many(
        [
            (
                _mgprof(
                    "compare",
                    str(SCRIPTS / "plain_loop.py"),
                    "--gpus",
                    "2",
                    "--precision",
                    "fp32,int4",
                    "--out",
                    str(tmp_path),
                ),
                tmp_path,
                clean_env(),
            )
        ],
        timeout_s=60,
    )
    assert result.returncode == 2
    assert "unknown precision 'int4'" in result.stderr
    assert "Traceback" not in result.stderr
    assert not any(tmp_path.iterdir())


def test_a_script_that_wraps_ddp_itself_gets_the_setting_too(tmp_path: Path) -> None:
    """The torchrun tutorial builds its own DDP: nothing is wrapped, the DDP module is routed."""
    report = _analyze_bf16(tmp_path, "ddp_tutorial.py", 2, "--epochs", "1")
    precision = report["analysis"]["precision"]
    assert precision["applied_ranks"] == [0, 1]
    assert precision["module_class"].endswith("DistributedDataParallel")
    assert report["analysis"]["job"]["grad_sync"]["status"] == "synchronised"
    wrap = report["ranks"][0]["training"]["auto_wrap"]
    assert wrap["wrapper"] is None and "wraps its model itself" in wrap["reason"]
    run_dir = next(p for p in tmp_path.iterdir() if (p / "run.json").exists())
    assert _gemm_input_types(run_dir) == {"c10::BFloat16"}


def test_diff_names_the_precision_change_without_calling_it_incomparable(
    compared: dict[str, tuple[Result, Path]],
) -> None:
    comp = _comparison(compared, "cnn")
    _, root = compared["cnn"]
    rows = _rows(comp)
    comp_dir = root / comp["comparison_id"]
    [result] = run_many(
        [
            (
                _mgprof(
                    "diff",
                    str(comp_dir / rows["fp32"]["run"]),
                    str(comp_dir / rows["bf16"]["run"]),
                    "--json",
                ),
                root,
                clean_env(),
            )
        ],
        timeout_s=120,
    )
    assert result.returncode == 0, result.explain()
    verdict = json.loads(result.stdout)
    found = [d for d in verdict["differences"] if d["field"] == "precision"]
    assert found == [
        {
            "field": "precision",
            "base": "fp32 (autocast off at the model)",
            "new": "bf16 autocast",
            "kind": "precision",
            "effect": found[0]["effect"],
        }
    ]
    assert "not the loss" in found[0]["effect"]
    assert verdict["comparable"] is True
