"""report.html for every study: a comparison's and a sweep's page from their recorded JSON
(``tests/data/studies``: real records, no training here) with every table row, their charts
drawn in headless Chromium with no console error, ``mgprof report DIR --format html``; the run
report's fixes (Markdown code spans as ``<code>``, one kernel table, one colour per category);
and, slow, that ``mgprof compare`` and ``mgprof sweep`` write the page themselves."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from _spawn import clean_env, python_args, run, write_script

pytest.importorskip("plotly", reason="the HTML report needs plotly: pip install 'mgprof[html]'")

from mgprof.analyze.compare.scaling import Comparison, read_comparison
from mgprof.analyze.findings import evaluate_findings
from mgprof.analyze.run.analysis import analyze_run
from mgprof.analyze.sweep.result import SweepResult
from mgprof.cli import main
from mgprof.records import read_run
from mgprof.report import compare_view, sweep_view
from mgprof.report.html import page as html_report
from mgprof.report.html.palette import COLORS
from mgprof.report.html.study.compare_page import comparison_charts, comparison_to_html
from mgprof.report.html.study.sweep_page import sweep_charts, sweep_to_html
from mgprof.report.html.text import esc, prose, unintern_strings
from mgprof.studies.sweep import read_sweep
from tests._data import DATA, GPU, need
from tests.test_html_report import CHROMIUM, render_in_chromium

STUDIES = DATA / "studies"
COMPARE_DIR = STUDIES / "compare-fsdp-bf16"
SWEEPS = (STUDIES / "sweep-memory", STUDIES / "sweep-noise")
H200_RUN = GPU / "mgprof-run-h200"
SCRIPTS = Path(__file__).parent / "scripts"


def chart_data(text: str) -> dict[str, Any]:
    """chart id -> Plotly figure, from the page's one JSON block."""
    m = re.search(r'<script type="application/json" id="mgprof-charts">(.*?)</script>', text, re.S)
    assert m is not None
    return dict(unintern_strings(json.loads(m.group(1)))["charts"])


def without_plotly(text: str) -> str:
    """The page with the inlined plotly.js taken out (its minified code holds backticks, URLs)."""
    library = html_report.plotly_js()
    assert text.count(library) == 1
    return text.replace(library, "")


def assert_offline(text: str) -> None:
    """Nothing loads from anywhere: no external src/href, no URL, the no-network policy."""
    page = without_plotly(text)
    assert not re.search(r"<(script|link|img|iframe)\b[^>]*\b(src|href)=", page)
    assert "http://" not in page and "https://" not in page
    assert "default-src &#x27;none&#x27;" in page


def table_rows(text: str, section_id: str) -> list[list[str]]:
    """The cells (as text) of the first table in ``<section id=section_id>``."""
    start = text.index(f'<section id="{section_id}">')
    part = text[start : text.index("</section>", start)]
    body = part.split("<tbody>", 1)[1].split("</tbody>", 1)[0]
    return [
        [re.sub(r"<[^>]+>", "", cell) for cell in re.findall(r"<td[^>]*>(.*?)</td>", row)]
        for row in re.findall(r"<tr>(.*?)</tr>", body)
    ]


@pytest.fixture(scope="module")
def comparison() -> Comparison:
    return read_comparison(need(COMPARE_DIR / "comparison.json"))


@pytest.fixture(scope="module")
def compare_page(comparison: Comparison) -> str:
    return comparison_to_html(comparison)


@pytest.fixture(scope="module", params=SWEEPS, ids=lambda p: p.name)
def sweep(request: pytest.FixtureRequest) -> SweepResult:
    return read_sweep(need(Path(request.param) / "sweep.json"))


# ------------------------------------------------------------------ the comparison's page


