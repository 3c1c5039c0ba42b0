"""``mgprof timeline``: every rank of a job in one Chrome/Perfetto trace, on one clock.

Each rank becomes one process (pid = rank + 1, sorted by rank, named ``rank 1 · cuda:1 · host``
with what is known), each of its host threads and device streams one thread of it. Every rank's
timestamps are moved onto the lowest rank's clock by an offset estimated from the collectives
the ranks share (:mod:`~mgprof.analyze.timeline.clock`), then onto one origin so that the first
event written is at ``ts`` 0. The offsets, how they were found and their error go into the
file's ``otherData`` and into the command's output.

The work is two passes per rank (:mod:`~mgprof.analyze.timeline.scan`, then
:mod:`~mgprof.analyze.timeline.write`) with the decisions between them in
:mod:`~mgprof.analyze.timeline.plan`; each pass streams its file, and what is kept of a rank
between them is a few bytes per device and flow event, so memory does not grow with the trace.
"""

from __future__ import annotations

import time
from pathlib import Path

import msgspec

from mgprof.analyze.timeline.clock import ClockOffset, RankClock, align_clocks
from mgprof.analyze.timeline.inputs import (
    DEFAULT_NAME,
    TimelineInputs,
    assign_ranks,
    check_min_dur,
    choose_out,
    find_inputs,
    is_run_dir,
)
from mgprof.analyze.timeline.plan import StepRange, parse_steps, plan_rank, set_origin
from mgprof.analyze.timeline.read import GENERATOR
from mgprof.analyze.timeline.result import RankFacts, TimelineResult
from mgprof.analyze.timeline.scan import RankScan, scan_trace
from mgprof.analyze.timeline.summary import clock_line, read_timeline_facts, summary_lines
from mgprof.analyze.timeline.write import EventCounts, TimelineFile, metadata_events, write_rank
from mgprof.errors import TraceError, UsageError
from mgprof.safe_read import format_size

__all__ = [
    "AUTO_MAX_TRACE_BYTES",
    "DEFAULT_NAME",
    "GENERATOR",
    "RankFacts",
    "StepRange",
    "TimelineInputs",
    "TimelineResult",
    "build_timeline",
    "check_min_dur",
    "choose_out",
    "clock_line",
    "find_inputs",
    "is_run_dir",
    "parse_steps",
    "read_timeline_facts",
    "summary_lines",
    "write_run_timeline",
]

AUTO_MAX_TRACE_BYTES = 256 << 20
"""At the end of ``mgprof analyze`` the timeline is written only when the run's trace files
take at most this much disk (gzip): past it, the command does it on demand, so that the end of a
run stays quick."""
CLOCK_DEFINITION = (
    "ts on the reference rank's clock = ts in a rank's own trace + offset_us; offsets from the "
    "ends of matched symmetric collectives (median, causal interval, error_us = largest |end "
    "difference| over the calls used), else from baseTimeNanoseconds; output ts 0 = "
    "origin_trace_us on the reference rank's clock"
)


def _process_name(rank: int, scan: RankScan, labels: dict[str, str]) -> str:
    device = labels.get("device")
    if device is None:
        pids = scan.device_pids
        names = [scan.process_labels.get(p) or f"device {p}" for p in pids]
        device = ", ".join(names) if names else "cpu"
    host = labels.get("host") or scan.host
    return " · ".join([f"rank {rank}", device, *([host] if host else [])])


def _clock_label(clock: ClockOffset) -> str:
    if clock.method == "reference":
        return "clock: reference"
    text = f"clock {clock.offset_us:+,.1f} µs"
    if clock.error_us is not None:
        text += f" ± {clock.error_us:,.1f} µs"
    return f"{text} ({clock.method})"


