"""mgprof for the Hugging Face ``Trainer``: ``Trainer(..., callbacks=[MgprofCallback()])``.

Each rank the framework started opens a session at ``on_train_begin``; each optimizer step
(``on_step_end``, after the update and ``global_step += 1``) is one mgprof step, its batch the
samples the model's training forwards took since the previous step (read off the inputs by a
forward pre-hook on the model: every micro-batch of a gradient-accumulation group counts), or,
when no input was seen, ``per_device_train_batch_size × gradient_accumulation_steps``.
Regions: ``forward`` (the model's training forwards, loss included when the model computes it,
from forward hooks) and ``optimizer`` (``on_pre_optimizer_step`` to ``on_optimizer_step``).
Backward has no callback hook; it is the rest of the step. ``on_train_end`` closes the session:
rank 0 writes the run directory and the report, as ``mgprof.profile`` does.

Options are ``mgprof.profile``'s (``MgprofCallback(out="runs", name="gpt2", active=3)``).
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback  # type: ignore[import-not-found,unused-ignore]

from mgprof.integrations._common import HoldsProfiled, Profiled, leading_dim

__all__ = ["MgprofCallback"]


class MgprofCallback(HoldsProfiled, TrainerCallback):  # type: ignore[misc,unused-ignore]
    """Profile a ``transformers.Trainer`` run with mgprof. Takes ``mgprof.profile``'s options."""

    def __init__(self, **profile_options: Any) -> None:
        self._profiled = Profiled(profile_options)
        self._hooks: list[Any] = []
        self._samples = 0
        self._first_inputs: Any = None

    # -- the training's lifetime -----------------------------------------------------------

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._profiled.start()
        model = kwargs.get("model")
        if model is not None and hasattr(model, "register_forward_pre_hook"):
            try:
                self._hooks = [
                    model.register_forward_pre_hook(self._before_forward, with_kwargs=True),
                    model.register_forward_hook(self._after_forward),
                ]
            except Exception as exc:  # fail open: steps still count, batch from the arguments
                self._profiled._warn("hf forward hooks", exc)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
        self._profiled.stop()

    # -- steps and regions -------------------------------------------------------------------

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._profiled.open_region("optimizer")

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._profiled.close_region("optimizer")

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        samples, self._samples = self._samples, 0
        inputs, self._first_inputs = self._first_inputs, None
        if samples <= 0:
            per_device = getattr(args, "per_device_train_batch_size", None) or 0
            accumulation = getattr(args, "gradient_accumulation_steps", None) or 1
            samples = int(per_device) * int(accumulation)
        self._profiled.step(batch=inputs, batch_size=samples if samples > 0 else None)

    def _before_forward(self, module: Any, args: Any, kwargs: Any) -> None:
        if not module.training or not self._profiled.running:
            return
        try:
            inputs = kwargs.get("input_ids")
            if inputs is None:
                inputs = args if args else kwargs
            size = leading_dim(inputs)
            if size is not None:
                self._samples += size
                if self._first_inputs is None:
                    self._first_inputs = inputs
        except Exception as exc:
            self._profiled._warn("hf batch", exc)
        self._profiled.open_region("forward")

    def _after_forward(self, module: Any, args: Any, output: Any) -> None:
        self._profiled.close_region("forward")
