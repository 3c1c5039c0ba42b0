"""The rank-summary cache: a hit only for an unchanged file under the same key and engine, the
same bytes as a fresh analysis, and a corrupt or foreign entry ignored and replaced."""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from _data import TRACES

from mgprof.analyze.execution import cache as trace_cache
from mgprof.analyze.execution.cache import TraceCache, default_cache, file_stamp
from mgprof.analyze.execution.executor import ProcessExecutor
from mgprof.analyze.trace.job import analyze_job, find_trace_files
from mgprof.commands.trace import _dumps
from mgprof.errors import TraceError
from mgprof.report.trace_terminal import jobs_to_json

ROOT = Path(__file__).resolve().parents[1]
SERIAL = ProcessExecutor(1)


def _json(files: list[Path], cache: Any, top: int = 10) -> str:
    return _dumps(jobs_to_json([analyze_job(files, top=top, executor=SERIAL, cache=cache)]))


def _entries(cache: TraceCache) -> list[Path]:
    return sorted(cache.folder.rglob("*.msgpack"))


@pytest.fixture
def job(tmp_path: Path) -> list[Path]:
    """A writable copy of the 2-rank NCCL fixture job."""
    out = tmp_path / "job"
    out.mkdir()
    src = TRACES / "gpu-nccl-128ranks-sampled"
    return [Path(shutil.copy(f, out / f.name)) for f in sorted(src.glob("*.json.gz"))]


@pytest.mark.parametrize(
    "folder",
    [
        "gpu-nccl-128ranks-sampled",
        "cpu-gloo-ddp-mlp-2ranks",
        "gpu-resnet50-v100-old-schema",
        "misc",
    ],
)
def test_hit_gives_the_same_bytes(folder: str, tmp_path: Path) -> None:
    (files,) = find_trace_files([TRACES / folder]).values()
    cache = TraceCache(tmp_path / "cache")
    fresh = _json(files, False)
    assert _json(files, cache) == fresh  # written
    assert (cache.hits, cache.writes) == (0, len(files))
    assert _json(files, cache) == fresh  # read back
    assert cache.hits == len(files)


def test_changed_file_is_analysed_again(job: list[Path], tmp_path: Path) -> None:
    cache = TraceCache(tmp_path / "cache")
    before = _json(job, cache)
    raw = gzip.decompress(job[1].read_bytes())
    # same length: the top kernel renamed, then the old mtime put back as `cp -p` would
    name = analyze_job(job[1:], executor=SERIAL, cache=False).ranks[0].top_kernels[0].name
    changed = raw.replace(name.encode(), name[:-1].encode() + b"~")
    assert changed != raw and len(changed) == len(raw)
    st = job[1].stat()
    job[1].write_bytes(gzip.compress(changed, mtime=0))
    os.utime(job[1], ns=(st.st_atime_ns, st.st_mtime_ns))
    after = _json(job, cache)
    assert cache.hits == 1  # rank 0 only
    assert after == _json(job, False) and after != before


def test_stamp_sees_same_size_same_mtime_rewrites(tmp_path: Path) -> None:
    f = tmp_path / "t.json"
    f.write_bytes(b'{"traceEvents": [' + b" " * 200_000 + b"]}")
    a = file_stamp(str(f))
    st = f.stat()
    data = bytearray(f.read_bytes())
    data[100_000] = ord("\t")  # in the middle: neither sampled block covers it
    f.write_bytes(bytes(data))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    b = file_stamp(str(f))
    assert a is not None and b is not None
    assert (a.size, a.mtime_ns, a.sample) == (b.size, b.mtime_ns, b.sample)
    assert a != b  # the ctime moved: touch and cp -p cannot set it back


