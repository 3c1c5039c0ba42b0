"""mgprof's own measurements as TensorBoard scalars, next to the profiler traces of a run.

``tensorboard --logdir mgprof-runs`` shows the PyTorch Profiler tab from ``traces/`` and, from the
event files written here, the step times, throughput, sampler time series and memory peaks that
mgprof measured outside the profiler's window. Files go to ``<run_dir>/tb/rank<N>/`` (not into
``traces/``: the profiler plugin treats every folder holding traces as one of its runs, and
TensorBoard treats every folder holding event files as a run, so one folder per rank makes each
rank its own line in the Scalars tab).

Written with TensorBoard's own event writer and protos so this module does not import torch: a
saved run can be turned into scalars on any machine with the ``tensorboard`` extra.

Tags (``<dev>`` is the sampler's device name, ``cuda:0`` or ``cpu``):

- ``mgprof/step_time_ms``: the step timer's duration of each step; x = step index.
- ``mgprof/throughput_samples_per_s``: batch_size / duration of each step whose batch size is
  known; x = step index.
- ``mgprof/util/<dev>/<column>``: every sampler column (``gpu_util_pct``, ``mem_used_mib``,
  ``power_w``, ``cpu_pct``, ``rss_mib``, ...); x = sample index, wall time = the sample's time.
- ``mgprof/memory/peak_allocated_mib``, ``peak_reserved_mib``, ``peak_rss_mib``: one point each
  (x = 0) where the rank measured it; ``mgprof/memory/<dev>/peak_*_mib`` per DataParallel device.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from mgprof.atomic import current_umask
from mgprof.records import RankRecord, RunRecord

__all__ = ["SCALARS_DIR", "STAMP_FILE", "scalars_stale", "write_scalars"]

SCALARS_DIR = "tb"
"""Folder under the run directory that holds the event files (one subfolder per rank)."""

STAMP_FILE = "mgprof-scalars.json"
"""Records which run.json the scalars were made from, so a viewer can tell when they are stale.
TensorBoard ignores it (it reads only ``*tfevents*`` files)."""

_PEAKS = ("peak_allocated_mib", "peak_reserved_mib", "peak_rss_mib")


def _scalar_event(tag: str, value: float, step: int, wall_time: float) -> event_pb2.Event:
    summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)])
    return event_pb2.Event(wall_time=wall_time, step=step, summary=summary)


def _run_start_unix_s(run: RunRecord) -> float:
    """Epoch seconds the run began (from ``created_utc``), 0 when the record lacks it.

    Only used to anchor step points on TensorBoard's wall-time axis; the values never depend on it.
    """
    try:
        stamp = _dt.datetime.fromisoformat(run.created_utc)
    except ValueError:
        return 0.0
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=_dt.timezone.utc)
    return stamp.timestamp()


def _is_number(value: float | None) -> bool:
    return value is not None and value == value  # drops None and NaN


def rank_events(rank: RankRecord, run_start_unix_s: float) -> Iterable[event_pb2.Event]:
    """All scalar events of one rank, in the order they are written.

    Steps carry no timestamp of their own, so a step's wall time is the run start plus the
    durations of the steps up to and including it: TensorBoard's "relative" axis then reads as
    time spent in steps (gaps between steps left out). Sampler points use the sampler's own clock,
    anchored at ``facts["started_unix_s"]`` when the sampler recorded it.
    """
    elapsed_s = 0.0
    for step in rank.steps:
        elapsed_s += step.duration_ms / 1000.0
        wall = run_start_unix_s + elapsed_s
        yield _scalar_event("mgprof/step_time_ms", step.duration_ms, step.index, wall)
        if step.batch_size is not None and step.duration_ms > 0:
            throughput = step.batch_size / (step.duration_ms / 1000.0)
            yield _scalar_event("mgprof/throughput_samples_per_s", throughput, step.index, wall)

    for dev in rank.sampler.devices:
        started = dev.facts.get("started_unix_s")
        anchor = float(started) if isinstance(started, (int, float)) else run_start_unix_s
        for column, values in dev.columns.items():
            tag = f"mgprof/util/{dev.device}/{column}"
            for i, (t_s, value) in enumerate(zip(dev.t_s, values)):
                if _is_number(value):
                    assert value is not None
                    yield _scalar_event(tag, float(value), i, anchor + t_s)

    memory = rank.memory
    if memory is not None:
        for name in _PEAKS:
            value = getattr(memory, name)
            if _is_number(value):
                yield _scalar_event(f"mgprof/memory/{name}", float(value), 0, run_start_unix_s)
        for device, peaks in memory.per_device.items():
            for name, value in peaks.items():
                if _is_number(value):
                    assert value is not None
                    tag = f"mgprof/memory/{device}/{name}"
                    yield _scalar_event(tag, float(value), 0, run_start_unix_s)


def _source_stamp(run_dir: Path) -> dict[str, int] | None:
    try:
        st = (run_dir / "run.json").stat()
    except OSError:
        return None
    return {"run_json_mtime_ns": st.st_mtime_ns, "run_json_size": st.st_size}


def scalars_stale(run_dir: Path) -> bool:
    """True when ``tb/`` is missing or was made from a different run.json than the one now there.

    Compared by run.json's mtime and size, recorded at write time: cheap enough to check on every
    ``mgprof view``, and a rewritten run.json (``mgprof analyze`` finishing, a re-analysis) changes
    at least the mtime.
    """
    try:
        recorded = json.loads((run_dir / SCALARS_DIR / STAMP_FILE).read_text("utf-8"))
    except (OSError, ValueError):
        return True
    return recorded != _source_stamp(run_dir)


def write_scalars(run_dir: Path, run: RunRecord) -> Path:
    """Write ``run``'s scalars under ``run_dir/tb/`` (one folder per rank); return that folder.

    Idempotent: the event files are built in a hidden temp folder beside ``tb/`` and swapped in,
    so rewriting replaces the previous files instead of adding a second set that TensorBoard
    would merge into doubled lines, and a crash mid-write leaves the old scalars intact.
    """
    run_dir = Path(run_dir)
    target = run_dir / SCALARS_DIR
    tmp = Path(tempfile.mkdtemp(prefix=f".{SCALARS_DIR}.new-", dir=run_dir))
    try:
        start = _run_start_unix_s(run)
        for rank in run.ranks:
            writer = EventFileWriter(str(tmp / f"rank{rank.rank}"), filename_suffix=".mgprof")
            try:
                for event in rank_events(rank, start):
                    writer.add_event(event)
            finally:
                writer.close()
        stamp = _source_stamp(run_dir)
        if stamp is not None:
            (tmp / STAMP_FILE).write_text(json.dumps(stamp), "utf-8")
        os.chmod(tmp, 0o777 & ~current_umask())  # mkdtemp's 0700 would hide the scalars
        old: Path | None = None
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{SCALARS_DIR}.old-", dir=run_dir))
            os.replace(target, old / SCALARS_DIR)
        os.replace(tmp, target)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target
