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

The cache trusts only a folder that is its own: ``$MGPROF_CACHE_DIR`` gets a folder of mgprof's
inside it (``mgprof-trace-summaries``), and every folder the cache uses must be a real folder
(not a symbolic link) owned by this user and writable by no one else, under parents no one
else can swap — checked when the cache is first used, else the cache is off for the run. A
folder others can write would let them forge an entry (its digest is a checksum, not a key), so
a cache shared between users is refused rather than trusted. Entries are opened without
following links and non-blocking, regular files of this user only (a FIFO planted at an entry's
path cannot hang a read). Pruning walks only the cache's own layout and removes only files
with its own entry names, in a folder that holds its marker (``.mgprof-cache``): never anything
of the user's.
"""

from __future__ import annotations

import hashlib
import os
import re
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
_OWN_FOLDER = "mgprof-trace-summaries"
"""The folder the cache makes for itself inside ``$MGPROF_CACHE_DIR``."""
_MARKER = ".mgprof-cache"
"""Written in a cache folder when the cache creates it; pruning needs it."""
_ENGINE_DIR = re.compile(r"[0-9a-f]{16}")
_PREFIX_DIR = re.compile(r"[0-9a-f]{2}")
_ENTRY_NAME = re.compile(r"([0-9a-f]{40})\.msgpack")
_TEMP_NAME = re.compile(r"\.([0-9a-f]{40})\.msgpack\..+\.tmp")
"""``write_bytes_atomic``'s temp file of an entry (``.<name>.<random>.tmp``)."""
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

    def __init__(self, folder: str | os.PathLike[str], private: bool = True) -> None:
        self.folder = Path(folder)
        self.private = private
        """Folders 0700 and files 0600 (always, since a folder others can write is refused;
        kept for callers that pass it)."""
        self.refused: str | None = None
        """Why the folder is not used (not the user's, a link, writable by others), or None."""
        self._checked = False
        self.hits = 0
        self.misses = 0
        self.writes = 0
        self.rejected = 0
        """Entries found but not trusted (corrupt, another key, a changed file)."""
        self._pruned = False

    def usable(self) -> bool:
        """Whether the folder is this user's alone (created, 0700, with its marker, when it
        does not exist yet); checked once, the reason kept in ``refused``."""
        if not self._checked:
            self._checked = True
            self.refused = _claim(self.folder)
        return self.refused is None

    def _entry_path(self, path: str, top: int, limit: str | None) -> Path:
        key = f"{path}\0{top}\0{limit}".encode()
        name = hashlib.blake2b(key, digest_size=20).hexdigest()
        return self.folder / engine_id()[:16] / name[:2] / f"{name}.msgpack"

    def get(self, path: str, top: int, limit: str | None, stamp: FileStamp) -> bytes | None:
        """The summary (msgpack) cached for this file in this state, or None."""
        if not self.usable():
            self.misses += 1
            return None
        entry_path = self._entry_path(path, top, limit)
        read = _read_own(entry_path)
        if read is None:
            self.misses += 1
            return None
        data, st = read
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
        """Store a summary; False when the cache folder cannot be written or is not the user's
        own (nothing else happens: the analysis goes on without the cache)."""
        if not self.usable():
            return False
        entry_path = self._entry_path(path, top, limit)
        try:
            body = _ENCODER.encode(_Entry(engine_id(), path, top, limit, stamp, summary))
        except (OverflowError, TypeError, ValueError):  # a key msgpack cannot hold (a huge top)
            return False
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

        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_bytes_atomic(target, data, durable=False, private=True)

    def prune(self, now: float | None = None) -> int:
        """Remove entries unused for 30 days (and left-over temp files of entries), at most
        once a day per cache folder; returns how many files were removed. Only the cache's own
        layout (``<engine>/<prefix>/<entry>``) in a folder holding its marker is walked, and
        only files named as its entries are removed: a folder of the user's loses nothing."""
        now = time.time() if now is None else now
        if not self.usable() or not _is_own_file(self.folder / _MARKER):
            return 0
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
        for engine in _own_dirs(self.folder, _ENGINE_DIR):
            for prefix in _own_dirs(engine, _PREFIX_DIR):
                removed += _prune_prefix(prefix, now)
                _rmdir_quietly(prefix)
            _rmdir_quietly(engine)
        return removed


