"""After-run steps: the optional HTML report, and figures that depend on how steps were marked."""

from __future__ import annotations

from pathlib import Path

import pytest

from mgprof.analyze.run.analysis import analyze_run
from mgprof.records import RankRecord, RunRecord, StepRecord
from mgprof.report.html import page as html_report
from mgprof.run.finish import write_html_report


def _run(step_form: str) -> RunRecord:
    steps = [
        StepRecord(index=i, duration_ms=10.0, batch_size=8, dataloader_ms=5.0) for i in range(5)
    ]
    rank = RankRecord(rank=0, world_size=1, steps=steps, step_form=step_form)  # type: ignore[arg-type]
    return RunRecord(ranks=[rank])


@pytest.mark.parametrize(("form", "share"), [("call", 50.0), ("auto", 50.0), ("with", 100 / 3)])
def test_dataloader_share_counts_the_wait_once(form: str, share: float) -> None:
    """5 ms wait, 10 ms step: inside the step (call, auto) 50 %; outside (with) 5/15."""
    analysis = analyze_run(_run(form), None)
    assert analysis["ranks"][0]["dataloader_share_pct"] == pytest.approx(share)
    assert analysis["job"]["dataloader_share_pct"] == pytest.approx(share)


def test_html_report_is_skipped_without_plotly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def missing(*args: object) -> str:
        raise html_report.HtmlDependencyMissing("plotly is not installed")

    monkeypatch.setattr(html_report, "run_to_html", missing)
    run = _run("call")
    assert write_html_report(tmp_path, run, analyze_run(run, None)) is None
    assert not (tmp_path / "report.html").exists()


def test_html_report_is_written_with_plotly(tmp_path: Path) -> None:
    pytest.importorskip("plotly")
    run = _run("call")
    path = write_html_report(tmp_path, run, analyze_run(run, None))
    assert path is not None and path.read_text().lstrip().lower().startswith("<!doctype html")
