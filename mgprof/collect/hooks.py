"""Process-wide hooks that observe how a script trains, without changing what it does.

Installed while a session runs: DataLoader iteration is timed (data-loading stalls),
``destroy_process_group`` first lets the session send its record to rank 0,
``init_process_group`` gets ``mgprof analyze --collective-timeout`` when the script gives no
timeout of its own (so a rank stuck in a collective fails the run instead of hanging), and a few
facts are noted for the findings (loader workers, pin_memory, DistributedSampler and set_epoch,
autocast, DDP's find_unused_parameters and bucket size). Each patch calls the original first
or last and swallows its own errors, so the script's behaviour is unchanged.
"""

from __future__ import annotations

import datetime
import functools
import os
import time
import weakref
from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch.nn import DataParallel
from torch.utils.data import DistributedSampler
from torch.utils.data.dataloader import _BaseDataLoaderIter

from mgprof.collect import grad_check, model_state
from mgprof.collect.failopen import report as _report
from mgprof.collect.wrapping import compile_watch, fsdp_watch
from mgprof.records import TrainingFacts


class Observer(Protocol):
    """What the hooks report to: the running session (kept as an interface so that this module
    never imports the session, which imports it)."""

    def add_dataloader_wait(self, ms: float) -> None: ...

    def note_batch(self, batch: Any) -> None: ...


_facts: dict[str, Any] = {}
_owner: Observer | None = None
_originals: dict[str, Any] = {}
_before_destroy: Callable[[], None] | None = None


def set_before_destroy(callback: Callable[[], None] | None) -> None:
    """Register what runs just before ``destroy_process_group`` (the session module stops the
    active session there, so its record reaches rank 0 while the group still exists)."""
    global _before_destroy
    _before_destroy = callback


def training_facts() -> TrainingFacts:
    """What the hooks observed so far in this process."""
    facts = {k: v for k, v in _facts.items() if k in TrainingFacts.__struct_fields__}
    facts["cpu_threads"] = torch.get_num_threads()
    facts["omp_num_threads"] = os.environ.get("OMP_NUM_THREADS")
    facts["cpu_cores"] = _usable_cores()
    if fsdp_watch.forwards() or fsdp_watch.settings() is not None:
        facts["fsdp_forwards"] = fsdp_watch.forwards()
        facts["fsdp"] = fsdp_watch.settings()
    facts["model_state"] = model_state.read()
    try:
        facts["compile"] = compile_watch.record()
    except Exception as exc:
        _report("compile counters", exc)
    updates, norms, nonfinite = grad_check.read()
    if updates:
        facts["grad_check_updates"], facts["grad_norms"] = updates, norms
        facts["grad_nonfinite"] = nonfinite
    return TrainingFacts(**facts)


def _usable_cores() -> int | None:
    """Cores this process may run on: its affinity mask (a container or ``taskset`` limit),
    else ``os.cpu_count()``."""
    getaffinity = getattr(os, "sched_getaffinity", None)
    if getaffinity is not None:
        try:
            return len(getaffinity(0))
        except OSError:
            pass
    return os.cpu_count()


def _gradient_mib(module: Any) -> float:
    """MiB of the gradients a DDP module all-reduces: its trainable parameters' bytes."""
    total = 0
    for p in module.parameters():
        if p.requires_grad:
            total += p.numel() * p.element_size()
    return total / 2**20


def _timed_next(self: Any) -> Any:
    start = time.perf_counter()
    batch = None
    try:
        batch = _originals["next"](self)
        return batch
    finally:
        owner = _owner
        if owner is not None:
            try:
                owner.add_dataloader_wait((time.perf_counter() - start) * 1000.0)
                if batch is not None:
                    owner.note_batch(batch)
                if "dataloader_num_workers" not in _facts:
                    _facts["dataloader_num_workers"] = int(getattr(self, "_num_workers", 0))
                    _facts["dataloader_pin_memory"] = bool(getattr(self, "_pin_memory", False))
                    sampler = getattr(getattr(self, "_index_sampler", None), "sampler", None)
                    _facts["distributed_sampler"] = isinstance(sampler, DistributedSampler)
                    if _facts["distributed_sampler"]:
                        _facts.setdefault("set_epoch_called", False)
            except Exception as exc:
                _report("dataloader hook", exc)


