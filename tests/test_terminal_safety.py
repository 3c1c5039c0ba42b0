"""Strings from data are printed as text in every renderer: never markup, never a terminal command.

Hostile kernel/op names, hostnames, script paths, error text and run-directory paths (rich markup,
OSC-8 hyperlinks, ANSI escapes, BEL/CR, bidi overrides, ``|``, ``<script>``) go through the real
renderers and the real CLI (``mgprof trace``, ``mgprof report``). The output must hold no raw
control character but newline and tab (colour codes aside when a terminal is forced), no OSC-8
hyperlink, the names visible in escaped form, and, in Markdown and HTML, no markup from data.
"""

from __future__ import annotations

import html
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from mgprof.analyze.compare.scaling import Comparison, NotApplicable, Row
from mgprof.analyze.run.analysis import analyze_run
from mgprof.analyze.run.schema import RunAnalysis, decode_analysis
from mgprof.analyze.sweep.result import SweepResult
from mgprof.analyze.sweep.trials import Trial
from mgprof.cli import main
from mgprof.errors import UsageError
from mgprof.records import (
    DeviceInfo,
    DeviceSamples,
    RankRecord,
    RunRecord,
    SamplerRecord,
    StepRecord,
    decode_run,
    encode_run,
)
from mgprof.report import safe_text
from mgprof.report.compare_view import (
    comparison_to_json,
    comparison_to_markdown,
    render_comparison,
)
from mgprof.report.doctor_view import render_bandwidth, render_doctor
from mgprof.report.run.markdown import run_to_markdown
from mgprof.report.run.summary_lines import summary_lines
from mgprof.report.run.terminal import render_run
from mgprof.report.sweep_view import render_sweep, sweep_to_json, sweep_to_markdown, trial_line
from mgprof.run.finish import print_report
from tests._analysis import trace_summary

CLOSE_TAG = "[/x]"
LINK_MARKUP = "[link=https://evil.example]x[/link]"
OSC8 = "\x1b]8;;https://evil.example\x1b\\x\x1b]8;;\x1b\\"
CLEAR = "\x1b[2J"
PIPE = "a|b"
SCRIPT = "<script>alert(1)</script>"
CLOSE_SCRIPT = "</script>"
BIDI = "abc\u202edef"
BELL_CR = "x\x07y\rz"
UNICODE = "µs × — 名前"
HOSTILE = [CLOSE_TAG, LINK_MARKUP, OSC8, CLEAR, PIPE, SCRIPT, CLOSE_SCRIPT, BIDI, BELL_CR, UNICODE]

SGR = re.compile(r"\x1b\[[0-9;]*m")
"""Colour codes rich writes itself when a terminal is forced: the only escapes allowed."""
EVIL_DIR = f"run {CLOSE_TAG} {CLEAR}"
"""A run-directory path (two levels: '/' splits it) holding rich markup and an ANSI escape."""


def escaped(text: str) -> str:
    """How ``safe_text.printable`` shows ``text``."""
    return safe_text.printable(text)


def assert_inert(out: str, colour: bool = False) -> str:
    """No OSC-8 hyperlink; no control character but newline and tab (SGR colour codes too when
    ``colour``); no bidi override. Returns the text with colour codes removed."""
    assert "\x1b]8;" not in out, "an OSC-8 hyperlink reached the output"
    text = SGR.sub("", out) if colour else out
    bad = sorted(
        {
            repr(ch)
            for ch in text
            if (ord(ch) < 0x20 and ch not in "\n\t")
            or 0x7F <= ord(ch) <= 0x9F
            or ch in "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
        }
    )
    assert not bad, f"raw control characters in the output: {bad}"
    return text


def assert_names_visible(text: str, names: list[str] = HOSTILE) -> None:
    flat = text.replace("\n", "")
    for name in names:
        assert escaped(name) in flat, f"{escaped(name)!r} not shown"


