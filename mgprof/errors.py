"""mgprof's own exceptions: misuse becomes one clear line and exit code 2, never a traceback."""

from __future__ import annotations


class MgprofError(Exception):
    """Base class for errors mgprof raises on purpose."""


class UsageError(MgprofError):
    """Bad input from the user (path, flag, file). The CLI prints the message and exits 2.

    The message must say what is wrong and what to do about it, in one line.
    """


class Interrupted(MgprofError):
    """mgprof was stopped by a signal (Ctrl-C, ``kill``, a closed terminal) while it ran a
    script; what it started has been stopped. The CLI exits 128 + ``signum``, no traceback."""

    def __init__(self, signum: int, label: str) -> None:
        super().__init__(label)
        self.signum = signum
        self.label = label


class TraceError(UsageError):
    """A trace file that cannot be read as a torch.profiler / Kineto trace."""


class RunRecordError(UsageError):
    """A run.json that is missing, unreadable, or of a schema this mgprof does not know."""