def test_comparison_page_shows_every_row_of_every_table(
    comparison: Comparison, compare_page: str
) -> None:
    assert compare_page.startswith("<!DOCTYPE html>")
    assert_offline(compare_page)
    # the cells the terminal and report.md print, every row, in order (the last cell: links)
    cells = compare_view.table_cells(comparison)
    shown = table_rows(compare_page, "sec-strategies")
    assert [row[: len(compare_view.COLUMNS)] for row in shown] == [
        [esc(c) for c in row] for row in cells
    ]
    assert len(shown) == 6
    memory = compare_view.memory_cells(comparison)
    assert memory and table_rows(compare_page, "sec-memory-and-communication-per-rank") == [
        [esc(c) for c in row] for row in memory
    ]
    precision = compare_view.precision_cells(comparison)
    assert precision and table_rows(compare_page, "sec-precision") == [
        [esc(c) for c in row] for row in precision
    ]
    for header in (*compare_view.COLUMNS, *compare_view.MEMORY_COLUMNS):
        assert f">{esc(header)}</th>" in compare_page
    for line in compare_view.header_lines(comparison):
        assert f"<li>{esc(line)}</li>" in compare_page
    assert f"<strong>Answer:</strong> {prose(comparison.answer[0])}</p>" in compare_page
    for caveat in comparison.caveats:
        assert f"<li>{prose(caveat)}</li>" in compare_page
    for line in compare_view.note_lines(comparison):
        assert f"<li>{prose(line)}</li>" in compare_page


def test_comparison_page_links_every_run(comparison: Comparison, compare_page: str) -> None:
    for row in comparison.rows:
        for name in (row.run, *row.rounds_run):
            assert f'<a href="{name}/report.html">' in compare_page


def test_a_run_name_can_only_be_a_relative_link() -> None:
    comp = Comparison(script="s.py")
    comp.rows = [
        msgspec_row(run="javascript:alert(1)", strategy="single"),
        msgspec_row(run="../x y", strategy="ddp"),
    ]
    text = comparison_to_html(comp)
    assert 'href="javascript%3Aalert%281%29/report.html"' in text
    assert 'href="../x%20y/report.html"' in text
    assert "javascript:" not in without_plotly(text)


def msgspec_row(**fields: Any) -> Any:
    from mgprof.analyze.compare.scaling import Row

    return Row(devices=1, status="complete", **fields)


def test_speedup_chart_draws_each_rows_interval_and_memory_each_device(
    comparison: Comparison, compare_page: str
) -> None:
    charts = chart_data(compare_page)
    assert charts == comparison_charts(comparison)
    assert set(charts) == {"chart-speedup", "chart-peak-memory", "chart-model-state"}
    for chart_id in charts:
        assert f'<div class="chart" id="{chart_id}"></div>' in compare_page
    point = charts["chart-speedup"]["data"][0]
    rows = comparison.rows
    assert point["x"] == [compare_view.row_label(r) for r in rows]
    assert point["y"] == pytest.approx([r.speedup for r in rows])
    for i, r in enumerate(rows):
        plus, minus = point["error_y"]["array"][i], point["error_y"]["arrayminus"][i]
        if r.speedup_low is None:
            assert plus is None and minus is None
        else:  # the bar spans the row's own interval
            assert r.speedup + plus == pytest.approx(r.speedup_high)
            assert r.speedup - minus == pytest.approx(r.speedup_low)
    bars = charts["chart-peak-memory"]["data"]
    assert [b["name"] for b in bars] == ["device 0", "device 1"]
    assert bars[1]["y"] == [r.peak_mem_mib[1] if len(r.peak_mem_mib) > 1 else None for r in rows]
    state = {t["name"]: t for t in charts["chart-model-state"]["data"]}
    assert state["parameters"]["y"] == [r.params_mib for r in rows]
    assert state["optimizer state"]["marker"]["color"] == COLORS["optimizer state"]


# ------------------------------------------------------------------ the sweep's page


