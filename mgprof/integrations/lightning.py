"""mgprof for Lightning: ``Trainer(..., callbacks=[MgprofCallback()])``.

Each rank the framework started opens a session at ``on_train_start``; each optimizer step is one
mgprof step, marked at the ``on_train_batch_end`` where ``trainer.global_step`` moved, its batch
the leading dimension of the batches passed to ``on_train_batch_end`` since the previous step
(every micro-batch of ``accumulate_grad_batches`` counts). Regions, from Lightning's own hooks:
``forward`` (``on_train_batch_start`` to ``on_before_backward``: ``training_step``, loss
included), ``backward`` (``on_before_backward`` to ``on_after_backward``) and ``optimizer``
(``on_before_optimizer_step`` to ``on_train_batch_end``). ``on_train_end`` closes the session:
rank 0 writes the run directory and the report, as ``mgprof.profile`` does; ``on_exception``
closes it with the error (none for ``SystemExit(0)``: how ``mgprof compare`` and ``sweep`` stop
a script after its measured steps).

Options are ``mgprof.profile``'s (``MgprofCallback(out="runs", name="mnist", active=3)``).
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch import Callback  # type: ignore[import-not-found,unused-ignore]

from mgprof.integrations._common import HoldsProfiled, Profiled, exception_error, leading_dim

__all__ = ["MgprofCallback"]


class MgprofCallback(HoldsProfiled, Callback):  # type: ignore[misc,unused-ignore]
    """Profile a ``lightning.pytorch.Trainer`` run with mgprof. Takes ``mgprof.profile``'s
    options."""

    def __init__(self, **profile_options: Any) -> None:
        super().__init__()
        self._profiled = Profiled(profile_options)
        self._samples = 0
        self._last_step: int | None = None

    # -- the training's lifetime -----------------------------------------------------------

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._last_step = int(trainer.global_step)
        self._samples = 0
        self._profiled.start()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._profiled.stop()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._profiled.stop(error=exception_error(exception))

    # -- regions -----------------------------------------------------------------------------

    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        self._profiled.open_region("forward")

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        self._profiled.close_region("forward")
        self._profiled.open_region("backward")

    def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
        self._profiled.close_region("backward")

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        self._profiled.close_regions()
        self._profiled.open_region("optimizer")

    # -- steps -------------------------------------------------------------------------------

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._profiled.close_regions()
        size = leading_dim(batch)
        if size is not None:
            self._samples += size
        step = int(trainer.global_step)
        if self._last_step is None or step <= self._last_step:
            return  # a micro-batch of an accumulation group: no optimizer step yet
        self._last_step = step
        samples, self._samples = self._samples, 0
        self._profiled.step(batch=batch, batch_size=samples if samples > 0 else None)
