"""Start TensorBoard (with the PyTorch Profiler plugin) on a run directory, for ``mgprof view``.

Kept apart from the command so tests and notebooks can start the same server the CLI starts.
TensorBoard runs as a child process (``python -m tensorboard.main``) rather than in-process: its
own signal handling, threads and logging stay out of mgprof's process, and stopping it is a plain
terminate. Nothing here imports tensorboard, so the check for the extra can run first.
"""

from __future__ import annotations

import errno
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import Path

from mgprof.errors import MgprofError, UsageError

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "EXTRA_MODULES",
    "INSTALL_HINT",
    "ViewerError",
    "check_port_free",
    "find_logdir_runs",
    "missing_extra",
    "profiler_url",
    "start_tensorboard",
    "stop_tensorboard",
    "tensorboard_command",
    "wait_until_serving",
]

DEFAULT_HOST = "127.0.0.1"
"""Loopback by default: TensorBoard has no authentication, and traces name the user's code."""
DEFAULT_PORT = 6006
EXTRA_MODULES = ("tensorboard", "torch_tb_profiler")
INSTALL_HINT = "TensorBoard is not installed: pip install 'mgprof[tensorboard]'"


class ViewerError(MgprofError):
    """TensorBoard did not come up (exited early or did not answer in time)."""


def missing_extra(modules: Iterable[str] = EXTRA_MODULES) -> list[str]:
    """The modules of the ``tensorboard`` extra that cannot be imported here (empty when all can).

    ``find_spec`` looks for the modules without importing them: importing tensorboard takes
    seconds and is wasted when the command is about to stop with an install hint.
    """
    missing = []
    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(name)
    return missing


def tensorboard_command(logdir: str | os.PathLike[str], host: str, port: int) -> list[str]:
    """The argv that serves ``logdir`` on ``host:port`` with this interpreter's TensorBoard.

    ``sys.executable`` rather than a ``tensorboard`` on PATH, so the server sees the same
    site-packages (and so the same torch-tb-profiler) as mgprof.
    """
    return [
        sys.executable,
        "-m",
        "tensorboard.main",
        "--logdir",
        str(logdir),
        "--host",
        host,
        "--port",
        str(port),
    ]


def check_port_free(host: str, port: int) -> None:
    """Raise ``UsageError`` when ``host:port`` cannot be bound (in use, or not an address here).

    Checked before starting TensorBoard because TensorBoard's own message for a busy port comes
    after seconds of start-up and among its log lines. ``SO_REUSEADDR`` as servers set it, so a
    port left in TIME_WAIT by a previous viewer is not reported as busy.
    """
    if not 0 < port < 65536:
        raise UsageError(f"--port {port} is not a TCP port; give a number from 1 to 65535")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise UsageError(f"--host {host!r} is not an address here ({exc.strerror})") from None
    family, socktype, proto, _, address = infos[0]
    with socket.socket(family, socktype, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise UsageError(
                    f"port {port} on {host} is already in use (another TensorBoard?); "
                    f"pass --port with a free port, e.g. --port {port + 1}"
                ) from None
            raise UsageError(
                f"cannot listen on {host}:{port} ({exc.strerror}); choose another --host/--port"
            ) from None


def profiler_url(host: str, port: int) -> str:
    """The address to open: the PyTorch Profiler tab of the server on ``host:port``.

    A server bound to every interface (``0.0.0.0``/``::``) is still reached locally through
    loopback, so that is the address printed.
    """
    shown = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
    if ":" in shown:
        shown = f"[{shown}]"
    return f"http://{shown}:{port}/#pytorch_profiler"


def start_tensorboard(
    logdir: str | os.PathLike[str],
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    *,
    quiet: bool = False,
) -> subprocess.Popen[bytes]:
    """Start TensorBoard on ``logdir`` and return the running process (not waiting for it).

    ``quiet`` sends its output to /dev/null (tests, notebooks); otherwise it shares the terminal,
    so the user sees TensorBoard's own warnings.
    """
    sink = subprocess.DEVNULL if quiet else None
    return subprocess.Popen(
        tensorboard_command(logdir, host, port),
        stdin=subprocess.DEVNULL,
        stdout=sink,
        stderr=sink,
        # its own process group: a Ctrl-C at the terminal reaches mgprof, which stops the
        # server and reports; and the kernel stops it if mgprof itself is killed (SIGKILL)
        start_new_session=True,
        preexec_fn=_die_with_parent,
    )


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when mgprof ends, however it ends (Linux)."""
    from mgprof.parent_death import parent_death_signal

    parent_death_signal(signal.SIGTERM)


def wait_until_serving(
    url: str, timeout_s: float, proc: subprocess.Popen[bytes] | None = None
) -> None:
    """Poll ``url`` until the server answers; raise ``ViewerError`` on timeout or early exit.

    TensorBoard takes a few seconds to import its plugins before it listens, so "started" and
    "serving" differ; a caller that prints the URL earlier would hand the user a dead link.
    """
    base = url.split("#", 1)[0]
    deadline = time.monotonic() + timeout_s
    last = "no answer yet"
    while True:
        if proc is not None and proc.poll() is not None:
            raise ViewerError(f"TensorBoard exited with code {proc.returncode} before serving")
        try:
            with urllib.request.urlopen(base, timeout=2) as response:
                if response.status == 200:
                    return
                last = f"HTTP {response.status}"
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code}"
        except (urllib.error.URLError, OSError) as exc:
            last = str(getattr(exc, "reason", exc))
        if time.monotonic() >= deadline:
            raise ViewerError(
                f"TensorBoard did not answer at {base} within {timeout_s:g} s: {last}"
            )
        time.sleep(0.25)


def stop_tensorboard(proc: subprocess.Popen[bytes], timeout_s: float = 10.0) -> int:
    """Terminate the server and reap it (kill if it ignores SIGTERM); return its exit code."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def find_logdir_runs(logdir: Path) -> tuple[list[Path], bool]:
    """Run directories (folders with a run.json) under ``logdir``, and whether any trace exists.

    ``logdir`` may be one run directory or a folder of them (``mgprof-runs``), as with
    ``tensorboard --logdir``. Scalar (``tb``) folders are not searched.
    """
    runs: list[Path] = []
    has_traces = False
    for root, dirs, files in os.walk(logdir):
        dirs[:] = sorted(d for d in dirs if d != "tb" and not d.startswith("."))
        if "run.json" in files:
            runs.append(Path(root))
        for f in files:
            if f.endswith(".pt.trace.json") or f.endswith(".pt.trace.json.gz"):
                _refuse_unless_regular(Path(root) / f)
                has_traces = True
    return runs, has_traces


def _refuse_unless_regular(path: Path) -> None:
    """A FIFO, device or socket named like a trace would block TensorBoard's profiler plugin
    in ``open`` (and its children outlive a stop): refused before anything starts."""
    import stat

    from mgprof.errors import UsageError

    try:
        mode = os.stat(path).st_mode
    except OSError:
        return  # a dangling link: the plugin skips what it cannot open
    if not stat.S_ISREG(mode):
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "not a regular file"
        raise UsageError(
            f"{path} is {kind}, not a trace file; TensorBoard would block reading it: "
            "remove or rename it"
        )
