"""Batch size and a cheap fingerprint of a batch, without forcing a device synchronisation."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import torch

FINGERPRINT_ELEMENTS = 64
"""Values sampled per batch: enough to tell two different batches apart, a few bytes to hash."""


def first_tensor(batch: Any) -> torch.Tensor | None:
    """The first tensor in a (nested) batch: a tensor, a sequence or a mapping of them."""
    if isinstance(batch, torch.Tensor):
        return batch
    if isinstance(batch, Mapping):
        items: Any = batch.values()
    elif isinstance(batch, (list, tuple)):
        items = batch
    else:
        return None
    for item in items:
        found = first_tensor(item)
        if found is not None:
            return found
    return None


def batch_size_of(batch: Any) -> int | None:
    """Leading dimension of the first tensor of the batch, None when there is none."""
    t = first_tensor(batch)
    if t is None or t.dim() == 0:
        return None
    return int(t.shape[0])


class PendingFingerprint:
    """A fingerprint whose values may still live on the device; resolved after the run."""

    __slots__ = ("_host", "_sample")

    def __init__(self, sample: torch.Tensor | None, host: str | None = None) -> None:
        self._sample = sample
        self._host = host

    def resolve(self) -> str | None:
        if self._host is None and self._sample is not None:
            sample = self._sample.detach().to("cpu")
            if sample.is_complex():
                sample = torch.view_as_real(sample)
            data = sample.to(torch.float64).numpy().tobytes()
            self._host = hashlib.blake2b(data, digest_size=8).hexdigest()
            self._sample = None
        return self._host


def fingerprint(batch: Any) -> PendingFingerprint | None:
    """Sample up to 64 evenly spaced values of the first tensor of the batch.

    On CUDA the strided copy stays on the device (an asynchronous kernel), so the training step
    never waits; the hash is computed when the session ends.
    """
    t = first_tensor(batch)
    if t is None or t.numel() == 0:
        return None
    flat = t.detach().reshape(-1)
    stride = max(1, flat.numel() // FINGERPRINT_ELEMENTS)
    sample = flat[::stride][:FINGERPRINT_ELEMENTS]
    pending = PendingFingerprint(sample.clone() if sample.is_cuda else sample)
    if not sample.is_cuda:
        pending.resolve()  # 64 host values: hash now, before the batch can be changed in place
    return pending


class ForwardSamples:
    """Samples the trained module was called with since the last step boundary.

    Auto-wrap's route sees every outer call of the trained module (``collect.wrapping.autowrap``)
    and adds the leading dimension of the call's first tensor when the call trains (the module
    in training mode, autograd on). That is the batch that was trained: a batch the script only
    fetched (``next(iter(loader))`` to peek at it) never reaches the model, and a script without a
    DataLoader (nanoGPT's ``get_batch``) still has one. Gradient accumulation adds up the
    micro-batches of one update.
    """

    __slots__ = ("calls", "samples", "total_calls")

    def __init__(self) -> None:
        self.samples = 0
        self.calls = 0
        self.total_calls = 0

    def add(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
        size = batch_size_of(args) if args else None
        if size is None and kwargs:
            size = batch_size_of(list(kwargs.values()))
        if size is None:
            return
        self.samples += size
        self.calls += 1
        self.total_calls += 1

    def take(self) -> int | None:
        """The samples since the last call (None when the model was not called), and reset."""
        if not self.calls:
            return None
        size, self.samples, self.calls = self.samples, 0, 0
        return size


forward_samples = ForwardSamples()
"""This process's counter: one trained module per process is routed at a time."""
