"""``mgprof.accumulation_steps()``: how many micro-batches a script accumulates per update.

``mgprof sweep --global-batch G`` keeps the global batch fixed while the per-device batch varies:
each trial sets ``MGPROF_ACCUM_STEPS = G / (batch x devices)``, and a script that reads this
value (and calls ``optimizer.step()`` once per that many micro-batches) trains with the same
optimisation at every trial. Outside a sweep it returns the script's own default.
"""

from __future__ import annotations

from mgprof.collect.envknobs import positive_int_env

ACCUM_STEPS_ENV = "MGPROF_ACCUM_STEPS"


def accumulation_steps(default: int = 1) -> int:
    """Micro-batches per optimizer update: the sweep's trial value, else ``default``."""
    return positive_int_env(ACCUM_STEPS_ENV, default, blank_is_default=True)
