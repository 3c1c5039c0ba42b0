"""``--strategy fsdp``: FSDP2 applied to a script that does not shard its model itself.

Units follow the FSDP2 tutorial's rule, found from the model instead of written by hand: the
module class whose instances repeat (two or more), together hold most of the parameters and sit
highest in the tree (a ``ModuleList`` of transformer blocks, not the ``Linear`` layers inside
them) gets ``fully_shard`` on each instance; a model with no such class gets it on each direct
child that holds a sizeable share of the parameters instead. The root is sharded last, so its
own parameters (embeddings, heads) form one more unit and its forward starts the all-gathers.

A unit whose parameters are shared with a module outside it (tied embeddings and heads) is left
to the root: sharding one half of a tied pair would give the two halves different tensors.

Before sharding, every rank takes rank 0's parameters and buffers (DDP does the same at
construction), so an FSDP row starts where the DDP row starts.

The script's optimizer was built over the unsharded parameters; FSDP2 replaces each parameter
with a ``DTensor`` shard, so the optimizer's parameter groups are pointed at the new tensors by
name (``repoint``). That is safe only before the optimizer holds state; with state (a resumed
checkpoint) the model is not sharded and the reason is recorded.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch
from torch import nn

CHILD_SHARE = 0.05
"""Fallback units: a direct child holding at least this share of the parameters."""
REPEATED_SHARE = 0.5
"""A repeated class is the unit class when its instances hold at least this share."""


def _numel(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _outermost(instances: list[tuple[str, nn.Module]]) -> list[tuple[str, nn.Module]]:
    """Instances not nested inside another instance of the list (a class used recursively)."""
    names = [name for name, _ in instances]
    return [
        (name, m)
        for name, m in instances
        if not any(other != name and name.startswith(other + ".") for other in names)
    ]


def _shares_outside(module: nn.Module, root: nn.Module) -> bool:
    """Whether a parameter of ``module`` is also reachable from ``root`` outside it (tied)."""
    inside = {id(p) for p in module.parameters()}
    inside_modules = {id(m) for m in module.modules()}
    for m in root.modules():
        if id(m) in inside_modules:
            continue
        for p in m.parameters(recurse=False):
            if id(p) in inside:
                return True
    return False


def choose_units(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The modules to ``fully_shard`` before the root (name, module), in model order."""
    total = _numel(model)
    if total == 0:
        return []
    by_class: dict[type, list[tuple[str, nn.Module]]] = defaultdict(list)
    for name, module in model.named_modules():
        if module is model or not name:
            continue
        by_class[type(module)].append((name, module))
    best: tuple[float, int, type] | None = None
    for cls, found in by_class.items():
        instances = [(n, m) for n, m in _outermost(found) if _numel(m) > 0]
        if len(instances) < 2:
            continue
        held = sum(_numel(m) for _, m in instances)
        if held < REPEATED_SHARE * total:
            continue
        depth = sum(n.count(".") for n, _ in instances) / len(instances)
        key = (-depth, held, cls)
        if best is None or key[:2] > best[:2]:
            best = key
    if best is not None:
        units = [(n, m) for n, m in _outermost(by_class[best[2]]) if _numel(m) > 0]
    else:
        units = [(n, m) for n, m in model.named_children() if _numel(m) >= CHILD_SHARE * total]
    return [(n, m) for n, m in units if not _shares_outside(m, model)]


def shard(model: nn.Module, *, reshard_after_forward: bool = True) -> nn.Module:
    """``fully_shard`` the chosen units and the root over all ranks of the default group,
    after taking rank 0's parameters; returns ``model`` (now an ``FSDPModule``)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard  # the watched name: fsdp_watch sees it

    params = list(model.parameters())
    where = params[0].device if params else torch.device("cpu")
    with torch.no_grad():
        for tensor in model.state_dict().values():
            if isinstance(tensor, torch.Tensor) and tensor.device == where:
                dist.broadcast(tensor, src=0)
    mesh = init_device_mesh(where.type, (dist.get_world_size(),))
    for _, unit in choose_units(model):
        fully_shard(unit, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
    return model


def why_not(model: nn.Module, optimizers: list[Any]) -> str | None:
    """Why ``model`` cannot be sharded for the script safely (None: it can)."""
    import torch.distributed as dist

    params = list(model.parameters())
    if not params:
        return "the trained model has no parameters to shard"
    if any(type(p).__name__ == "DTensor" for p in params):
        return "the model's parameters are already distributed (DTensor)"
    devices = {p.device for p in params}
    if len(devices) > 1:
        return f"the model's parameters are on {len(devices)} devices (model parallel)"
    if dist.is_initialized() and dist.get_world_size() < 2:
        return "FSDP needs two or more ranks"
    mine = {id(p) for p in params}
    for opt in optimizers:
        held = [p for group in opt.param_groups for p in group["params"] if id(p) in mine]
        if held and any(opt.state.get(p) for p in held):
            return (
                "the optimizer already holds state (a resumed checkpoint?): its tensors "
                "cannot be re-pointed at FSDP's shards"
            )
    return None


def names_of(model: nn.Module) -> dict[int, str]:
    """Each parameter's name (first one, for a tied parameter), by identity."""
    out: dict[int, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        out.setdefault(id(p), name)
    return out


def repoint(model: nn.Module, before: dict[int, str], optimizers: list[Any]) -> int:
    """Point the optimizers' parameter groups at the sharded parameters that replaced the
    ones they were built over (by name); returns how many entries changed."""
    after = dict(model.named_parameters(remove_duplicate=False))
    changed = 0
    for opt in optimizers:
        for group in opt.param_groups:
            new = []
            for p in group["params"]:
                name = before.get(id(p))
                replacement = after.get(name) if name is not None else None
                if replacement is not None and replacement is not p:
                    new.append(replacement)
                    changed += 1
                else:
                    new.append(p)
            group["params"] = new
    return changed