def test_no_stamp_for_what_is_not_a_regular_file(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    assert file_stamp(str(fifo)) is None  # and it did not block
    assert file_stamp(str(tmp_path / "missing.json")) is None
    assert file_stamp(str(tmp_path)) is None


def test_one_entry_serves_every_top_and_spelling_of_the_path(
    job: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`trace --top 3`, `diff` (top 200) and a run's analysis (top 10) of the same files, from
    any working directory, read the entry the first of them wrote: same bytes as fresh."""
    cache = TraceCache(tmp_path / "cache")
    _json(job, cache)
    assert cache.writes == 2
    assert _json(job, cache, top=3) == _json(job, False, top=3)
    assert _json(job, cache, top=0) == _json(job, False, top=0)
    assert _json(job, cache, top=200) == _json(job, False, top=200)
    assert cache.hits == 6 and cache.writes == 2
    monkeypatch.chdir(job[0].parent)
    relative = [Path(f.name) for f in job]
    assert _json(relative, cache) == _json(relative, False)  # the summary shows the path as given
    assert '"source": "rank-0.json.gz"' in _json(relative, cache)
    assert cache.hits == 10 and cache.writes == 2


def test_key_holds_a_larger_top_size_limit_and_engine(
    job: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = TraceCache(tmp_path / "cache")
    _json(job, cache)
    assert _json(job, cache, top=250) == _json(job, False, top=250)  # past the kernels list
    assert cache.hits == 0
    monkeypatch.setenv("MGPROF_MAX_TRACE_BYTES", "64M")
    _json(job, cache)
    assert cache.hits == 0
    monkeypatch.delenv("MGPROF_MAX_TRACE_BYTES")
    monkeypatch.setattr(trace_cache, "engine_id", lambda: "another-build")
    _json(job, cache)
    assert cache.hits == 0
    monkeypatch.undo()
    _json(job, cache)
    assert cache.hits == 2


def test_size_limit_still_applies_to_a_cached_file(
    job: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = TraceCache(tmp_path / "cache")
    _json(job, cache)
    monkeypatch.setenv("MGPROF_MAX_TRACE_BYTES", "1000")
    with pytest.raises(TraceError, match="limit"):
        analyze_job(job, executor=SERIAL, cache=cache)


@pytest.mark.parametrize(
    "damage",
    [
        lambda b: b[:-10],  # torn write
        lambda b: b[:60] + bytes([b[60] ^ 1]) + b[61:],  # one bit flipped
        lambda b: b"not an entry",
        lambda b: b"",
    ],
)
def test_corrupt_entry_is_ignored_and_rewritten(
    damage: Any, job: list[Path], tmp_path: Path
) -> None:
    cache = TraceCache(tmp_path / "cache")
    fresh = _json(job, cache)
    entry = _entries(cache)[0]
    entry.write_bytes(damage(entry.read_bytes()))
    assert _json(job, cache) == fresh
    assert (cache.hits, cache.rejected) == (1, 1)
    assert _json(job, cache) == fresh
    assert cache.hits == 3  # the entry was rewritten whole


def test_entry_of_another_file_is_not_trusted(job: list[Path], tmp_path: Path) -> None:
    cache = TraceCache(tmp_path / "cache")
    fresh = _json(job, cache)
    a, b = _entries(cache)
    a.write_bytes(b.read_bytes())  # a valid entry, under the wrong name
    assert _json(job, cache) == fresh
    assert cache.rejected == 1


def test_file_rewritten_during_its_analysis_is_not_cached(job: list[Path], tmp_path: Path) -> None:
    class Rewrites:
        description = "this process"

        def map_unordered(self, fn: Any, tasks: Any, on_done: Any) -> None:
            os.utime(job[0], ns=(1, 1))  # as a writer still appending to it would
            SERIAL.map_unordered(fn, tasks, on_done)

        def close(self) -> None:
            pass

    cache = TraceCache(tmp_path / "cache")
    analyze_job(job, executor=Rewrites(), cache=cache)
    assert cache.writes == 1  # rank 1 only
    analyze_job(job, executor=SERIAL, cache=cache)
    assert (cache.hits, cache.writes) == (1, 2)


def test_unwritable_cache_costs_nothing_but_speed(job: list[Path], tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    cache = TraceCache(blocker / "cache")  # cannot be created, even by root
    assert _json(job, cache) == _json(job, False)
    assert cache.writes == 0 and cache.hits == 0


def test_default_location(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("MGPROF_NO_CACHE", "MGPROF_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    c = default_cache()
    assert c is not None and c.private
    assert c.folder == tmp_path / ".cache" / "mgprof" / "trace-summaries"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    c = default_cache()
    assert c is not None and c.folder == tmp_path / "xdg" / "mgprof" / "trace-summaries"
    monkeypatch.setenv("MGPROF_CACHE_DIR", str(tmp_path / "my-caches"))
    c = default_cache()  # a folder of the user's: the cache keeps to its own folder inside it
    assert c is not None and c.folder == tmp_path / "my-caches" / "mgprof-trace-summaries"
    monkeypatch.setenv("MGPROF_NO_CACHE", "1")
    assert default_cache() is None
    monkeypatch.setenv("MGPROF_NO_CACHE", "0")
    assert default_cache() is not None


def test_private_cache_files_are_private(job: list[Path], tmp_path: Path) -> None:
    cache = TraceCache(tmp_path / "cache", private=True)
    _json(job, cache)
    for entry in _entries(cache):
        assert entry.stat().st_mode & 0o077 == 0
        assert entry.parent.stat().st_mode & 0o077 == 0


def test_prune_removes_old_entries_only(tmp_path: Path) -> None:
    cache = TraceCache(tmp_path / "cache")
    assert cache.usable()  # created, with its marker
    engine = cache.folder / ("0" * 16)
    old = engine / "ab" / f"{'ab' * 20}.msgpack"
    new = engine / "cd" / f"{'cd' * 20}.msgpack"
    mine = engine / "notes.txt"
    for p in (old, new, mine):
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"x")
    long_ago = time.time() - 40 * 86400
    os.utime(old, (long_ago, long_ago))
    os.utime(mine, (long_ago, long_ago))
    assert cache.prune() == 1
    assert not old.exists() and not old.parent.exists()
    assert new.exists() and mine.exists()
    assert cache.prune() == 0  # at most once a day


def test_cli_no_cache_writes_nothing(tmp_path: Path) -> None:
    folder = str(TRACES / "cpu-gloo-ddp-mlp-2ranks")
    env = {**os.environ, "MGPROF_CACHE_DIR": str(tmp_path / "c")}
    env.pop("MGPROF_NO_CACHE", None)
    run = [sys.executable, "-m", "mgprof", "trace", "--json", folder]
    first = subprocess.run([*run, "--no-cache"], capture_output=True, env=env, timeout=120)
    assert first.returncode == 0 and not (tmp_path / "c").exists()
    second = subprocess.run(run, capture_output=True, env=env, timeout=120)
    assert len(list((tmp_path / "c").rglob("*.msgpack"))) == 2
    third = subprocess.run(run, capture_output=True, env=env, timeout=120)
    assert first.stdout == second.stdout == third.stdout
