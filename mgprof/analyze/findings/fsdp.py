"""Findings for FSDP runs: when sharding costs more than it saves, and units that cannot overlap.

FSDP trades memory for communication: every unit's parameters are all-gathered before its
forward (and again in backward when they were freed after forward) and its gradients are
reduce-scattered after. That pays when the model's state does not fit a device under DDP; on a
model that fits, DDP does the same training with one all-reduce of the gradients, overlapped
with the backward. The rules here fire on measured figures only: the comparison's rows for the
DDP-versus-FSDP cost, the units' own sizes for the overlap that their layout allows.
"""

from __future__ import annotations

from typing import Any

from mgprof.analyze.findings.core import Finding, _facts, finding_id
from mgprof.analyze.findings.fit import grad_sync_status
from mgprof.analyze.run.schema import ComparisonRow, RunAnalysis, given
from mgprof.analyze.step_samples import RowSamples, rate_intervals
from mgprof.records import FsdpRecord, RunRecord

LARGEST_UNIT_SHARE = 0.6
"""One unit holding 60 % or more of the parameters gathers most of the model in one collective
that nothing of its own size can overlap with (the FSDP2 tutorial shards each block)."""

MIB = 1024 * 1024


def _fsdp_record(run: RunRecord) -> FsdpRecord | None:
    found = _facts(run, "fsdp")
    return next(iter(found.values()), None)


def _rows(figures: RunAnalysis) -> list[ComparisonRow]:
    table = given(figures.comparison)
    return table.rows if table is not None else []


def _state_mib(row: ComparisonRow) -> float | None:
    parts = (row.params_mib, row.grads_mib, row.optimizer_mib)
    return None if any(p is None for p in parts) else sum(p or 0.0 for p in parts)


def _mib(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def fsdp_slower_than_ddp(run: RunRecord, figures: RunAnalysis) -> Finding | None:
    """The same script under DDP, in the same comparison, was measurably faster and fit."""
    _, how = grad_sync_status(figures)
    if how != "fsdp":
        return None
    rows = [r for r in _rows(figures) if r.precision is None and r.status == "complete"]
    mine = next((r for r in rows if r.strategy == run.strategy), None)
    ddp = next((r for r in rows if r.strategy == "ddp" and r.grad_sync == "synchronised"), None)
    if mine is None or ddp is None or mine.samples_per_s is None or ddp.samples_per_s is None:
        return None
    samples = {
        name: RowSamples([r for r in row.round_step_ms if r], row.samples_per_step)
        for name, row in (("ddp", ddp), ("fsdp", mine))
    }
    (interval,) = rate_intervals(samples, [("ddp", "fsdp")]) or (None,)
    if interval is None or not interval.above:
        return None
    figs: dict[str, Any] = {
        "ddp_samples_per_s": ddp.samples_per_s,
        "fsdp_samples_per_s": mine.samples_per_s,
        "ddp_over_fsdp": interval.ratio,
        "ddp_over_fsdp_low": interval.low,
        "ddp_over_fsdp_high": interval.high,
        "interval_pct": 95,
    }
    evidence = (
        f"in the same comparison ddp trained {ddp.samples_per_s:,.1f} samples/s and "
        f"{run.strategy} {mine.samples_per_s:,.1f}: ddp {interval.ratio:.2f}x (95 % interval "
        f"{interval.low:.2f}–{interval.high:.2f}x)"
    )
    ddp_state, my_state = _state_mib(ddp), _state_mib(mine)
    if ddp_state is not None and my_state is not None:
        figs["ddp_model_state_mib"], figs["fsdp_model_state_mib"] = ddp_state, my_state
        evidence += (
            f"; model state per rank {_mib(ddp_state)} MiB under ddp, {_mib(my_state)} MiB sharded"
        )
    peaks = [p for p in ddp.peak_mem_mib if p is not None]
    if peaks:
        figs["ddp_peak_mem_mib"] = max(peaks)
        evidence += f"; ddp's peak memory {max(peaks):,.0f} MiB per device ({ddp.peak_mem_kind})"
    return Finding(
        id=finding_id("fsdp_slower_than_ddp"),
        rule="fsdp_slower_than_ddp",
        severity="medium",
        title="FSDP costs throughput on a model that fits DDP",
        evidence=evidence + "; the ddp row ran to completion, so the model fits its replica",
        cause=(
            "FSDP gathers every unit's parameters before its forward and backward and "
            "reduce-scatters the gradients after; DDP keeps a full replica and all-reduces the "
            "gradients once, overlapped with the backward. The memory FSDP saves buys nothing "
            "when DDP's replica already fits."
        ),
        change=(
            "train this model with DDP (`--strategy ddp`, or `DistributedDataParallel(model)`); "
            "keep FSDP for models whose parameters, gradients and optimizer state do not fit "
            "one device, or to free memory for a larger batch"
        ),
        fix=["--strategy ddp", "DistributedDataParallel(model)"],
        saving=(
            f"{interval.ratio:.2f}x throughput (95 % interval {interval.low:.2f}–"
            f"{interval.high:.2f}x), measured by mgprof compare"
        ),
        figures=figs,
    )


def fsdp_unit_layout(run: RunRecord, figures: RunAnalysis) -> Finding | None:
    """One FSDP unit holds most of the parameters (or only the root is sharded)."""
    fsdp = _fsdp_record(run)
    if fsdp is None or not fsdp.unit_parameters:
        return None
    sizes = fsdp.unit_parameters
    total = sum(sizes)
    if total <= 0:
        return None
    share = sizes[0] / total
    if len(sizes) > 1 and share < LARGEST_UNIT_SHARE:
        return None
    figs: dict[str, Any] = {
        "units": len(sizes),
        "largest_unit_parameters": sizes[0],
        "parameters": total,
        "largest_unit_share_pct": 100.0 * share,
        "threshold_share_pct": 100.0 * LARGEST_UNIT_SHARE,
    }
    if len(sizes) == 1:
        evidence = f"one FSDP unit holds all {total:,} parameters (only the root is sharded)"
    else:
        evidence = (
            f"the largest of {len(sizes)} FSDP units holds {sizes[0]:,} of {total:,} parameters "
            f"({100.0 * share:.0f} %; fires ≥ {100.0 * LARGEST_UNIT_SHARE:.0f} %)"
        )
    classes = ", ".join(f"{k} x{v}" for k, v in fsdp.unit_classes.items())
    if classes:
        evidence += f"; units: {classes}"
    return Finding(
        id=finding_id("fsdp_unit_layout"),
        rule="fsdp_unit_layout",
        severity="medium",
        title="One FSDP unit holds most of the parameters: no overlap possible",
        evidence=evidence,
        cause=(
            "FSDP overlaps one unit's all-gather with the previous unit's compute and one "
            "unit's reduce-scatter with the next unit's backward; a unit holding most of the "
            "model is gathered whole before anything can run, and its gradients are "
            "reduce-scattered with nothing left to hide behind. Its gathered parameters also set "
            "the memory peak."
        ),
        change=(
            "call `fully_shard` on each repeated block (each transformer layer) before the root, "
            "as the FSDP2 tutorial does: `for layer in model.layers: fully_shard(layer)` then "
            "`fully_shard(model)`; `mgprof analyze --strategy fsdp` does this for an unsharded "
            "script"
        ),
        fix=["for layer in model.layers: fully_shard(layer)", "fully_shard(model)"],
        figures=figs,
    )
