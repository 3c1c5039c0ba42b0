"""``mgprof.wrap``: one line puts a model under single device, DataParallel, DDP or FSDP.

The launcher chooses the strategy (``MGPROF_STRATEGY``) so one script runs unchanged under each;
``strategy=`` overrides it. The process group is initialised from torchrun's environment when
needed: gloo on CPU, NCCL on CUDA.
"""

from __future__ import annotations

import os
import random
import warnings
import weakref
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from mgprof.collect.envknobs import positive_int_env
from mgprof.collect.failopen import guarded, report

STRATEGY_ENV = "MGPROF_STRATEGY"
BATCH_SIZE_ENV = "MGPROF_BATCH_SIZE"
NOSYNC_STEPS_ENV = "MGPROF_NOSYNC_STEPS"
"""Set by ``mgprof compare``: DDP models get the switchable comm hook for the no-sync A/B."""
STRATEGIES = ("single", "dp", "ddp", "fsdp", "fsdp-noreshard")
RANKED = ("ddp", "fsdp", "fsdp-noreshard")
"""Strategies that run one process per device (torchrun's ranks)."""

_dp_device_ids: list[int] | None = None
_skip_grad_sync = False
_switchable: list[weakref.ref[nn.Module]] = []


def _local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", 0))


def _gpu_limit(available: int) -> int:
    """How many GPUs DataParallel may use: ``mgprof analyze --gpus N`` caps it at N."""
    try:
        return max(1, min(available, int(os.environ.get("MGPROF_GPUS", available))))
    except ValueError:
        return available


def chosen_strategy(strategy: str | None = None) -> str:
    """Explicit argument, else the launcher's choice, else DDP under torchrun, else single."""
    choice = strategy or os.environ.get(STRATEGY_ENV)
    if choice is None:
        choice = "ddp" if int(os.environ.get("WORLD_SIZE", 1)) > 1 else "single"
    if choice not in STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, got {choice!r}")
    return choice


def device() -> torch.device:
    """The device this process should put its model and batches on."""
    if torch.cuda.is_available():
        if chosen_strategy() in RANKED:
            return torch.device("cuda", _local_rank() % torch.cuda.device_count())
        return torch.device("cuda", 0 if _dp_device_ids is None else _dp_device_ids[0])
    return torch.device("cpu")


def devices_in_use(strategy: str | None = None) -> list[int]:
    """CUDA indices this process drives (all DP devices, or its own); [] on CPU."""
    if not torch.cuda.is_available():
        return []
    try:
        choice = chosen_strategy(strategy)
    except ValueError:
        choice = "single"
    if choice == "dp":
        return list(_dp_device_ids or range(_gpu_limit(torch.cuda.device_count())))
    if choice in RANKED:
        return [_local_rank() % torch.cuda.device_count()]
    return [torch.cuda.current_device()]


def init_process_group(backend: str | None = None) -> None:
    """Initialise the default group from torchrun's environment if it is not up yet.

    ``backend`` None: NCCL when CUDA is available, else gloo (auto-wrap passes gloo for a model
    that trains on the CPU of a CUDA machine)."""
    if dist.is_initialized():
        return
    if "MASTER_ADDR" not in os.environ or "WORLD_SIZE" not in os.environ:
        raise RuntimeError(
            "DDP needs a process group: launch with 'mgprof analyze --gpus N' or torchrun"
        )
    kwargs: dict[str, Any] = {}
    from mgprof.collect.hooks import collective_timeout  # hooks imports this package

    timeout = collective_timeout()  # mgprof analyze --collective-timeout
    if timeout is not None:
        kwargs["timeout"] = timeout
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(_local_rank() % torch.cuda.device_count())
        dist.init_process_group(
            backend="nccl", device_id=torch.device("cuda", _local_rank()), **kwargs
        )
    else:
        dist.init_process_group(backend="gloo", **kwargs)


def wrap(
    model: nn.Module,
    strategy: str | None = None,
    device_ids: list[int] | None = None,
    **ddp_kwargs: Any,
) -> nn.Module:
    """Return ``model`` on the right device under the chosen strategy.

    ``single``: moved to the device. ``dp``: ``nn.DataParallel`` over ``device_ids`` (all
    visible GPUs by default). ``ddp``: ``DistributedDataParallel`` on this rank's device, the
    process group initialised from torchrun's environment when needed. Extra keyword arguments
    go to DDP (``bucket_cap_mb``, ``find_unused_parameters``, ...). ``fsdp`` /
    ``fsdp-noreshard``: FSDP2's ``fully_shard`` on each repeated block and on the root
    (``mgprof.collect.wrapping.fsdp_wrap``), the model itself returned (FSDP changes it in
    place); build the optimizer after this call, as FSDP2 requires.
    """
    global _dp_device_ids
    choice = chosen_strategy(strategy)
    if choice == "dp":
        if not torch.cuda.is_available():
            warnings.warn(
                "mgprof.wrap: DataParallel needs CUDA devices; running on a single CPU device",
                RuntimeWarning,
                stacklevel=2,
            )
            return model
        ids = device_ids or list(range(_gpu_limit(torch.cuda.device_count())))
        _dp_device_ids = ids
        return nn.DataParallel(model.to(torch.device("cuda", ids[0])), device_ids=ids)
    if choice == "ddp":
        init_process_group()
        from torch.nn.parallel import DistributedDataParallel

        with guarded("wrap"):  # facts for the findings: never a reason to fail the wrap
            from mgprof.collect import hooks

            cap = ddp_kwargs.get("bucket_cap_mb")  # None (torch's default) is 25 MB
            hooks.note_fact(
                "find_unused_parameters", bool(ddp_kwargs.get("find_unused_parameters"))
            )
            hooks.note_fact("ddp_bucket_cap_mb", float(cap) if cap is not None else 25.0)
        if torch.cuda.is_available():
            dev = device()
            ids = device_ids or [dev.index]
            ddp = DistributedDataParallel(model.to(dev), device_ids=ids, **ddp_kwargs)
        else:
            ddp = DistributedDataParallel(model, **ddp_kwargs)
        enable_sync_ab(ddp, lazy=True)
        return ddp
    if choice in RANKED:  # fsdp, fsdp-noreshard
        init_process_group()
        from mgprof.collect.wrapping.fsdp_wrap import shard

        return shard(model.to(device()), reshard_after_forward=choice == "fsdp")
    return model.to(device())


