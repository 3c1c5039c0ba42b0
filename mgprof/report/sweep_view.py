"""Rendering of a batch-size sweep (``sweep.json``): rich terminal, Markdown and JSON.

Renderers only: the figures come from ``mgprof.analyze.sweep.result.summarize``. Cells are
``rich.text.Text`` so a script name or error text prints as itself, never as markup; every string
goes through ``safe_text`` (control characters escaped, Markdown and HTML characters escaped in
the Markdown form).
"""

from __future__ import annotations

import msgspec
from rich.console import Console
from rich.table import Table as RichTable
from rich.text import Text

from mgprof.analyze.run.noise_scale import SweepNoiseScale, pooled_steps_note
from mgprof.analyze.sweep.result import SweepResult, Trial
from mgprof.report.safe_text import json_text, md_text, printable, rich_text
from mgprof.report.term_table import Col, print_fitted
from mgprof.report.term_title import rule_with_path

COLUMNS = (
    "batch",
    "global",
    "status",
    "samples/s",
    "per device",
    "step ms",
    "mem MiB",
    "comm %",
    "exposed %",
    "",
)
"""batch: per device; samples/s: job total; mem: the sweep's memory figure; last: the verdicts.
With the noise scale measured, ``columns`` adds the trial's own B_simple and the time to a given
loss relative to the recommended batch."""


