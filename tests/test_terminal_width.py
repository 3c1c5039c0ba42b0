"""Terminal reports at 80 and 120 columns: every number whole, no line past the width.

A piped run or a CI log is 80 columns wide. The reference is the same report rendered 400
columns wide, where every table fits on one line: each number in it must appear at least as
often at 80 and 120 columns (continuation tables repeat label columns, so more is fine). A number
cut to ``660…`` or folded over two lines would be missing, and a cut adds a ``…`` the wide
rendering does not have (short kernel names have theirs at every width).
"""

from __future__ import annotations

import io
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from _data import TRACES
from rich.console import Console

from mgprof.analyze.compare.scaling import Comparison, Row, add_speedups
from mgprof.analyze.compare.verdict import verdict
from mgprof.analyze.sweep.result import SweepResult
from mgprof.analyze.sweep.trials import Trial
from mgprof.commands.report import build_analysis
from mgprof.records import read_run
from mgprof.report.compare_view import render_comparison
from mgprof.report.run.terminal import render_run
from mgprof.report.sweep_view import render_sweep
from mgprof.report.term_table import Col, fitted_tables
from mgprof.report.trace_terminal import render_job

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = TRACES
H200_RUN = ROOT / "tests" / "data" / "gpu" / "mgprof-run-h200"
NUMBER = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?(?![\w.])")
WIDTHS = (80, 120)

Render = Callable[[Console], None]


def rendered(render: Render, width: int) -> str:
    buf = io.StringIO()
    console = Console(file=buf, width=width, force_terminal=False, color_system=None)
    render(console)
    return buf.getvalue()


def numbers(text: str) -> Counter[str]:
    return Counter(NUMBER.findall(text))


def assert_fits(render: Render) -> None:
    wide = rendered(render, 400)
    expected = numbers(wide)
    assert expected, "the reference rendering holds no number"
    for width in WIDTHS:
        text = rendered(render, width)
        too_long = [line for line in text.splitlines() if len(line) > width]
        assert not too_long, f"{width} columns: lines past the width: {too_long[:3]}"
        # short kernel names carry their own "…" at every width; one more is a cut
        assert text.count("…") == wide.count("…"), f"{width} columns: something was cut"
        got = numbers(text)
        missing = {n: c for n, c in expected.items() if got[n] < c}
        assert not missing, f"{width} columns: numbers missing or cut: {missing}"


def test_fitted_tables_continue_columns_that_do_not_fit() -> None:
    cols = [Col("rank"), *(Col(f"figure {i} ms") for i in range(12))]
    rows = [[str(r), *(f"{1000 * r + i:,.2f}" for i in range(12))] for r in range(3)]
    tables = fitted_tables(cols, rows, 80)
    assert len(tables) > 1
    assert all(t.columns[0].header.plain == "rank" for t in tables)  # type: ignore[union-attr]
    assert sum(len(t.columns) - 1 for t in tables) == 12
    assert len(fitted_tables(cols, rows, 400)) == 1


def test_cpu_run_report(cpu_run_dir: Path) -> None:
    run = read_run(cpu_run_dir)
    analysis = build_analysis(run, cpu_run_dir)
    assert_fits(lambda c: render_run(run, analysis, c))


def test_cpu_run_report_with_definitions(cpu_run_dir: Path) -> None:
    run = read_run(cpu_run_dir)
    analysis = build_analysis(run, cpu_run_dir)
    plain = rendered(lambda c: render_run(run, analysis, c), 80)
    full = rendered(lambda c: render_run(run, analysis, c, definitions=True), 80)
    assert "Definitions" not in plain and "step_time_ms:" not in plain
    assert "Definitions" in full and "step_time_ms:" in full


def test_gpu_run_report() -> None:
    run = read_run(H200_RUN)
    analysis = build_analysis(run, H200_RUN)
    assert_fits(lambda c: render_run(run, analysis, c))


