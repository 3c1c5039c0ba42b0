"""Every process mgprof starts ends when mgprof ends, whatever signal ends it.

torchrun is started in its own session (so a terminal's Ctrl-C reaches mgprof first, which
forwards it once, in order) and torchrun gives each worker a session of its own, so a signal to
torchrun's process group never reaches the workers. mgprof therefore keeps the PIDs of every
descendant it has seen (``ProcessTree.scan``, about once a second, and again before stopping):
a worker whose torchrun is already gone is still found. Stopping is: the signal to the child's
group (torchrun passes it to the workers and waits for them), a grace period in which a second
signal ends the wait, then SIGKILL to every process of the tree still alive. The workers also
carry a parent-death signal (``mgprof.run.entry``) for the case where mgprof itself is killed.

A process that leaves the tree before a scan sees it (a daemon the script double-forks:
``fork; setsid; fork; exec``, its middle process gone at once) would escape: while a launch runs,
mgprof is its child subreaper (``child_subreaper``, Linux ``PR_SET_CHILD_SUBREAPER``), so such an
orphan becomes mgprof's own child rather than init's, and the tree finds it there
(``ProcessTree(adopting=True)``). Where prctl is unavailable the tree is what the scans saw, as
before.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import psutil

from mgprof.errors import Interrupted

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37
SCAN_EVERY_S = 1.0
LEFTOVER_GRACE_S = 2.0


class Stopped(Interrupted):
    """mgprof received ``signum`` (Ctrl-C, ``kill``, a closed terminal) while its child ran;
    ``label`` (``Ctrl-C`` or the signal's name) is how run.json's error names the stop."""

    def __init__(self, signum: int) -> None:
        name = signal.Signals(signum).name
        super().__init__(signum, "Ctrl-C" if signum == signal.SIGINT else name)

    @property
    def forward(self) -> int:
        """The signal passed to the workers: Ctrl-C as SIGINT, anything else as SIGTERM
        (which every rank turns into a clean end with its record written; SIGHUP would not)."""
        return signal.SIGINT if self.signum == signal.SIGINT else signal.SIGTERM


def _raise_stopped(signum: int, frame: FrameType | None) -> None:
    raise Stopped(signum)


@contextmanager
def stop_signals() -> Iterator[None]:
    """While the block runs, SIGINT/SIGTERM/SIGHUP raise ``Stopped`` in the main thread.

    Outside the main thread (signals cannot be caught there) the handlers stay as they are.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    try:
        for sig in STOP_SIGNALS:
            signal.signal(sig, _raise_stopped)
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def ignore_stop_signals() -> None:
    """A second signal while the tree is being killed changes nothing: the kill is under way."""
    if threading.current_thread() is threading.main_thread():
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)


def _prctl() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


@contextmanager
def child_subreaper() -> Iterator[bool]:
    """While the block runs, orphans among this process's descendants become its children
    (``PR_SET_CHILD_SUBREAPER``); yields whether that holds. Fails open: False where prctl is
    unavailable (not Linux, a seccomp filter), and the previous setting comes back after."""
    prctl = _prctl()
    if prctl is None:
        yield False
        return
    import ctypes

    before = ctypes.c_int(0)
    try:
        known = int(prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(before), 0, 0, 0)) == 0
        on = int(prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except Exception:  # fail open: the scans alone find what they find
        yield False
        return
    try:
        yield on
    finally:
        if on and not (known and before.value):
            with contextlib.suppress(Exception):
                prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


class ProcessTree:
    """The processes below ``root`` that mgprof has seen, kept after their parents end.

    ``adopting``: mgprof is the launch's child subreaper (``child_subreaper``), so its own
    children other than ``root`` that were not there when the tree was made are orphans of the
    launch, and belong to it (with their descendants)."""

    def __init__(self, root: int, adopting: bool = False) -> None:
        self.root = root
        self.seen: dict[int, psutil.Process] = {}
        self._last_scan = 0.0
        self._adopting = adopting
        self._before: set[int] = set()
        try:
            self.seen[root] = psutil.Process(root)
        except psutil.Error:
            pass
        if adopting:
            self._before = {p.pid for p in _own_children()} - {root}

    def scan(self, force: bool = True) -> None:
        """Remember the root's current descendants (at most once a second unless ``force``)."""
        now = time.monotonic()
        if not force and now - self._last_scan < SCAN_EVERY_S:
            return
        self._last_scan = now
        try:
            children = self.seen[self.root].children(recursive=True)
        except (KeyError, psutil.Error):
            children = []
        for child in children:
            self.seen.setdefault(child.pid, child)
        if self._adopting:
            self._adopt()

    def _adopt(self) -> None:
        """Orphans of the launch re-parented to mgprof: into the tree; those that have ended
        already are reaped (mgprof is their parent now; the root is left to ``Popen``)."""
        for child in _own_children():
            if child.pid in self._before or child.pid == self.root:
                continue
            self.seen.setdefault(child.pid, child)
            try:
                if child.status() == psutil.STATUS_ZOMBIE:
                    os.waitpid(child.pid, os.WNOHANG)
                    continue
                below = child.children(recursive=True)
            except (psutil.Error, OSError):
                continue
            for proc in below:
                self.seen.setdefault(proc.pid, proc)

    def alive(self) -> list[psutil.Process]:
        """Processes of the tree still running (a reused PID is not ours: psutil checks its
        creation time)."""
        out = []
        for proc in self.seen.values():
            try:
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    out.append(proc)
            except psutil.Error:
                pass
        return out

    def signal_all(self, sig: int) -> None:
        send_each(self.alive(), sig)

    def kill_all(self) -> None:
        """SIGKILL every process of the tree still alive, and wait briefly for them to go."""
        self.scan()
        procs = self.alive()
        send_each(procs, signal.SIGKILL)
        psutil.wait_procs(procs, timeout=5)

    def end_leftovers(self, grace_s: float = LEFTOVER_GRACE_S) -> int:
        """After the child ended: SIGTERM what is left of the tree, SIGKILL it after ``grace_s``.

        Returns how many processes were left over (a worker torchrun lost track of, a
        background process the script started and never stopped).
        """
        self.scan()
        left = [p for p in self.alive() if p.pid != self.root]
        if not left:
            return 0
        send_each(left, signal.SIGTERM)
        _, still = psutil.wait_procs(left, timeout=grace_s)
        send_each(still, signal.SIGKILL)
        psutil.wait_procs(still, timeout=5)
        return len(left)


def _own_children() -> list[psutil.Process]:
    try:
        return psutil.Process().children()
    except psutil.Error:
        return []


def send_each(procs: list[psutil.Process], sig: int) -> None:
    """``sig`` to each process; one already gone (or a reused PID psutil refuses) is skipped."""
    for proc in procs:
        try:
            proc.send_signal(sig)
        except psutil.Error:
            pass


def signal_group(pid: int, sig: int) -> None:
    """``sig`` to the process group led by ``pid`` (the child started in its own session)."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
