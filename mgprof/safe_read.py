"""Open the files a user names without hanging or running out of memory.

A path given to mgprof may be a FIFO (opening it waits for a writer forever), a device such as
``/dev/zero`` (reading it never ends), a symlink to either, or a file far larger than any record
mgprof writes. Only regular files are read (symlinks resolved); a FIFO is opened non-blocking
and checked with ``fstat`` before anything is read; JSON records are read up to a size limit.
Every problem is one :class:`~mgprof.errors.UsageError` line that names the path and what was
found there ("is a FIFO", "is a character device", ...), never "no such file".
"""

from __future__ import annotations

import errno
import math
import os
import re
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

from mgprof.errors import UsageError

__all__ = [
    "MAX_RECORD_BYTES",
    "MAX_RECORD_ENV",
    "check_out_path",
    "check_size",
    "describe_mode",
    "file_problem",
    "format_size",
    "open_regular",
    "parse_size",
    "read_limited",
    "read_regular",
    "record_size_limit",
]

MAX_RECORD_BYTES = 256 << 20
"""Default largest run.json / comparison.json / sweep.json read: mgprof writes a few MiB (a day
of sampler readings on 8 GPUs is ~100 MiB)."""
MAX_RECORD_ENV = "MGPROF_MAX_RECORD_BYTES"
"""Environment variable that raises (or lowers) that limit: ``1G``, ``512M``, a byte count."""

_KINDS = (
    (stat.S_ISDIR, "is a folder"),
    (stat.S_ISFIFO, "is a FIFO (named pipe)"),
    (stat.S_ISCHR, "is a character device"),
    (stat.S_ISBLK, "is a block device"),
    (stat.S_ISSOCK, "is a socket"),
)


def describe_mode(mode: int) -> str | None:
    """What a non-regular file is ("is a FIFO (named pipe)", ...); None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    for test, words in _KINDS:
        if test(mode):
            return words
    return "is not a regular file"


def _os_problem(exc: OSError) -> str:
    if exc.errno == errno.ENOENT:
        return "no such file"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    if exc.errno == errno.ENOTDIR:
        return "a part of the path is a file, not a folder"
    if exc.errno == errno.ELOOP:
        return "symlink loop"
    if exc.errno == errno.ENAMETOOLONG:
        return "path too long"
    return f"cannot read ({exc.strerror or exc})"


def file_problem(path: str | os.PathLike[str]) -> str | None:
    """Why ``path`` cannot be read as a regular file, in a few words; None when it can.

    Symlinks are followed: a symlink to ``/dev/zero`` "is a character device (symlink to
    /dev/zero)", one whose target is missing is "a symlink to a missing file".
    """
    try:
        st = os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ENOENT and os.path.islink(path):
            return f"a symlink to a missing file ({os.readlink(path)})"
        return _os_problem(exc)
    kind = describe_mode(st.st_mode)
    if kind is None:
        return None
    if os.path.islink(path):
        kind += f" (symlink to {os.path.realpath(path)})"
    return kind + ", not a regular file"


def open_regular(
    path: str | os.PathLike[str], *, error: type[UsageError] = UsageError, hint: str = ""
) -> BinaryIO:
    """Open a regular file for reading; ``error`` (one line: path, problem, ``hint``) otherwise.

    The file is opened with ``O_NONBLOCK`` and checked with ``fstat`` before it is returned, so a
    FIFO (which would block ``open`` until a writer comes) or a device is refused, not read.
    """
    tail = f"; {hint}" if hint else ""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        problem = file_problem(path) or _os_problem(exc)
        raise error(f"{path}: {problem}{tail}") from None
    try:
        kind = describe_mode(os.fstat(fd).st_mode)
        if kind is not None:
            if os.path.islink(path):
                kind += f" (symlink to {os.path.realpath(path)})"
            raise error(f"{path}: {kind}, not a regular file{tail}")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def record_size_limit(error: type[UsageError] = UsageError) -> int:
    """The largest JSON record read: ``MGPROF_MAX_RECORD_BYTES``, else ``MAX_RECORD_BYTES``."""
    raw = os.environ.get(MAX_RECORD_ENV, "").strip()
    if not raw:
        return MAX_RECORD_BYTES
    try:
        return parse_size(raw)
    except ValueError as exc:
        raise error(f"{MAX_RECORD_ENV}: {exc}; set it like 1G, 512M or a byte count") from None


def read_regular(
    path: str | os.PathLike[str],
    *,
    limit: int | None = None,
    error: type[UsageError] = UsageError,
    hint: str = "",
) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes (default: the record limit);
    ``error`` (one line) otherwise."""
    with open_regular(path, error=error, hint=hint) as fh:
        return read_limited(fh, path, limit=limit, error=error)


