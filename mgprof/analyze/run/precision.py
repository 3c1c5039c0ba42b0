"""What ``--precision`` did in a run, and whether its loss stayed with the fp32 row's.

Pure (no torch): read from the ranks' ``PrecisionRecord`` (``mgprof.collect.wrapping.precision``).

The loss check compares two runs of the same script, strategy and seed that differ only in
precision, update by update. It can only mean something when both started from the same
weights and data, so it first checks the first update: there the two losses differ by
rounding alone (the weights have not moved), and a first-update gap beyond
``LOSS_DEVIATION_PCT`` says the runs did not see the same start (an unseeded script, a
data order that depends on time) and nothing more is claimed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol

import msgspec

from mgprof.records import RunRecord

LOSS_DEVIATION_PCT = 10.0
"""A precision row whose loss over its last ``TAIL`` compared updates is, on average, more than
this far from the baseline row's (relative) is flagged as diverged."""
TAIL = 5

DEFINITIONS = {
    "precision": "what --precision did: the autocast setting mgprof put around the trained "
    "module's forward (fp32 = autocast disabled there), the script's own autocast and "
    "GradScaler if it had them, fp16 loss scaling (inserted by mgprof, the script's, or none: "
    "speed only), and the loss per optimizer update (sum of the scalars backpropagated in it, "
    "averaged over ranks)",
    "precision.loss_check": "the loss per update against the baseline precision row's (same "
    "script, strategy and seed): non-finite = inf/NaN in some update; not comparable = the "
    f"first update's losses differ by more than {LOSS_DEVIATION_PCT:g} % (different weights or "
    f"data, not precision); diverged = the mean relative gap over the last {TAIL} compared "
    f"updates exceeds {LOSS_DEVIATION_PCT:g} %; else ok",
}


class LossCheck(msgspec.Struct, kw_only=True):
    """One precision row's loss against its baseline row's, update by update."""

    status: Literal["ok", "diverged", "non-finite", "not comparable", "not measured"]
    detail: str
    compared_updates: int = 0
    nonfinite_updates: int = 0
    first_gap_pct: float | None = None
    max_gap_pct: float | None = None
    tail_gap_pct: float | None = None
    """Mean relative gap over the last ``TAIL`` compared updates."""
    last_loss: float | None = None
    baseline_last_loss: float | None = None


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def mean_losses(run: RunRecord) -> tuple[list[float | None], list[int]]:
    """Per update, the mean over ranks of each rank's loss (None where a rank had none), and
    the updates whose loss was inf/NaN on some rank."""
    records = [r.training.precision for r in run.ranks if r.training.precision]
    if not records:
        return [], []
    n = min(len(p.losses) for p in records)
    bad = sorted({k for p in records for k in p.nonfinite if 0 <= k < n})
    out: list[float | None] = []
    for k in range(n):
        values = [p.losses[k] for p in records]
        if k in bad or any(v is None for v in values):
            out.append(None)
        else:
            out.append(sum(v for v in values if v is not None) / len(values))
    return out, bad


def precision_analysis(run: RunRecord) -> dict[str, Any] | None:
    """``analysis["precision"]``; None when the run had no ``--precision``."""
    records = [(r.rank, r.training.precision) for r in run.ranks if r.training.precision]
    if not records:
        return None
    first = records[0][1]
    assert first is not None
    applied = [rank for rank, p in records if p and p.applied]
    losses, nonfinite = mean_losses(run)
    known = [v for v in losses if v is not None]
    scripts = {p.script_autocast for _, p in records if p and p.script_autocast}
    scaling = {p.loss_scaling for _, p in records if p and p.loss_scaling}
    notes = sorted({p.loss_scaling_note for _, p in records if p and p.loss_scaling_note})
    reasons = sorted({p.reason for _, p in records if p and p.reason and not p.applied})
    return {
        "requested": first.requested,
        "applied_ranks": applied,
        "ranks": len(records),
        "device_type": first.device_type,
        "module_class": first.module_class,
        "not_applied_reason": "; ".join(reasons) or None,
        "script_autocast": sorted(scripts)[0] if scripts else None,
        "script_grad_scaler": any(p.script_grad_scaler for _, p in records if p),
        "loss_scaling": sorted(scaling)[0] if scaling else None,
        "loss_scaling_note": "; ".join(notes) or None,
        "skipped_updates": max((p.skipped_updates for _, p in records if p), default=0),
        "losses": losses,
        "losses_truncated": any(p.losses_truncated for _, p in records if p),
        "nonfinite_updates": nonfinite,
        "first_loss": known[0] if known else None,
        "last_loss": known[-1] if known else None,
    }


