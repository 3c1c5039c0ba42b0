"""The analysis has one schema (``mgprof.analyze.run.schema``): every analysis mgprof writes
decodes into it and encodes back to the same JSON, key order included; a stored analysis that is
old, hand-edited or broken still decodes (a bad block is left out, with a warning) and renders
in every format; docs/reports.md's description of it is the generator's output."""

from __future__ import annotations

import copy
import io
import json
import shutil
from pathlib import Path
from typing import Any

import msgspec
import pytest
from rich.console import Console

from mgprof.analyze.findings import with_findings
from mgprof.analyze.run.analysis import analyze_run
from mgprof.analyze.run.schema import (
    ANALYSIS_VERSION,
    RunAnalysis,
    decode_analysis,
    given,
    schema_markdown,
)
from mgprof.analyze.trace.job import analyze_job, find_trace_files
from mgprof.analyze.trace.summary import RankTraceSummary
from mgprof.cli import main
from mgprof.commands.report import analysis_data
from mgprof.errors import TraceError
from mgprof.records import RankRecord, RunRecord, StepRecord, read_run
from mgprof.report.run.as_json import run_to_json
from mgprof.report.run.markdown import run_to_markdown
from mgprof.report.run.terminal import render_run

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
RECORDED_RUNS = sorted(p.parent for p in DATA.rglob("run.json"))
"""Every run.json recorded in the repository (the H200 run, written by an earlier mgprof)."""
TRACE_INPUTS = sorted(
    [p for p in (DATA / "traces").iterdir() if p.is_dir() and p.name not in ("misc", "peers")]
    + sorted((DATA / "traces" / "misc").glob("*.gz"))
    + [p for p in (DATA / "traces" / "peers").iterdir() if p.is_dir()]
    + [p for p in (DATA / "gpu" / "traces").iterdir() if p.is_dir()]
)
"""Every recorded trace the render check renders (``mgprof trace`` on each)."""
GLOO = DATA / "traces" / "cpu-gloo-ddp-mlp-2ranks"


def assert_round_trip(data: dict[str, Any]) -> RunAnalysis:
    """``data`` decodes with no warning of its own and encodes back to the same JSON text."""
    analysis = decode_analysis(data)
    assert analysis.warnings == data.get("warnings", [])
    assert json.dumps(msgspec.to_builtins(analysis)) == json.dumps(data)
    return analysis


def assert_kept(old: Any, new: Any, where: str = "analysis") -> None:
    """Everything ``old`` holds is in ``new`` unchanged (``new`` may add keys: defaults of
    fields added since ``old`` was written)."""
    if isinstance(old, dict):
        assert isinstance(new, dict), where
        for key, value in old.items():
            assert key in new, f"{where}.{key} lost"
            assert_kept(value, new[key], f"{where}.{key}")
    elif isinstance(old, (list, tuple)):
        assert isinstance(new, (list, tuple)) and len(new) == len(old), where
        for i, (a, b) in enumerate(zip(old, new)):
            assert_kept(a, b, f"{where}[{i}]")
    else:
        assert json.dumps(old) == json.dumps(new), where


# ------------------------------------------------------------------ round trips


def test_the_repository_holds_a_recorded_run() -> None:
    assert DATA / "gpu" / "mgprof-run-h200" in RECORDED_RUNS


@pytest.mark.parametrize("run_dir", RECORDED_RUNS, ids=[p.name for p in RECORDED_RUNS])
def test_recorded_run_analysis_round_trips(run_dir: Path) -> None:
    """What ``mgprof report`` builds from a recorded run (its stored analysis under the fresh
    one) is exactly the typed analysis; the stored analysis itself loses nothing in decoding."""
    run = read_run(run_dir)
    data, typed = analysis_data(run, run_dir)
    assert json.dumps(msgspec.to_builtins(typed)) == json.dumps(data)
    assert_round_trip(data)
    assert run.analysis is not None
    stored = decode_analysis(run.analysis)
    assert stored.warnings == run.analysis["warnings"]
    assert_kept(run.analysis, msgspec.to_builtins(stored))


