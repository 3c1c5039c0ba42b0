"""The in-code API reports back: ``python train.py`` with ``mgprof.profile`` writes report.md and
report.html beside run.json and prints a few lines on stderr (rank 0 only, unless quiet); under
the launcher (``MGPROF_RUN_DIR``) it leaves both to ``mgprof analyze``. Everything fails open.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from _spawn import (
    clean_env,
    python_args,
    run,
    run_dirs,
    torchrun_args,
    write_script,
)

import mgprof
import mgprof.collect.session.session as session_module
import mgprof.report.files as report_files
from mgprof.analyze.run.analysis import analyze_run
from mgprof.analyze.run.results import CommFigures, JobAnalysis, RankAnalysis, StepTimeStats
from mgprof.analyze.run.schema import Finding, RunAnalysis, decode_analysis
from mgprof.collect.failopen import MgprofWarning
from mgprof.records import DeviceInfo, RankRecord, RunRecord, StepRecord, read_run
from mgprof.report.files import analyze_with_findings
from mgprof.report.run.summary_lines import summary_lines

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "mlp_context.py"
H200 = ROOT / "tests" / "data" / "gpu" / "mgprof-run-h200"

SAVED = "mgprof: run saved to"
STEP = "mgprof: step "
FULL = "mgprof: full report: mgprof report "


def mgprof_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("mgprof: ")]


def check_report_files(run_dir: Path) -> dict[str, Any]:
    """report.md and report.html beside run.json, whose analysis they render."""
    assert (run_dir / "report.md").read_text().strip()
    assert (run_dir / "report.html").read_text().lstrip().lower().startswith("<!doctype html")
    data = json.loads((run_dir / "run.json").read_text())
    assert isinstance(data["analysis"], dict) and data["analysis"]["ranks"]
    assert "findings" in data["analysis"]
    return data


# --------------------------------------------------------------------------------------------
# Real processes


@pytest.mark.slow
def test_plain_python_script_writes_the_report_and_prints_a_summary(tmp_path: Path) -> None:
    args = python_args(EXAMPLE, "--steps", "6", "--hidden", "64", "--out", "runs")
    result = run(args, cwd=tmp_path, env=clean_env())
    assert result.returncode == 0, result.explain()
    (run_dir,) = run_dirs(tmp_path / "runs", "mlp_context")
    check_report_files(run_dir)

    lines = mgprof_lines(result.stderr)
    rel = f"runs/{run_dir.name}"
    assert lines[0] == f"{SAVED} {rel} (report.md, report.html)", result.explain()
    (step,) = [line for line in lines if line.startswith(STEP)]
    assert " ms (p95 " in step and "samples/s on CPU" in step
    assert lines[-1] == f"{FULL}{rel}"
    assert not any("MgprofWarning" in line for line in result.stderr.splitlines())
    assert result.stdout == ""


@pytest.mark.slow
def test_quiet_env_silences_the_summary_but_writes_the_files(tmp_path: Path) -> None:
    """``MGPROF_QUIET=1``, through the decorator whose session closes at interpreter exit."""
    script = write_script(
        tmp_path,
        "deco_quiet.py",
        """
        import torch
        import mgprof

        model = torch.nn.Linear(4, 2)

        @mgprof.profile_step(out="runs", name="deco", skip=0, warmup=1, active=1, sample=False)
        def train_step(x):
            model(x).sum().backward()

        for n in (3, 4, 5):
            train_step(torch.randn(n, 4))
        """,
    )
    result = run(python_args(script), cwd=tmp_path, env=clean_env(MGPROF_QUIET="1"))
    assert result.returncode == 0, result.explain()
    assert mgprof_lines(result.stderr) == [], result.explain()
    (run_dir,) = run_dirs(tmp_path / "runs", "deco")
    check_report_files(run_dir)


TWO_RANKS = """
import sys

import torch
import torch.distributed as dist

import mgprof