def _own_dirs(folder: Path, pattern: re.Pattern[str]) -> list[Path]:
    """Real sub-folders (never links) of ``folder`` named like the cache's own."""
    try:
        with os.scandir(folder) as it:
            return [
                Path(e.path)
                for e in it
                if pattern.fullmatch(e.name) and e.is_dir(follow_symlinks=False)
            ]
    except OSError:
        return []


def _prune_prefix(prefix: Path, now: float) -> int:
    removed = 0
    try:
        with os.scandir(prefix) as it:
            found = list(it)
    except OSError:
        return 0
    for e in found:
        if not (_ENTRY_NAME.fullmatch(e.name) or _TEMP_NAME.fullmatch(e.name)):
            continue
        try:
            st = e.stat(follow_symlinks=False)
            if stat.S_ISREG(st.st_mode) and now - st.st_mtime > _KEEP_S:
                os.unlink(e.path)
                removed += 1
        except OSError:
            pass
    return removed


def _rmdir_quietly(folder: Path) -> None:
    try:
        os.rmdir(folder)  # only succeeds when empty
    except OSError:
        pass


def _claim(folder: Path) -> str | None:
    """None when ``folder`` is safe to use as this user's cache (creating it, 0700, with its
    marker, when missing), else why not."""
    parent = folder.parent
    try:
        parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.mkdir(folder, 0o700)
        _write_marker(folder)
    except FileExistsError:
        pass
    except OSError as exc:
        return f"cannot create {folder}: {exc.strerror or exc}"
    why = _own_folder(folder)
    if why is not None:
        return why
    return _safe_ancestors(Path(os.path.realpath(parent)))


def _write_marker(folder: Path) -> None:
    fd = os.open(folder / _MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    os.close(fd)


def _own_folder(folder: Path) -> str | None:
    """Why ``folder`` is not a real folder of this user's that no one else can write."""
    try:
        st = os.lstat(folder)
    except OSError as exc:
        return f"{folder}: {exc.strerror or exc}"
    if stat.S_ISLNK(st.st_mode):
        return f"{folder} is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return f"{folder} is not a folder"
    if st.st_uid != os.geteuid():
        return f"{folder} belongs to another user"
    if st.st_mode & 0o022:
        return f"{folder} is writable by others (a shared cache could be forged)"
    return None


def _safe_ancestors(folder: Path) -> str | None:
    """Why someone else could replace ``folder`` or a folder above it (a folder they own or
    may write without the sticky bit), else None."""
    me = os.geteuid()
    for p in (folder, *folder.parents):
        try:
            st = os.stat(p)
        except OSError as exc:
            return f"{p}: {exc.strerror or exc}"
        sticky = bool(st.st_mode & stat.S_ISVTX)
        if st.st_uid not in (0, me):
            return f"{p}, above the cache, belongs to another user"
        if st.st_mode & 0o022 and not sticky:
            return f"{p}, above the cache, is writable by others"
    return None


def _is_own_file(path: Path) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()


def _read_own(path: Path) -> tuple[bytes, os.stat_result] | None:
    """An entry's bytes and stat: never through a link, never blocking on a FIFO, only a
    regular file of this user's no larger than an entry can be; else None."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            return None
        if st.st_size > _MAX_ENTRY_BYTES:
            return b"", st
        chunks = []
        left = _MAX_ENTRY_BYTES + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks), st
    except OSError:
        return None
    finally:
        os.close(fd)


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
    if explicit:  # a folder of the user's: the cache keeps to a folder of its own inside it
        return TraceCache(Path(explicit) / _OWN_FOLDER)
    base = os.environ.get("XDG_CACHE_HOME", "").strip()
    if not base or not os.path.isabs(base):
        home = os.path.expanduser("~")
        if home == "~" or not os.path.isabs(home):
            return None
        base = os.path.join(home, ".cache")
    return TraceCache(Path(base) / "mgprof" / "trace-summaries", private=True)
