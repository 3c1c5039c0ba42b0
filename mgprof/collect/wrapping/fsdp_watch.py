"""A script's own FSDP, recognised: its units and settings, and its forwards as the evidence that
the ranks synchronised their gradients.

FSDP (``fully_shard``, FSDP2; ``FullyShardedDataParallel``, FSDP1) synchronises gradients by a
reduce-scatter in backward, not by DDP's all-reduce, so a rank whose model FSDP shards ran no
DDP forward, and its run read as "independent replicas". Every FSDP module the script makes
(``fully_shard`` and FSDP1's constructor are watched from the start of the run; modules made
before a script's own session started are found once by a walk over live objects) gets a
forward pre-hook and a forward hook, kept on roots only: once FSDP has marked a unit as not a
root its hooks are removed, so nested units cost nothing per call. A forward of the outermost
FSDP module with gradients on, outside backward, counts as one sharded, gradient-synchronising
forward, and its inputs give the samples the step trained (FSDP swaps module classes itself,
so auto-wrap's route cannot observe them).
Reading only: the hooks change nothing the script computes.
"""

from __future__ import annotations

import functools
import weakref
from collections import Counter
from typing import Any

import torch
from torch import nn

from mgprof.collect.batchinfo import forward_samples
from mgprof.collect.failopen import report
from mgprof.records import FsdpRecord

_watched: weakref.WeakSet[nn.Module] = weakref.WeakSet()
_handles: weakref.WeakKeyDictionary[nn.Module, list[Any]] = weakref.WeakKeyDictionary()
"""Each watched unit's two hook handles, removed once FSDP says the unit is not a root."""
_depth = 0
"""FSDP forwards under way: the outermost one is the step's (nested units are parts of it)."""
_forwards = 0


@functools.cache
def fsdp_classes() -> tuple[type, ...]:
    """FSDP2's ``FSDPModule`` (public from torch 2.6; ``torch.distributed._composable.fsdp``
    before) and FSDP1's ``FullyShardedDataParallel``; either may be missing (a torch built
    without distributed has neither)."""
    found: list[type] = []
    try:
        from torch.distributed.fsdp import FSDPModule

        found.append(FSDPModule)
    except ImportError:
        try:
            from torch.distributed._composable.fsdp import FSDPModule

            found.append(FSDPModule)
        except ImportError:
            pass
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel

        found.append(FullyShardedDataParallel)
    except ImportError:
        pass
    return tuple(found)


def is_fsdp(module: Any) -> bool:
    classes = fsdp_classes()
    return bool(classes) and isinstance(module, classes)


def watch(module: Any) -> None:
    """Hook ``module`` (an FSDP module; anything else is left alone) once."""
    if not is_fsdp(module) or module in _watched:
        return
    _watched.add(module)
    _handles[module] = [
        module.register_forward_pre_hook(_pre_forward, with_kwargs=True),
        module.register_forward_hook(_post_forward, always_call=True),
    ]


def _in_backward() -> bool:
    """Inside the autograd engine: a forward run there is activation checkpointing recomputing
    a block, not a step of its own."""
    task = getattr(torch._C, "_current_graph_task_id", None)
    return task is not None and task() != -1


def _not_root(module: Any) -> bool:
    """FSDP knows its root once it has run (FSDP2's state ``_is_root``, FSDP1's ``_is_root``):
    a unit that is not one is part of another model's step."""
    try:
        state = module._get_fsdp_state() if hasattr(module, "_get_fsdp_state") else module
        return getattr(state, "_is_root", None) is False
    except Exception:
        return False


@torch.compiler.disable
def _pre_forward(module: Any, args: Any, kwargs: Any) -> None:
    global _depth, _forwards
    try:
        if _not_root(module):  # a unit inside the root's forward: unhooked, nothing to count
            for handle in _handles.pop(module, []):
                handle.remove()  # its forward hook too, so the depth is not touched
            return
        outermost = _depth == 0
        _depth += 1
        if not outermost or not module.training or not torch.is_grad_enabled():
            return
        if _in_backward():
            return
        _forwards += 1
        forward_samples.add(args, kwargs)
    except Exception as exc:  # fail open: the forward runs, uncounted
        report("FSDP hook", exc)


