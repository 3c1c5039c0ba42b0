"""``mgprof diff`` rendered: the same sections in the terminal, in Markdown and as one HTML file.

The sections are built once (``diff_sections``) from the diff's plain data and handed to the run
report's renderers, so escaping, 80-column fitting and styling are the run report's.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.text import Text

from mgprof.report.run.section_model import Section, Table

_TOP_COMPONENTS = 15


def _num(value: Any, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return f"{value:,.{digits}f}"


def _signed(value: Any, digits: int = 1, unit: str = "") -> str:
    if value is None:
        return "n/a"
    return f"{value:+,.{digits}f}".replace("-", "−") + unit


def _ci(metric: Mapping[str, Any]) -> str:
    ci = metric.get("ci_pct")
    if not ci:
        return "n/a"
    return f"{_signed(ci[0])}…{_signed(ci[1])} %"


def _p(metric: Mapping[str, Any]) -> str:
    p = metric.get("p_value")
    if p is None:
        return "n/a"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def _verdict_cell(metric: Mapping[str, Any]) -> str:
    sig = metric.get("significant")
    if sig is None:
        return "n/a"
    if not sig:
        return "no"
    change = metric.get("change_pct") or 0.0
    better = metric.get("better") == ("lower" if change < 0 else "higher")
    return "better" if better else "worse"


def _change(metric: Mapping[str, Any]) -> str:
    if metric.get("unit", "").startswith("%") and metric.get("change") is not None:
        return _signed(metric["change"], 1, " pp")
    return _signed(metric.get("change_pct"), 1, " %")


def _digits(metric: Mapping[str, Any]) -> int:
    unit = metric.get("unit", "")
    return 0 if unit in ("samples/s", "MiB") else (1 if unit.startswith("%") else 2)


def _metrics_table(diff: Mapping[str, Any]) -> Table:
    table = Table(
        columns=["Figure", "Base", "New", "Change", "95 % CI", "p", "Sig."],
        numeric_from=1,
    )
    metrics = diff.get("metrics") or {}
    for name in diff.get("metric_order") or []:
        m = metrics.get(name)
        if m is None or name == "time":
            continue
        if m.get("base") is None and m.get("new") is None:
            continue
        d = _digits(m)
        table.rows.append(
            [
                f"{m.get('label', name)} ({m.get('unit', '')})",
                _num(m.get("base"), d),
                _num(m.get("new"), d),
                _change(m),
                _ci(m),
                _p(m),
                _verdict_cell(m),
            ]
        )
    return table


def _not_measured(diff: Mapping[str, Any]) -> list[str]:
    metrics = diff.get("metrics") or {}
    out = []
    for name in diff.get("metric_order") or []:
        m = metrics.get(name)
        if m and m.get("base") is None and m.get("new") is None and name != "time":
            out.append(f"{m.get('label', name)}: {m.get('reason') or 'not measured'}")
    return out


def _summary_section(diff: Mapping[str, Any]) -> Section:
    base, new = diff.get("base") or {}, diff.get("new") or {}
    time = (diff.get("metrics") or {}).get("time") or {}
    n = time.get("n") or ["?", "?"]
    facts = [
        ("change", str(diff.get("headline", ""))),
        ("base", f"{base.get('label', '')} ({base.get('kind', '')})"),
        ("new", f"{new.get('label', '')} ({new.get('kind', '')})"),
        (
            "compared",
            f"{'per sample (the batch changed)' if diff.get('basis') == 'sample' else 'per step'}; "
            f"{n[0]} base and {n[1]} new steps",
        ),
    ]
    checks = diff.get("fail_on") or []
    if checks:
        facts.append(("verdict", "FAIL" if diff.get("verdict") == "fail" else "pass"))
        for c in checks:
            facts.append(
                (f"--fail-on {c['spec']}", ("failed: " if c["failed"] else "ok: ") + c["reason"])
            )
    return Section(title="Diff", facts=facts)


def _comparability_section(diff: Mapping[str, Any]) -> Section:
    diffs = diff.get("differences") or []
    if not diffs:
        return Section(
            title="Comparability", brief="same setup on both sides (every fact recorded)"
        )
    table = Table(columns=["Fact", "Base", "New", "What it means"], numeric_from=4)
    for d in diffs:
        table.rows.append([d["field"], d["base"], d["new"], d["effect"]])
    notes = []
    if not diff.get("comparable"):
        notes.append("The setups differ: the figures below compare different jobs, not one change.")
    return Section(title="Comparability", tables=[table], notes=notes)


def _figures_section(diff: Mapping[str, Any]) -> Section:
    notes = [
        "Sig.: the 95 % bootstrap interval of the change excludes 0 (better or worse), or not "
        "(no); p: Mann-Whitney U test. Figures that are one number per run carry no interval.",
    ]
    missing = _not_measured(diff)
    return Section(
        title="Figures",
        tables=[_metrics_table(diff)],
        notes=notes,
        footnotes=[f"n/a: {m}" for m in missing],
    )


def _components_section(diff: Mapping[str, Any]) -> Section:
    rows = [r for r in diff.get("components") or [] if abs(r.get("delta_ms") or 0.0) > 0.0]
    if not rows:
        return Section(title="Where the time went", brief="no component changed")
    table = Table(
        columns=["Component", "Base ms/step", "New ms/step", "Change ms", "Of step change"],
        numeric_from=1,
    )
    for r in rows[:_TOP_COMPONENTS]:
        name = (
            f"{r['kind']} {r['name']}"
            if r["kind"] in ("region", "kernel", "operator")
            else r["name"]
        )
        name += "" if r.get("leaf", True) else " (holds child regions)"
        share = r.get("share_of_change_pct")
        table.rows.append(
            [
                name,
                _num(r.get("base_ms"), 3),
                _num(r.get("new_ms"), 3),
                _signed(r.get("delta_ms"), 3),
                _signed(share, 0, " %"),
            ]
        )
    notes = []
    if len(rows) > _TOP_COMPONENTS:
        notes.append(
            f"{len(rows) - _TOP_COMPONENTS} more components changed less (--json lists all)."
        )
    notes.append(
        "Regions are wall time on the host; kernels are device time; a kernel inside a region "
        "shows in both."
    )
    return Section(title="Where the time went", tables=[table], notes=notes)


def _findings_section(diff: Mapping[str, Any]) -> Section:
    f = diff.get("findings") or {}
    table = Table(columns=["", "Severity", "Finding", "Id"], numeric_from=4)
    for tag, key in (("added", "added"), ("removed", "removed")):
        for item in f.get(key) or []:
            table.rows.append([tag, item.get("severity", ""), item.get("title", ""), item["id"]])
    for item in f.get("severity_changed") or []:
        table.rows.append(
            [
                "severity",
                f"{item['base_severity']} → {item['new_severity']}",
                item["title"],
                item["id"],
            ]
        )
    if not table.rows:
        return Section(title="Findings", brief="the same findings on both sides")
    return Section(title="Findings", tables=[table])


def diff_sections(diff: Mapping[str, Any]) -> list[Section]:
    return [
        _summary_section(diff),
        _comparability_section(diff),
        _figures_section(diff),
        _components_section(diff),
        _findings_section(diff),
    ]


def render_diff(diff: Mapping[str, Any], console: Console) -> None:
    from mgprof.report.run.terminal import render_section
    from mgprof.report.safe_text import rich_text

    verdict = diff.get("verdict")
    for section in diff_sections(diff):
        render_section(section, console)
    if diff.get("fail_on"):
        style = "bold red" if verdict == "fail" else "bold green"
        console.print(Text.assemble(rich_text("verdict: ", "bold"), rich_text(str(verdict), style)))


def diff_to_markdown(diff: Mapping[str, Any]) -> str:
    from mgprof.report.run.markdown import escape_md, section_markdown

    base, new = diff.get("base") or {}, diff.get("new") or {}
    lines = [
        f"# mgprof diff: {escape_md(str(base.get('label')))} → {escape_md(str(new.get('label')))}",
        "",
    ]
    for section in diff_sections(diff):
        lines += section_markdown(section)
    return "\n".join(lines).rstrip() + "\n"


def diff_to_json(diff: Mapping[str, Any]) -> str:
    from mgprof.analyze.diff.changes import finite_or_none

    return json.dumps(finite_or_none(dict(diff)), indent=2, ensure_ascii=False) + "\n"


def _steps_chart(diff: Mapping[str, Any]) -> dict[str, Any]:
    steps = diff.get("steps") or {}
    traces = []
    for side in ("base", "new"):
        s = steps.get(side) or {}
        label = (diff.get(side) or {}).get("label", side)
        traces.append(
            {
                "type": "box",
                "name": f"{side}: {label}",
                "y": s.get("ms") or [],
                "boxpoints": "all",
                "jitter": 0.4,
                "pointpos": 0,
            }
        )
    return {
        "data": traces,
        "layout": {
            "title": {"text": "Job step time per step (ms)"},
            "yaxis": {"title": {"text": "ms"}, "rangemode": "tozero"},
            "showlegend": False,
            "margin": {"t": 40, "l": 60, "r": 20, "b": 60},
            "height": 360,
        },
    }


def diff_to_html(diff: Mapping[str, Any]) -> str:
    """One offline page: the sections, then a box plot of both runs' step times (plotly,
    inlined like report.html's)."""
    from mgprof.report.html.assets import CSS
    from mgprof.report.html.page import CSP, plotly_js
    from mgprof.report.html.sections import section_html
    from mgprof.report.html.text import esc, json_for_script

    script_js = plotly_js()
    base, new = diff.get("base") or {}, diff.get("new") or {}
    title = f"mgprof diff: {base.get('label', '')} → {new.get('label', '')}"
    sections = diff_sections(diff)
    chart = '<div id="diff-steps" class="chart"></div>'
    body = [section_html(s, after=chart if i == 2 else "") for i, s in enumerate(sections)]
    script = (
        "(function(){var el=document.getElementById('diff-steps');"
        "var fig=JSON.parse(document.getElementById('diff-data').textContent);"
        "try{Plotly.newPlot(el,fig.data,fig.layout,{displaylogo:false,responsive:true});"
        "el.setAttribute('data-rendered','1');}catch(e){el.textContent='chart failed: '+e;}})();"
    )
    return "".join(
        [
            '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">',
            f'<meta http-equiv="Content-Security-Policy" content="{esc(CSP)}">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{esc(title)}</title>",
            f"<style>{CSS}</style>",
            f"<script>{script_js}</script>",
            "</head><body>",
            f"<h1>{esc(title)}</h1>",
            *body,
            '<script type="application/json" id="diff-data">',
            json_for_script(_steps_chart(diff)),
            "</script>",
            f"<script>{script}</script>",
            "</body></html>\n",
        ]
    )
