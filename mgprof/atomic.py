"""Atomic file writes: a reader never sees half a run.json, a crash never leaves one.

A write that fails (disk full, quota, file size limit, read-only folder) raises ``OSError`` and
leaves the previous file, if any, untouched, and no temp file behind. ``reserve_space`` and
``release_space`` keep room for a last small write on a disk that fills while a run goes on.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

_write = os.write
"""The one call that puts bytes on disk here (tests replace it to simulate a full disk)."""


def file_size_limit() -> int | None:
    """The process's file size limit (``ulimit -f``) in bytes, None when unlimited.

    A write past it raises SIGXFSZ, whose default action kills the process: mgprof checks
    before it writes, so that its own file can fail but never end the training.
    """
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    except (ImportError, OSError, ValueError, AttributeError):
        return None
    return None if soft == resource.RLIM_INFINITY or soft < 0 else int(soft)


def _check_size(nbytes: int) -> None:
    limit = file_size_limit()
    if limit is not None and nbytes > limit:
        raise OSError(errno.EFBIG, os.strerror(errno.EFBIG))


def _write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    view = memoryview(data).cast("B")
    while view:
        written = _write(fd, view)
        view = view[written:]


def write_bytes_atomic(
    path: str | os.PathLike[str], data: bytes, *, durable: bool = True, private: bool = False
) -> Path:
    """Write ``data`` to ``path`` through a temp file in the same folder and a rename.

    The file gets the mode the user's umask gives a new file (tempfile's 0600 is widened), or
    stays 0600 when ``private``. ``durable=False`` skips the fsync, for files whose loss costs
    only a recomputation (the trace-summary cache: a torn entry fails its digest).
    """
    target = Path(path)
    _check_size(len(data))
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        try:
            _write_all(fd, data)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        if not private:
            os.chmod(tmp, 0o666 & ~current_umask())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return target


def current_umask() -> int:
    """The process umask, read without changing it where Linux shows it (``/proc``).

    ``os.umask`` can only be read by setting it: another thread creating a file in between
    (a sampler, a trace writer) would get mode 0666/0777, so it is the fallback only.
    """
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Text variant of :func:`write_bytes_atomic` (UTF-8)."""
    return write_bytes_atomic(path, text.encode("utf-8"))


_CHUNK = 1 << 20


def reserve_space(path: str | os.PathLike[str], nbytes: int) -> bool:
    """Hold ``nbytes`` of disk at ``path`` (a file of real blocks), to be freed with
    :func:`release_space` just before a small write that must succeed on a full disk.

    Allocated with ``posix_fallocate`` where the filesystem supports it, else written with
    random bytes (zeros could be compressed or left sparse, and reserve nothing). False, with no
    file left, when the room is not there; never raises.
    """
    target = os.fspath(path)
    try:
        _check_size(nbytes)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    except OSError:
        return False
    ok = False
    try:
        try:
            os.posix_fallocate(fd, 0, nbytes)
            ok = True
        except (OSError, AttributeError):
            os.ftruncate(fd, 0)
            chunk = os.urandom(min(nbytes, _CHUNK))
            left = nbytes
            while left > 0:
                _write_all(fd, chunk[:left])
                left -= min(left, len(chunk))
            ok = True
    except OSError:
        ok = False
    finally:
        try:
            os.close(fd)
        except OSError:
            ok = False
        if not ok:
            try:
                os.unlink(target)
            except OSError:
                pass
    return ok


def release_space(path: str | os.PathLike[str]) -> int:
    """Delete a reserve made by :func:`reserve_space`; the bytes freed (0 if none). Never raises."""
    try:
        size = os.stat(path).st_size
        os.unlink(path)
    except OSError:
        return 0
    return size