@pytest.mark.slow
def test_real_run_analysis_round_trips(cpu_run_dir: Path) -> None:
    """A run made now (2 gloo ranks, regions, noise scale, findings): run.json's analysis as
    written, and the one ``mgprof report`` builds again."""
    run = read_run(cpu_run_dir)
    assert run.analysis is not None and "findings" in run.analysis
    typed = assert_round_trip(run.analysis)
    assert given(typed.findings) is not None and typed.ranks[0].regions
    assert given(typed.noise_scale) is not None
    data, again = analysis_data(run, cpu_run_dir)
    assert_round_trip(data)
    assert json.dumps(msgspec.to_builtins(again)) == json.dumps(data)


def _gloo_run(tmp_path: Path) -> RunRecord:
    files = sorted(GLOO.glob("*.pt.trace.json.gz"))
    (tmp_path / "traces").mkdir()
    ranks = []
    for i, f in enumerate(files):
        shutil.copy(f, tmp_path / "traces" / f.name)
        steps = [StepRecord(index=k, duration_ms=10.0 + k, batch_size=8) for k in range(5)]
        ranks.append(RankRecord(rank=i, world_size=2, steps=steps, traces=[f"traces/{f.name}"]))
    return RunRecord(world_size=2, strategy="ddp", backend="gloo", cpu_fallback=True, ranks=ranks)


def test_analysis_of_recorded_traces_round_trips(tmp_path: Path) -> None:
    run = _gloo_run(tmp_path)
    data = analyze_run(run, tmp_path)
    typed = assert_round_trip(data)
    assert typed.traces.job is not None and typed.traces.job.cross_rank is not None
    assert all(r.comm is not None and r.comm.collectives for r in typed.ranks)
    with_data, with_typed = with_findings(run, data)
    assert_round_trip(with_data)
    assert json.dumps(msgspec.to_builtins(with_typed)) == json.dumps(with_data)


def _name(path: Path) -> str:
    return str(path.relative_to(DATA))


@pytest.mark.parametrize("path", TRACE_INPUTS, ids=[_name(p) for p in TRACE_INPUTS])
def test_trace_summaries_of_every_fixture_round_trip(path: Path) -> None:
    """The traces block as a run analysis stores it: the engine's summaries without their
    per-call lists, and the job summary without its ranks."""
    try:
        groups = find_trace_files([path])
        jobs = [analyze_job(files, workers=1) for files in groups.values()]
    except TraceError as exc:  # one the engine itself refuses (mgprof trace says why, exit 2)
        assert path.name == "hta-execution_trace", exc
        return
    for job in jobs:
        plain = msgspec.to_builtins(job)
        ranks = [
            {k: v for k, v in r.items() if k != "collective_calls"} for r in plain.pop("ranks")
        ]
        traces = {"ranks": {str(i): [r] for i, r in enumerate(ranks)}, "job": plain}
        typed = decode_analysis({"traces": traces})
        assert typed.warnings == []
        assert json.dumps(msgspec.to_builtins(typed.traces)) == json.dumps(traces)


def test_the_stored_summary_is_the_engine_summary_without_its_calls() -> None:
    """Same fields, same order (``mgprof trace --json``'s), ``collective_calls`` left out."""
    fields = list(RankTraceSummary.__struct_fields__)
    (files,) = find_trace_files([GLOO]).values()
    summary = analyze_job(files[:1], workers=1).ranks[0]
    assert list(msgspec.to_builtins(summary)) == fields
    stored = msgspec.structs.replace(summary, collective_calls=msgspec.UNSET)
    assert list(msgspec.to_builtins(stored)) == [f for f in fields if f != "collective_calls"]


# ------------------------------------------------------------------ lenient decoding


