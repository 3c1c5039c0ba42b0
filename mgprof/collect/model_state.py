"""What the trained model's state holds on this rank: parameters, gradients, optimizer state.

FSDP's whole point is that these shrink to about 1/N of DDP's on each rank; the peak memory of a
rank (CUDA allocator, or RSS on CPU) mixes them with activations, workspace and, on CPU, the
interpreter itself. The bytes of the tensors the optimizer holds are exact and need no
allocator: measured once per optimizer, just before its second update (Adam's state exists from
the first, and the gradients about to be applied are there), from each tensor's local shard (a
DTensor, as FSDP2 makes, counts only the part this rank stores). An optimizer updated only once
is measured when the rank's record is made.

A pre-step hook, not a post-step one: mgprof's own post-step hook starts the session at the
first update, and torch iterates its post-step hooks while they run, so one registered or
removed then would end the step with "OrderedDict mutated during iteration".
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from mgprof.collect.failopen import report
from mgprof.records import ModelStateRecord

_handle: Any = None
_seen: set[int] = set()
_once: dict[int, weakref.ref[Any]] = {}
"""Optimizers updated once so far, not yet measured."""
_params: dict[int, int] = {}
_grads: dict[int, int] = {}
_state: dict[int, int] = {}
_elements: dict[int, int] = {}
_sharded = False

MIB = 1024 * 1024


def _local_bytes(tensor: torch.Tensor) -> int:
    to_local = getattr(tensor, "to_local", None)
    local = to_local() if callable(to_local) and type(tensor).__name__ == "DTensor" else tensor
    return int(local.numel()) * int(local.element_size())


@torch.compiler.disable
def _pre_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    key = id(optimizer)
    if key in _seen:
        return
    if key not in _once:
        try:
            _once[key] = weakref.ref(optimizer)
        except TypeError:
            pass
        return
    _measure(optimizer)


def _measure(optimizer: Any) -> None:
    global _sharded
    key = id(optimizer)
    _seen.add(key)
    _once.pop(key, None)
    try:
        for group in optimizer.param_groups:
            for p in group["params"]:
                pid = id(p)
                if pid in _params:
                    continue
                _sharded = _sharded or type(p).__name__ == "DTensor"
                _params[pid] = _local_bytes(p)
                _elements[pid] = int(p.numel())
                grad = getattr(p, "grad", None)
                if grad is not None:
                    _grads[pid] = _local_bytes(grad)
                state = optimizer.state.get(p) or {}
                _state[pid] = sum(
                    _local_bytes(v)
                    for v in state.values()
                    if isinstance(v, torch.Tensor) and v.dim() > 0
                )
    except Exception as exc:  # fail open: no model-state figures
        report("model state", exc)


def install() -> None:
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


def read() -> ModelStateRecord | None:
    """This rank's model state after the first update (None: no optimizer update was seen)."""
    for ref in list(_once.values()):
        optimizer = ref()
        if optimizer is not None:
            _measure(optimizer)
    if not _params:
        return None
    return ModelStateRecord(
        parameters_mib=round(sum(_params.values()) / MIB, 6),
        gradients_mib=round(sum(_grads.values()) / MIB, 6),
        optimizer_mib=round(sum(_state.values()) / MIB, 6),
        parameters=sum(_elements.values()),
        sharded=_sharded,
    )