def forced_console(buf: io.StringIO) -> Console:
    return Console(file=buf, force_terminal=True, color_system="truecolor", width=250)


@pytest.fixture
def forced_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's own ``Console()`` believes it writes to a wide colour terminal."""
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.setenv("COLUMNS", "250")


# --------------------------------------------------------------------------------------------
# safe_text


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("\x1b[2J", "\\x1b[2J"),
        ("a\x07b", "a\\x07b"),
        ("a\rb", "a\\rb"),
        ("a\nb", "a\\nb"),
        ("a\tb", "a\tb"),
        ("\x00\x7f\x85\x9b", "\\x00\\x7f\\x85\\x9b"),
        ("abc\u202edef\u2066", "abc\\u202edef\\u2066"),
        ("x\u2028y", "x\\u2028y"),
        ("bad\udcffpath", "bad\\udcffpath"),
        (UNICODE, UNICODE),
        ("Ελληνικά العربية 😀", "Ελληνικά العربية 😀"),
        (LINK_MARKUP, LINK_MARKUP),
    ],
)
def test_printable_escapes_controls_and_keeps_text(raw: str, shown: str) -> None:
    assert safe_text.printable(raw) == shown


def test_printable_multiline_keeps_newlines_only() -> None:
    assert safe_text.printable("a\nb\r\n\x1b", multiline=True) == "a\nb\\r\n\\x1b"


def test_rich_text_is_never_markup_nor_a_link() -> None:
    buf = io.StringIO()
    console = forced_console(buf)
    for name in HOSTILE:
        console.print(safe_text.rich_text(name, highlight=True))
    assert_names_visible(assert_inert(buf.getvalue(), colour=True))


def test_json_text_escapes_what_msgspec_leaves_raw() -> None:
    import msgspec

    value = {"name": f"{CLEAR}\x9b31m{BIDI}\x7f\u2028{UNICODE}"}
    raw = msgspec.json.encode(value).decode()
    assert "\x9b" in raw and "\u202e" in raw  # msgspec writes C1 and bidi as UTF-8
    text = safe_text.json_text(raw)
    assert_inert(text)
    assert json.loads(text) == value and UNICODE in text


def test_markdown_helpers() -> None:
    assert safe_text.md_text(f"{PIPE} {SCRIPT}") == "a\\|b &lt;script&gt;alert(1)&lt;/script&gt;"
    assert safe_text.md_text("x\ny\x1b") == "x y\\\\x1b"
    assert safe_text.md_code("a`b|c") == "``a`b\\|c``"
    assert safe_text.md_link("x](y", "run [1]/report.md") == "[x\\](y](run%20%5B1%5D/report.md)"


# --------------------------------------------------------------------------------------------
# Run reports (terminal, Markdown, HTML) from a hostile run record


def trace_doc(names: list[str]) -> dict[str, Any]:
    """A small Kineto-like trace: one CPU op and one kernel per name."""
    events = []
    for i, name in enumerate(names):
        events.append(
            {"ph": "X", "cat": "cpu_op", "name": name, "pid": 0, "tid": 1, "ts": i * 20, "dur": 5}
        )
        events.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": name,
                "pid": 0,
                "tid": 7,
                "ts": i * 20 + 1,
                "dur": 100 - i,  # the first names are the heaviest kernels
            }
        )
    return {"traceEvents": events}


def fake_summary(path: Path) -> dict[str, Any]:
    """What the trace engine would say: the hostile names as top kernels."""
    return trace_summary(
        kind="cpu",
        totals={"window_us": 1000.0, "busy_pct": 50.0, "comm_pct": 0.0},
        top_kernels=[
            {"name": n, "count": 1, "total_us": 10.0, "pct_of_compute": 10.0, "kind": "compute"}
            for n in HOSTILE[:5]  # the report lists five per rank
        ],
    )