model = mgprof.wrap(torch.nn.Linear(8, 4))  # DDP over gloo from torchrun's environment
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with mgprof.profile(out="runs", name="ddp", skip=0, warmup=1, active=2, sample=False) as prof:
    for _ in range(4):
        x = torch.randn(16, 8)
        with prof.step(x):
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
print(f"rank {dist.get_rank()} done", file=sys.stderr)
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_two_gloo_ranks_report_once_from_rank_0(tmp_path: Path) -> None:
    script = write_script(tmp_path, "ddp_inline.py", TWO_RANKS)
    result = run(torchrun_args(script), cwd=tmp_path, env=clean_env())
    assert result.returncode == 0, result.explain()
    assert "rank 0 done" in result.stderr and "rank 1 done" in result.stderr
    (run_dir,) = run_dirs(tmp_path / "runs", "ddp")
    data = check_report_files(run_dir)
    assert [r["rank"] for r in data["ranks"]] == [0, 1]

    lines = mgprof_lines(result.stderr)
    assert [line for line in lines if line.startswith(SAVED)] == [
        f"{SAVED} runs/{run_dir.name} (report.md, report.html)"
    ], result.explain()
    assert len([line for line in lines if line.startswith(STEP)]) == 1
    assert len([line for line in lines if line.startswith(FULL)]) == 1
    (step,) = [line for line in lines if line.startswith(STEP)]
    assert "slowest of 2 ranks" in step
    assert any(" exposed" in line and "comm " in line for line in lines), result.explain()


# --------------------------------------------------------------------------------------------
# In process: the switches and failing open


def _train(prof: mgprof.Session, steps: int = 3) -> None:
    model = torch.nn.Linear(4, 2)
    for _ in range(steps):
        x = torch.randn(5, 4)
        with prof.step(x):
            model(x).sum().backward()


def test_quiet_argument_writes_files_and_prints_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with mgprof.profile(out=tmp_path, name="quiet", quiet=True, sample=False) as prof:
        _train(prof)
    assert prof.run_dir is not None
    check_report_files(prof.run_dir)
    assert mgprof_lines(capsys.readouterr().err) == []


def test_in_process_session_prints_the_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MGPROF_QUIET", raising=False)
    with mgprof.profile(out=tmp_path, name="loud", trace=False, sample=False) as prof:
        _train(prof)
    assert prof.run_dir is not None
    lines = mgprof_lines(capsys.readouterr().err)
    assert lines[0] == f"{SAVED} {prof.run_dir} (report.md, report.html)"
    assert any(line.startswith(STEP) for line in lines)
    assert lines[-1] == f"{FULL}{prof.run_dir}"


def test_stop_returns_the_run_with_its_analysis(tmp_path: Path) -> None:
    prof = mgprof.profile(out=tmp_path, name="ret", trace=False, sample=False, quiet=True)
    prof.start()
    _train(prof)
    run_record = prof.stop()
    assert run_record is not None and prof.run_dir is not None
    assert run_record.analysis is not None and "findings" in run_record.analysis
    assert run_record == read_run(prof.run_dir)
    assert prof.stop() is None  # already stopped: no second run, no second report


def test_under_the_launcher_the_session_leaves_the_report_to_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fixed = tmp_path / "from-launcher"
    monkeypatch.setenv("MGPROF_RUN_DIR", str(fixed))
    with mgprof.profile(name="launched", trace=False, sample=False) as prof:
        _train(prof)
    assert prof.run_dir == fixed
    assert read_run(fixed).analysis is None
    assert not (fixed / "report.md").exists() and not (fixed / "report.html").exists()
    assert mgprof_lines(capsys.readouterr().err) == []