@torch.compiler.disable
def _post_forward(module: Any, args: Any, output: Any) -> None:
    global _depth
    _depth = max(0, _depth - 1)


def forwards() -> int:
    """Outermost FSDP forwards with gradients on, so far in this process."""
    return _forwards


def _own_class(module: Any) -> str:
    """The script's class of an FSDP unit: FSDP2 makes ``FSDP<Class>`` subclassing both
    ``FSDPModule`` and the class; FSDP1 wraps the module."""
    inner = getattr(module, "_fsdp_wrapped_module", None)
    if inner is not None:
        return type(inner).__name__
    return script_class(module).__name__


def script_class(module: Any) -> type:
    """The first class in ``module``'s MRO that is not FSDP's (``FSDP<Class>``, ``FSDPModule``,
    and mgprof's route around them, which subclasses them): the class the script wrote."""
    classes = fsdp_classes()
    fsdp2 = classes[0] if classes else None
    for cls in type(module).__mro__:
        if cls is object:
            continue
        if fsdp2 is not None and issubclass(cls, fsdp2):
            continue
        return cls
    return type(module)


def _dtype(value: Any) -> str | None:
    return str(value).removeprefix("torch.") if value is not None else None


def settings() -> FsdpRecord | None:
    """What the watched FSDP modules are: units, classes, resharding, precision, mesh."""
    modules = list(_watched)
    if not modules:
        return None
    try:
        return _settings(modules)
    except Exception as exc:  # private FSDP state changed shape: the units are still counted
        report("FSDP settings", exc)
        return FsdpRecord(api="unknown", units=len(modules))


def _settings(modules: list[Any]) -> FsdpRecord:
    fsdp1 = [m for m in modules if hasattr(m, "_fsdp_wrapped_module")]
    if fsdp1:
        first = fsdp1[0]
        strategy = getattr(first, "sharding_strategy", None)
        mp = getattr(first, "mixed_precision", None)
        return FsdpRecord(
            api="FullyShardedDataParallel",
            units=len(fsdp1),
            unit_classes=_classes(fsdp1),
            sharding_strategy=getattr(strategy, "name", None),
            param_dtype=_dtype(getattr(mp, "param_dtype", None)),
            reduce_dtype=_dtype(getattr(mp, "reduce_dtype", None)),
            world=int(getattr(first, "world_size", 0) or 0) or None,
        )
    reshard: set[bool] = set()
    param_dtype = reduce_dtype = None
    mesh: list[int] | None = None
    units = []
    sizes: list[int] = []
    for module in modules:
        group = module._get_fsdp_state()._fsdp_param_group
        if group is None:  # a root holding no parameters of its own
            continue
        units.append(module)
        sizes.append(sum(int(fp._orig_size.numel()) for fp in group.fsdp_params))
        reshard.add(group.post_forward_mesh_info is not None)
        policy = group.mp_policy
        param_dtype = param_dtype or _dtype(policy.param_dtype)
        reduce_dtype = reduce_dtype or _dtype(policy.reduce_dtype)
        if mesh is None:
            mesh = [int(n) for n in group.mesh_info.mesh.shape]
    return FsdpRecord(
        api="fully_shard",
        units=len(units),
        unit_classes=_classes(units),
        reshard_after_forward=sorted(reshard),
        param_dtype=param_dtype,
        reduce_dtype=reduce_dtype,
        mesh_shape=mesh,
        world=None if mesh is None else _product(mesh),
        unit_parameters=sorted(sizes, reverse=True),
    )


def _classes(units: list[Any]) -> dict[str, int]:
    """Unit classes with their counts, most units first (the same order on every rank)."""
    counts = Counter(_own_class(m) for m in units)
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def _product(values: list[int]) -> int:
    out = 1
    for v in values:
        out *= v
    return out
