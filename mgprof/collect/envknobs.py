"""Settings a launcher (or the user) passes to the script through the environment (no torch
import): integers, and the noise-scale switch."""

from __future__ import annotations

import os

MEMORY_ENV = "MGPROF_MEMORY"
"""Set to 1 by ``--memory``: every session of the script tracks memory."""

NOISE_SCALE_ENV = "MGPROF_NOISE_SCALE"
"""The gradient norms behind the gradient noise scale (docs/noise-scale.md): ``1`` at every
gradient sync (``--noise-scale``; 3-16 % of a CPU DDP step through mgprof's comm hook), ``0``
never (``--no-noise-scale``), unset: on a sample of a DDP model's syncs (one in
``MGPROF_NOISE_SCALE_EVERY``), read without a comm hook, so the steps between cost nothing
(benchmarks/bench_noise_scale.py, docs/benchmarks.md)."""
NOISE_SCALE_EVERY_ENV = "MGPROF_NOISE_SCALE_EVERY"
"""Syncs per measured sync in the default (sampled) mode."""
NOISE_SCALE_EVERY = 16
"""One sync in 16: the sampled norms then cost under 1 % of a CPU DDP step
(benchmarks/bench_noise_scale.py)."""


PRECISION_ENV = "MGPROF_PRECISION"
"""``fp32``, ``bf16`` or ``fp16`` (``--precision``): the trained module's forward runs under that
autocast setting and the loss is recorded (``mgprof.collect.wrapping.precision``)."""
PRECISIONS = ("fp32", "bf16", "fp16", "script")
"""``script``: the script's own setting, with its loss recorded (a precision comparison's
baseline when the script brings its own autocast or GradScaler)."""
SEED_ENV = "MGPROF_SEED"
"""Set by ``mgprof compare --precision``: every row starts from the same seeds (``seed + rank``
for torch, ``random`` and numpy) so their losses are comparable; a script's own seeding
replaces it, identically in every row."""


def noise_scale_mode() -> str:
    """``every`` (``MGPROF_NOISE_SCALE=1``), ``off`` (``0``), else ``sampled``: the default."""
    value = os.environ.get(NOISE_SCALE_ENV, "").strip().lower()
    if value in ("1", "true", "yes", "on"):
        return "every"
    if value in ("0", "false", "no", "off"):
        return "off"
    return "sampled"


def noise_scale_enabled() -> bool:
    """Whether mgprof records the gradient norms at every sync (``--noise-scale``)."""
    return noise_scale_mode() == "every"


def noise_scale_every() -> int:
    """Syncs per measured sync in the sampled mode (``MGPROF_NOISE_SCALE_EVERY``, default 16);
    an unusable value falls back to the default (a launcher setting, never the script's)."""
    try:
        return max(1, int(os.environ.get(NOISE_SCALE_EVERY_ENV, "") or NOISE_SCALE_EVERY))
    except ValueError:
        return NOISE_SCALE_EVERY


def positive_int_env(name: str, default: int, *, blank_is_default: bool = False) -> int:
    """``int(os.environ[name])`` when set, else ``default``; a value that is not an integer >= 1
    raises ValueError naming the variable (a launcher bug must not train with a wrong size)."""
    value = os.environ.get(name)
    if value is None or (blank_is_default and value == ""):
        return default
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not an integer") from None
    if number < 1:
        raise ValueError(f"{name} must be >= 1, got {number}")
    return number
