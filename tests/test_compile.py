"""A script that compiles its model and trains it unwrapped, under ``mgprof analyze --gpus 2``.

Auto-wrap used to build ``DDP(compiled)``, the order PyTorch advises against; it now wraps the
original module and compiles the DDP wrapper with the script's own options, and the rank
records what dynamo compiled (graphs, graph breaks) from dynamo's counters.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from _spawn import clean_env

SCRIPTS = Path(__file__).resolve().parent / "scripts"

pytestmark = pytest.mark.slow


def _analyze(out: Path, *script_args: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    proc = subprocess.run(
        [
            sys.executable, "-m", "mgprof", "analyze", str(SCRIPTS / "compiled_mlp.py"),
            "--gpus", "2", "--steps", "8", "--trace-steps", "1", "--out", str(out),
            "--", "--backend", "aot_eager", *script_args,
        ],
        env=clean_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_json,) = out.glob("*/run.json")
    return proc, run_json.parent


@pytest.fixture(scope="module")
def compiled_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    proc, run_dir = _analyze(tmp_path_factory.mktemp("compiled"))
    return proc.stdout, run_dir


def test_a_compiled_model_is_compiled_around_ddp(compiled_run: tuple[str, Path]) -> None:
    stdout, run_dir = compiled_run
    run = json.loads((run_dir / "run.json").read_text())
    sync = run["analysis"]["job"]["grad_sync"]
    assert (sync["status"], sync["how"]) == ("synchronised", "ddp")
    wrap = sync["auto_wrap"]
    assert wrap["wrapper"] == "ddp"
    assert wrap["compile_order"] == "compile(ddp(model)) with the script's compile options"
    for rank in run["ranks"]:
        compiled = rank["training"]["compile"]
        assert compiled["graphs"] >= 1 and compiled["frames_ok"] >= 1
        assert all("/" not in r.split(" ", 1)[0] for r in compiled["break_reasons"])
    report = " ".join(stdout.split())
    assert "compiled as compile(ddp(model))" in report and "torch.compile" in report
    rules = {f["rule"] for f in run["analysis"]["findings"]}
    assert "ddp_around_compiled" not in rules


def test_mostly_uncompiled_fires_only_under_half(compiled_run: tuple[str, Path]) -> None:
    import msgspec

    from mgprof.analyze.findings import findings_of
    from mgprof.analyze.run.schema import decode_analysis
    from mgprof.records import read_run

    run = read_run(compiled_run[1])
    analysis = decode_analysis(run.analysis or {})
    (summary,) = analysis.traces.ranks["0"]
    assert summary.compiled is not None and summary.compiled.regions >= 1
    record = run.ranks[0].training.compile
    assert record is not None
    ranks = [
        msgspec.structs.replace(
            r, training=msgspec.structs.replace(r.training, compile=msgspec.structs.replace(
                record, graph_breaks=max(1, record.graph_breaks)))
        )
        for r in run.ranks
    ]  # fmt: skip
    broken = msgspec.structs.replace(run, ranks=ranks)
    fired = {f.rule: f for f in findings_of(broken, analysis)}
    if summary.compiled.compiled_pct is not None and summary.compiled.compiled_pct >= 50:
        assert "mostly_uncompiled" not in fired
    summary.compiled.compiled_pct = 20.0  # as if most of the step ran between graphs
    fired = {f.rule: f for f in findings_of(broken, analysis)}
    assert fired["mostly_uncompiled"].figures["compiled_pct"] == pytest.approx(20.0)
    assert "TORCH_LOGS=graph_breaks" in fired["mostly_uncompiled"].fix


def test_torchs_own_container_keeps_the_order_and_says_what_it_costs(tmp_path: Path) -> None:
    _, run_dir = _analyze(tmp_path, "--sequential")
    run = json.loads((run_dir / "run.json").read_text())
    wrap = run["analysis"]["job"]["grad_sync"]["auto_wrap"]
    assert wrap["compile_order"].startswith("ddp(compiled): the model is torch's own Sequential")
    (finding,) = [f for f in run["analysis"]["findings"] if f["rule"] == "ddp_around_compiled"]
    assert "median_comm_overlap_pct" in finding["figures"]
    assert "class of your own" in finding["change"]


def test_torchs_own_container_keeps_the_scripts_order() -> None:
    import torch
    from torch import nn

    from mgprof.collect.wrapping import compile_watch

    compile_watch.patch()
    try:
        sequential = torch.compile(nn.Sequential(nn.Linear(2, 2)), backend="aot_eager")
        options = compile_watch.options_of(sequential)
        assert options == {"backend": "aot_eager"}
        why = compile_watch.why_not_around_ddp(sequential, options)
        assert why is not None and "Sequential" in why  # compile(DDP(seq)) would compile nothing

        class Mine(nn.Linear):
            pass

        mine = torch.compile(Mine(2, 2), backend="aot_eager")
        assert compile_watch.why_not_around_ddp(mine, compile_watch.options_of(mine)) is None
        assert compile_watch.why_not_around_ddp(mine, None) == "the compile options were not seen"
    finally:
        compile_watch.unpatch()


def test_the_report_shows_the_compiled_share_each_rank_traced(
    compiled_run: tuple[str, Path],
) -> None:
    """The torch.compile section: dynamo's counters and, per rank whose trace has compiled
    regions, the compiled share and regions per step as the trace analysis measured them."""
    from mgprof.analyze.run.schema import decode_analysis
    from mgprof.records import read_run
    from mgprof.report.run.sections import build_sections

    stdout, run_dir = compiled_run
    run = read_run(run_dir)
    analysis = decode_analysis(run.analysis or {})
    section = next(s for s in build_sections(run, analysis) if s.title == "torch.compile")
    assert dict(section.facts)["dynamo"].startswith(f"{run.ranks[0].training.compile.graphs} ")
    (table,) = section.tables
    for rank, summaries in analysis.traces.ranks.items():
        compiled = summaries[0].compiled
        assert compiled is not None and compiled.compiled_pct is not None
        cells = next(r for r in table.rows if r[0] == rank)
        assert cells[2] == f"{compiled.compiled_pct:.1f}"
        assert cells[3] == f"{compiled.regions_per_step:.1f}"
    assert "torch.compile ─" in stdout and "compiled %" in stdout
    # report.html's Overview holds the same figures, as numbers
    from mgprof.report.html.view_model import Context
    from mgprof.report.html.view_overview import overview_view

    spec = overview_view(Context.of(run, analysis)).tables["ov-compiled"]
    by_rank = {row[0]: row for row in spec["rows"]}
    for rank, summaries in analysis.traces.ranks.items():
        compiled = summaries[0].compiled
        assert compiled is not None and compiled.compiled_pct is not None
        assert by_rank[int(rank)][2] == round(compiled.compiled_pct, 1)
        assert by_rank[int(rank)][3] == round(compiled.regions_per_step, 1)