@pytest.mark.parametrize(
    "folder", ["gpu-nccl-a100-rank0of2", "cpu-gloo-ddp-mlp-2ranks", "gpu-v100-single"]
)
def test_trace_report(folder: str) -> None:
    from mgprof.analyze.trace.job import analyze_job, find_trace_files

    (files,) = find_trace_files([FIXTURES / folder]).values()
    job = analyze_job(files, workers=1)
    assert_fits(lambda c: render_job(job, c))


def test_trace_report_under_a_long_path(tmp_path: Path) -> None:
    """A folder path longer than the line: the title folds it at its ``/`` separators, every
    name whole (it was cut with ``…`` at 80 columns)."""
    import shutil

    from mgprof.analyze.trace.job import analyze_job, find_trace_files

    deep = tmp_path / "experiments-2026-12-01" / ("run-with-a-long-descriptive-name-" * 3)
    shutil.copytree(FIXTURES / "cpu-gloo-ddp-mlp-2ranks", deep / "traces")
    (files,) = find_trace_files([deep / "traces"]).values()
    job = analyze_job(files, workers=1)
    assert len(job.directory) > 120
    assert_fits(lambda c: render_job(job, c))
    for width in WIDTHS:
        lines = rendered(lambda c: render_job(job, c), width).splitlines()
        start = next(i for i, line in enumerate(lines) if line.startswith(job.directory[:10]))
        folded = "".join(lines[start : start + 4])
        assert folded.startswith(job.directory), width


def test_path_lines_break_after_separators_and_fold_only_a_longer_name() -> None:
    from mgprof.report.term_title import path_lines

    assert path_lines("/a/bb/ccc", 5) == ["/a/", "bb/", "ccc"]
    assert path_lines("/runs/x", 80) == ["/runs/x"]
    assert path_lines("x" * 12, 5) == ["xxxxx", "xxxxx", "xx"]
    assert all(len(line) <= 7 for line in path_lines("/tmp/" + "n" * 30 + "/f.json", 7))


def test_compare_table() -> None:
    rows = [
        Row(strategy="single", devices=1, run="s", status="complete", samples_per_s=6660.43),
        Row(strategy="dp", devices=8, run="p", status="complete", samples_per_s=21034.5),
        Row(strategy="ddp", devices=8, run="d", status="complete", samples_per_s=47001.25),
    ]
    for row, step in zip(rows, (9.61, 24.33, 10.9)):
        row.step_time_ms = step
        row.batch_per_device = 64
        row.global_batch = 64 * row.devices
        row.peak_mem_kind = "cuda"
        row.peak_mem_mib = [40123.0] * row.devices
    add_speedups(rows)
    comp = Comparison(rows=rows, verdict=verdict(rows, False, "weak"))
    assert_fits(lambda c: render_comparison(comp, c, "/runs/compare-1"))


def test_sweep_table() -> None:
    trials = [
        Trial(
            batch_size=b,
            status="ok",
            world_size=8,
            global_batch=8 * b,
            step_time_ms=3.2 * b**0.8,
            samples_per_s=8 * b / (3.2 * b**0.8) * 1000,
            samples_per_s_per_device=b / (3.2 * b**0.8) * 1000,
            peak_memory_mib=1234.5 + 98.25 * b,
            comm_pct=41.5 / b**0.3,
            exposed_comm_pct=20.25 / b**0.3,
        )
        for b in (8, 16, 32, 64, 128, 256)
    ]
    result = SweepResult(script="train.py", world_size=8, trials=trials, sweet_spot=64)
    assert_fits(lambda c: render_sweep(result, c))


def test_top_level_help_is_for_users_and_fits_80_columns() -> None:
    import os
    import subprocess
    import sys

    env = {**os.environ, "COLUMNS": "80"}
    out = subprocess.run(
        [sys.executable, "-m", "mgprof", "--help"], capture_output=True, text=True, env=env
    ).stdout
    assert "examples:" in out and "mgprof analyze train.py --gpus 2" in out
    assert "``" not in out and "map errors to exit codes" not in out  # no developer docstring
    assert max(len(line) for line in out.splitlines()) <= 80
