"""Render a ``mgprof compare`` result: rich table, Markdown and JSON from one set of cells.

Cells are built once (``table_cells``) so the three forms never disagree. Terminal cells are
``rich.text.Text``, never markup, because notes quote error text that may contain brackets; every
string from the comparison (script, strategy names, notes, paths) goes through ``safe_text``, so
control characters show escaped and Markdown cannot be broken or carry HTML.
"""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from mgprof.analyze.compare.scaling import Comparison, Row, encode_comparison
from mgprof.analyze.compare.verdict import state_mib
from mgprof.report.safe_text import json_text, md_link, md_text, rich_text
from mgprof.report.term_table import Col, print_fitted

SHORT_COLUMNS = (
    "strategy",
    "dev",
    "batch\n/dev",
    "global\nbatch",
    "step\nms",
    "samples\n/s",
    "speedup",
    "95 %\ninterval",
    "eff.",
    "comm\ntrace",
    "comm\nA/B",
    "peak MiB\n/device",
)
"""Terminal headers: the same columns, short enough for an 80-column terminal."""

COLUMNS = (
    "strategy",
    "devices",
    "batch/device",
    "global batch",
    "step time (ms)",
    "samples/s",
    "speedup",
    "speedup 95 % interval",
    "efficiency",
    "exposed comm (trace)",
    "comm (sync A/B)",
    "peak mem/device (MiB)",
)


def _f(value: float | None, fmt: str, suffix: str = "") -> str:
    return "n/a" if value is None else f"{value:{fmt}}{suffix}"


def _batch(row: Row, value: int | None) -> str:
    text = "n/a" if value is None else str(value)
    return text if row.batch_controlled else f"{text}*"


def _memory(row: Row) -> str:
    if not row.peak_mem_mib:
        return "n/a"
    return "/".join(_f(v, ".0f") for v in row.peak_mem_mib)


def _interval(low: float | None, high: float | None) -> str:
    if low is None or high is None:
        return "n/a"
    return f"{low:.2f}–{high:.2f}x"


def row_label(row: Row) -> str:
    """``ddp`` or, with precision rows, ``ddp bf16``."""
    return row.strategy if row.precision is None else f"{row.strategy} {row.precision}"


def row_cells(row: Row) -> list[str]:
    """The table cells of one measured strategy, in ``COLUMNS`` order."""
    return [
        row_label(row),
        str(row.devices),
        _batch(row, row.batch_per_device),
        _batch(row, row.global_batch),
        _f(row.step_time_ms, ".1f"),
        _f(row.samples_per_s, ".1f"),
        _f(row.speedup, ".2f", "x"),
        "-" if row.strategy == "single" else _interval(row.speedup_low, row.speedup_high),
        _f(row.efficiency_pct, ".0f", "%"),
        _f(row.exposed_comm_pct, ".1f", "%"),
        _f(row.ab_comm_pct, ".1f", "%"),
        _memory(row),
    ]


def table_cells(comp: Comparison) -> list[list[str]]:
    """Measured rows, then a row per strategy that does not apply, with its reason."""
    cells = [row_cells(r) for r in comp.rows]
    for na in comp.not_applicable:
        cells.append([na.strategy, "-", *(["n/a"] * (len(COLUMNS) - 2))])
    return cells


MEMORY_SHORT = ("row", "params\nMiB", "grads\nMiB", "optim\nMiB", "state\nMiB", "comm MiB\n/step")
MEMORY_COLUMNS = (
    "row",
    "parameters per rank (MiB)",
    "gradients per rank (MiB)",
    "optimizer state per rank (MiB)",
    "model state per rank (MiB)",
    "communication per step (MiB)",
)


def memory_cells(comp: Comparison) -> list[list[str]]:
    """Per row, the model state each rank holds and the bytes its collectives moved; shown
    when a row shards the model (FSDP), the choice these columns decide."""
    if not any(r.state_sharded or r.strategy.startswith("fsdp") for r in comp.rows):
        return []
    return [
        [
            row_label(row),
            _f(row.params_mib, ".3g"),
            _f(row.grads_mib, ".3g"),
            _f(row.optimizer_mib, ".3g"),
            _f(state_mib(row), ".3g") + (" (shard)" if row.state_sharded else ""),
            _f(row.comm_mib_per_step, ".3g"),
        ]
        for row in comp.rows
    ]


PRECISION_SHORT = (
    "row",
    "vs\nbase",
    "mem\nvs base",
    "bf16/fp16\nGEMM",
    "tensor\ncores",
    "MFU",
    "loss",
)
PRECISION_COLUMNS = (
    "row",
    "speedup vs baseline",
    "peak memory vs baseline",
    "reduced-precision GEMM time",
    "tensor-core share",
    "MFU",
    "loss vs baseline",
)


