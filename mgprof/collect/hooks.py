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
import os
import time
from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch.utils.data import DistributedSampler
from torch.utils.data.dataloader import _BaseDataLoaderIter

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
    return TrainingFacts(
        **{k: v for k, v in _facts.items() if k in TrainingFacts.__struct_fields__}
    )


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
            except Exception:
                pass


def _set_epoch(self: Any, epoch: int) -> None:
    _facts["set_epoch_called"] = True
    _originals["set_epoch"](self, epoch)


def _autocast_enter(self: Any) -> Any:
    try:
        if getattr(self, "_enabled", True):
            _facts["autocast_used"] = True
    except Exception:
        pass
    return _originals["autocast_enter"](self)


def _ddp_init(self: Any, *args: Any, **kwargs: Any) -> None:
    _originals["ddp_init"](self, *args, **kwargs)
    try:
        _facts["find_unused_parameters"] = bool(getattr(self, "find_unused_parameters", False))
        cap = kwargs.get("bucket_cap_mb")
        _facts["ddp_bucket_cap_mb"] = float(cap) if cap is not None else 25.0
    except Exception:
        pass


def _destroy_process_group(*args: Any, **kwargs: Any) -> Any:
    """Let the running session send its record to rank 0 while the group still exists."""
    if not args and kwargs.get("group") is None and _before_destroy is not None:
        _before_destroy()
    return _originals.get("destroy", _destroy_fallback)(*args, **kwargs)


COLLECTIVE_TIMEOUT_ENV = "MGPROF_COLLECTIVE_TIMEOUT_S"
"""Set by the launcher (``--collective-timeout``); mirrors ``mgprof.run.launcher``'s constant."""


def collective_timeout() -> datetime.timedelta | None:
    """The process-group timeout the launcher asked for, or None (torch's default applies)."""
    try:
        seconds = float(os.environ.get(COLLECTIVE_TIMEOUT_ENV, ""))
    except ValueError:
        return None
    return datetime.timedelta(seconds=seconds) if 0 < seconds < 1e9 else None


def _init_process_group(*args: Any, **kwargs: Any) -> Any:
    """``init_process_group`` with the launcher's timeout unless the script chose one."""
    if "timeout" not in kwargs and len(args) < 3:  # (backend, init_method, timeout, ...)
        timeout = collective_timeout()
        if timeout is not None:
            kwargs["timeout"] = timeout
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
    if _originals:
        return
    from torch.nn.parallel import DistributedDataParallel

    _originals["next"] = _BaseDataLoaderIter.__next__
    _originals["set_epoch"] = DistributedSampler.set_epoch
    _originals["autocast_enter"] = torch.autocast.__enter__
    _originals["ddp_init"] = DistributedDataParallel.__init__
    if torch.distributed.is_available():
        _originals["destroy"] = torch.distributed.destroy_process_group
        torch.distributed.destroy_process_group = _destroy_process_group
        _originals["init"] = torch.distributed.init_process_group
        torch.distributed.init_process_group = _init_process_group
    _BaseDataLoaderIter.__next__ = _timed_next  # type: ignore[method-assign]
    DistributedSampler.set_epoch = _set_epoch  # type: ignore[method-assign]
    torch.autocast.__enter__ = _autocast_enter  # type: ignore[method-assign]
    DistributedDataParallel.__init__ = _ddp_init  # type: ignore[method-assign]


def uninstall(session: Observer) -> None:
    """Restore the originals when ``session`` is the one that installed them."""
    global _owner
    if _owner is not session:
        return
    _owner = None
    if not _originals:
        return
    from torch.nn.parallel import DistributedDataParallel

    _BaseDataLoaderIter.__next__ = _originals.pop("next")  # type: ignore[method-assign]
    DistributedSampler.set_epoch = _originals.pop("set_epoch")  # type: ignore[method-assign]
    torch.autocast.__enter__ = _originals.pop("autocast_enter")  # type: ignore[method-assign]
    DistributedDataParallel.__init__ = _originals.pop("ddp_init")  # type: ignore[method-assign]
    if "destroy" in _originals:
        torch.distributed.destroy_process_group = _originals.pop("destroy")
    if "init" in _originals:
        torch.distributed.init_process_group = _originals.pop("init")
