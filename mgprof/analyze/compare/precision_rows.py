"""Precision rows of ``mgprof compare --precision``: each row against its strategy's baseline.

The baseline of a strategy is its ``script`` row (the script's own autocast/GradScaler, added
when the script has one), else its fp32 row, else its first row. A row is compared with it on
throughput, peak memory and the loss per update (``mgprof.analyze.run.precision.loss_check``); a
row whose loss went inf/NaN or diverged keeps its measured speed but is never the verdict's
recommendation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mgprof.analyze.compare.scaling import Interval, Row, row_name
from mgprof.analyze.compare.verdict import VerdictParts, ratio_between, verdict_parts
from mgprof.analyze.readers import as_dict as _dict
from mgprof.analyze.readers import num as _num
from mgprof.analyze.run.precision import loss_check, setting_label

BASELINE_ORDER = ("script", "fp32")
UNUSABLE = ("non-finite", "diverged")


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def fill_precision_figures(row: Row, precision: str, analysis: Mapping[str, Any]) -> None:
    """The row's own precision figures, from its run's analysis."""
    row.precision = precision
    found = analysis.get("precision")
    row.precision_setting = (
        _script_label(_dict(found)) if precision == "script" else setting_label(_dict(found))
    )
    if not isinstance(found, Mapping):
        row.notes.append(f"precision {precision}: no rank recorded what ran")
    elif precision != "script" and not found.get("applied_ranks"):
        row.notes.append(f"precision {precision} not applied: {found.get('not_applied_reason')}")
    else:
        skipped = _num(found.get("skipped_updates")) or 0
        if skipped:
            row.notes.append(
                f"mgprof's GradScaler skipped {skipped:.0f} optimizer steps (inf/NaN "
                "gradients); they still count as steps"
            )
        if found.get("loss_scaling") == "none":
            row.notes.append(f"speed only, no loss scaling: {found.get('loss_scaling_note')}")
    summaries = [
        s
        for per_rank in _dict(_dict(analysis.get("traces")).get("ranks")).values()
        if isinstance(per_rank, list)
        for s in per_rank
        if isinstance(s, Mapping)
    ]
    row.reduced_gemm_pct = _mean(
        [_num(_dict(s.get("gemm_precision")).get("reduced_pct")) for s in summaries]
    )
    row.tensor_core_pct = tensor_core_share_of_gemm(summaries)
    ranks = [r for r in analysis.get("ranks") or [] if isinstance(r, Mapping)]
    row.mfu_pct = _mean([_num(r.get("mfu_pct")) for r in ranks])


def tensor_core_share_of_gemm(summaries: Sequence[Mapping[str, Any]]) -> float | None:
    """Tensor-core kernel time ÷ (tensor-core + FP32 GEMM kernel time), over the ranks' trace
    summaries (``tensor_cores``); None on CPU traces or without GEMM kernels."""
    tc = fp = 0.0
    for s in summaries:
        facts = _dict(s.get("tensor_cores"))
        tc += _num(facts.get("tensor_core_us")) or 0.0
        fp += _num(facts.get("fp32_gemm_us")) or 0.0
    return 100.0 * tc / (tc + fp) if tc + fp > 0 else None


def _script_label(found: Mapping[str, Any]) -> str:
    own = found.get("script_autocast")
    text = f"the script's own: {own} autocast" if own else "the script's own: no autocast"
    if found.get("script_grad_scaler"):
        text += " + GradScaler"
    return text


def baseline(rows: Sequence[Row]) -> Row | None:
    """The baseline precision row among one strategy's rows."""
    for name in BASELINE_ORDER:
        found = next((r for r in rows if r.precision == name), None)
        if found is not None:
            return found
    return rows[0] if rows else None


LossSeries = tuple[Sequence[float | None], Sequence[int]]
"""A run's loss per update and the updates whose loss was inf/NaN."""


def run_losses(analysis: Mapping[str, Any]) -> LossSeries:
    found = _dict(analysis.get("precision"))
    losses = found.get("losses")
    bad = found.get("nonfinite_updates")
    return (
        list(losses) if isinstance(losses, list) else [],
        [k for k in bad if isinstance(k, int)] if isinstance(bad, list) else [],
    )


