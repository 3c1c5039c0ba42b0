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
from typing import Any

import torch

from mgprof.collect.failopen import report

FIRST = 4
"""Updates checked at the start of each optimizer's training."""
EVERY = 64
"""Then one update in this many: a run that stops learning later is seen too."""
MAX_CHECKS = 64
"""Norms kept per process: bounded whatever the run's length."""

_pending: list[tuple[int, list[torch.Tensor] | None]] = []
"""(update index of the optimizer, per-device squared norms; None when no parameter it holds
had a gradient)."""
_updates: dict[int, int] = {}
_handle: Any = None


def _local(grad: torch.Tensor) -> torch.Tensor:
    """A DTensor gradient (FSDP2) as this rank's shard: its norm needs no collective."""
    to_local = getattr(grad, "to_local", None)
    return to_local() if callable(to_local) else grad


def _pre_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    try:
        key = id(optimizer)
        n = _updates.get(key, 0)
        _updates[key] = n + 1
        if not (n < FIRST or n % EVERY == 0) or len(_pending) >= MAX_CHECKS:
            return
        by_device: dict[torch.device, list[torch.Tensor]] = {}
        for group in optimizer.param_groups:
            for p in group["params"]:
                grad = getattr(p, "grad", None)
                if grad is None:
                    continue
                grad = _local(grad.detach())
                if grad.is_sparse:
                    grad = grad.coalesce().values()
                by_device.setdefault(grad.device, []).append(grad)
        if not by_device:
            _pending.append((n, None))
            return
        squares = []
        with torch.no_grad():
            for grads in by_device.values():
                norms = torch._foreach_norm(grads, 2, dtype=torch.float32)
                squares.append(torch.stack(norms).square().sum())
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


def read() -> tuple[list[int], list[float | None]]:
    """The checked updates and the total gradient norm at each (None: no gradient at all).

    Called when the rank's record is made: the one place the device tensors are read."""
    updates: list[int] = []
    norms: list[float | None] = []
    try:
        for index, squares in _pending:
            updates.append(index)
            if squares is None:
                norms.append(None)
                continue
            total = sum(float(s.item()) for s in squares)
            norms.append(math.sqrt(total) if math.isfinite(total) else total)
    except Exception as exc:
        report("gradient check", exc)
        return [], []
    return updates, norms
