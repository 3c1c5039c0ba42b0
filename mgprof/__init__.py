"""mgprof: profiling and diagnostics for multi-GPU PyTorch training.

The public names are loaded on first use, so ``import mgprof.analyze`` (and saved-run analysis)
works on a machine without torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "profile": "mgprof.collect.api",
    "profile_step": "mgprof.collect.api",
    "region": "mgprof.collect.api",
    "Session": "mgprof.collect.session.session",
    "wrap": "mgprof.collect.wrapping.wrap",
    "device": "mgprof.collect.wrapping.wrap",
    "seed_everything": "mgprof.collect.wrapping.wrap",
    "batch_size": "mgprof.collect.wrapping.wrap",
    "find_sweet_spot": "mgprof.studies.sweet_spot",
    "accumulation_steps": "mgprof.collect.accum",
    "noise_scale": "mgprof.collect.noise_scale",
    "RunRecord": "mgprof.records",
    "RankRecord": "mgprof.records",
    "read_run": "mgprof.records",
    "compare": "mgprof.studies.compare",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mgprof' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