def compare_precisions(
    rows: Sequence[Row], losses: Mapping[str, LossSeries], intervals: Sequence[Interval] = ()
) -> None:
    """Speedup (with its 95 % interval from ``intervals``), memory change and loss check of each
    precision row against its strategy's baseline, in place. ``losses``: run directory name ->
    ``run_losses`` of its analysis."""
    for strategy in dict.fromkeys(r.strategy for r in rows if r.precision is not None):
        group = [r for r in rows if r.strategy == strategy and r.precision is not None]
        base = baseline(group)
        if base is None:
            continue
        for row in group:
            row.precision_baseline = base.precision
            if row is base:
                continue
            if row.samples_per_s is not None and base.samples_per_s:
                row.precision_speedup = row.samples_per_s / base.samples_per_s
                found = ratio_between(intervals, row_name(row), row_name(base))
                if found is not None:
                    row.precision_speedup_low, row.precision_speedup_high = found.low, found.high
            elif row.step_time_ms and base.step_time_ms:
                row.precision_speedup = base.step_time_ms / row.step_time_ms
            mem, base_mem = _mean(row.peak_mem_mib), _mean(base.peak_mem_mib)
            if mem is not None and base_mem:
                row.peak_mem_change_pct = 100.0 * (mem - base_mem) / base_mem
            own, bad = losses.get(row.run, ([], []))
            row.loss_check = loss_check(own, losses.get(base.run, ([], []))[0], bad)


def usable(row: Row) -> bool:
    return row.loss_check is None or row.loss_check.status not in UNUSABLE


def precision_verdict(rows: Sequence[Row], strategy: str | None, cpu: bool) -> str:
    """One sentence on the precision rows of ``strategy`` (the strategy verdict's best)."""
    group = [r for r in rows if r.strategy == strategy and r.precision is not None]
    base = baseline(group)
    if base is None or len(group) < 2:
        return ""
    parts = []
    for row in group:
        if row is base:
            continue
        check = row.loss_check
        speed = "n/a" if row.precision_speedup is None else f"{row.precision_speedup:.2f}x"
        if row.precision_speedup_low is not None and row.precision_speedup_high is not None:
            speed += f" (95 % interval {row.precision_speedup_low:.2f}–"
            speed += f"{row.precision_speedup_high:.2f}x)"
        text = f"{row.precision} {speed}"
        if row.peak_mem_change_pct is not None:
            text += f", memory {row.peak_mem_change_pct:+.0f} %"
        if check is not None:
            text += f", loss {check.status}"
            if check.status in UNUSABLE:
                text += " (not a usable setting)"
        parts.append(text)
    fastest = max(
        (r for r in group if r is not base and usable(r) and r.precision_speedup),
        key=lambda r: r.precision_speedup or 0.0,
        default=None,
    )
    text = f"precision on {strategy}, against {base.precision}: " + "; ".join(parts)
    if fastest is not None and (fastest.precision_speedup or 0.0) > 1.0:
        low = fastest.precision_speedup_low
        if low is None or low > 1.0:
            text += f"; fastest usable: {fastest.precision}"
        else:
            text += f"; no measurable speedup over {base.precision} (the interval holds 1)"
    if cpu:
        text += (
            " — CPU autocast: these ratios say nothing about a GPU's tensor cores; rerun on "
            "the GPUs you train on"
        )
    return text


def baseline_rows(rows: Sequence[Row]) -> list[Row]:
    """Each strategy's baseline precision row (the rows the strategy verdict compares)."""
    out = []
    for strategy in dict.fromkeys(r.strategy for r in rows):
        base = baseline([r for r in rows if r.strategy == strategy])
        if base is not None:
            out.append(base)
    return out


def comparison_verdict(
    rows: Sequence[Row],
    cpu: bool,
    mode: str,
    intervals: Sequence[Interval] = (),
    busy: Sequence[str] = (),
    diffs: Sequence[str] = (),
    rounds: int = 1,
) -> tuple[VerdictParts, str]:
    """The strategy verdict over the baseline rows, and the precision sentence for the best
    strategy's rows ("" without precision rows)."""
    bases = baseline_rows(rows)
    parts = verdict_parts(bases, cpu, mode, intervals, busy, diffs, rounds)
    measured = [r for r in bases if r.samples_per_s is not None]
    best = max(measured, key=lambda r: r.samples_per_s or 0.0).strategy if measured else None
    if best is None and bases:
        best = bases[0].strategy
    return parts, precision_verdict(rows, best, cpu)