def _set_epoch(self: Any, epoch: int) -> None:
    _facts["set_epoch_called"] = True
    _originals["set_epoch"](self, epoch)


def _autocast_enter(self: Any) -> Any:
    try:
        if getattr(self, "_enabled", True) and not getattr(self, "_mgprof", False):
            _facts["autocast_used"] = True  # mgprof's own (--precision) is not the script's
    except Exception as exc:
        _report("autocast hook", exc)
    return _originals["autocast_enter"](self)


def _ddp_init(self: Any, *args: Any, **kwargs: Any) -> None:
    _originals["ddp_init"](self, *args, **kwargs)
    try:
        _facts["find_unused_parameters"] = bool(getattr(self, "find_unused_parameters", False))
        cap = kwargs.get("bucket_cap_mb")
        _facts["ddp_bucket_cap_mb"] = float(cap) if cap is not None else 25.0
        _facts["ddp_gradient_mib"] = _gradient_mib(self.module)
        watch_wrapper(self)
    except Exception as exc:
        _report("DDP hook", exc)
    try:
        from mgprof.collect import noise_scale

        noise_scale.attach_sampled(self)  # the script's own DDP is measured too
    except Exception as exc:
        _report("noise scale", exc)


def _dp_init(self: Any, *args: Any, **kwargs: Any) -> None:
    _originals["dp_init"](self, *args, **kwargs)
    try:
        watch_wrapper(self)
    except Exception as exc:
        _report("DataParallel hook", exc)


_watched: weakref.WeakSet[Any] = weakref.WeakSet()


def watch_wrapper(module: Any) -> None:
    """Count the forwards of a DDP or DataParallel module that synchronise gradients.

    A DDP forward with grad enabled and sync on (not inside ``no_sync``) arms the reducer, so
    the backward that follows all-reduces the gradients; a DataParallel forward over two or more
    devices sums the replicas' gradients on device 0. These counts are the rank's evidence that
    its gradients were really synchronised, whoever built the wrapper.
    """
    if module in _watched:
        return
    _watched.add(module)
    module.register_forward_pre_hook(_count_forward)


def _count_forward(module: Any, args: Any) -> None:
    try:
        if not torch.is_grad_enabled():
            return
        if hasattr(module, "require_backward_grad_sync"):  # DistributedDataParallel
            if module.require_backward_grad_sync:
                _facts["ddp_sync_forwards"] = _facts.get("ddp_sync_forwards", 0) + 1
        elif len(getattr(module, "device_ids", []) or []) > 1:  # DataParallel over 2+ devices
            _facts["dp_forwards"] = _facts.get("dp_forwards", 0) + 1
    except Exception as exc:
        _report("forward hook", exc)


def _watch_existing() -> None:
    """Wrappers built before the hooks were installed (a script's own session starts after it
    wrapped its model): found once, by a walk over the live objects."""
    import gc

    from torch.nn import DataParallel
    from torch.nn.parallel import DistributedDataParallel

    fsdp = fsdp_watch.fsdp_classes()
    for obj in gc.get_objects():
        if issubclass(type(obj), (DistributedDataParallel, DataParallel)):  # no __class__ lookups
            watch_wrapper(obj)
        elif fsdp and issubclass(type(obj), fsdp):
            fsdp_watch.watch(obj)


def _all_reduce(*args: Any, **kwargs: Any) -> Any:
    """``all_reduce`` called by the script itself (hand-written gradient averaging, or a metric):
    counted, since it is the only evidence of synchronisation a script without DDP leaves."""
    try:
        _facts["script_all_reduces"] = _facts.get("script_all_reduces", 0) + 1
    except Exception as exc:
        _report("all_reduce hook", exc)
    return _originals["all_reduce"](*args, **kwargs)


