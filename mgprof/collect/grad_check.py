"""Whether the model learns at all: the norm of the gradients the optimizer applies, on a sample
of updates.

A loss that is identically 0 (cross-entropy over a single class: the pytorch/examples DDP
tutorial's ``nn.Linear(20, 1)`` under ``CrossEntropyLoss``), a detached loss or a frozen model
gives gradients that are exactly 0 or absent. Every figure of such a run is true and the
training is useless, and nothing else in a profile says so. A global optimizer step pre-hook
takes the total L2 norm of the gradients each optimizer is about to apply on its first
``FIRST`` updates and then on one in ``EVERY``: on the device, without a synchronisation in the
loop (the norms stay device tensors until the record is made, when they are read once).
Reading only: the update is untouched.
"""

from __future__ import annotations

import math
import weakref
from typing import Any

import torch

from mgprof.collect.failopen import report

FIRST = 4
"""Updates checked at the start of each optimizer's training."""
EVERY = 64
"""Then one update in this many: a run that stops learning later is seen too."""
MAX_CHECKS = 64
"""Norms kept per process: bounded whatever the run's length."""

_REDUCED = (torch.float16, torch.bfloat16, torch.float32)
"""Gradient dtypes whose norms are taken in fp32 (float64 and complex keep their own)."""

_pending: list[tuple[int, list[torch.Tensor] | None]] = []
"""(update index of the optimizer, per-device squared norms; None when no parameter it holds
had a gradient)."""
_updates: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
"""Updates so far per optimizer, held weakly: keyed by ``id()`` a new optimizer that reused a
freed one's id continued its count."""
_handle: Any = None


def _local(grad: torch.Tensor) -> torch.Tensor:
    """A DTensor gradient (FSDP2) as this rank's shard: its norm needs no collective."""
    to_local = getattr(grad, "to_local", None)
    return to_local() if callable(to_local) else grad


@torch.compiler.disable  # traced, its counter would make a compiled step recompile every step
def _pre_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    try:
        n = _updates.get(optimizer, 0)
        _updates[optimizer] = n + 1
        if not (n < FIRST or n % EVERY == 0) or len(_pending) >= MAX_CHECKS:
            return
        by_kind: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
        for group in optimizer.param_groups:
            for p in group["params"]:
                grad = getattr(p, "grad", None)
                if grad is None:
                    continue
                grad = _local(grad.detach())
                if grad.is_sparse:
                    grad = grad.coalesce().values()
                by_kind.setdefault((grad.device, grad.dtype), []).append(grad)
        if not by_kind:
            _pending.append((n, None))
            return
        squares = []
        with torch.no_grad():
            for (_, dtype), grads in by_kind.items():
                as_fp32 = torch.float32 if dtype in _REDUCED else None
                norms = torch._foreach_norm(grads, 2, dtype=as_fp32)
                squares.append(torch.stack(norms).abs().double().square().sum())
        _pending.append((n, squares))
    except Exception as exc:  # fail open: the update runs, unchecked
        report("gradient check", exc)


def install() -> None:
    """Register the pre-step hook once per process."""
    global _handle
    if _handle is not None:
        return
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    _handle = register_optimizer_step_pre_hook(_pre_step)


def uninstall() -> None:
    global _handle
    if _handle is not None:
        _handle.remove()
        _handle = None


def read() -> tuple[list[int], list[float | None], list[int]]:
    """The checked updates, the total gradient norm at each (None: no gradient at all, or not
    finite) and the positions whose norm was not finite (NaN or inf gradients: not zero).

    Called when the rank's record is made: the one place the device tensors are read."""
    updates: list[int] = []
    norms: list[float | None] = []
    nonfinite: list[int] = []
    try:
        for index, squares in _pending:
            updates.append(index)
            if squares is None:
                norms.append(None)
                continue
            total = sum(float(s.item()) for s in squares)
            if math.isfinite(total):
                norms.append(math.sqrt(total))
            else:
                nonfinite.append(len(norms))
                norms.append(None)
    except Exception as exc:
        report("gradient check", exc)
        return [], [], []
    return updates, norms, nonfinite