def test_a_block_that_does_not_match_is_left_out_with_a_warning(tmp_path: Path) -> None:
    data = analyze_run(_gloo_run(tmp_path), tmp_path)
    broken = copy.deepcopy(data)
    broken["job"] = {"strategy": 3}
    broken["memory"] = {"ranks": "nope"}
    broken["findings"] = [{"title": "only a title"}]
    broken["future_block"] = {"anything": 1}  # a newer mgprof's block: ignored
    broken["ranks"][0]["a_newer_field"] = [1, 2]  # likewise a field
    typed = decode_analysis(broken)
    assert typed.job is None and given(typed.memory) is None and given(typed.findings) is None
    notes = typed.warnings[len(data["warnings"]) :]
    assert [n.split(" left out")[0] for n in notes] == [
        "analysis block 'job'",
        "analysis block 'memory'",
        "analysis block 'findings'",
    ]
    assert "analysis.job.strategy" in notes[0] and "analysis.memory.ranks" in notes[1]
    # every other block is read as it was
    assert json.dumps(msgspec.to_builtins(typed.traces)) == json.dumps(data["traces"])
    assert len(typed.ranks) == 2 and typed.ranks[0].comm == decode_analysis(data).ranks[0].comm


def test_anything_decodes_without_an_exception() -> None:
    for data in (None, {}, {"ranks": 7}, {"version": "x"}, [1, 2], "text", {"traces": []}):
        typed = decode_analysis(data)  # type: ignore[arg-type]
        assert isinstance(typed, RunAnalysis)
    assert decode_analysis(None) == RunAnalysis()
    deep: Any = []
    for _ in range(100_000):
        deep = [deep]
    assert decode_analysis({"findings": deep}).warnings  # nested past any reader: a warning
    newer = decode_analysis({"version": ANALYSIS_VERSION + 1})
    assert newer.version == ANALYSIS_VERSION + 1 and "newer" in newer.warnings[0]
    same = RunAnalysis()
    assert decode_analysis(same) is same


def test_a_sweep_is_read_from_every_shape_it_was_stored_in() -> None:
    points = [{"batch_size": 64, "samples_per_s": 10.0}, {"batch_size": 32, "samples_per_s": 6.0}]
    shapes = [
        points,
        {"series": points},
        {"series": [{"name": "sweep", "points": points}]},
        {"series": {"batch_size": [64, 32], "samples_per_s": [10.0, 6.0]}},
        {"batch_size": [64, 32], "samples_per_s": [10.0, 6.0]},
    ]
    for shape in shapes:
        sweep = given(decode_analysis({"sweep": shape}).sweep)
        assert sweep is not None, shape
        (series,) = sweep.series
        assert [(p.batch_size, p.samples_per_s) for p in series.points] == [
            (64.0, 10.0),
            (32.0, 6.0),
        ]
    named = given(decode_analysis({"sweep": {"series": [{"strategy": "ddp", "points": []}]}}).sweep)
    assert named is not None and named.series[0].name == "ddp"


# ------------------------------------------------------------------ old and broken runs render


def _render_all(run: RunRecord, analysis: RunAnalysis) -> dict[str, str]:
    buf = io.StringIO()
    render_run(run, analysis, Console(file=buf, width=100), definitions=True)
    out = {"term": buf.getvalue(), "md": run_to_markdown(run, analysis)}
    out["json"] = run_to_json(run, analysis)
    try:
        from mgprof.report.html.page import run_to_html
    except ImportError:
        return out
    out["html"] = run_to_html(run, analysis)
    return out


