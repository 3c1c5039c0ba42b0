"""The report a session writes itself when no launcher is around (``python train.py``,
``torchrun train.py``): rank 0 analyses the run directory it just wrote, writes report.md and
report.html (``mgprof.report.files``, run in a fresh process) and prints a few summary lines to
stderr, unless ``quiet=True`` or ``MGPROF_QUIET=1``. Under ``mgprof analyze`` the launcher does
both, and this step stays out.

Split from ``session.py``: it needs nothing of the session but its run directory, rank, quiet flag
and fail-open guard, so it takes those as arguments. The command that writes the report files is
passed in as well (``session.py`` passes its own ``_report_command``, which tests replace there).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

from mgprof import rundir
from mgprof.collect.distenv import RankInfo, env_rank_info
from mgprof.collect.failopen import FailOpen
from mgprof.records import RunRecord

QUIET_ENV = "MGPROF_QUIET"
"""Set to 1 (or true/yes/on) to silence the end-of-session summary; the files are still written."""


def report_run(
    run_dir: Path | None,
    run: RunRecord,
    *,
    info: RankInfo | None,
    quiet: bool,
    failopen: FailOpen,
    command: Callable[[Path], list[str]],
) -> RunRecord:
    """Rank 0 wrote the run directory itself (no ``mgprof analyze`` launcher, which analyses
    and reports on its own): analyse it, write report.md and report.html (in a fresh
    process), print a summary unless quiet.

    Fails open like the rest: an error here is one warning; run.json stays as written.
    """
    if os.environ.get(rundir.RUN_DIR_ENV) or run_dir is None:
        return run
    if (info or env_rank_info()).rank != 0:
        return run
    if not (run_dir / rundir.RUN_JSON).exists():
        return run  # the writer failed (already one warning): nothing to report on
    analysis = None
    written: list[str] = []
    with failopen.guard("report"):
        written = _write_report_files(run_dir, run, command)
        from mgprof.analyze.run.schema import decode_analysis
        from mgprof.records import read_run

        run = read_run(run_dir)  # as saved: with its analysis
        analysis = decode_analysis(run.analysis) if run.analysis is not None else None
    if quiet or _quiet_env():
        return run
    with failopen.guard("summary"):
        from mgprof.report.run.summary_lines import summary_lines

        lines = summary_lines(run, analysis, run_dir, written)
        sys.stderr.write("".join(f"{line}\n" for line in lines))
        sys.stderr.flush()
    return run


def report_command(run_dir: Path) -> list[str]:
    return [sys.executable, "-m", "mgprof.report.files", str(run_dir)]


def _write_report_files(
    run_dir: Path, run: RunRecord, command: Callable[[Path], list[str]]
) -> list[str]:
    """Analysis into run.json, report.md and report.html, written by ``mgprof.report.files`` in a
    fresh Python process (why: that module's docstring); the names of the report files written.

    In the unusual interpreter with no ``sys.executable`` (embedded), it runs in this process.
    """
    if not sys.executable:
        from mgprof.report.files import write_report_files

        return [p.name for p in write_report_files(run_dir, run).written]
    import subprocess

    env = dict(os.environ)
    # appended, not prepended: an mgprof source tree only put on sys.path is found too
    import mgprof

    root = str(Path(mgprof.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), root) if p)
    proc = subprocess.run(
        command(run_dir.resolve()),
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        errors="replace",
        check=False,
    )
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        raise RuntimeError(
            "report files not written: " + (lines[-1] if lines else f"exit code {proc.returncode}")
        )
    return [line for line in proc.stdout.splitlines() if line]


def _quiet_env() -> bool:
    return os.environ.get(QUIET_ENV, "").strip().lower() in {"1", "true", "yes", "on"}
