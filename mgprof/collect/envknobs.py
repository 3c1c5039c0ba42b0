"""Settings a launcher (or the user) passes to the script through the environment (no torch
import): integers, and the noise-scale switch."""

from __future__ import annotations

import os

MEMORY_ENV = "MGPROF_MEMORY"
"""Set to 1 by ``--memory``: every session of the script tracks memory."""

NOISE_SCALE_ENV = "MGPROF_NOISE_SCALE"
"""``1`` records the gradient norms behind the gradient noise scale (docs/noise-scale.md). Off by
default: on 2 CPU ranks the norms (and mgprof's comm hook) cost 3-16 % of a DDP step
(benchmarks/bench_noise_scale.py, docs/benchmarks.md), above the 1 % a default may cost."""


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


def noise_scale_enabled() -> bool:
    """Whether mgprof records the gradient norms for the noise scale in this process."""
    return os.environ.get(NOISE_SCALE_ENV, "0").strip().lower() in ("1", "true", "yes", "on")


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
