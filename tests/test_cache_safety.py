"""The summary cache never deletes what is not its own and never trusts a folder others can
write (reproducers from the reliability probe: a user's folder as ``MGPROF_CACHE_DIR`` lost its
``*.msgpack`` and ``.*.tmp`` files to pruning; a planted link to another user's folder let that
user forge ``mgprof trace``'s figures; a FIFO at an entry's path hung it; a huge ``--top`` gave a
traceback)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _data import TRACES

from mgprof.analyze.execution.cache import TraceCache, default_cache, file_stamp

NOBODY = 65534
root_only = pytest.mark.skipif(
    os.geteuid() != 0, reason="making a folder another user owns needs root (chown)"
)


def _users_folder(base: Path) -> dict[str, Path]:
    """What the probe put in the folder it named as MGPROF_CACHE_DIR: all of it old."""
    files = {
        "weights": base / "models" / "weights.msgpack",
        "notes": base / "exp1" / ".notes.tmp",
        "entry_like": base / ("a" * 16) / "ab" / f"{'ab' * 20}.msgpack",
    }
    for p in files.values():
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"the user's")
    (base / "models" / "empty_placeholder").mkdir()
    files["empty"] = base / "models" / "empty_placeholder"
    long_ago = time.time() - 400 * 86400
    for p in files.values():
        os.utime(p, (long_ago, long_ago))
    return files


def test_a_users_folder_as_cache_dir_loses_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    base = tmp_path / "work"
    files = _users_folder(base)
    monkeypatch.setenv("MGPROF_CACHE_DIR", str(base))
    monkeypatch.delenv("MGPROF_NO_CACHE", raising=False)
    cache = default_cache()
    assert cache is not None and cache.folder.parent == base
    trace = next(iter(sorted((TRACES / "cpu-gloo-ddp-mlp-2ranks").glob("*.json*"))))
    stamp = file_stamp(str(trace))
    assert stamp is not None
    assert cache.put(str(trace), 10, None, stamp, b"summary")
    assert cache.prune(now=time.time() + 400 * 86400) == 1  # its own entry, nothing else
    for name, p in files.items():
        assert p.exists(), name
    # even a cache pointed straight at the user's folder prunes nothing there: no marker
    direct = TraceCache(base)
    assert direct.prune(now=time.time() + 400 * 86400) == 0
    assert all(p.exists() for p in files.values())


def test_a_link_at_the_cache_folder_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    link = tmp_path / "cache"
    link.symlink_to(elsewhere)
    cache = TraceCache(link)
    assert not cache.usable() and "symbolic link" in (cache.refused or "")
    assert cache.get("x", 10, None, file_stamp(__file__)) is None  # type: ignore[arg-type]
    assert not cache.put("x", 10, None, file_stamp(__file__), b"s")  # type: ignore[arg-type]
    assert list(elsewhere.iterdir()) == []


def test_a_folder_others_can_write_is_refused(tmp_path: Path) -> None:
    open_folder = tmp_path / "open-to-all"
    open_folder.mkdir()
    open_folder.chmod(0o777)
    cache = TraceCache(open_folder)
    assert not cache.usable() and "writable by others" in (cache.refused or "")


@root_only
def test_a_folder_of_another_user_is_refused(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, NOBODY, NOBODY)
    cache = TraceCache(theirs)
    assert not cache.usable() and "another user" in (cache.refused or "")
    # and under a parent another user owns, even a folder of one's own is not trusted
    parent = tmp_path / "their-parent"
    parent.mkdir(mode=0o755)
    (parent / "mine").mkdir(mode=0o700)
    os.chown(parent, NOBODY, NOBODY)
    below = TraceCache(parent / "mine")
    assert not below.usable() and "belongs to another user" in (below.refused or "")


@root_only
def test_an_entry_another_user_rewrote_is_not_trusted(tmp_path: Path) -> None:
    cache = TraceCache(tmp_path / "cache")
    stamp = file_stamp(__file__)
    assert stamp is not None and cache.put("k", 10, None, stamp, b"true figures")
    (entry,) = cache.folder.rglob("*.msgpack")
    os.chown(entry, NOBODY, NOBODY)  # as if someone else had replaced it
    assert TraceCache(tmp_path / "cache").get("k", 10, None, stamp) is None


def test_a_fifo_at_an_entry_path_does_not_hang(tmp_path: Path) -> None:
    cache = TraceCache(tmp_path / "cache")
    stamp = file_stamp(__file__)
    assert stamp is not None and cache.put("k", 10, None, stamp, b"s")
    (entry,) = cache.folder.rglob("*.msgpack")
    entry.unlink()
    os.mkfifo(entry)
    started = time.monotonic()
    assert TraceCache(tmp_path / "cache").get("k", 10, None, stamp) is None
    assert time.monotonic() - started < 5


def test_a_huge_top_is_not_a_traceback(tmp_path: Path) -> None:
    cache = TraceCache(tmp_path / "cache")
    stamp = file_stamp(__file__)
    assert stamp is not None
    assert cache.put("k", 10**20, None, stamp, b"s") is False  # msgpack cannot hold it


def test_trace_uses_its_own_folder_inside_the_users(tmp_path: Path) -> None:
    base = tmp_path / "work"
    files = _users_folder(base)
    env = {**os.environ, "MGPROF_CACHE_DIR": str(base)}
    env.pop("MGPROF_NO_CACHE", None)
    folder = tmp_path / "job"
    shutil.copytree(TRACES / "cpu-gloo-ddp-mlp-2ranks", folder)
    run = [sys.executable, "-m", "mgprof", "trace", "--json", str(folder)]
    proc = subprocess.run(run, capture_output=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    own = base / "mgprof-trace-summaries"
    assert len(list(own.rglob("*.msgpack"))) == 2 and (own / ".mgprof-cache").is_file()
    assert all(p.exists() for p in files.values())
