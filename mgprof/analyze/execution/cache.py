"""A per-user cache of rank summaries: re-rendering, ``diff`` and re-analysis of a large job read
a few hundred kB per rank instead of parsing its JSON again.

Where: ``$MGPROF_CACHE_DIR``, else ``$XDG_CACHE_HOME/mgprof/trace-summaries``, else
``~/.cache/mgprof/trace-summaries``; ``MGPROF_NO_CACHE=1`` (or ``--no-cache``) turns it off. Not
beside the traces: trace folders are often read-only or shared with other users, and a file
mgprof added there would be seen by every tool that lists the folder.

An entry is keyed by the trace's absolute path, the ``top`` it was computed for and the
size-limit setting, in a folder per engine identity (the code that computed it). The caller asks
for one ``top`` for every request that a summary of it can answer (see ``trace_job``), and
relabels a hit with the path as given, so ``trace --top 5``, ``diff`` and a run's analysis of
the same files share their entries whatever the working directory. It is used only while the
file's stamp matches: size, mtime and ctime in nanoseconds (ctime cannot be set back by
``touch`` or ``cp -p``), and a digest of its first and last 64 KiB (a gzip file ends with the
CRC of all its content). Each entry starts with a digest of its own bytes: an entry that does
not check out is ignored and replaced, never trusted.
Summaries are msgpack (measured faster to write and read, and smaller, than Parquet for these
nested records: docs/benchmarks.md).
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
from pathlib import Path

import msgspec

from mgprof.analyze.execution.engine_id import engine_id

__all__ = [
    "CACHE_DIR_ENV",
    "NO_CACHE_ENV",
    "FileStamp",
    "TraceCache",
    "default_cache",
    "file_stamp",
]

CACHE_DIR_ENV = "MGPROF_CACHE_DIR"
NO_CACHE_ENV = "MGPROF_NO_CACHE"

_MAGIC = b"MGPTSC1\n"
_DIGEST_BYTES = 32
_SAMPLE_BYTES = 64 * 1024
_MAX_ENTRY_BYTES = 64 << 20
_KEEP_S = 30 * 86400
"""Entries unused this long are removed (a hit refreshes an entry's mtime, at most daily)."""
_PRUNE_EVERY_S = 86400


class FileStamp(msgspec.Struct, frozen=True, array_like=True):
    """What must not change for a cached summary of a file to stay valid."""

    size: int
    mtime_ns: int
    ctime_ns: int
    sample: bytes


class _Entry(msgspec.Struct, frozen=True, array_like=True):
    engine: str
    path: str
    top: int
    limit: str | None
    stamp: FileStamp
    summary: bytes


_ENTRY_DECODER = msgspec.msgpack.Decoder(_Entry)
_ENCODER = msgspec.msgpack.Encoder()


def file_stamp(path: str) -> FileStamp | None:
    """The stamp of a regular file, or None (missing, unreadable, not a regular file: such a
    file is analysed, never looked up). Opened non-blocking so a FIFO cannot hang it."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        head = os.pread(fd, _SAMPLE_BYTES, 0)
        tail = os.pread(fd, _SAMPLE_BYTES, max(0, st.st_size - _SAMPLE_BYTES))
    except OSError:
        return None
    finally:
        os.close(fd)
    digest = hashlib.blake2b(head + b"\0" + tail, digest_size=16).digest()
    return FileStamp(st.st_size, st.st_mtime_ns, st.st_ctime_ns, digest)


class TraceCache:
    """One cache folder. ``get`` and ``put`` never raise for a cache problem: a cache that
    cannot be read or written only costs the analysis it would have saved."""

    def __init__(self, folder: str | os.PathLike[str], private: bool = False) -> None:
        self.folder = Path(folder)
        self.private = private
        """Folders 0700 and files 0600 (the default location); else the umask decides, so a
        team can share a cache folder."""
        self.hits = 0
        self.misses = 0
        self.writes = 0
        self.rejected = 0
        """Entries found but not trusted (corrupt, another key, a changed file)."""
        self._pruned = False

    def _entry_path(self, path: str, top: int, limit: str | None) -> Path:
        key = f"{path}\0{top}\0{limit}".encode()
        name = hashlib.blake2b(key, digest_size=20).hexdigest()
        return self.folder / engine_id()[:16] / name[:2] / f"{name}.msgpack"

    def get(self, path: str, top: int, limit: str | None, stamp: FileStamp) -> bytes | None:
        """The summary (msgpack) cached for this file in this state, or None."""
        entry_path = self._entry_path(path, top, limit)
        try:
            with open(entry_path, "rb") as fh:
                st = os.fstat(fh.fileno())
                data = fh.read(_MAX_ENTRY_BYTES + 1) if st.st_size <= _MAX_ENTRY_BYTES else b""
        except OSError:
            self.misses += 1
            return None
        entry = _check(data)
        want = (engine_id(), path, top, limit, stamp)
        if entry is None or (entry.engine, entry.path, entry.top, entry.limit, entry.stamp) != want:
            self.rejected += 1
            self.misses += 1
            return None
        self.hits += 1
        if time.time() - st.st_mtime > _PRUNE_EVERY_S:
            try:
                os.utime(entry_path)
            except OSError:
                pass
        return entry.summary

    def put(
        self,
        path: str,
        top: int,
        limit: str | None,
        stamp: FileStamp,
        summary: bytes,
    ) -> bool:
        """Store a summary; False when the cache folder cannot be written (nothing else
        happens: the analysis goes on without the cache)."""
        entry_path = self._entry_path(path, top, limit)
        body = _ENCODER.encode(_Entry(engine_id(), path, top, limit, stamp, summary))
        data = _MAGIC + hashlib.blake2b(body, digest_size=_DIGEST_BYTES).digest() + body
        try:
            self._write(entry_path, data)
        except OSError:
            return False
        self.writes += 1
        if not self._pruned:
            self._pruned = True
            self.prune()
        return True

    def _write(self, target: Path, data: bytes) -> None:
        """Through a temp file and a rename: a reader sees the old entry or the new one. No
        fsync: a torn entry fails its digest and is recomputed."""
        from mgprof.atomic import write_bytes_atomic

        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700 if self.private else 0o777)
        write_bytes_atomic(target, data, durable=False, private=self.private)

    def prune(self, now: float | None = None) -> int:
        """Remove entries unused for 30 days (and left-over temp files), at most once a day
        per cache folder; returns how many files were removed."""
        now = time.time() if now is None else now
        marker = self.folder / ".last-prune"
        try:
            if now - marker.stat().st_mtime < _PRUNE_EVERY_S:
                return 0
        except OSError:
            pass
        try:
            marker.touch()
        except OSError:
            return 0
        removed = 0
        for root, dirs, files in os.walk(self.folder, topdown=False):
            for name in files:
                temp = name.startswith(".") and name.endswith(".tmp")  # a write cut short
                if not (name.endswith(".msgpack") or temp):
                    continue
                p = os.path.join(root, name)
                try:
                    if now - os.stat(p).st_mtime > _KEEP_S:
                        os.unlink(p)
                        removed += 1
                except OSError:
                    pass
            for name in dirs:
                try:
                    os.rmdir(os.path.join(root, name))  # only succeeds when empty
                except OSError:
                    pass
        return removed


def _check(data: bytes) -> _Entry | None:
    """The entry in ``data`` if its magic and digest check out and it decodes, else None."""
    head = len(_MAGIC) + _DIGEST_BYTES
    if len(data) <= head or not data.startswith(_MAGIC):
        return None
    body = memoryview(data)[head:]
    if hashlib.blake2b(body, digest_size=_DIGEST_BYTES).digest() != data[len(_MAGIC) : head]:
        return None
    try:
        return _ENTRY_DECODER.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def default_cache() -> TraceCache | None:
    """The cache at its configured place, or None when ``MGPROF_NO_CACHE`` is set (to
    anything but ``0`` or empty) or no place can be found."""
    if os.environ.get(NO_CACHE_ENV, "").strip() not in ("", "0"):
        return None
    explicit = os.environ.get(CACHE_DIR_ENV, "").strip()
    if explicit:
        return TraceCache(explicit)
    base = os.environ.get("XDG_CACHE_HOME", "").strip()
    if not base or not os.path.isabs(base):
        home = os.path.expanduser("~")
        if home == "~" or not os.path.isabs(home):
            return None
        base = os.path.join(home, ".cache")
    return TraceCache(Path(base) / "mgprof" / "trace-summaries", private=True)