def enable_sync_ab(ddp: nn.Module, *, lazy: bool = False) -> None:
    """Give a DDP model mgprof made (``wrap`` or auto-wrap) mgprof's comm hook when something
    needs it: DDP's averaging all-reduce, plus the gradient norms behind the noise scale at every
    sync (``--noise-scale``) or at a sample of them, switchable off for ``mgprof compare``'s
    no-sync A/B. Without either, DDP keeps its own reducer and the norms are sampled without a
    hook (``collect.noise_scale.attach_sampled``).

    ``lazy``: a model handed back to the script (``mgprof.wrap``) gets the hook at its first
    forward, so a comm hook the script registers itself before training still wins; compare's
    A/B needs its hook at once, as before. Nothing is installed when neither is wanted.
    """
    from mgprof.collect import noise_scale

    ab = _nosync_requested()
    every = noise_scale.enabled()
    record = noise_scale.mode() != "off"
    try:
        ddp._mgprof_built = True  # type: ignore[assignment]
        if not ab and not every:
            noise_scale.attach_sampled(ddp)  # sampled norms, DDP's own reducer untouched
            return
    except Exception as exc:  # fail open: no norms, the training runs as usual
        report("noise scale", exc)
        return
    try:
        if lazy and not ab:
            noise_scale.install_at_first_forward(ddp, _switchable_allreduce)
            return
        state = noise_scale.install(ddp, _switchable_allreduce, record=record)
        if state is None and not ab:
            return  # no norms on this model: DDP's built-in averaging stays
        if state is None:  # the A/B's hook as before: torch's allreduce_hook
            ddp.register_comm_hook(None, _torch_allreduce)  # type: ignore[operator]
        if ab:
            _switchable.append(weakref.ref(ddp))
    except Exception as exc:  # fail open: no A/B and no norms, the training runs as usual
        report("sync A/B disabled" if ab else "noise scale", exc)


def _nosync_requested() -> bool:
    """Only ``mgprof compare`` asks for the A/B; plain ``wrap`` keeps DDP's built-in all-reduce."""
    try:
        return int(os.environ.get(NOSYNC_STEPS_ENV, "0") or 0) > 0
    except ValueError:
        return False


def _switchable_allreduce(state, bucket):  # type: ignore[no-untyped-def]
    """DDP comm hook: DDP's own averaging all-reduce (with the noise-scale norms when the state
    records them), or, while the A/B's "B" steps run, the local gradient unchanged (a completed
    future) so the step pays no communication at all.

    Unannotated on purpose: DDP rejects a hook whose annotations are not the real
    ``dist.GradBucket``/``Future`` classes, and this module's annotations are strings.
    """
    if _skip_grad_sync:
        if bucket.is_last() and hasattr(state, "samples"):
            state.samples = 0  # a skipped sync measures nothing: its forwards start over
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut
    from mgprof.collect.noise_scale import averaging_allreduce

    return averaging_allreduce(state, bucket)


def _torch_allreduce(state, bucket):  # type: ignore[no-untyped-def]
    """The A/B's hook where mgprof's averaging cannot match DDP's bit for bit (see
    ``collect.noise_scale``): torch's ``allreduce_hook``, as before the norms existed."""
    if _skip_grad_sync:
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    return allreduce_hook(state, bucket)


def set_grad_sync(enabled: bool) -> None:
    """Switch gradient synchronisation of the models wrapped for the A/B on or off."""
    global _skip_grad_sync
    _skip_grad_sync = not enabled


def switchable_models() -> list[nn.Module]:
    """DDP models (still alive) whose gradient sync ``set_grad_sync`` controls."""
    alive = [ref() for ref in _switchable]
    return [m for m in alive if m is not None]


def seed_everything(seed: int, per_rank: bool = True) -> int:
    """Seed Python, NumPy (if present) and torch; with ``per_rank`` each rank gets seed + rank.

    Distinct seeds per rank keep data augmentation and dropout independent across ranks, as the
    multi-GPU guides advise; model initialisation stays identical because DDP broadcasts rank 0's
    parameters at construction. Returns the seed used on this rank.
    """
    rank = dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", 0))
    used = seed + rank if per_rank else seed
    random.seed(used)
    try:
        import numpy as np

        np.random.seed(used % (2**32))
    except ImportError:
        pass
    torch.manual_seed(used)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(used)
    return used


def batch_size(default: int) -> int:
    """The batch size for this run: the launcher's trial value (``mgprof sweep``) or ``default``."""
    value = positive_int_env(BATCH_SIZE_ENV, default)  # a malformed value raises: a launcher bug
    if os.environ.get(BATCH_SIZE_ENV):
        with guarded("batch_size"):
            from mgprof.collect import hooks

            hooks.note_fact("batch_size_read", True)
    return value
