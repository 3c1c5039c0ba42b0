"""A TensorBoard log folder where every run shows under its own name, not as ``traces``.

The PyTorch Profiler plugin names a run by the folder holding its trace files, relative to the
log folder, so pointing TensorBoard at a run directory lists every run as ``traces``. Instead
TensorBoard reads a temporary folder with one entry per run, named by the run directory's
path under what the user gave (its run id for a single run): ``<name>/`` holds links to the
run's trace files and ``<name>/scalars/rankN/`` links to its scalar event files. Links to files,
not folders, so any directory walk finds them; nothing is copied, nothing in the run changes.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

TRACE_SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz")


def _is_trace(name: str) -> bool:
    return name.endswith(TRACE_SUFFIXES)


def run_name(logdir: Path, run_dir: Path) -> str:
    """The name a run shows under: its path below ``logdir`` (its own folder name when it is
    ``logdir``), ``/``-joined."""
    rel = os.path.relpath(run_dir, logdir)
    return run_dir.resolve().name if rel == "." else Path(rel).as_posix()


def _link_files(src: Path, dst: Path, keep: bool = True) -> int:
    """Link the regular files of ``src`` (traces only unless ``keep``) into ``dst``."""
    count = 0
    try:
        entries = sorted(os.scandir(src), key=lambda e: e.name)
    except OSError:
        return 0
    for entry in entries:
        if entry.is_file() and (keep or _is_trace(entry.name)):
            dst.mkdir(parents=True, exist_ok=True)
            os.symlink(os.path.abspath(entry.path), dst / entry.name)
            count += 1
    return count


def build(logdir: Path, runs: Sequence[Path], into: Path) -> int:
    """Fill ``into`` with each run's traces and scalars under its name; return traces linked."""
    traces = 0
    for run_dir in runs:
        name = run_name(logdir, run_dir)
        target = into / name
        traces += _link_files(run_dir / "traces", target, keep=False)
        scalars = run_dir / "tb"
        if scalars.is_dir():
            for rank_dir in sorted(p for p in scalars.iterdir() if p.is_dir()):
                _link_files(rank_dir, target / "scalars" / rank_dir.name)
    return traces


def traces_outside(logdir: Path, runs: Sequence[Path]) -> bool:
    """Whether a trace file lies outside the runs' ``traces`` folders (a plain torch.profiler
    folder beside the runs), which the named folder would leave out."""
    inside = {(r / "traces").resolve() for r in runs}
    for root, dirs, files in os.walk(logdir):
        dirs[:] = [d for d in dirs if d != "tb" and not d.startswith(".")]
        if any(_is_trace(f) for f in files) and Path(root).resolve() not in inside:
            return True
    return False


@contextmanager
def named_logdir(logdir: Path, runs: Sequence[Path]) -> Iterator[Path]:
    """The folder TensorBoard should read: a temporary named one for runs, or ``logdir`` itself
    when there is no run, traces lie outside runs, or links cannot be made (then runs show
    under their folder names, as before)."""
    if not runs or traces_outside(logdir, runs):
        yield logdir
        return
    tmp = Path(tempfile.mkdtemp(prefix="mgprof-view-"))
    try:
        try:
            build(logdir, runs, tmp)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            yield logdir
            return
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