def hostile_run(**kw: Any) -> RunRecord:
    ranks = [
        RankRecord(
            rank=r,
            world_size=2,
            host=f"node{r}{CLEAR}{OSC8}",
            device=DeviceInfo(kind="cpu", name=LINK_MARKUP),
            steps=[StepRecord(index=i, duration_ms=10.0 + r, batch_size=4) for i in range(4)],
            traces=["rank0.json"],
            warnings=[f"warn {CLOSE_TAG} {BELL_CR}"],
            sampler=SamplerRecord(
                kind="cpu",
                devices=[
                    DeviceSamples(
                        device=f"cpu {SCRIPT}",
                        t_s=[0.0, 1.0],
                        columns={"cpu_pct": [10.0, 20.0]},
                        facts={"started_unix_s": 1.0},
                    )
                ],
            ),
        )
        for r in range(2)
    ]
    base: dict[str, Any] = {
        "run_id": f"id {CLOSE_TAG}",
        "script": f"/tmp/train{CLEAR}.py",
        "script_args": [LINK_MARKUP, BIDI],
        "world_size": 2,
        "strategy": "ddp",
        "backend": "gloo",
        "ranks": ranks,
    }
    base.update(kw)
    return RunRecord(**base)


def hostile_data(run: RunRecord, tmp_path: Path) -> dict[str, Any]:
    """The analysis dict, hostile names in every block a renderer shows."""
    (tmp_path / "rank0.json").write_text("{}")
    analysis = analyze_run(run, tmp_path, trace_analyzer=fake_summary)
    analysis["findings"] = [
        {
            "id": "hostile",
            "severity": "high",
            "title": f"title {LINK_MARKUP}",
            "evidence": f"evidence {OSC8} {CLOSE_TAG}",
            "cause": f"cause {SCRIPT}",
            "change": f"change {CLEAR}",
            "fix": [],
            "saving": f"saving {BIDI}",
            "rule": f"rule {CLOSE_SCRIPT}",
        }
    ]
    analysis["definitions"] = {f"def {CLOSE_TAG}": f"means {OSC8}"}
    analysis["comparison"] = {
        "rows": [
            {
                "strategy": f"{CLOSE_SCRIPT}{SCRIPT}",
                "devices": 2,
                "run": f"run {SCRIPT}",
                "status": "complete",
                "samples_per_s": 5.0,
            }
        ]
    }
    return analysis


def hostile_analysis(run: RunRecord, tmp_path: Path) -> RunAnalysis:
    """:func:`hostile_data` decoded, as the renderers read it."""
    analysis = decode_analysis(hostile_data(run, tmp_path))
    assert analysis.warnings == [] and analysis.findings and analysis.comparison
    return analysis


def test_terminal_run_report_prints_data_as_text(tmp_path: Path) -> None:
    run = hostile_run()
    buf = io.StringIO()
    render_run(run, hostile_analysis(run, tmp_path), forced_console(buf))
    text = assert_inert(buf.getvalue(), colour=True)
    assert_names_visible(text, [*HOSTILE[:5], BIDI, BELL_CR])
    for part in (f"node0{CLEAR}{OSC8}", f"/tmp/train{CLEAR}.py", f"evidence {OSC8}"):
        assert escaped(part) in text
    assert "Setup" in text and "Top kernels" in text and "Findings" in text


def test_failure_summary_prints_error_and_traceback_as_text(tmp_path: Path) -> None:
    tb = (
        "Traceback (most recent call last):\n"
        '  File "/tmp/train.py", line 3, in <module>\n'
        "    boom()\n"
        f"ValueError: bad {OSC8} {CLOSE_TAG} {CLEAR}\n"
    )
    run = hostile_run(status="incomplete", error=f"rank 0 failed first {LINK_MARKUP}", exit_code=1)
    run.ranks[0].error = tb
    run.ranks[0].steps = run.ranks[0].steps[:1]
    run.ranks[1].steps = run.ranks[1].steps[:1]
    analysis = hostile_analysis(run, tmp_path)
    buf = io.StringIO()
    render_run(run, analysis, forced_console(buf))
    text = assert_inert(buf.getvalue(), colour=True)
    assert "Run failed" in text
    assert escaped(f"ValueError: bad {OSC8} {CLOSE_TAG} {CLEAR}") in text
    assert LINK_MARKUP in text
    md = run_to_markdown(run, analysis)
    assert_inert(md)
    assert "## Run failed" in md and escaped(f"ValueError: bad {OSC8}") in md