def test_sweep_page_shows_the_answer_every_trial_and_the_caveats(sweep: SweepResult) -> None:
    text = sweep_to_html(sweep)
    assert_offline(text)
    for key, value in sweep_view.facts(sweep):
        assert f"<tr><th>{esc(key)}</th><td>{esc(value)}</td></tr>" in text
    shown = table_rows(text, "sec-trials")
    names = sweep_view.columns(sweep)
    assert [row[: len(names)] for row in shown] == [
        [esc(c) for c in row] for row in sweep_view.rows(sweep)
    ]
    assert len(shown) == len(sweep.trials) == 5
    for trial, row in zip(sweep_view.trial_order(sweep), shown, strict=True):
        assert (row[-1] == "report") == bool(trial.run_dir)
        if trial.run_dir:
            assert f'<a href="{trial.run_dir}/report.html">' in text
    for note in sweep_view.caveats(sweep):
        assert f"<li>{prose(note)}</li>" in text


def test_sweep_charts_mark_the_sweet_spot_and_b_simple(sweep: SweepResult) -> None:
    text = sweep_to_html(sweep)
    charts = chart_data(text)
    assert charts == sweep_charts(sweep)
    expected = {"chart-sweep-throughput", "chart-sweep-comm"}
    if any(t.peak_memory_mib is not None for t in sweep.trials):
        expected.add("chart-sweep-memory")
    assert set(charts) == expected
    fitted = sorted((t for t in sweep.trials if t.status == "ok"), key=lambda t: t.batch_size)
    for chart_id, fig in charts.items():
        assert f'<div class="chart" id="{chart_id}"></div>' in text
        names = [t["name"] for t in fig["data"]]
        spot = next(t for t in fig["data"] if t["name"].startswith("sweet spot (knee)"))
        assert spot["x"] == [sweep.sweet_spot] * 2
        b_line = next(t for t in fig["data"] if t["name"].startswith("B_simple ≈"))
        ns = sweep_view.noise_scale_of(sweep)
        assert ns is not None and ns.estimate is not None and ns.estimate.b_simple
        per_device = ns.estimate.b_simple * fitted[0].batch_size / fitted[0].global_batch
        assert b_line["x"][0] == pytest.approx(per_device)
        assert any(n.startswith("B_simple 95 % band") for n in names)
        assert fig["layout"]["xaxis"]["type"] == "log"
        # the axis holds every size tried and B_simple
        lo, hi = (10**v for v in fig["layout"]["xaxis"]["range"])
        assert lo < min(t.batch_size for t in sweep.trials) and hi > max(per_device, 1)
    throughput = charts["chart-sweep-throughput"]["data"][0]
    assert throughput["x"] == [t.batch_size for t in fitted]
    assert throughput["y"] == [t.samples_per_s for t in fitted]
    assert throughput["line"]["color"] == COLORS["throughput"]


def test_sweep_memory_chart_shows_the_capacity_and_the_predicted_size() -> None:
    sweep = read_sweep(need(SWEEPS[0] / "sweep.json"))
    fig = sweep_charts(sweep)["chart-sweep-memory"]
    by_name = {t["name"]: t for t in fig["data"]}
    skipped = [t for t in sweep.trials if t.status == "skipped"]
    assert skipped and by_name["predicted (not run)"]["x"] == [t.batch_size for t in skipped]
    assert sweep.capacity_mib is not None
    assert by_name[f"capacity {sweep.capacity_mib:,.0f} MiB"]["y"] == [sweep.capacity_mib] * 2


# ------------------------------------------------------------------ mgprof report DIR --format html


