"""Building Kineto trace events in tests: one complete (``ph: X``) event per call."""

from __future__ import annotations

from typing import Any


def ev(name: str, cat: str, ts: float, dur: float | None, tid: Any = 7, **args: Any) -> dict:
    e: dict[str, Any] = {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": tid, "ts": ts}
    if dur is not None:
        e["dur"] = dur
    if args:
        e["args"] = args
    return e
