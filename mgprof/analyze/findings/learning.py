"""Findings on whether the model learns: gradients that are exactly zero or never computed.

A profile of a model that does not learn is a profile of wasted hardware: the DDP tutorial's
loss (cross-entropy over one class) is identically 0, so every gradient is 0, and its report
read like any other. The ranks record the total gradient norm the optimizer applied on a
sample of updates (``mgprof.collect.grad_check``); this rule reads them.
"""

from __future__ import annotations

from typing import Any

from mgprof.analyze.findings.core import Finding, _rank_list, finding_id
from mgprof.analyze.run.schema import RunAnalysis
from mgprof.records import RunRecord


def _checks(run: RunRecord) -> dict[int, list[float | None]]:
    """rank -> the gradient norms it checked (ranks that checked none are left out)."""
    out: dict[int, list[float | None]] = {}
    for rec in sorted(run.ranks, key=lambda r: r.rank):
        norms = rec.training.grad_norms
        if norms:
            out[rec.rank] = list(norms)
    return out


def zero_gradients(run: RunRecord, figures: RunAnalysis) -> Finding | None:
    """Every checked update on every rank applied gradients that were exactly 0 (or none)."""
    checks = _checks(run)
    if not checks or any(r.training.grad_nonfinite for r in run.ranks):
        return None  # NaN or inf gradients are a problem of their own, not zero ones
    norms = [n for values in checks.values() for n in values]
    if any(n is not None and n != 0.0 for n in norms):
        return None
    updates = max(len(v) for v in checks.values())
    indices = max((r.training.grad_check_updates or [] for r in run.ranks), key=len, default=[])
    shown = ", ".join(str(i + 1) for i in indices[:8]) + (", …" if len(indices) > 8 else "")
    absent = all(n is None for n in norms)
    what = (
        "no parameter the optimizer holds received a gradient"
        if absent
        else ("every gradient the optimizer applied was exactly 0")
    )
    ranks = sorted(checks)
    evidence = (
        f"{what} on rank{'s' if len(ranks) > 1 else ''} {_rank_list(ranks)} in each of "
        f"{updates} checked update(s)" + (f" (updates {shown})" if shown else "")
    )
    figs: dict[str, Any] = {
        "checked_updates": updates,
        "checked_update_numbers": [i + 1 for i in indices],
        "ranks": ranks,
        "zero_norm_checks": sum(1 for n in norms if n == 0.0),
        "no_gradient_checks": sum(1 for n in norms if n is None),
    }
    cause = (
        "the parameters get no gradient: the loss is detached from them "
        "(`.detach()`, `.item()`, `torch.no_grad()`), or every parameter is frozen"
        if absent
        else "the loss does not depend on the parameters where it is computed: e.g. "
        "`CrossEntropyLoss` over a single class (a model with one output) is identically 0, "
        "a loss multiplied by 0, or labels that the model already fits exactly"
    )
    return Finding(
        id=finding_id("zero_gradients"),
        rule="zero_gradients",
        severity="high",
        title="The model does not learn: its gradients are zero",
        evidence=evidence,
        cause=cause + "; the step times are real, but the training changes nothing.",
        change=(
            "check the loss: print `loss.item()` for a few steps and the gradient norm "
            "(`torch.nn.utils.clip_grad_norm_(model.parameters(), float('inf'))`); for one "
            "output use `BCEWithLogitsLoss`, for C classes a model with C outputs"
        ),
        fix=[
            "print(loss.item())",
            "torch.nn.utils.clip_grad_norm_(model.parameters(), float('inf'))",
        ],
        saving=None,
        figures=figs,
    )