def read_limited(
    fh: BinaryIO,
    path: str | os.PathLike[str],
    *,
    limit: int | None = None,
    error: type[UsageError] = UsageError,
) -> bytes:
    """The rest of an open regular file, refused (one line) past ``limit`` bytes."""
    limit = check_size(fh, path, limit=limit, error=error)
    size = os.fstat(fh.fileno()).st_size
    try:
        # read(n) allocates n bytes at once: ask for what is there (+1 to see growth)
        data = fh.read(min(size, limit) + 1)
    except OSError as exc:
        raise error(f"{path}: {_os_problem(exc)}") from None
    if len(data) > limit:  # grew while it was read
        raise error(_too_big(path, len(data), limit))
    return data


def check_size(
    fh: BinaryIO,
    path: str | os.PathLike[str],
    *,
    limit: int | None = None,
    error: type[UsageError] = UsageError,
) -> int:
    """Refuse (one line) an open file larger than ``limit`` (default: the record limit); the
    limit that applied."""
    if limit is None:
        limit = record_size_limit(error)
    size = os.fstat(fh.fileno()).st_size
    if size > limit:
        raise error(_too_big(path, size, limit))
    return limit


def _too_big(path: str | os.PathLike[str], size: int, limit: int) -> str:
    return (
        f"{path}: file is {format_size(size)}, over the {format_size(limit)} limit for an "
        f"mgprof record; if mgprof wrote it, set {MAX_RECORD_ENV} (e.g. 1G) to read it"
    )


_SIZE_RE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgtp]?)(i?b)?\s*", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}


def parse_size(text: str) -> int:
    """Bytes from ``4G``, ``512M``, ``1.5GiB``, ``300k`` or a plain byte count (binary units).

    ValueError when the text is not a size, is zero, or is beyond ``MAX_SIZE`` (1 PiB: no
    file or buffer mgprof bounds comes near it, and a larger number would overflow the
    integers it reaches).
    """
    m = _SIZE_RE.fullmatch(text)
    if m is None:
        raise ValueError(f"{text!r} is not a size (use e.g. 4G, 512M or a byte count)")
    scaled = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if not math.isfinite(scaled) or scaled > MAX_SIZE:
        raise ValueError(f"{_short(text)} is larger than the most allowed, 1 PiB")
    value = int(scaled)
    if value <= 0:
        raise ValueError(f"{_short(text)} is not a size above zero")
    return value


MAX_SIZE = 1 << 50
"""1 PiB: the largest size ``parse_size`` accepts."""


def _short(text: str) -> str:
    """The text as quoted in a message, cut when it is long (400 nines)."""
    return repr(text if len(text) <= 40 else text[:20] + "…" + text[-8:])


def format_size(nbytes: int) -> str:
    """``4 GiB``, ``512 MiB``, ``1.5 KiB``, ``17 B``."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{nbytes} B" if unit == "B" else f"{value:.3g} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def check_out_path(
    out: Path,
    *,
    force: bool,
    inputs: Iterable[str | os.PathLike[str]] = (),
    error: type[UsageError] = UsageError,
) -> None:
    """Refuse, in one line and before any work, an ``--out`` that cannot or must not be written.

    Refused whatever ``force`` says: a folder, something under a file, a folder that cannot be
    written, and any of ``inputs`` (the files being read: replacing one would destroy the input).
    An existing file is refused without ``force``.
    """
    if out.exists():
        if out.is_dir():
            raise error(f"--out {out} is a folder; give a file path for --out")
        problem = file_problem(out)
        if problem is not None:
            raise error(f"--out {out}: {problem}; give a file path for --out")
        for path in inputs:
            try:
                same = os.path.samefile(out, path)
            except OSError:
                continue
            if same:
                raise error(
                    f"--out {out} is the input {path}; writing it would destroy what is being "
                    "read, whatever --force says: choose another --out"
                )
        if not force:
            raise error(f"{out} exists; pass --force to replace it or choose another --out")
    parent = Path(os.path.abspath(out)).parent
    while not parent.exists() and not parent.is_symlink() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise error(f"--out {out}: {parent} is a file, not a folder; choose another --out")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise error(f"--out {out}: folder {parent} is not writable; choose another --out")