def _loss_cell(row: Row) -> str:
    check = row.loss_check
    if check is None:
        return "baseline" if row.precision == row.precision_baseline else "n/a"
    if check.status == "ok" and check.max_gap_pct is not None:
        return f"ok (max {check.max_gap_pct:.2g} %)"
    return check.status


def precision_cells(comp: Comparison) -> list[list[str]]:
    """Per precision row: its figures against its strategy's baseline row."""
    out = []
    for row in comp.rows:
        if row.precision is None:
            continue
        base = row.precision == row.precision_baseline
        out.append(
            [
                row_label(row),
                "1.00x" if base else _f(row.precision_speedup, ".2f", "x"),
                "-" if base else _f(row.peak_mem_change_pct, "+.0f", "%"),
                _f(row.reduced_gemm_pct, ".0f", "%"),
                _f(row.tensor_core_pct, ".0f", "%"),
                _f(row.mfu_pct, ".1f", "%"),
                _loss_cell(row),
            ]
        )
    return out


def precision_lines(comp: Comparison) -> list[str]:
    """What each precision row ran, and its loss check in words."""
    lines = []
    for row in comp.rows:
        if row.precision is None:
            continue
        text = f"{row_label(row)}: {row.precision_setting or '?'}"
        if row.loss_check is not None:
            text += f"; loss {row.loss_check.status}: {row.loss_check.detail}"
        lines.append(text)
    if lines:
        lines.append(
            "precision rows: same seed (MGPROF_SEED) and steps; baseline = the script's own "
            "setting when it has autocast/GradScaler, else fp32; GEMM share = host time of the "
            "innermost matmul/conv ops with bf16/fp16 operands (the trace's Input type)"
        )
    return lines


MODE_WORDS = {
    "weak": "weak scaling (per-device batch the same in every row; throughput scaling)",
    "strong": "strong scaling (global batch the same in every row; ranks share it)",
    "mixed": "mixed (neither the global nor the per-device batch is the same; throughput ratio)",
    "unknown": "unknown (a row's batch per step was not seen)",
}


def header_lines(comp: Comparison) -> list[str]:
    """What was compared: script, the scaling the batches showed, steps, rounds, threads."""
    scaling = MODE_WORDS.get(comp.mode, comp.mode)
    batch = (
        f"--batch-size {comp.batch_size}"
        if comp.batch_size is not None
        else "the script's own batch (not controlled)"
    )
    lines = [
        f"script: {comp.script} {' '.join(comp.script_args)}".rstrip(),
        f"mode: {scaling}; batch: {batch}",
    ]
    if comp.mode_basis:
        lines.append(f"observed: {comp.mode_basis}")
    if comp.schema_version < 2:  # recorded before untraced steps and intervals
        lines.append(
            f"steps: {comp.warmup} warm-up + {comp.steps} measured per strategy, traced steps "
            "included and no interval (recorded by an earlier mgprof; compare again for both)"
        )
        if comp.cpu_note:
            lines.append(f"CPU: {comp.cpu_note}")
        return lines
    rounds = (
        f"; {comp.rounds} rounds per row, interleaved (round 1 traced, the others not)"
        if comp.rounds > 1
        else "; 1 round per row"
    )
    lines.append(
        f"steps: {comp.warmup} warm-up + {comp.steps} measured per run{rounds}; step time and "
        "speedup from untraced steady-state steps only"
        + (
            f"; sync A/B: {comp.nosync_steps} steps each with and without gradient sync"
            if comp.nosync_steps
            else ""
        )
    )
    if comp.cpu_threads_setting:
        lines.append(f"threads: {comp.cpu_threads_setting}")
    if comp.cpu_note:
        lines.append(f"CPU: {comp.cpu_note}")
    return lines


def _set_apart(row: Row) -> str | None:
    """The steps a row's figures leave out, with their times."""
    parts = []
    if row.traced_step_ms is not None:
        parts.append(f"traced steps {row.traced_step_ms:.1f} ms")
    if row.post_trace_step_ms is not None:
        parts.append(f"the step writing the trace {row.post_trace_step_ms:.1f} ms")
    if not parts:
        return None
    return (
        f"{', '.join(parts)} (not in its figures: {row.steps_measured} untraced steps "
        f"{row.step_time_ms:.1f} ms)"
        if row.step_time_ms is not None
        else ", ".join(parts) + " (not in its figures)"
    )


