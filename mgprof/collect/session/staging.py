"""Where a session keeps its trace files while the training runs, and what a dead rank left.

torch.profiler writes a rank's trace when its window closes, long before the session sends its
record to rank 0. Until then the file is *staged*: inside the run folder when one is known
(``mgprof analyze`` sets ``MGPROF_RUN_DIR``)::

    <run>/.staging-rank<N>/rank<N>.pt.trace.json.gz

else in the output folder the session will write its run folder into
(``<out>/.mgprof-staging-<host>-<pid>-XXXX/``); only when neither can be written, in the system
temp folder. The staging folder also holds a small reserve (``.mgprof-reserve``): room freed
just before the record is written, so a disk that filled while the training ran still takes
the run's record.

Every way out of a session removes its staging folder: ``stop`` (a normal end, an exception in
the user's code, KeyboardInterrupt, ``destroy_process_group``), ``abandon``, and an ``atexit``
handler for a session never stopped (which, under a launcher, first moves its complete traces
into ``traces/``). A rank killed outright (SIGKILL, ``os._exit``, a crashed interpreter) leaves
its staging folder behind: :func:`recover_staged`, called by the launcher once every rank has
ended, moves the complete traces found there to ``<run>/traces/``, where ``mgprof trace`` and
TensorBoard find them, and discards unfinished ones.
"""

from __future__ import annotations

import atexit
import gzip
import os
import re
import shutil
import tempfile
import threading
import zlib
from pathlib import Path

import msgspec

from mgprof import rundir
from mgprof.atomic import release_space, reserve_space

STAGING_PREFIX = ".staging-rank"
"""``<run>/.staging-rank<N>``: rank N's staging folder inside a launcher's run folder (beside
``traces/``, not in it: a rank removing its own folder then never races another rank writing
into ``traces/``)."""

OUT_PREFIX = ".mgprof-staging-"
"""``<out>/.mgprof-staging-<host>-<pid>-XXXX``: a session's staging folder with no launcher."""

TEMP_PREFIX = "mgprof-traces-"
"""System temp folder fallback, when neither the run folder nor the output folder is writable."""

RESERVE_NAME = ".mgprof-reserve"
RESERVE_BYTES = 2 << 20
"""Room held for the record: run.json of a few ranks with minutes of samples fits in 2 MiB;
a bigger one may still fail on a full disk, and says so."""

TRACE_SUFFIXES = (".pt.trace.json.gz", ".pt.trace.json")
"""Names the trace writer gives finished traces; anything else in staging is an unfinished
export (torch's ``*.json.tmp``, the writer's ``tmp*.json``/``*.json.gz``)."""

_RANK_OF = re.compile(re.escape(STAGING_PREFIX) + r"(\d+)$")


class Staging:
    """One session's staging folder (and the reserve in it)."""

    def __init__(self, path: Path, run_dir: Path | None, reserve: Path | None) -> None:
        self.path = path
        self.run_dir = run_dir
        """The launcher's run folder when staging sits inside it, else None."""
        self.reserve = reserve

    def release_reserve(self) -> None:
        """Free the reserve: the record is written next. Never raises."""
        if self.reserve is not None:
            release_space(self.reserve)
            self.reserve = None

    def close(self, salvage: bool = False) -> list[str]:
        """Remove the staging folder. With ``salvage`` (a session never stopped, at exit) and a
        launcher's run folder, complete traces move to ``traces/`` first. Never raises."""
        notes: list[str] = []
        _live.pop(id(self), None)
        self.release_reserve()
        try:
            if salvage and self.run_dir is not None:
                notes = _recover_folder(self.path, self.run_dir / rundir.TRACES)
            shutil.rmtree(self.path, ignore_errors=True)
        except Exception:
            pass
        return notes


_live: dict[int, Staging] = {}
_lock = threading.Lock()