@pytest.mark.parametrize("source", [COMPARE_DIR, *SWEEPS], ids=lambda p: p.name)
def test_report_renders_a_study_directory_as_html(
    source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / source.name
    shutil.copytree(source, folder)
    record = next(folder.glob("*.json"))
    assert main(["report", str(folder), "--format", "html"]) == 0
    page = folder / "report.html"
    assert f"wrote {page}" in capsys.readouterr().out
    text = page.read_text()
    assert text.startswith("<!DOCTYPE html>") and chart_data(text)
    # again from the JSON file itself: the page beside it, replaced
    page.write_text("old")
    assert main(["report", str(record), "--format", "html"]) == 0
    assert page.read_text() == text and f"wrote {page}" in capsys.readouterr().out
    out = tmp_path / "elsewhere.html"
    assert main(["report", str(folder), "--format", "html", "--out", str(out)]) == 0
    assert "wrote" not in capsys.readouterr().out
    assert out.read_text() == text
    # --out that exists needs --force; the record itself is never overwritten
    assert main(["report", str(folder), "--format", "html", "--out", str(out)]) == 2
    assert main(["report", str(folder), "--format", "html", "--out", str(record), "--force"]) == 2


# ------------------------------------------------------------------ the run report's fixes


@pytest.fixture(scope="module")
def h200_page() -> str:
    run_record = read_run(need(H200_RUN))
    analysis = analyze_run(run_record, H200_RUN)
    analysis["findings"] = evaluate_findings(run_record, analysis)
    return html_report.run_to_html(run_record, analysis)


def test_run_report_shows_code_spans_as_code(h200_page: str) -> None:
    page = without_plotly(h200_page)
    findings = page[page.index('<ul class="findings">') :].split("</ul>", 1)[0]
    assert findings.count("<li") >= 3
    assert "`" not in findings and "<code>.item()</code>" in findings
    assert "`" not in page  # notes and definitions too
    assert prose("a `b<c>` d") == "a <code>b&lt;c&gt;</code> d"
    assert prose("one ` tick") == "one ` tick" and prose("``x``") == "<code>x</code>"


def view_of(page: str, view: str) -> str:
    part = page[page.index(f'id="view-{view}"') :]
    end = part.find('<section class="view"')
    return part if end < 0 else part[:end]


def test_run_report_has_one_kernel_table(h200_page: str) -> None:
    assert h200_page.count("<h2>Top kernels</h2>") == 1
    assert h200_page.count('data-table="kernels-table"') == 1
    kernels = view_of(h200_page, "kernels")
    # the shared section's rows wait inside the sortable table's element, which the script
    # fills in their place: one table, with its static copy shown only until it is drawn
    assert kernels.count("<table>") == 1
    assert kernels.split('data-table="kernels-table">', 1)[1].startswith("<table>")


def test_one_colour_per_category_in_every_chart(h200_page: str) -> None:
    """Idle (and each part) has the same colour in the Overview and the Distributed view."""
    m = re.search(r'id="mgprof-charts">(.*?)</script>', h200_page, re.S)
    assert m is not None
    data = unintern_strings(json.loads(m.group(1)))
    figures = [data["charts"]["chart-step-breakdown"], data["figures"]["ov-step-breakdown"]["all"]]
    figures += [data["figures"]["ov-tensor-cores"]["all"], data["figures"]["kernels-top"]["all"]]
    seen: dict[str, set[str]] = {}
    for fig in figures:
        for trace in fig["data"]:
            seen.setdefault(trace["name"], set()).add(trace["marker"]["color"])
    assert seen["idle"] == {COLORS["idle"]}
    assert seen["compute (incl. overlapped comm)"] == {COLORS["compute"]}
    assert seen["other kernels"] == {COLORS["other kernels"]}
    assert all(len(colours) == 1 for colours in seen.values()), seen


# ------------------------------------------------------------------ headless Chromium


def assert_drawn(dom: str, console: list[str], charts: set[str]) -> None:
    """Every chart drawn (an SVG in it, marked), no console error, no error on the page."""
    bad = [c for c in console if re.search(r"error|uncaught|refused|failed", c, re.I)]
    assert not bad, bad
    found = re.findall(r'<div class="chart[^"]*" id="([^"]+)"([^>]*)>', dom)
    assert {c for c, attrs in found if 'data-rendered="1"' in attrs} == {c for c, _ in found}
    assert {c for c, _ in found} == charts
    assert dom.count('class="main-svg"') >= len(charts) and "data-ready-ms" in dom
    errors = re.search(r'<div id="mgprof-errors"([^>]*)>(.*?)</div>', dom, re.S)
    assert errors is not None and "hidden" in errors.group(1) and errors.group(2) == ""


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install chromium)")
def test_kernels_view_draws_one_table_in_headless_chromium(h200_page: str, tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    page.write_text(h200_page)
    dom, console = render_in_chromium(page, tmp_path / "profile", fragment="view=kernels")
    kernels = view_of(dom, "kernels")
    assert 'data-view-rendered="1"' in kernels.split(">", 1)[0]
    assert kernels.count("<table") == 1 and 'data-rows="18"' in kernels
    assert "<h2>Top kernels</h2>" in kernels
    bad = [c for c in console if re.search(r"error|uncaught|refused|failed", c, re.I)]
    assert not bad, bad


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install chromium)")
def test_study_pages_draw_in_headless_chromium(comparison: Comparison, tmp_path: Path) -> None:
    pages = [(comparison_to_html(comparison), set(comparison_charts(comparison)))]
    for folder in SWEEPS:
        result = read_sweep(need(folder / "sweep.json"))
        pages.append((sweep_to_html(result), set(sweep_charts(result))))
    for i, (text, charts) in enumerate(pages):
        page = tmp_path / f"page{i}" / "report.html"
        page.parent.mkdir()
        page.write_text(text)
        dom, console = render_in_chromium(page, tmp_path / f"profile{i}")
        assert_drawn(dom, console, charts)
        assert re.search(r"<h2>(Strategies|Trials)</h2>", dom)