def test_the_old_recorded_analysis_renders_as_stored() -> None:
    """The H200 run.json's own analysis (an earlier mgprof's: no regions, findings or noise
    scale, trace summaries without operators), rendered without analysing it again."""
    run_dir = DATA / "gpu" / "mgprof-run-h200"
    run = read_run(run_dir)
    typed = decode_analysis(run.analysis)
    assert typed.warnings == [] and given(typed.findings) is None
    assert given(typed.noise_scale) is None and typed.ranks[0].regions == []
    out = _render_all(run, typed)
    assert "Step time per rank" in out["term"] and "no findings" in out["term"]
    assert "Gradient noise scale" not in out["md"] and "## Top kernels" in out["md"]
    assert json.loads(out["json"])["analysis"]["ranks"][0]["rank"] == 0
    if "html" in out:
        assert "No operator table in this analysis" in out["html"]


def _broken_copy(tmp_path: Path) -> Path:
    """The H200 run directory with blocks ``mgprof report`` keeps from run.json broken."""
    run_dir = tmp_path / "h200"
    shutil.copytree(DATA / "gpu" / "mgprof-run-h200", run_dir)
    raw = json.loads((run_dir / "run.json").read_text())
    raw["analysis"]["memory"] = {"ranks": "not a list"}
    raw["analysis"]["comparison"] = {"rows": [{"strategy": 3}]}
    raw["analysis"]["sweep"] = "not a sweep"
    (run_dir / "run.json").write_text(json.dumps(raw))
    return run_dir


@pytest.mark.parametrize("fmt", ["term", "md", "json", "html"])
def test_a_run_json_with_broken_blocks_renders_in_every_format(
    fmt: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if fmt == "html":
        pytest.importorskip("plotly")
    run_dir = _broken_copy(tmp_path)
    out = tmp_path / f"report.{fmt}"
    args = ["report", str(run_dir), "--format", fmt]
    assert main([*args, "--out", str(out)] if fmt != "term" else args) == 0
    text = capsys.readouterr().out if fmt == "term" else out.read_text()
    assert "Traceback" not in text
    if fmt == "json":  # the analysis as stored beside the fresh figures: nothing dropped
        analysis = json.loads(text)["analysis"]
        assert analysis["memory"] == {"ranks": "not a list"} and "findings" in analysis
        return
    for block in ("memory", "comparison", "sweep"):
        assert f"analysis block &#x27;{block}&#x27; left out" in text or (
            f"analysis block '{block}' left out" in text
        ), block
    assert "Step time" in text


def test_findings_and_renderers_take_the_typed_analysis(tmp_path: Path) -> None:
    """A dict given to an entry point is decoded once at it; the result is what the typed
    analysis renders."""
    run = _gloo_run(tmp_path)
    data, typed = with_findings(run, analyze_run(run, tmp_path))
    assert run_to_markdown(run, data) == run_to_markdown(run, typed)
    assert run_to_json(run, data) == run_to_json(run, typed)


# ------------------------------------------------------------------ docs/reports.md


def test_docs_describe_the_analysis_from_the_schema() -> None:
    """docs/reports.md's "The analysis" section is ``python -m mgprof.analyze.run.schema``'s
    output, byte for byte (regenerate it after changing a record)."""
    from mgprof.analyze.run.schema import END_MARK, START_MARK

    docs = (ROOT / "docs" / "reports.md").read_text()
    start = docs.index(START_MARK)
    end = docs.index(END_MARK, start) + len(END_MARK) + 1
    assert docs[start:end] == schema_markdown(), (
        "docs/reports.md is out of date: replace its generated section with the output of "
        "`python -m mgprof.analyze.run.schema`"
    )
    assert docs[:start].endswith("## The analysis\n\n")
    for name in ("RunAnalysis", "RankAnalysis", "JobAnalysis", "RankTraceSummary", "Finding"):
        assert f"#### `{name}`" in docs


def test_the_schema_markdown_names_every_field_with_its_type() -> None:
    text = schema_markdown()
    assert "| `noise_scale` | absent or NoiseScale |" in text
    assert "| `job` | JobAnalysis \\| null |" in text
    assert "| `collective_calls` | absent or list[CollectiveCall] |" in text
    assert "Layout version (1)." in text
