"""Integer settings a launcher passes to the script through the environment (no torch import)."""

from __future__ import annotations

import os

MEMORY_ENV = "MGPROF_MEMORY"
"""Set to 1 by ``--memory``: every session of the script tracks memory."""


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