def _cells(row: str) -> int:
    """Cells of a GFM table row: ``|`` not preceded by a backslash splits."""
    return len(re.split(r"(?<!\\)\|", row.strip())) - 2


def test_markdown_report_escapes_controls_markup_and_html(tmp_path: Path) -> None:
    run = hostile_run()
    md = run_to_markdown(run, hostile_analysis(run, tmp_path))
    assert_inert(md)
    assert "<script" not in md and "</script" not in md
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in md
    assert "a\\|b" in md
    assert "\\\\x1b\\[2J" in md  # ESC shown as \x1b, its backslash and bracket escaped
    assert "\\[link=https://evil.example\\]x\\[/link\\]" in md
    lines = md.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("|---") or line.startswith("|--"):
            width = _cells(lines[i - 1])
            j = i + 1
            while j < len(lines) and lines[j].startswith("|"):
                assert _cells(lines[j]) == width, lines[j]
                j += 1


def _without_plotly_js(page: str) -> str:
    from plotly.offline import get_plotlyjs

    js = str(get_plotlyjs())
    assert js in page
    return page.replace(js, "")


def assert_html_safe(page: str) -> None:
    """Only the report's own three scripts; data shows as text, JSON cannot close its script."""
    assert "\x1b" not in page and "\x07" not in page
    body = _without_plotly_js(page)
    assert body.count("<script") == 3 and body.count("</script>") == 3
    assert "alert(1)</" not in body
    start = body.index('<script type="application/json" id="mgprof-charts">')
    block = body[start:].split(">", 1)[1].split("</script>", 1)[0]
    assert "<" not in block and ">" not in block
    charts = json.loads(block)
    labels = json.dumps(charts)
    assert html.escape(escaped(f"{CLOSE_SCRIPT}{SCRIPT}")) in labels  # comparison x label
    assert html.escape(escaped(f"cpu {SCRIPT}")) in labels  # sampler device series name


def test_html_report_escapes_text_chart_labels_and_json(tmp_path: Path) -> None:
    pytest.importorskip("plotly")
    from mgprof.report.html.page import run_to_html

    run = hostile_run()
    page = run_to_html(run, hostile_analysis(run, tmp_path))
    assert_html_safe(page)
    assert html.escape(SCRIPT) in page
    assert html.escape(escaped(f"evidence {OSC8}")) in page


# --------------------------------------------------------------------------------------------
# The CLI end to end: mgprof trace, mgprof report