def test_a_failing_report_is_one_warning_and_the_run_stays(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(run_dir: Path) -> list[str]:
        fail = "import sys; print('Traceback ...', file=sys.stderr); sys.exit('renderer exploded')"
        return [sys.executable, "-c", fail]

    monkeypatch.delenv("MGPROF_QUIET", raising=False)
    monkeypatch.setattr(session_module, "_report_command", broken)
    warned = "report: RuntimeError: report files not written: renderer exploded"
    with (
        pytest.warns(MgprofWarning, match=warned),
        mgprof.profile(out=tmp_path, name="broken", trace=False, sample=False) as prof,
    ):
        _train(prof)
    assert prof.run_dir is not None
    assert read_run(prof.run_dir).ranks[0].steps  # run.json as the session wrote it
    assert not (prof.run_dir / "report.md").exists()
    # the summary still says where the run is
    assert mgprof_lines(capsys.readouterr().err) == [
        f"{SAVED} {prof.run_dir}",
        f"{FULL}{prof.run_dir}",
    ]


def test_report_files_module_runs_on_its_own(tmp_path: Path) -> None:
    """``python -m mgprof.report.files RUN_DIR``, as the session runs it: names on stdout."""
    with mgprof.profile(out=tmp_path, name="cli", quiet=True, sample=False) as prof:
        _train(prof)
    assert prof.run_dir is not None
    (prof.run_dir / "report.md").unlink()
    (prof.run_dir / "report.html").unlink()
    assert report_files.main([str(prof.run_dir)]) == 0
    check_report_files(prof.run_dir)
    assert report_files.main([]) == 2
    assert report_files.main([str(tmp_path / "nothing-here")]) == 1


def test_a_failing_summary_is_one_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import mgprof.report.run.summary_lines as summary

    def broken(*args: object) -> list[str]:
        raise ValueError("bad figure")

    monkeypatch.delenv("MGPROF_QUIET", raising=False)
    monkeypatch.setattr(summary, "summary_lines", broken)
    with (
        pytest.warns(MgprofWarning, match="summary: ValueError: bad figure"),
        mgprof.profile(out=tmp_path, name="nosum", trace=False, sample=False) as prof,
    ):
        _train(prof)
    assert prof.run_dir is not None
    check_report_files(prof.run_dir)
    assert mgprof_lines(capsys.readouterr().err) == []


# --------------------------------------------------------------------------------------------
# The summary lines, pure


def test_summary_of_the_saved_h200_run() -> None:
    run_record = read_run(H200)
    analysis = analyze_with_findings(run_record, H200)
    typed = decode_analysis(analysis)
    lines = summary_lines(run_record, typed, "runs/h200", ["report.md", "report.html"])
    assert lines == [
        "mgprof: run saved to runs/h200 (report.md, report.html)",
        "mgprof: step 2.04 ms (p95 3.54), 31,402 samples/s",
        "mgprof: GPU util 0.5% (NVML), busy 2.7% (trace), MFU 0.1%",
        f"mgprof: top finding [high]: {analysis['findings'][0]['title']} (+3 more in the report)",
        "mgprof: full report: mgprof report runs/h200",
    ]


def test_summary_of_the_stored_analysis_without_findings() -> None:
    run_record = read_run(H200)
    assert run_record.analysis is not None and "findings" not in run_record.analysis
    lines = summary_lines(run_record, decode_analysis(run_record.analysis), H200)
    assert lines[0] == f"mgprof: run saved to {H200}"
    assert not any("top finding" in line for line in lines)
    # one process, no communication: no comm figure to speak of
    assert not any("comm" in line for line in lines)


def _cpu_run(steps: int = 5, **fields: Any) -> RunRecord:
    records = [
        StepRecord(index=i, duration_ms=20.0 + i, batch_size=32, traced=False) for i in range(steps)
    ]
    rank = RankRecord(rank=0, world_size=1, device=DeviceInfo(kind="cpu"), steps=records)
    return RunRecord(run_id="cpu", ranks=[rank], cpu_fallback=True, **fields)


def test_summary_of_a_minimal_cpu_run() -> None:
    run_record = _cpu_run()
    lines = summary_lines(
        run_record, decode_analysis(analyze_run(run_record, None)), "out/cpu", ["report.md"]
    )
    assert lines[0] == "mgprof: run saved to out/cpu (report.md)"
    (step,) = [line for line in lines if line.startswith(STEP)]
    # steady state: steps 1..4 (21, 22, 23, 24 ms), 32 samples per step
    assert step.startswith("mgprof: step 22.5 ms (p95 ")
    assert step.endswith("samples/s on CPU (the wiring, not GPU performance)")
    assert not any("busy" in line or "comm" in line for line in lines)  # no trace
    assert lines[-1] == "mgprof: full report: mgprof report out/cpu"


def test_summary_without_steps_says_how_to_mark_them() -> None:
    run_record = _cpu_run(steps=0)
    lines = summary_lines(run_record, decode_analysis(analyze_run(run_record, None)), "r")
    assert "mgprof: no steps recorded: call prof.step() once per iteration" in lines


def test_summary_names_an_incomplete_run_and_missing_ranks() -> None:
    run_record = _cpu_run(status="incomplete", error="RuntimeError: boom", missing_ranks=[3, 1])
    lines = summary_lines(run_record, decode_analysis(analyze_run(run_record, None)), "r")
    assert lines[1] == (
        "mgprof: run incomplete: RuntimeError: boom; ranks missing from the report: 1, 3"
    )


def test_summary_without_analysis_says_where_the_run_is() -> None:
    for analysis in (None, RunAnalysis(), decode_analysis({})):
        assert summary_lines(_cpu_run(), analysis, "a dir/run") == [
            "mgprof: run saved to a dir/run",
            "mgprof: full report: mgprof report 'a dir/run'",
        ]


def test_summary_of_two_ranks_takes_the_slowest_step_and_the_worst_comm() -> None:
    def rank(n: int, mean: float, busy: float, exposed: float) -> RankAnalysis:
        return RankAnalysis(
            rank=n,
            steps_total=10,
            step_time_ms=StepTimeStats(
                count=9, mean=mean, p50=mean, p95=mean + 2, min=mean, max=mean + 2
            ),
            trace_busy_pct=busy,
            comm=CommFigures(
                window_us=1000.0,
                comm_us=10.0 * exposed,
                comm_overlap_us=0.0,
                exposed_comm_us=10.0 * exposed,
                comm_pct=exposed * 2,
                comm_overlap_pct=None,
                exposed_comm_pct=exposed,
            ),
        )

    finding = Finding(
        id="exposed_comm",
        rule="exposed_comm",
        severity="medium",
        title="Communication is exposed",
        evidence="",
        cause="",
        change="",
        fix=[],
    )
    analysis = RunAnalysis(
        job=JobAnalysis(strategy="ddp", world_size=2, ranks_reported=2, samples_per_s=5200.4),
        ranks=[rank(0, 12.3, 70.0, 18.2), rank(1, 10.0, 80.0, 25.0)],
        findings=[finding],
    )
    run_record = RunRecord(world_size=2, strategy="ddp")
    assert summary_lines(run_record, analysis, "r")[1:] == [
        "mgprof: step 12.3 ms (p95 14.3, slowest of 2 ranks), 5,200 samples/s",
        "mgprof: mean of 2 ranks: busy 75% (trace); comm 25% exposed (worst: rank 1)",
        "mgprof: top finding [medium]: Communication is exposed",
        "mgprof: full report: mgprof report r",
    ]


def test_summary_of_a_malformed_stored_analysis_leaves_the_bad_blocks_out() -> None:
    analysis = decode_analysis(
        {
            "job": "not a dict",
            "ranks": [{"rank": 0, "step_time_ms": {"mean": "fast"}, "comm": None}, 7],
            "findings": ["x", {"title": "only a title"}],
        }
    )
    assert [w.split(":")[0] for w in analysis.warnings] == [
        "analysis block 'ranks' left out",
        "analysis block 'job' left out",
        "analysis block 'findings' left out",
    ]
    lines = summary_lines(RunRecord(), analysis, "r")
    assert lines == ["mgprof: run saved to r", "mgprof: full report: mgprof report r"]