def build_timeline(
    inputs: TimelineInputs,
    out: Path,
    *,
    steps: StepRange | None = None,
    min_dur_us: float | None = None,
) -> TimelineResult:
    """Write ``out`` (``.json`` or ``.json.gz``) from the inputs (module docstring); TraceError
    or UsageError (one line) on bad input, OSError when ``out`` cannot be written."""
    t0 = time.monotonic()
    check_min_dur(min_dur_us)
    notes = list(inputs.skipped)
    scans: list[RankScan] = []
    plans = []
    for path in inputs.files:
        scan = scan_trace(path, min_dur_us)
        if scan.generated:
            notes.append(f"{path.name}: a timeline mgprof wrote, not a rank's trace; skipped")
            continue
        plans.append(plan_rank(scan, steps, min_dur_us))
        scan.release()
        scans.append(scan)
    if not scans:
        raise TraceError("no rank trace among the inputs (only timelines mgprof wrote)")
    ranks = assign_ranks(scans, notes)
    if steps is not None and not any(p.steps_found for p in plans):
        found = sorted({s[0] for sc in scans for s in sc.steps})
        have = f"steps in the traces: {found[0]}..{found[-1]}" if found else "no ProfilerStep#N"
        raise UsageError(f"--steps {steps.text()}: no such step in the traces ({have})")
    clocks = align_clocks({r: RankClock(s.anchors, s.base_us) for r, s in zip(ranks, scans)})
    for plan, rank in zip(plans, ranks):
        plan.place(rank, clocks[rank].offset_us)
    origin = set_origin(plans)
    ref = min(ranks)
    order = sorted(range(len(scans)), key=lambda i: ranks[i])
    facts: list[RankFacts] = []
    totals = EventCounts()
    target = TimelineFile(out)
    try:
        for i in order:
            scan, plan, rank = scans[i], plans[i], ranks[i]
            counts, lane_events = write_rank(scan, plan, target)
            name = _process_name(rank, scan, inputs.labels.get(rank, {}))
            label = _clock_label(clocks[rank])
            target.add(metadata_events(plan, scan, name, label, lane_events))
            if steps is not None and not plan.steps_found:
                notes.append(f"rank {rank}: no ProfilerStep#N in {steps.text()}; no events")
            facts.append(
                RankFacts(
                    rank=rank,
                    pid=plan.pid,
                    file=scan.path.name,
                    rank_source=scan.rank_source,
                    name=name,
                    clock=clocks[rank],
                    events=counts,
                    steps_found=plan.steps_found if steps is not None else None,
                )
            )
            for key in EventCounts.__struct_fields__:
                setattr(totals, key, getattr(totals, key) + getattr(counts, key))
        ref_base = scans[ranks.index(ref)].base_us
        result = TimelineResult(
            path=str(out),
            size_bytes=0,
            seconds=0.0,
            reference_rank=ref,
            origin_trace_us=origin,
            origin_unix_us=ref_base + origin if ref_base is not None else None,
            steps=steps.text() if steps is not None else None,
            min_dur_us=min_dur_us,
            ranks=facts,
            events=totals,
            notes=notes,
        )
        tail = {"generator": GENERATOR, "clock_definition": CLOCK_DEFINITION}
        tail.update(msgspec.to_builtins(result))
        for key in ("path", "size_bytes", "seconds"):
            tail.pop(key, None)
        target.commit(tail)
    except BaseException:
        target.abort()
        raise
    result.size_bytes = out.stat().st_size
    result.seconds = time.monotonic() - t0
    return result


def write_run_timeline(run_dir: Path) -> TimelineResult | str:
    """RUN/timeline.json.gz for a run directory (the end of ``mgprof analyze``); a string
    saying why not when its traces are over :data:`AUTO_MAX_TRACE_BYTES`."""
    inputs = find_inputs([run_dir])
    total = sum(f.stat().st_size for f in inputs.files)
    if total > AUTO_MAX_TRACE_BYTES:
        return (
            f"its traces take {format_size(total)} (over {format_size(AUTO_MAX_TRACE_BYTES)}); "
            f"make it with 'mgprof timeline {run_dir}'"
        )
    return build_timeline(inputs, run_dir / DEFAULT_NAME)
