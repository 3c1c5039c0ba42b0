"""Reading a timeline's facts back (report.html's link) and the command's summary lines."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from mgprof.analyze.timeline.clock import METHOD_BASE, METHOD_COLLECTIVES
from mgprof.analyze.timeline.read import GENERATOR
from mgprof.safe_read import file_problem

if TYPE_CHECKING:
    from mgprof.analyze.timeline.result import TimelineResult

__all__ = ["clock_line", "read_timeline_facts", "summary_lines"]

_MARK = b'"otherData":'
_TAIL_BYTES = 8 << 20
FACTS_MAX_FILE_BYTES = 512 << 20
"""A timeline larger than this on disk is linked without reading its facts back."""


def read_timeline_facts(path: Path) -> dict[str, Any] | None:
    """The ``otherData`` of a timeline this module wrote (it is the file's last key), read by
    streaming the file and keeping only its end; None when there is no such file or it cannot
    be read as one (the caller then says how to make it)."""
    if file_problem(path) is not None:
        return None
    try:
        if path.stat().st_size > FACTS_MAX_FILE_BYTES:
            return {"generator": GENERATOR, "ranks": []}
        with open(path, "rb") as raw:
            gz = raw.read(2) == b"\x1f\x8b"
            raw.seek(0)
            fh: Any = gzip.GzipFile(fileobj=raw) if gz else raw
            tail = b""
            while block := fh.read(1 << 20):
                tail = (tail + block)[-_TAIL_BYTES:]
        at = tail.rfind(_MARK)
        if at < 0:
            return None
        doc = msgspec.json.decode(b"{" + tail[at:])
    except (OSError, EOFError, msgspec.DecodeError, ValueError):
        return None
    facts = doc.get("otherData") if isinstance(doc, dict) else None
    if not isinstance(facts, dict) or facts.get("generator") != GENERATOR:
        return None
    return facts


def _size(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:,.1f} {unit}"
    return f"{nbytes} B"


def _count(n: int, what: str) -> str:
    return f"{n:,} {what}" + ("" if n == 1 else "s")


def clock_line(clock: dict[str, Any]) -> str:
    """``+34.6 µs ± 37.4 µs from collectives (4 of 6 matched calls)`` for one rank, with the
    causal interval when it is narrower than the spread of the calls' ends (a busy CPU delays
    the end of a gloo op on one rank by milliseconds; no rank leaves a call before every rank
    entered it, whatever the load)."""
    method = clock.get("method")
    if method == "reference":
        return "reference"
    offset = clock.get("offset_us") or 0.0
    error = clock.get("error_us")
    text = f"{offset:+,.1f} µs" + (f" ± {error:,.1f} µs" if error is not None else "")
    if method == METHOD_COLLECTIVES:
        used, matched = clock.get("calls_used", 0), clock.get("calls_matched", 0)
        calls = f"{used} of {_count(matched, 'matched call')}"
        bounds = clock.get("bounds_us")
        if isinstance(bounds, (list, tuple)) and len(bounds) == 2 and error is not None:
            lo, hi = bounds
            if (hi - lo) / 2 < error:  # causality says more than the spread of the ends
                calls += f"; causal bounds {lo:+,.1f}..{hi:+,.1f} µs"
        return f"{text} from collectives ({calls})"
    if method == METHOD_BASE:
        why = clock.get("note")
        return f"{text} from the recorded clock base" + (f" ({why})" if why else "")
    return f"{text} ({method})"


def summary_lines(result: TimelineResult) -> list[str]:
    """What the command prints: where the file went, the offsets, what was left out."""
    ev = result.events
    lines = [
        f"wrote {result.path}: {_count(len(result.ranks), 'rank')}, "
        f"{_count(ev.written, 'event')} ({_size(result.size_bytes)}) "
        f"in {result.seconds:.1f} s",
        f"clock (reference: rank {result.reference_rank}; offset = what is added to a rank's ts):",
    ]
    for r in result.ranks:
        lines.append(f"  rank {r.rank}  {clock_line(msgspec.to_builtins(r.clock))}")
    if result.steps is not None:
        lines.append(
            f"steps {result.steps}: {_count(ev.dropped_steps, 'event')} outside them left out"
        )
    if result.min_dur_us is not None:
        lines.append(
            f"--min-dur {result.min_dur_us:g} µs: "
            f"{_count(ev.dropped_min_dur, 'shorter complete event')} left out"
        )
    if ev.flows_dropped:
        lines.append(
            f"flows: {_count(ev.flows_dropped, 'flow event')} left out (an end was cut or "
            "was never written)"
        )
    lines.extend(f"note: {n}" for n in result.notes)
    lines.append("open it in https://ui.perfetto.dev (Open trace file) or chrome://tracing (Load)")
    return lines