def test_trace_cli_prints_hostile_names_as_text(
    tmp_path: Path, forced_terminal: None, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / EVIL_DIR
    folder.mkdir(parents=True)
    (folder / "rank-0.json").write_text(json.dumps(trace_doc(HOSTILE)))
    assert main(["trace", "--workers", "1", str(folder / "rank-0.json")]) == 0
    out = capsys.readouterr().out
    assert "\x1b[" in out, "the terminal was not forced: colour codes expected"
    text = assert_inert(out, colour=True)
    assert "Top kernels" in text
    assert_names_visible(text)
    assert escaped(EVIL_DIR) in text


def write_hostile_run_dir(tmp_path: Path) -> Path:
    folder = tmp_path / EVIL_DIR
    folder.mkdir(parents=True)
    (folder / "rank0.json").write_text(json.dumps(trace_doc(HOSTILE)))
    run = hostile_run(analysis={"comparison": hostile_data(hostile_run(), tmp_path)["comparison"]})
    (folder / "run.json").write_bytes(encode_run(run))
    return folder


@pytest.mark.parametrize("fmt", ["term", "md", "html", "json"])
def test_report_cli_every_format_prints_data_as_text(
    fmt: str, tmp_path: Path, forced_terminal: None, capsys: pytest.CaptureFixture[str]
) -> None:
    if fmt == "html":
        pytest.importorskip("plotly")
    folder = write_hostile_run_dir(tmp_path)
    assert main(["report", str(folder), "--format", fmt]) == 0
    out = capsys.readouterr().out
    if fmt == "term":
        text = assert_inert(out, colour=True)
        assert "Top kernels" in text
        assert_names_visible(text, HOSTILE[:5])  # the report's five heaviest kernels
        assert escaped(f"node0{CLEAR}{OSC8}") in text
    elif fmt == "json":
        assert_inert(out)
        back = decode_run(out.encode())
        assert (
            back.script == f"/tmp/train{CLEAR}.py" and back.ranks[0].host == f"node0{CLEAR}{OSC8}"
        )
    elif fmt == "md":
        assert_inert(out)
        assert "<script" not in out and "</script" not in out and "a\\|b" in out
        assert "## Top kernels" in out
    else:  # the page goes beside run.json; the printed path is text
        assert_inert(out)
        assert escaped(str(folder / "report.html")) in out
        assert_html_safe((folder / "report.html").read_text())


# --------------------------------------------------------------------------------------------
# The other views


def test_doctor_view_prints_environment_as_text() -> None:
    env = {
        "mgprof": "0.1",
        "python": {"version": f"3.11 {CLOSE_TAG}"},
        "platform": {"system": "Linux", "release": CLEAR, "machine": "x86_64"},
        "torch": {"version": LINK_MARKUP, "distributed": {"gloo": True}},
        "nvml": {"ok": False, "reason": OSC8},
        "env": {"CUDA_VISIBLE_DEVICES": f"0,1{BELL_CR}"},
        "gpus": [{"cuda_index": 0, "name": SCRIPT, "nvml_mapping_error": f"no map {CLOSE_TAG}"}],
        "fallbacks": [f"fallback {OSC8}"],
        "probe_errors": [f"probe {CLOSE_TAG} {BIDI}"],
    }
    buf = io.StringIO()
    render_doctor(env, forced_console(buf))
    text = assert_inert(buf.getvalue(), colour=True)
    assert_names_visible(text, [CLOSE_TAG, LINK_MARKUP, CLEAR, OSC8, SCRIPT, BELL_CR, BIDI])
    assert "probe failed" in text and "mgprof will fall back to" in text

    buf = io.StringIO()
    result = {
        "world_size": 2,
        "backend": "gloo",
        "device": f"cpu {LINK_MARKUP}",
        "iters": 3,
        "rows": [{"op": f"all_reduce{CLEAR}", "bytes": 64, "error": f"failed {OSC8} {CLOSE_TAG}"}],
    }
    render_bandwidth(result, forced_console(buf))
    text = assert_inert(buf.getvalue(), colour=True)
    assert_names_visible(text, [LINK_MARKUP, CLEAR, OSC8, CLOSE_TAG])


def hostile_comparison() -> Comparison:
    return Comparison(
        comparison_id=f"cmp {CLOSE_TAG}",
        script=f"train{CLEAR}.py",
        script_args=[LINK_MARKUP],
        rows=[
            Row(
                strategy=f"ddp {PIPE}",
                devices=2,
                run=f"run{OSC8}",
                status="complete",
                samples_per_s=10.0,
                notes=[f"note {SCRIPT} {BIDI}"],
            )
        ],
        not_applicable=[NotApplicable(strategy="dp", reason=f"no {CLOSE_TAG} {BELL_CR}")],
        runs={f"ddp {PIPE}": f"20250101-ddp {CLOSE_SCRIPT}"},
        verdict=f"verdict {OSC8}",
    )


def test_compare_view_prints_data_as_text() -> None:
    comp = hostile_comparison()
    buf = io.StringIO()
    render_comparison(comp, forced_console(buf), f"out/{EVIL_DIR}")
    text = assert_inert(buf.getvalue(), colour=True)
    assert_names_visible(text, [CLOSE_TAG, CLEAR, LINK_MARKUP, PIPE, SCRIPT, BIDI, BELL_CR, OSC8])
    assert escaped(f"comparison directory: out/{EVIL_DIR}") in text
    md = comparison_to_markdown(comp)
    assert_inert(md)
    assert "<script" not in md and "</script" not in md
    assert "| ddp a\\|b | 2 |" in md
    assert "(20250101-ddp%20%3C/script%3E/report.md)" in md
    text = comparison_to_json(comp)
    assert_inert(text)
    assert json.loads(text)["verdict"] == f"verdict {OSC8}"


def hostile_sweep() -> SweepResult:
    return SweepResult(
        script=f"train{CLEAR}.py {CLOSE_TAG}",
        sweep_dir=f"out/{EVIL_DIR}",
        memory_definition=LINK_MARKUP,
        trials=[
            Trial(batch_size=8, status="ok", global_batch=16, samples_per_s=10.0),
            Trial(batch_size=16, status="failed", error=f"boom {OSC8} {CLOSE_TAG} {BELL_CR}"),
        ],
        trial_count=2,
        stop_reason=f"stopped {SCRIPT}",
        caveats=[f"caveat {BIDI} {PIPE}"],
    )


def test_sweep_view_prints_data_as_text() -> None:
    result = hostile_sweep()
    buf = io.StringIO()
    render_sweep(result, forced_console(buf))
    text = assert_inert(buf.getvalue(), colour=True)
    assert_names_visible(text, [CLEAR, CLOSE_TAG, LINK_MARKUP, SCRIPT, BIDI, PIPE, EVIL_DIR])
    md = sweep_to_markdown(result)
    assert_inert(md)
    assert "<script" not in md and "caveat abc\\\\u202edef a\\|b" in md
    text = sweep_to_json(result)
    assert_inert(text)
    assert json.loads(text)["caveats"] == [f"caveat {BIDI} {PIPE}"]
    line = trial_line(result.trials[1])
    assert_inert(line)
    assert escaped(f"boom {OSC8} {CLOSE_TAG} {BELL_CR}") in line


# --------------------------------------------------------------------------------------------
# Paths and end-of-run lines


def test_end_of_run_paths_are_text(
    tmp_path: Path, forced_terminal: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """``mgprof analyze --out '[/x]'``: the closing lines print the path, never crash on it."""
    run = hostile_run()
    analysis = hostile_analysis(run, tmp_path)
    run_dir = tmp_path / EVIL_DIR
    print_report(run, analysis, run_dir, "term")
    text = assert_inert(capsys.readouterr().out, colour=True)
    assert escaped(f"run directory: {run_dir}") in text
    assert escaped(f"re-render:   mgprof report {run_dir}") in text


def test_summary_lines_escape_path_error_and_title(tmp_path: Path) -> None:
    run = hostile_run(status="incomplete", error=f"bad {OSC8}\nsecond line {BELL_CR}")
    analysis = hostile_analysis(run, tmp_path)
    lines = summary_lines(run, analysis, f"runs/{EVIL_DIR}", ["report.md"])
    for line in lines:
        assert_inert(line)
    joined = "\n".join(lines)
    assert escaped(f"runs/{EVIL_DIR}") in joined
    assert escaped(f"bad {OSC8}") in joined and escaped(f"second line {BELL_CR}") in joined
    assert escaped(f"title {LINK_MARKUP}") in joined


def test_view_usage_error_shows_the_path_escaped(tmp_path: Path) -> None:
    from mgprof.commands import view

    with pytest.raises(UsageError) as err:
        view._logdir(tmp_path / f"missing {CLEAR}")
    assert_inert(str(err.value))
    assert escaped(f"missing {CLEAR}") in str(err.value)
