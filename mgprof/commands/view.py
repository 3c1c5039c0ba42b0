"""``mgprof view RUN_DIR``: open a run's traces and scalars in TensorBoard's PyTorch Profiler tab.

Parses arguments and calls ``mgprof.view.tensorboard`` / ``mgprof.view.scalars``; the server
runs in the foreground until Ctrl-C, which stops it and exits 0 (stopping the viewer is the
normal way out). Paths, the host and error text are printed through ``safe_text.printable``:
control characters (terminal escape sequences) in a folder name show escaped.
"""

from __future__ import annotations

import argparse
import signal
import sys
import webbrowser
from pathlib import Path
from typing import Any

from mgprof.commands import help_formatter
from mgprof.errors import UsageError
from mgprof.report.safe_text import printable
from mgprof.run.process_tree import Stopped, stop_signals
from mgprof.view import tensorboard as viewer
from mgprof.view.named_logdir import named_logdir

EPILOG = """\
examples:
  mgprof view mgprof-runs/RUN        one run; opens a browser on http://127.0.0.1:6006
  mgprof view mgprof-runs --port 6007 --no-browser
                                     every run in the folder, on another port"""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "view",
        help="open a run's traces and scalars in TensorBoard",
        description=(
            "Serve a run directory (or a folder of runs) with TensorBoard and the PyTorch Profiler "
            "plugin, in the foreground until Ctrl-C; writes mgprof's scalars to RUN_DIR/tb first. "
            "Needs the tensorboard extra: pip install 'mgprof[tensorboard]'."
        ),
        epilog=EPILOG,
        formatter_class=help_formatter(),
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="run directory, or a folder of runs")
    p.add_argument(
        "--port",
        type=int,
        default=viewer.DEFAULT_PORT,
        help=f"TCP port (default: {viewer.DEFAULT_PORT})",
    )
    p.add_argument(
        "--host",
        default=viewer.DEFAULT_HOST,
        help=f"address to listen on (default: {viewer.DEFAULT_HOST}, this machine only)",
    )
    p.add_argument("--no-browser", action="store_true", help="do not open a web browser")
    p.set_defaults(func=run)


def _logdir(path: Path) -> tuple[Path, list[Path]]:
    if not path.exists():
        raise UsageError(
            f"{printable(path)} does not exist; give a run directory made by 'mgprof analyze'"
        )
    if path.is_file():
        if path.name != "run.json":
            raise UsageError(
                f"{printable(path)} is a file; give a run directory (or a folder of runs)"
            )
        path = path.parent
    runs, has_traces = viewer.find_logdir_runs(path)
    if not runs and not has_traces:
        raise UsageError(
            f"{printable(path)} holds no run.json and no *.pt.trace.json[.gz] traces; "
            "give a run directory made by 'mgprof analyze' or a folder of them"
        )
    return path, runs


def _refresh_scalars(runs: list[Path]) -> None:
    """(Re)write scalars of runs whose ``tb/`` is missing or older than their run.json.

    A run whose run.json cannot be read still has traces worth viewing: one warning, go on.
    """
    from mgprof.errors import RunRecordError
    from mgprof.records import read_run
    from mgprof.view.scalars import scalars_stale, write_scalars

    for run_dir in runs:
        if not scalars_stale(run_dir):
            continue
        try:
            write_scalars(run_dir, read_run(run_dir))
        except RunRecordError as exc:
            print(
                printable(f"mgprof view: warning: no scalars for {run_dir}: {exc}"),
                file=sys.stderr,
            )
        except OSError as exc:
            why = f"cannot write scalars to {run_dir}: {exc.strerror}"
            print(printable(f"mgprof view: warning: {why}"), file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    if viewer.missing_extra():
        raise UsageError(viewer.INSTALL_HINT)
    logdir, runs = _logdir(Path(args.run_dir))
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(
            f"mgprof view: warning: --host {printable(args.host)} lets other machines that can "
            "reach this one read the traces; TensorBoard has no login",
            file=sys.stderr,
        )
    viewer.check_port_free(args.host, args.port)
    _refresh_scalars(runs)

    url = viewer.profiler_url(args.host, args.port)
    with stop_signals(), named_logdir(logdir, runs) as served:
        return _serve(viewer, logdir, served, args, url)


def _serve(viewer: Any, logdir: Path, served: Path, args: argparse.Namespace, url: str) -> int:
    """Serve until TensorBoard ends or mgprof is stopped; the server never outlives mgprof."""
    proc = viewer.start_tensorboard(served, args.host, args.port)
    try:
        try:
            viewer.wait_until_serving(url, timeout_s=120, proc=proc)
        except viewer.ViewerError as exc:
            print(printable(f"mgprof view: error: {exc}", multiline=True), file=sys.stderr)
            viewer.stop_tensorboard(proc)
            return 1
        print(printable(f"mgprof view: serving {logdir} at {url}  (Ctrl-C to stop)"), flush=True)
        if not args.no_browser:
            try:
                webbrowser.open(url)
            except webbrowser.Error:
                pass  # headless machine: the printed URL is enough
        code = proc.wait()
        return 0 if code == 0 else 1
    except Stopped as stop:  # Ctrl-C, or SIGTERM/SIGHUP: the server goes too
        viewer.stop_tensorboard(proc)
        print("mgprof view: stopped", file=sys.stderr)
        return 0 if stop.signum == signal.SIGINT else 128 + stop.signum
    finally:
        if proc.poll() is None:
            viewer.stop_tensorboard(proc)
