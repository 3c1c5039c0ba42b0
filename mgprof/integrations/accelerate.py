"""mgprof for a Hugging Face ``accelerate`` loop: ``with profile(accelerator) as prof:``.

accelerate has no callbacks: the loop is the script's own, so the session is opened in code, on
every rank ``accelerate launch`` (or torchrun, or ``mgprof analyze``) started, and the loop calls
``prof.step(batch)`` once per iteration, after ``optimizer.step()``. What this adds to a plain
``mgprof.profile``: with gradient accumulation (``accelerator.accumulate(model)``) one mgprof
step is one optimizer update, marked at the iteration where ``accelerator.sync_gradients`` is
true, its batch the samples of all the micro-batches since the previous update (the leading
dimension of each batch passed), as the framework callbacks count them. Without accumulation
every iteration is an update.

accelerate itself is not imported here: the accelerator is read (``sync_gradients``), never
changed. Options are ``mgprof.profile``'s (``profile(accelerator, out="runs", active=3)``);
rank 0 writes the run directory and the report when the block ends, the other ranks send it their
records over the accelerator's process group (so ``accelerator.end_training()``, which destroys
it, comes after the block).
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

from mgprof.integrations._common import HoldsProfiled, Profiled, exception_error, leading_dim

__all__ = ["AcceleratedProfile", "profile"]


def profile(accelerator: Any, **profile_options: Any) -> AcceleratedProfile:
    """Profile an accelerate training loop: ``with profile(accelerator) as prof:`` and
    ``prof.step(batch)`` once per iteration. Takes ``mgprof.profile``'s options."""
    return AcceleratedProfile(accelerator, **profile_options)


class AcceleratedProfile(HoldsProfiled):
    """One rank's session over an accelerate loop; steps at the iterations that updated."""

    def __init__(self, accelerator: Any, **profile_options: Any) -> None:
        if not hasattr(accelerator, "sync_gradients"):
            raise TypeError(
                "mgprof: profile() takes the script's accelerate.Accelerator (it reads "
                f"accelerator.sync_gradients), got {type(accelerator).__name__}"
            )
        self.accelerator = accelerator
        self._profiled = Profiled(profile_options)
        self._samples = 0
        self._first_batch: Any = None

    def __enter__(self) -> AcceleratedProfile:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop(error=None if exc is None else exception_error(exc))

    def start(self) -> AcceleratedProfile:
        """Open the session (``with`` does it); never raises."""
        self._profiled.start()
        return self

    def stop(self, error: str | None = None) -> None:
        """Close the session: rank 0 writes the run directory (``with`` does it)."""
        self._profiled.stop(error=error)

    def step(self, batch: Any = None, *, batch_size: int | None = None) -> None:
        """One loop iteration is done: count its samples, and mark an mgprof step when it
        updated the weights. ``batch_size`` overrides the leading dimension of ``batch``."""
        if batch_size is not None and (
            isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1
        ):
            raise ValueError(
                f"mgprof: batch_size must be a whole number of samples from 1, got {batch_size!r}"
            )
        if not self._profiled.running:
            return
        try:
            size = batch_size if batch_size is not None else leading_dim(batch)
            if size is not None and size > 0:
                self._samples += size
            if self._first_batch is None:
                self._first_batch = batch
            updated = bool(getattr(self.accelerator, "sync_gradients", True))
        except Exception as exc:  # fail open: the iteration counts as an update of unknown size
            self._profiled._warn("accelerate step", exc)
            updated = True
        if not updated:
            return  # a micro-batch of an accumulation group: no optimizer update yet
        samples, self._samples = self._samples, 0
        first, self._first_batch = self._first_batch, None
        self._profiled.step(batch=first, batch_size=samples if samples > 0 else None)