def open_staging(rank: int, out: str | os.PathLike[str] | None) -> tuple[Staging, str | None]:
    """A staging folder for rank ``rank`` and, when it is not where it should be, why.

    Raises OSError only when not even the system temp folder can hold one.
    """
    env = os.environ.get(rundir.RUN_DIR_ENV)
    why: str | None = None
    staging: Staging | None = None
    try:
        if env:
            run_dir = Path(env)
            path = run_dir / f"{STAGING_PREFIX}{rank}"
            path.mkdir(parents=True, exist_ok=True)
            staging = Staging(path, run_dir, None)
        else:
            root = Path(out or rundir.DEFAULT_ROOT)
            root.mkdir(parents=True, exist_ok=True)
            prefix = f"{OUT_PREFIX}{_safe(_host())}-{os.getpid()}-"
            staging = Staging(Path(tempfile.mkdtemp(prefix=prefix, dir=root)), None, None)
    except OSError as exc:
        where = env or str(out or rundir.DEFAULT_ROOT)
        why = f"traces staged in the system temp folder: {where} is not writable ({exc})"
        staging = Staging(Path(tempfile.mkdtemp(prefix=TEMP_PREFIX)), None, None)
    else:
        reserve = staging.path / RESERVE_NAME
        if reserve_space(reserve, RESERVE_BYTES):
            staging.reserve = reserve
    with _lock:
        _live[id(staging)] = staging
    return staging, why


def _host() -> str:
    from mgprof.collect.distenv import hostname

    return hostname()


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text)[:64] or "host"


def _close_all_at_exit() -> None:
    """Sessions never stopped: their staging folders go (complete traces saved under a
    launcher, for the run's ``traces/``)."""
    with _lock:
        live = list(_live.values())
    for staging in live:
        staging.close(salvage=True)


atexit.register(_close_all_at_exit)


# -- after a run: what dead ranks left ---------------------------------------------------------


def recover_staged(run_dir: Path) -> list[str]:
    """Move the complete traces that ranks left in staging into ``<run>/traces/``.

    For the launcher's finalize step, once every rank has ended: a rank that died before it
    delivered its record (killed, crashed) may have written its trace already. A complete trace
    (a full gzip stream holding a JSON object with ``traceEvents``) moves to
    ``traces/<name>``, where ``mgprof trace`` and TensorBoard find it; an unfinished one (the
    rank died while writing it: a truncated file, or the writer's temp file) is discarded; a
    trace already saved under that name is kept and the staged copy discarded. The staging
    folders are removed. Returns one line per trace recovered or discarded. Never raises.
    """
    run_dir = Path(run_dir)
    notes: list[str] = []
    try:
        folders = sorted(p for p in run_dir.glob(f"{STAGING_PREFIX}*") if p.is_dir())
    except OSError as exc:
        return [f"staged traces not looked for in {run_dir}: {exc}"]
    for folder in folders:
        notes.extend(_recover_folder(folder, run_dir / rundir.TRACES))
        shutil.rmtree(folder, ignore_errors=True)
        if folder.exists():
            notes.append(f"staging folder {folder} could not be removed")
    return notes


def _recover_folder(folder: Path, traces: Path) -> list[str]:
    match = _RANK_OF.search(folder.name)
    who = f"rank {match.group(1)}" if match else folder.name
    notes: list[str] = []
    try:
        entries = sorted(folder.iterdir())
    except OSError as exc:
        return [f"{who}: staging folder {folder} not readable: {exc}"]
    for path in entries:
        name = path.name
        try:
            if name == RESERVE_NAME or not path.is_file():
                continue
            if not name.endswith(TRACE_SUFFIXES):
                notes.append(
                    f"{who}: unfinished trace export {folder.name}/{name} discarded "
                    "(the rank ended while writing it)"
                )
                continue
            why = incomplete_trace_reason(path)
            if why is not None:
                notes.append(f"{who}: staged trace {folder.name}/{name} discarded: {why}")
                continue
            target = traces / name
            traces.mkdir(parents=True, exist_ok=True)
            if target.exists():
                notes.append(
                    f"{who}: staged trace {folder.name}/{name} discarded: "
                    f"{rundir.TRACES}/{name} is already saved"
                )
                continue
            os.replace(path, target)
            notes.append(
                f"{who}: trace recovered from staging into {rundir.TRACES}/{name} "
                "(the rank ended before it delivered its record)"
            )
        except OSError as exc:
            notes.append(f"{who}: staged trace {folder.name}/{name} not recovered: {exc}")
    return notes


def incomplete_trace_reason(path: Path) -> str | None:
    """Why ``path`` is not a complete Chrome trace (truncated gzip, truncated or invalid JSON,
    no ``traceEvents``), or None when it is one."""
    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "rb") as fh:
                data = fh.read()
        else:
            data = path.read_bytes()
    except (OSError, EOFError, zlib.error) as exc:
        return f"not a complete gzip file ({type(exc).__name__}: {exc})"
    try:
        doc = msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        return f"truncated or invalid JSON ({exc})"
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        return "not a Chrome trace (no traceEvents list)"
    return None
