"""``mgprof.accumulation_steps()``: how many micro-batches a script accumulates per update.

``mgprof sweep --global-batch G`` keeps the global batch fixed while the per-device batch varies:
each trial sets ``MGPROF_ACCUM_STEPS = G / (batch x devices)``, and a script that reads this
value (and calls ``optimizer.step()`` once per that many micro-batches) trains with the same
optimisation at every trial. Outside a sweep it returns the script's own default.
"""

from __future__ import annotations

import os

ACCUM_STEPS_ENV = "MGPROF_ACCUM_STEPS"


def accumulation_steps(default: int = 1) -> int:
    """Micro-batches per optimizer update: the sweep's trial value, else ``default``."""
    value = os.environ.get(ACCUM_STEPS_ENV)
    if value is None or value == "":
        return default
    try:
        steps = int(value)
    except ValueError:
        raise ValueError(f"{ACCUM_STEPS_ENV}={value!r} is not an integer") from None
    if steps < 1:
        raise ValueError(f"{ACCUM_STEPS_ENV} must be >= 1, got {steps}")
    return steps
