"""``--precision``: run an unmodified script's trained module in fp32, bf16 or fp16, and record
the loss it trains to, so a precision row reports speed *and* whether the numbers held.

``MGPROF_PRECISION`` (set by the launcher) names the precision (``script``: the script's own
setting, only recorded). Auto-wrap finds the trained
module (``mgprof.collect.wrapping.autowrap``) and routes its calls through
:meth:`PrecisionControl.route`,
which enters ``torch.autocast(device, dtype)`` (bf16/fp16) or ``torch.autocast(device,
enabled=False)`` (fp32) around the forward, outside DDP or DataParallel. DataParallel's replica
threads re-enter autocast with the enable flag only (the device's default dtype), so their
calls get the setting again (``replica_context``). The loss computation outside the module
runs as the script wrote it, as autocast's documentation recommends. A script's own autocast
around the forward is overridden there and recorded; mgprof's own autocast is not counted as
the script's.

fp16 needs loss scaling. When the script has no enabled ``GradScaler`` and trains with one
optimizer, mgprof inserts one: the scalar passed to ``Tensor.backward`` is scaled, gradients are
unscaled before ``clip_grad_norm_``/``clip_grad_value_``, and the optimizer's ``step`` goes
through ``GradScaler.step``/``update`` (a step skipped for inf/NaN gradients still counts as an
update, so the step limit is reached). Otherwise the record says "speed only" and why.

The loss of each optimizer update is the sum of the scalars backpropagated in it (the unscaled
value when a GradScaler scaled it), kept on the device and read every ``FLUSH_EVERY`` updates,
so a CUDA run does not synchronise per step.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from mgprof.collect.envknobs import PRECISION_ENV, PRECISIONS, SEED_ENV
from mgprof.records import PrecisionRecord

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
FLUSH_EVERY = 64
MAX_LOSSES = 10_000
"""Updates whose loss is kept: a run without ``--steps`` may train for a million steps."""


def requested() -> str | None:
    value = os.environ.get(PRECISION_ENV, "").strip().lower()
    return value if value in PRECISIONS else None


def seed_from_env() -> None:
    """Seed torch, ``random`` and numpy (when installed) from ``MGPROF_SEED`` plus the rank."""
    text = os.environ.get(SEED_ENV)
    if not text:
        return
    seed = int(text) + int(os.environ.get("RANK", "0") or 0)
    import random

    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed % 2**32)
    except ImportError:
        pass


class PrecisionControl:
    """The precision setting of this process, the loss capture and (fp16) the inserted scaler."""

    def __init__(self, precision: str, optimizers: Callable[[], list[Any]] | None = None) -> None:
        self.precision = precision
        self.record = PrecisionRecord(requested=precision)
        self._optimizers = optimizers or (lambda: [])
        self._pending: list[torch.Tensor] = []  # losses of the current update
        self._unread: list[torch.Tensor | None] = []  # closed updates not yet read to floats
        self._scaled_ids: set[int] = set()  # outputs of a script's GradScaler.scale
        self._scaler: Any = None
        self._making_scaler = False
        self._scaler_opt: Any = None
        self._scaled_now = False
        self._unscaled_now = False
        self._inside_step = False
        self._stepped = False
        self._orig: dict[str, Any] = {}
        self.on_skipped_update: Callable[[Any], None] | None = None
        """Called with the optimizer when mgprof's GradScaler skipped its step (inf/NaN)."""

    # -- the trained module -------------------------------------------------------------------
    def route(self, module: nn.Module, target: Callable[..., Any]) -> Callable[..., Any]:
        """``target`` (the module, or its DDP/DataParallel wrapper) called under this setting."""
        params = list(module.parameters())
        device_type = params[0].device.type if params else "cpu"
        self.record.applied = True
        self.record.device_type = device_type
        self.record.module_class = f"{type(module).__module__}.{type(module).__qualname__}"
        dtype = _DTYPES.get(self.precision)
        script_own = self.precision == "script"  # no change: the setting and loss recorded
        record = self.record

        def call(*args: Any, **kwargs: Any) -> Any:
            on = torch.is_autocast_enabled(device_type)
            if on and record.script_autocast is None:
                record.script_autocast = str(torch.get_autocast_dtype(device_type)).removeprefix(
                    "torch."
                )
            if script_own or (dtype is None and not on):
                return target(*args, **kwargs)  # fp32 with no autocast on: nothing to turn off
            with _autocast(device_type, dtype):
                return target(*args, **kwargs)

        return call

    def replica_context(self, device_type: str) -> Callable[[], Any] | None:
        """A factory of this setting's autocast for DataParallel's replica threads, which torch
        enters with the outer autocast's enable flag but the default dtype (fp16 on CUDA);
        None when the outer flag alone is right (fp32, the script's own)."""
        dtype = _DTYPES.get(self.precision)
        if dtype is None:
            return None

        return lambda: _autocast(device_type, dtype)

    def not_applied(self, reason: str) -> None:
        if not self.record.applied and self.record.reason is None:
            self.record.reason = reason

    # -- installation -------------------------------------------------------------------------
    def install(self) -> None:
        control = self
        self._orig["backward"] = torch.Tensor.backward
        orig_backward = self._orig["backward"]

        def backward(tensor: torch.Tensor, gradient: Any = None, *args: Any, **kwargs: Any) -> Any:
            if gradient is None:
                try:
                    tensor = control._on_backward(tensor)
                except Exception:  # fail open: the backward runs as the script wrote it
                    pass
            return orig_backward(tensor, gradient, *args, **kwargs)

        torch.Tensor.backward = backward  # type: ignore[method-assign,assignment]

        scaler_cls = torch.amp.GradScaler
        self._orig["scaler_init"] = scaler_cls.__init__
        self._orig["scaler_scale"] = scaler_cls.scale
        orig_init, orig_scale = self._orig["scaler_init"], self._orig["scaler_scale"]

        def scaler_init(scaler: Any, *args: Any, **kwargs: Any) -> None:
            orig_init(scaler, *args, **kwargs)
            if not control._making_scaler and getattr(scaler, "_enabled", False):
                control.record.script_grad_scaler = True

        def scaler_scale(scaler: Any, outputs: Any) -> Any:
            scaled = orig_scale(scaler, outputs)
            if scaler is not control._scaler and isinstance(outputs, torch.Tensor):
                try:
                    if control._is_loss(outputs):
                        control._pending.append(outputs.detach().reshape(()))
                        control._scaled_ids.add(id(scaled))
                except Exception:
                    pass
            return scaled

        scaler_cls.__init__ = scaler_init  # type: ignore[method-assign,assignment]
        scaler_cls.scale = scaler_scale  # type: ignore[method-assign,assignment]

        utils = torch.nn.utils
        for name in ("clip_grad_norm_", "clip_grad_value_"):
            self._orig[name] = getattr(utils, name)
            setattr(utils, name, self._unscaling(self._orig[name]))

    def uninstall(self) -> None:
        if "backward" in self._orig:
            torch.Tensor.backward = self._orig.pop("backward")  # type: ignore[method-assign]
        if "scaler_init" in self._orig:
            torch.amp.GradScaler.__init__ = self._orig.pop("scaler_init")  # type: ignore[method-assign]
            torch.amp.GradScaler.scale = self._orig.pop("scaler_scale")  # type: ignore[method-assign]
        for name in ("clip_grad_norm_", "clip_grad_value_"):
            if name in self._orig:
                setattr(torch.nn.utils, name, self._orig.pop(name))

    def _unscaling(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        control = self

        def clip(*args: Any, **kwargs: Any) -> Any:
            if control._scaler is not None and control._scaled_now and not control._unscaled_now:
                control._unscaled_now = True
                control._scaler.unscale_(control._scaler_opt)
            return orig(*args, **kwargs)

        return clip

    # -- backward and updates -----------------------------------------------------------------
    @staticmethod
    def _is_loss(tensor: torch.Tensor) -> bool:
        return tensor.numel() == 1 and tensor.is_floating_point() and tensor.requires_grad

    def _on_backward(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.precision == "fp16" and self.record.loss_scaling is None:
            self._decide_scaling(tensor.device.type)
        if id(tensor) in self._scaled_ids:  # the script's GradScaler: its loss is recorded
            self._scaled_ids.discard(id(tensor))
            return tensor
        if not self._is_loss(tensor):
            return tensor
        self._pending.append(tensor.detach().reshape(()))
        if self._scaler is not None:
            self._scaled_now = True
            return self._scaler.scale(tensor)
        return tensor

    def _decide_scaling(self, device_type: str) -> None:
        record = self.record
        if record.script_grad_scaler:
            record.loss_scaling = "script"
            return
        optimizers = [o for o in self._optimizers() if o is not None]
        if len(optimizers) != 1:
            record.loss_scaling = "none"
            record.loss_scaling_note = (
                f"{len(optimizers)} optimizers: mgprof inserts a GradScaler only for one"
            )
            return
        opt = optimizers[0]
        self._making_scaler = True
        try:
            self._scaler = torch.amp.GradScaler(device_type)
        finally:
            self._making_scaler = False
        self._scaler_opt = opt
        self._wrap_step(opt)
        record.loss_scaling = "inserted"

    def _wrap_step(self, opt: Any) -> None:
        control = self
        orig_step = opt.step

        def step(*args: Any, **kwargs: Any) -> Any:
            if control._inside_step or not control._scaled_now or args or kwargs:
                control._stepped = True
                return orig_step(*args, **kwargs)  # GradScaler's own call, or a closure
            control._inside_step = True
            control._stepped = False
            try:
                result = control._scaler.step(opt)
                control._scaler.update()
            finally:
                control._inside_step = False
                control._scaled_now = control._unscaled_now = False
            if not control._stepped:
                control.record.skipped_updates += 1
                if control.on_skipped_update is not None:
                    control.on_skipped_update(opt)
            return result

        opt.step = step

    def on_update(self) -> None:
        """One optimizer update of the clock optimizer ended: close its losses."""
        pending, self._pending = self._pending, []
        if len(self.record.losses) + len(self._unread) >= MAX_LOSSES:
            self.record.losses_truncated = True
            return
        if not pending:
            self._unread.append(None)
        else:
            total = pending[0].float()
            for t in pending[1:]:
                total = total + t.float()
            self._unread.append(total)
        if len(self._unread) >= FLUSH_EVERY or all(
            t is None or t.device.type == "cpu" for t in self._unread
        ):
            self.flush()

    def flush(self) -> None:
        """Read the closed updates' losses to floats (one device sync for many updates)."""
        unread, self._unread = self._unread, []
        known = [t for t in unread if t is not None]
        values = iter(torch.stack(known).tolist() if known else [])
        record = self.record
        for t in unread:
            value = None if t is None else next(values)
            if value is not None and not math.isfinite(value):
                record.nonfinite.append(len(record.losses))
                value = None
            record.losses.append(value)

    def snapshot(self) -> PrecisionRecord:
        """The record as of now (its losses read)."""
        try:
            self.flush()
        except Exception as exc:
            self.record.reason = self.record.reason or f"loss not read: {type(exc).__name__}"
        return self.record


def _autocast(device_type: str, dtype: torch.dtype | None) -> torch.autocast:
    """mgprof's autocast for a setting (None: autocast off), tagged so the hooks do not count
    it as the script's own (``hooks._autocast_enter``)."""
    if dtype is None:
        ctx = torch.autocast(device_type, enabled=False)
    else:
        ctx = torch.autocast(device_type, dtype=dtype)
    ctx._mgprof = True  # type: ignore[attr-defined]
    return ctx


control: PrecisionControl | None = None
"""This process's control, when ``--precision`` asked for one."""


def install(optimizers: Callable[[], list[Any]] | None = None) -> PrecisionControl | None:
    """Start the control ``MGPROF_PRECISION`` asks for (None when it asks for none)."""
    global control
    precision = requested()
    if precision is None:
        return None
    control = PrecisionControl(precision, optimizers)
    control.install()
    return control


def snapshot() -> PrecisionRecord | None:
    return control.snapshot() if control is not None else None