def _num(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def trial_line(trial: Trial) -> str:
    """One line per finished trial, for the progress shown while the sweep runs (plain text
    for ``print``: the trial's error is shown with its control characters escaped)."""
    if trial.status == "ok":
        return (
            f"batch {trial.batch_size}: {_num(trial.samples_per_s)} samples/s, "
            f"{_num(trial.peak_memory_mib)} MiB, comm {_num(trial.comm_pct)} %"
        )
    why = trial.error or trial.note or ""
    return printable(f"batch {trial.batch_size}: {trial.status.upper()} {why}")


def _marks(result: SweepResult, batch: int) -> str:
    marks = []
    if batch == result.sweet_spot:
        marks.append("sweet spot")
    if batch == result.throughput_optimal:
        marks.append("fastest")
    if batch == result.largest_fit:
        marks.append("largest fit")
    return ", ".join(marks)


def _noise(result: SweepResult) -> SweepNoiseScale | None:
    """The sweep's noise-scale figures (a ``NoiseSweepResult``), None for an older sweep.json."""
    ns = getattr(result, "noise_scale", None)
    return ns if isinstance(ns, SweepNoiseScale) else None


def noise_scale_of(result: SweepResult) -> SweepNoiseScale | None:
    """The sweep's noise-scale figures, None for a sweep.json written before them."""
    return _noise(result)


def columns(result: SweepResult) -> tuple[str, ...]:
    """``COLUMNS``, with the trials' own B_simple and the time to a given loss (the recommended
    batch = 1.00) before the verdicts when the sweep measured the noise scale."""
    ns = _noise(result)
    if ns is None or ns.estimate is None:
        return COLUMNS
    return (*COLUMNS[:-1], "B_simple", "time to loss", COLUMNS[-1])


def _noise_cells(ns: SweepNoiseScale, batch: int, ran: bool) -> list[str]:
    own = next((t for t in ns.trials if t.batch_size == batch), None)
    b_simple = _num(own.b_simple, 0) if own is not None and ran else ""
    rel = ns.time_to_target.get(str(batch)) if ran else None
    return [b_simple, f"{rel:.2f}" if rel is not None else ("n/a" if ran else "")]


def trial_order(result: SweepResult) -> list[Trial]:
    """The trials in the table's order: batch order, skipped ones included (``rows``)."""
    return sorted(result.trials, key=lambda t: (t.batch_size, t.status))


def rows(result: SweepResult) -> list[list[str]]:
    """The table rows (one per trial, skipped ones included), in batch order."""
    out = []
    ns = _noise(result)
    with_noise = ns is not None and ns.estimate is not None
    for t in trial_order(result):
        status = t.status.upper() if t.status != "ok" else "ok"
        memory = t.peak_memory_mib if t.status != "skipped" else t.predicted_memory_mib
        mark = _marks(result, t.batch_size) if t.status == "ok" else ""
        mem_text = _num(memory) + ("?" if t.status == "skipped" else "")
        row = [
            str(t.batch_size),
            str(t.global_batch) if t.global_batch else "n/a",
            status,
            _num(t.samples_per_s),
            _num(t.samples_per_s_per_device),
            _num(t.step_time_ms, 2),
            mem_text,
            _num(t.comm_pct),
            _num(t.exposed_comm_pct),
        ]
        if ns is not None and with_noise:
            row += _noise_cells(ns, t.batch_size, t.status == "ok")
            if t.status == "ok" and t.batch_size == ns.recommended_batch:
                mark = ", ".join(m for m in (mark, "recommended") if m)
        out.append([*row, mark])
    return out


def facts(result: SweepResult) -> list[tuple[str, str]]:
    """The answer, then the context needed to read it (``answer_facts`` + ``context_facts``)."""
    return answer_facts(result) + context_facts(result)


def answer_facts(result: SweepResult) -> list[tuple[str, str]]:
    """What a reader came for, first: the recommendation and the gradient noise scale when
    measured, the sweet spot, the optimum, the largest fit, the first OOM, the communication
    trend."""
    margin_pct = f"{100 * result.margin:.0f} %"
    spot = _batch(result, result.sweet_spot)
    if result.sweet_spot_vs_best is not None and result.sweet_spot != result.throughput_optimal:
        ratio, low, high = result.sweet_spot_vs_best
        spot += (
            f"; {100 * ratio:.0f} % of the best throughput (95 % interval "
            f"{100 * low:.0f}–{100 * high:.0f} %)"
        )
    optimal = _batch(result, result.throughput_optimal)
    if result.tied_with_optimal:
        tied = ", ".join(str(b) for b in result.tied_with_optimal)
        optimal += f"; not measurably faster than batch {tied} (95 % intervals hold 1)"
    noise = noise_facts(result)
    out = [item for item in noise if item[0] == "recommendation"]
    out += [
        ("sweet spot", spot),
        ("throughput-optimal", optimal),
        (f"largest fit ({margin_pct} headroom)", _batch(result, result.largest_fit)),
        ("first OOM", str(result.first_oom) if result.first_oom is not None else "none seen"),
    ]
    out += [item for item in noise if item[0] != "recommendation"]
    if result.comm_trend:
        out.append(("communication", result.comm_trend))
    return out


def context_facts(result: SweepResult) -> list[tuple[str, str]]:
    """How the answer was measured: the memory boundary, devices, trials, where it went."""
    cap = (
        f"{result.capacity_mib:,.0f} MiB ({result.capacity_source or 'device'})"
        if result.capacity_mib is not None
        else "unknown (no memory boundary on CPU without --memory-budget-mib)"
    )
    out = [
        (
            "predicted max batch",
            str(result.predicted_max_batch)
            if result.predicted_max_batch is not None
            else "n/a: " + result.not_applicable.get("predicted_max_batch", "no memory model"),
        ),
        ("memory capacity", cap),
        ("memory figure", result.memory_definition or "n/a"),
        ("devices", f"{result.world_size} ({result.device_kind})"),
        ("trials run", str(result.trial_count)),
        ("stopped because", result.stop_reason or "n/a"),
    ]
    if result.memory_model is not None:
        m = result.memory_model
        out.append(
            (
                "memory model",
                f"{m.intercept_mib:,.1f} MiB + {m.slope_mib_per_sample:.4f} MiB x batch "
                f"({m.points} trials)",
            )
        )
    if result.fixed_global_batch is not None:
        out.append(("fixed global batch", f"{result.fixed_global_batch} (gradient accumulation)"))
    if result.sweep_dir:
        out.append(("sweep directory", result.sweep_dir))
    return out


def noise_facts(result: SweepResult) -> list[tuple[str, str]]:
    """B_simple beside the knee, and the batch recommended with both (none for an old sweep)."""
    ns = _noise(result)
    if ns is None:
        return []
    est = ns.estimate
    if est is None or est.b_simple is None:
        why = (est.reason if est is not None else None) or ns.reason or "not measured"
        return [("gradient noise scale", f"n/a: {why}")]
    band = ""
    if est.band_low is not None:
        top = "∞" if est.band_high is None else f"{est.band_high:,.0f}"
        band = f" (95 % band {est.band_low:,.0f}–{top})"
    out = [
        (
            "gradient noise scale",
            f"B_simple ≈ {est.b_simple:,.0f}{band}, global batch; {pooled_steps_note(ns.trials)}",
        )
    ]
    if ns.knee_global_batch is not None:
        out.append(
            (
                "knee vs B_simple",
                f"sweet spot's global batch {ns.knee_global_batch} = "
                f"{ns.knee_global_batch / est.b_simple:.2g}x B_simple",
            )
        )
    out.append(("recommendation", ns.recommendation or f"n/a: {ns.reason or 'no fitted trial'}"))
    return out


NOISE_CAVEAT = (
    "B_simple (McCandlish et al. 2018) is measured over the trials' few steps, early in "
    "training, where it is usually smallest; it grows as the loss falls, depends on the "
    "optimizer (Adam vs SGD) and estimates the critical batch rather than guaranteeing it. "
    "The recommendation assumes the learning rate is retuned for each batch "
    "(time to a given loss ∝ (global batch + B_simple) / samples/s)."
)


PREDICTED_NOTE = "mem? = predicted by the memory model; the size was not run"
"""Under the table when a size was skipped (its memory is the model's prediction)."""


def table_notes(result: SweepResult) -> list[str]:
    """What the table's marks mean (``PREDICTED_NOTE`` when a size was skipped)."""
    return [PREDICTED_NOTE] if any(t.status == "skipped" for t in result.trials) else []


def caveats(result: SweepResult) -> list[str]:
    """The sweep's caveats, the noise scale's with them when it was measured."""
    return _caveats(result)


def _caveats(result: SweepResult) -> list[str]:
    ns = _noise(result)
    extra = [NOISE_CAVEAT] if ns is not None and ns.estimate is not None else []
    return [*result.caveats, *extra]


def _batch(result: SweepResult, batch: int | None) -> str:
    if batch is None:
        return "n/a: " + result.not_applicable.get("sweet_spot", "no trial fitted")
    trial = next((t for t in result.trials if t.batch_size == batch and t.status == "ok"), None)
    if trial is None:
        return str(batch)
    return (
        f"{batch} per device (global {trial.global_batch}), {_num(trial.samples_per_s)} samples/s"
    )


def _print_facts(console: Console, items: list[tuple[str, str]]) -> None:
    grid = RichTable.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    for key, value in items:
        grid.add_row(rich_text(key), rich_text(value, multiline=True))
    console.print(grid)


def render_sweep(result: SweepResult, console: Console) -> None:
    """The sweep as the terminal shows it: the answer, the table, how it was measured, the
    caveats."""
    rule_with_path(console, "mgprof sweep:", result.script or "", align="left")
    _print_facts(console, answer_facts(result))
    names = columns(result)
    cols = [Col(col, numeric=i not in (2, len(names) - 1)) for i, col in enumerate(names)]
    cells = [
        [rich_text(c, style="dim" if c.startswith("n/a") else "") for c in row]
        for row in rows(result)
    ]
    print_fitted(console, cols, cells)
    _print_facts(console, context_facts(result))
    for note in table_notes(result):
        console.print(Text(note, "dim"))
    for note in _caveats(result):
        console.print(Text("note: ", style="yellow").append(rich_text(note, multiline=True)))


def sweep_to_markdown(result: SweepResult) -> str:
    """The same content as the terminal view, as GitHub Markdown."""
    lines = [f"# Batch-size sweep: {md_text(result.script or '')}", ""]
    lines += [f"- **{md_text(k)}**: {md_text(v)}" for k, v in answer_facts(result)]
    names = columns(result)
    lines += ["", "| " + " | ".join(names) + " |", "|" + "---|" * len(names)]
    lines += ["| " + " | ".join(md_text(c) for c in row) + " |" for row in rows(result)]
    lines += [""] + [f"- **{md_text(k)}**: {md_text(v)}" for k, v in context_facts(result)]
    for note in table_notes(result):
        lines += ["", f"{note}."]
    notes = _caveats(result)
    if notes:
        lines += ["", "## Caveats", ""] + [f"- {md_text(n)}" for n in notes]
    return "\n".join(lines) + "\n"


def sweep_to_json(result: SweepResult) -> str:
    """sweep.json's content (the plot-ready ``series`` included; control characters as ``\\u``
    escapes, ``safe_text.json_text``)."""
    return json_text(msgspec.json.format(msgspec.json.encode(result), indent=1).decode()) + "\n"