def note_lines(comp: Comparison) -> list[str]:
    """Reasons and caveats under the table."""
    lines = [f"{na.strategy}: not applicable: {na.reason}" for na in comp.not_applicable]
    lines += precision_lines(comp)
    for row in comp.rows:
        lines += [f"{row_label(row)}: {note}" for note in row.notes]
        apart = _set_apart(row)
        if apart is not None:
            lines.append(f"{row_label(row)}: {apart}")
    if any(not r.batch_controlled for r in comp.rows):
        lines.append("* batch read from the records, not set by mgprof (see notes)")
    lines.append(
        "speedup = samples/s ÷ single's samples/s, with its 95 % interval (bootstrap over "
        "rounds and steps); efficiency = speedup ÷ devices; comm trace "
        "= exposed communication share of the trace window; comm A/B = step time saved "
        "without gradient sync; peak memory per device (CUDA allocated, or process RSS on CPU)"
    )
    if memory_cells(comp):
        lines.append(
            "model state = parameters + gradients + optimizer state one rank holds after the "
            "first update, from its own tensors (an FSDP shard counts its local part); comm "
            "MiB/step = bytes rank 0's collectives moved per traced step"
        )
    return lines


def answer_lines(comp: Comparison) -> list[tuple[str, str]]:
    """(label, sentence) pairs that open every form of a comparison: the answer (strategy,
    precision, memory), then its caveats. A comparison recorded before the answer was kept
    apart opens with its whole one-line verdict."""
    if not comp.answer:
        return [("verdict", comp.verdict)] if comp.verdict else []
    labels = ["answer"] + ["" for _ in comp.answer[1:]]
    lines = list(zip(labels, comp.answer, strict=True))
    lines += [("caveat", text) for text in comp.caveats]
    return lines


def render_comparison(comp: Comparison, console: Console, where: str | None = None) -> None:
    """The terminal form: the answer and its caveats, the table, then what was compared and
    the other tables and notes."""
    console.rule(Text("mgprof compare", style="bold"), align="left")
    for label, text in answer_lines(comp):
        head = Text(f"{label}: ", style="bold") if label else Text("")
        style = "dim" if label == "caveat" else ""
        console.print(head + rich_text(text, style=style, multiline=True))
    columns = [Col(col, numeric=i > 0) for i, col in enumerate(SHORT_COLUMNS)]
    cells = [
        [rich_text(c, style="dim" if c in ("n/a", "-") else "") for c in row]
        for row in table_cells(comp)
    ]
    print_fitted(console, columns, cells)
    for line in header_lines(comp):
        console.print(rich_text(line))
    memory = memory_cells(comp)
    if memory:
        columns = [Col(col, numeric=i > 0) for i, col in enumerate(MEMORY_SHORT)]
        cells = [[rich_text(c, style="dim" if c == "n/a" else "") for c in row] for row in memory]
        print_fitted(console, columns, cells)
    precision = precision_cells(comp)
    if precision:
        columns = [Col(col, numeric=0 < i < 6) for i, col in enumerate(PRECISION_SHORT)]
        cells = [
            [rich_text(c, style="dim" if c in ("n/a", "-") else "") for c in row]
            for row in precision
        ]
        print_fitted(console, columns, cells)
    for line in note_lines(comp):
        console.print(rich_text(line, style="dim", multiline=True))
    if where:
        console.print(Text("\ncomparison directory: ") + rich_text(where))
        console.print(Text("re-render: mgprof report ") + rich_text(where))


def comparison_to_markdown(comp: Comparison) -> str:
    """GitHub-flavoured Markdown of the same table, with links to each strategy's run."""
    out = [f"# mgprof compare: {md_text(comp.comparison_id or comp.script)}", ""]
    for label, text in answer_lines(comp):
        if label == "caveat":
            out.append(f"- {md_text(text)}")
        else:
            lead = f"**{label.capitalize()}:** " if label else ""
            out += [f"{lead}{md_text(text)}", ""]
    out += ["", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for cells in table_cells(comp):
        out.append("| " + " | ".join(md_text(c) for c in cells) + " |")
    out += [""] + [f"- {md_text(line)}" for line in header_lines(comp)]
    memory = memory_cells(comp)
    if memory:
        out += ["", "| " + " | ".join(MEMORY_COLUMNS) + " |", "|" + "---|" * len(MEMORY_COLUMNS)]
        out += ["| " + " | ".join(md_text(c) for c in cells) + " |" for cells in memory]
    precision = precision_cells(comp)
    if precision:
        out += ["", "| " + " | ".join(PRECISION_COLUMNS) + " |"]
        out += ["|" + "---|" * len(PRECISION_COLUMNS)]
        out += ["| " + " | ".join(md_text(c) for c in cells) + " |" for cells in precision]
    out += [""] + [f"- {md_text(line)}" for line in note_lines(comp)]
    if comp.runs:
        out += ["", "## Runs", ""]
        out += [
            f"- {md_text(s)}: {md_link(name, f'{name}/report.md')}" for s, name in comp.runs.items()
        ]
    return "\n".join(out) + "\n"


def comparison_to_json(comp: Comparison) -> str:
    """The comparison.json content, as printed by ``--format json`` (``safe_text.json_text``:
    control characters as ``\\u`` escapes, the same JSON value)."""
    return json_text(encode_comparison(comp).decode("utf-8")) + "\n"