class PrecisionFacts(Protocol):
    """What :func:`setting_label` reads (``mgprof.analyze.run.schema.PrecisionAnalysis``)."""

    @property
    def requested(self) -> str: ...
    @property
    def applied_ranks(self) -> list[int]: ...
    @property
    def not_applied_reason(self) -> str | None: ...
    @property
    def loss_scaling(self) -> str | None: ...
    @property
    def script_autocast(self) -> str | None: ...


def setting_label(precision: PrecisionFacts | Mapping[str, Any] | None) -> str:
    """``bf16 autocast (mgprof)``, ``fp32 (autocast off at the model)``, with the script's
    own setting named when mgprof replaced it. Takes the typed block or its dict."""
    if not precision:
        return "the script's own"
    if isinstance(precision, Mapping):
        requested, applied = precision.get("requested"), precision.get("applied_ranks")
        reason, scaling = precision.get("not_applied_reason"), precision.get("loss_scaling")
        own = precision.get("script_autocast")
    else:
        requested, applied = precision.requested, precision.applied_ranks
        reason, scaling = precision.not_applied_reason, precision.loss_scaling
        own = precision.script_autocast
    if not applied:
        why = reason or "the trained module was not found"
        return f"{requested} asked, not applied: {why}"
    text = "fp32 (autocast off at the model)" if requested == "fp32" else f"{requested} autocast"
    if requested == "fp16":
        text += {
            "inserted": " + GradScaler (inserted by mgprof)",
            "script": " + the script's GradScaler",
        }.get(str(scaling), " without loss scaling (speed only)")
    if own:
        text += f"; replaces the script's own {own} autocast at the model"
    return text


def _gap(a: float, b: float) -> float:
    return 100.0 * abs(a - b) / max(abs(b), 1e-12)


def loss_check(
    losses: Sequence[float | None],
    baseline: Sequence[float | None],
    nonfinite: Sequence[int] = (),
) -> LossCheck:
    """``losses`` (a precision row, with the updates ``nonfinite`` whose loss was inf/NaN)
    against ``baseline`` (its strategy's baseline row)."""
    bad = sorted(set(nonfinite)) + [
        k for k, v in enumerate(losses) if v is not None and not _finite(v)
    ]
    n = min(len(losses), len(baseline))
    if n == 0 and not bad:
        return LossCheck(
            status="not measured", detail="no loss recorded in one of the two runs (no backward?)"
        )
    last = next((v for v in reversed(losses) if v is not None), None)
    base_last = next((v for v in reversed(baseline) if v is not None), None)
    if bad:
        return LossCheck(
            status="non-finite",
            detail=f"the loss was inf/NaN in {len(bad)} of {len(losses)} updates (first: update "
            f"{bad[0] + 1})",
            nonfinite_updates=len(bad),
            last_loss=last,
            baseline_last_loss=base_last,
        )
    pairs = [
        (float(a), float(b))  # type: ignore[arg-type]
        for a, b in zip(losses[:n], baseline[:n], strict=True)
        if _finite(a) and _finite(b)
    ]
    if not pairs:
        return LossCheck(status="not measured", detail="no update has a loss in both runs")
    gaps = [_gap(a, b) for a, b in pairs]
    tail = gaps[-TAIL:]
    check = LossCheck(
        status="ok",
        detail="",
        compared_updates=len(pairs),
        first_gap_pct=gaps[0],
        max_gap_pct=max(gaps),
        tail_gap_pct=sum(tail) / len(tail),
        last_loss=last,
        baseline_last_loss=base_last,
    )
    if gaps[0] > LOSS_DEVIATION_PCT:
        check.status = "not comparable"
        check.detail = (
            f"the first update's losses already differ by {gaps[0]:.1f} %: the runs did not "
            "start from the same weights and data (seed the script, fix its data order)"
        )
    elif check.tail_gap_pct is not None and check.tail_gap_pct > LOSS_DEVIATION_PCT:
        check.status = "diverged"
        check.detail = (
            f"over the last {len(tail)} updates the loss is {check.tail_gap_pct:.1f} % away "
            f"from the baseline's on average (> {LOSS_DEVIATION_PCT:g} %)"
        )
    else:
        check.detail = (
            f"within {check.max_gap_pct:.2g} % of the baseline's loss over {len(pairs)} updates"
        )
    return check
