"""Apply a sweep trial's batch size through the DataLoader the script builds.

``mgprof sweep`` and ``mgprof compare --batch-size`` pass the size in ``MGPROF_BATCH_SIZE``. A
script that reads it with ``mgprof.batch_size(default)`` applies it itself; most scripts do not,
and used to run their own size in every trial while the sweep divided the *requested* size by the
step time. Here ``DataLoader.__init__`` is patched before the script runs: a loader built with a
``batch_size`` (map-style or iterable dataset) gets the trial's size, and a loader built with a
``BatchSampler`` gets its ``batch_size`` set. What was done, or why nothing could be, is noted in
the rank's training facts; the trial then checks the batch size it observed against the request.
"""

from __future__ import annotations

import inspect
from typing import Any

from mgprof.collect.envknobs import positive_int_env
from mgprof.collect.wrapping.wrap import BATCH_SIZE_ENV

_original_init: Any = None
_applied: list[str] = []
_refused: list[str] = []


def requested() -> int | None:
    """The trial's batch size, or None outside a sweep."""
    size = positive_int_env(BATCH_SIZE_ENV, 0, blank_is_default=True)
    return size or None


def install() -> bool:
    """Patch ``DataLoader.__init__`` when a trial asks for a batch size; True when patched."""
    global _original_init
    size = requested()
    if size is None or _original_init is not None:
        return False
    from torch.utils.data import DataLoader

    _original_init = DataLoader.__init__
    signature = inspect.signature(_original_init)

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            bound = signature.bind(self, *args, **kwargs)
            _apply(bound.arguments, size)
            args, kwargs = (), {k: v for k, v in bound.arguments.items() if k != "self"}
        except Exception as exc:  # fail open: the loader is built as the script asked
            _refused.append(f"DataLoader: {type(exc).__name__}: {exc}")
        _original_init(self, *args, **kwargs)

    DataLoader.__init__ = __init__  # type: ignore[method-assign]
    return True


def _apply(arguments: dict[str, Any], size: int) -> None:
    batch_sampler = arguments.get("batch_sampler")
    if batch_sampler is not None:
        old = getattr(batch_sampler, "batch_size", None)
        if isinstance(old, int):
            if old != size:
                batch_sampler.batch_size = size
            _applied.append(f"{type(batch_sampler).__name__}.batch_size {old} -> {size}")
        else:
            _refused.append(
                f"DataLoader(batch_sampler={type(batch_sampler).__name__}) has no batch_size "
                "to set: the sampler decides the batches"
            )
        _note()
        return
    if "batch_size" in arguments and arguments["batch_size"] is None:
        _refused.append(
            "DataLoader(batch_size=None): the dataset yields whole batches, so mgprof cannot "
            "set their size; call mgprof.batch_size(default) where the script sizes them"
        )
        _note()
        return
    old = arguments.get("batch_size", 1)
    arguments["batch_size"] = size
    _applied.append(f"DataLoader(batch_size={old}) -> {size}")
    _note()


def _note() -> None:
    from mgprof.collect import hooks

    hooks.note_fact("batch_size_applied", list(_applied))
    hooks.note_fact("batch_size_refused", list(_refused))