# ------------------------------------------------------------------ the studies write the page

LOADER = """
import os
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = TensorDataset(torch.randn(4096, 16), torch.randn(4096, 1))
gen = torch.Generator().manual_seed(1 + int(os.environ.get("RANK", "0")))
for x, y in DataLoader(data, batch_size=4, shuffle=True, generator=gen):
    opt.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()
"""


@pytest.mark.slow
def test_compare_writes_report_html(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import mgprof

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    comp = mgprof.compare(
        SCRIPTS / "plain_loop.py", gpus=2, strategies="single,ddp", rounds=1, trace_steps=1,
        steps=4, warmup=1, nosync_steps=0, out=tmp_path,
    )  # fmt: skip
    folder = tmp_path / comp.comparison_id
    text = (folder / "report.html").read_text()
    assert (folder / "report.md").exists() and (folder / "comparison.json").exists()
    assert [row[0] for row in table_rows(text, "sec-strategies")] == ["single", "ddp"]
    assert "chart-speedup" in chart_data(text)
    for row in comp.rows:
        assert (folder / row.run / "report.html").exists()
        assert f'<a href="{row.run}/report.html">' in text


@pytest.mark.slow
def test_sweep_writes_report_html(tmp_path: Path) -> None:
    script = write_script(tmp_path, "loader.py", LOADER)
    out = tmp_path / "runs"
    args = ["--gpus", "1", "--batch-sizes", "8,16", "--steps", "4", "--warmup", "1",
            "--trace-steps", "1", "--quiet", "--format", "json", "--out", out]  # fmt: skip
    result = run(python_args("-m", "mgprof", "sweep", script, *args), cwd=tmp_path,
                 env=clean_env(), timeout_s=240)  # fmt: skip
    assert result.returncode == 0, result.explain()
    (folder,) = [p for p in out.iterdir() if p.name.endswith("-sweep-loader")]
    text = (folder / "report.html").read_text()
    assert [row[0] for row in table_rows(text, "sec-trials")] == ["8", "16"]
    assert "chart-sweep-throughput" in chart_data(text)
    assert text == sweep_to_html(read_sweep(folder))