def _watching(original: Callable[..., Any]) -> Callable[..., Any]:
    """FSDP2's ``fully_shard``, then the unit watched (``fsdp_watch``). The original is kept in
    the closure (a script that imported the patched name keeps a working function after the
    hooks are removed) and its attributes are copied (``fully_shard.state`` is torch's API)."""

    @functools.wraps(original)
    def fully_shard(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        try:
            for module in out if isinstance(out, (list, tuple)) else [out]:
                fsdp_watch.watch(module)
        except Exception as exc:
            _report("FSDP hook", exc)
        return out

    return fully_shard


def _fsdp1_init(self: Any, *args: Any, **kwargs: Any) -> None:
    _originals["fsdp1_init"](self, *args, **kwargs)
    try:
        fsdp_watch.watch(self)
    except Exception as exc:
        _report("FSDP hook", exc)


_FULLY_SHARD_HOMES = ("torch.distributed.fsdp", "torch.distributed._composable.fsdp")
"""Where scripts import ``fully_shard`` from (the second before torch 2.6)."""


def _patch_fsdp() -> None:
    """``fully_shard`` where scripts import it from, and FSDP1's constructor, each on its own
    (torch 2.3-2.5 have FSDP1 but no public ``fully_shard``)."""
    import importlib

    for home in _FULLY_SHARD_HOMES:
        try:
            module = importlib.import_module(home)
        except ImportError:
            continue
        original = getattr(module, "fully_shard", None)
        if original is None or getattr(original, "_mgprof_watching", False):
            continue
        _originals[f"fully_shard:{home}"] = original
        patched = _watching(original)
        patched._mgprof_watching = True  # type: ignore[attr-defined]
        setattr(module, "fully_shard", patched)  # noqa: B010 (a module found by name)
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except ImportError:
        return
    _originals["fsdp1_init"] = FullyShardedDataParallel.__init__
    FullyShardedDataParallel.__init__ = _fsdp1_init  # type: ignore[method-assign]


def _unpatch_fsdp() -> None:
    import importlib

    for home in _FULLY_SHARD_HOMES:
        original = _originals.pop(f"fully_shard:{home}", None)
        if original is not None:
            setattr(importlib.import_module(home), "fully_shard", original)  # noqa: B010
    init = _originals.pop("fsdp1_init", None)
    if init is not None:
        from torch.distributed.fsdp import FullyShardedDataParallel

        FullyShardedDataParallel.__init__ = init  # type: ignore[method-assign]


def _destroy_process_group(*args: Any, **kwargs: Any) -> Any:
    """Let the running session send its record to rank 0 while the group still exists."""
    try:
        if not args and kwargs.get("group") is None and _before_destroy is not None:
            _before_destroy()
    except Exception as exc:  # fail open: the group is destroyed as the script asked
        _report("destroy_process_group hook", exc)
    return _originals.get("destroy", _destroy_fallback)(*args, **kwargs)


COLLECTIVE_TIMEOUT_ENV = "MGPROF_COLLECTIVE_TIMEOUT_S"
"""Set by the launcher (``--collective-timeout``); mirrors ``mgprof.run.launcher``'s constant."""


def collective_timeout() -> datetime.timedelta | None:
    """The process-group timeout the launcher asked for, or None (torch's default applies)."""
    try:
        seconds = float(os.environ.get(COLLECTIVE_TIMEOUT_ENV, ""))
    except ValueError:
        return None
    # the launcher's range (1 s to 7 days): c10d holds milliseconds in a C int
    return datetime.timedelta(seconds=seconds) if 1.0 <= seconds <= 7 * 24 * 3600.0 else None


_pg_by_mgprof = False


def mark_process_group_by_mgprof() -> None:
    """Auto-wrap made the default process group (before the script's own call)."""
    global _pg_by_mgprof
    _pg_by_mgprof = True


def process_group_by_mgprof() -> bool:
    """Whether auto-wrap initialised the default process group (a later ``init_process_group``
    by the script is then answered by the group that exists)."""
    return _pg_by_mgprof


def _init_process_group(*args: Any, **kwargs: Any) -> Any:
    """``init_process_group`` with the launcher's timeout unless the script chose one."""
    try:
        if process_group_by_mgprof() and torch.distributed.is_initialized():
            return None  # auto-wrap made the group from the same torchrun environment: reuse it
        if "timeout" not in kwargs and len(args) < 3:  # (backend, init_method, timeout, ...)
            timeout = collective_timeout()
            if timeout is not None:
                kwargs = {**kwargs, "timeout": timeout}
    except Exception as exc:  # fail open: the script's own call, unchanged
        _report("init_process_group hook", exc)
    return _originals.get("init", _init_fallback)(*args, **kwargs)


def _init_fallback(*args: Any, **kwargs: Any) -> Any:
    from torch.distributed import distributed_c10d

    return distributed_c10d.init_process_group(*args, **kwargs)


def _destroy_fallback(*args: Any, **kwargs: Any) -> Any:
    import torch.distributed as dist

    return dist.destroy_process_group(*args, **kwargs)


def note_fact(name: str, value: Any) -> None:
    """Record a fact observed elsewhere (``mgprof.wrap`` knows DDP's arguments directly)."""
    _facts[name] = value


def install(session: Observer | None) -> None:
    """Patch the hooks in (once per process) and route timings to ``session`` (None: facts only)."""
    global _owner
    _owner = session
    if session is not None:
        try:
            _watch_existing()
        except Exception as exc:
            _report("hooks", exc)
    if _originals:
        return
    from torch.nn.parallel import DistributedDataParallel

    try:
        grad_check.install()
        model_state.install()
    except Exception as exc:
        _report("gradient check", exc)
    _originals["next"] = _BaseDataLoaderIter.__next__
    _originals["set_epoch"] = DistributedSampler.set_epoch
    _originals["autocast_enter"] = torch.autocast.__enter__
    _originals["ddp_init"] = DistributedDataParallel.__init__
    _originals["dp_init"] = DataParallel.__init__
    if torch.distributed.is_available():
        _originals["destroy"] = torch.distributed.destroy_process_group
        torch.distributed.destroy_process_group = _destroy_process_group
        _originals["init"] = torch.distributed.init_process_group
        torch.distributed.init_process_group = _init_process_group
        _originals["all_reduce"] = torch.distributed.all_reduce
        torch.distributed.all_reduce = _all_reduce
        try:
            _patch_fsdp()
        except Exception as exc:
            _report("FSDP hook", exc)
    try:
        compile_watch.patch()
    except Exception as exc:
        _report("compile hook", exc)
    _BaseDataLoaderIter.__next__ = _timed_next  # type: ignore[method-assign]
    DistributedSampler.set_epoch = _set_epoch  # type: ignore[method-assign]
    torch.autocast.__enter__ = _autocast_enter  # type: ignore[method-assign]
    DistributedDataParallel.__init__ = _ddp_init  # type: ignore[method-assign]
    DataParallel.__init__ = _dp_init  # type: ignore[method-assign]


def uninstall(session: Observer) -> None:
    """Restore the originals when ``session`` is the one that installed them."""
    global _owner
    if _owner is not session:
        return
    _owner = None
    if not _originals:
        return
    from torch.nn.parallel import DistributedDataParallel

    grad_check.uninstall()
    model_state.uninstall()
    _BaseDataLoaderIter.__next__ = _originals.pop("next")  # type: ignore[method-assign]
    DistributedSampler.set_epoch = _originals.pop("set_epoch")  # type: ignore[method-assign]
    torch.autocast.__enter__ = _originals.pop("autocast_enter")  # type: ignore[method-assign]
    DistributedDataParallel.__init__ = _originals.pop("ddp_init")  # type: ignore[method-assign]
    DataParallel.__init__ = _originals.pop("dp_init")  # type: ignore[method-assign]
    if "destroy" in _originals:
        torch.distributed.destroy_process_group = _originals.pop("destroy")
    if "init" in _originals:
        torch.distributed.init_process_group = _originals.pop("init")
    if "all_reduce" in _originals:
        torch.distributed.all_reduce = _originals.pop("all_reduce")
    _unpatch_fsdp()
    compile_watch.unpatch()
