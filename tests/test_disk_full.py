"""A disk that fills (or a file size limit, a quota) while the training runs: mgprof says in one
line what it could not save and where, keeps the user's training, output and exit code, keeps
what is already on disk, saves the small record before the large traces, frees a reserve for
it, and never leaves run.json ``running`` when it could still write it.

Full disks are simulated without root: ``RLIMIT_FSIZE`` in a real process (a write past it
fails with EFBIG), or ``mgprof.atomic._write`` (the one call that puts record bytes on disk)
replaced to fail with ENOSPC.
"""

from __future__ import annotations

import errno
import os
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from _spawn import clean_env, python_args, run, write_script

import mgprof
from mgprof import atomic, rundir
from mgprof.collect import torch_profiler
from mgprof.collect.failopen import MgprofWarning
from mgprof.collect.session import delivery as delivery_module
from mgprof.collect.session import session as session_module
from mgprof.collect.session import staging as staging_module
from mgprof.collect.torch_profiler import TraceWriter
from mgprof.records import RunRecord, read_run

STEPS = 6
ENOSPC = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
LOST = "the measurements of this run are lost (free space and re-run)"


def train(prof: mgprof.Session | None = None) -> list[torch.Tensor]:
    torch.manual_seed(0)
    net = torch.nn.Linear(16, 16)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        x = torch.randn(4, 16, generator=gen)
        net(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        if prof is not None:
            prof.step(x)
    return [p.detach().clone() for p in net.parameters()]


def same(got: list[torch.Tensor]) -> bool:
    return all(torch.equal(a, b) for a, b in zip(got, train()))


def saved_lines(record: Any) -> list[str]:
    texts = [str(w.message) for w in record if issubclass(w.category, MgprofWarning)]
    return [t for t in texts if "could not save" in t]


def profile(out: Path) -> mgprof.Session:
    return mgprof.profile(out=out, name="full", sample=False, skip=1, warmup=1, active=2)


def fd_path(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


def launcher_run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, RunRecord]:
    """What ``mgprof analyze`` leaves before the script runs: the run folder, run.json
    ``running``, and ``MGPROF_RUN_DIR``."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    initial = RunRecord(run_id="run", world_size=1, status="running")
    rundir.write_run(run_dir, initial)
    monkeypatch.setenv(rundir.RUN_DIR_ENV, str(run_dir))
    return run_dir, initial


def leftovers(folder: Path) -> list[str]:
    """Temp files, staging folders or reserves anywhere below ``folder``."""
    names = [p.relative_to(folder).as_posix() for p in folder.rglob("*")]
    return [n for n in names if n.endswith(".tmp") or "staging" in n or "reserve" in n]


@pytest.fixture(autouse=True)
def _no_report_files(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session_module, "report_run", lambda run_dir, run, **kw: run)
    for name in (rundir.RUN_DIR_ENV, "WORLD_SIZE", "RANK"):
        monkeypatch.delenv(name, raising=False)


# -- nothing can be written -------------------------------------------------------------------


def test_no_space_at_all_says_the_record_is_lost_in_one_line_and_keeps_run_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir, _ = launcher_run_dir(tmp_path, monkeypatch)
    before = (run_dir / "run.json").read_bytes()

    def full(fd: int, data: Any) -> int:
        raise ENOSPC

    monkeypatch.setattr(atomic, "_write", full)
    with pytest.warns(MgprofWarning) as record, profile(tmp_path / "out") as prof:
        got = train(prof)
    assert same(got)
    (line,) = saved_lines(record)
    assert f"could not save rank 0's record to {run_dir / 'run.json'}" in line
    assert f"No space left on device; {LOST}" in line
    assert (run_dir / "run.json").read_bytes() == before  # what was on disk stays
    assert leftovers(run_dir) == []
    assert prof.record is not None and len(prof.record.steps) == STEPS


def test_no_space_prints_its_line_even_when_warnings_are_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def full(fd: int, data: Any) -> int:
        raise ENOSPC

    monkeypatch.setattr(atomic, "_write", full)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with profile(tmp_path) as prof:
            got = train(prof)
    assert same(got)
    err = capsys.readouterr().err
    assert "could not save rank 0's record to" in err and LOST in err
    assert list(tmp_path.iterdir()) == []  # no empty run folder, no staging, no temp file


# -- the large files fail, the record is saved ------------------------------------------------


def test_record_is_saved_before_the_traces_and_run_json_never_stays_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir, initial = launcher_run_dir(tmp_path, monkeypatch)
    order: list[str] = []
    real = atomic._write

    def traces_do_not_fit(fd: int, data: Any) -> int:
        path = fd_path(fd)
        order.append(Path(path).name)
        if f"/{rundir.TRACES}/" in path:
            raise ENOSPC
        return real(fd, data)

    monkeypatch.setattr(atomic, "_write", traces_do_not_fit)
    with pytest.warns(MgprofWarning) as record, profile(tmp_path / "out") as prof:
        got = train(prof)
    assert same(got)
    (line,) = saved_lines(record)
    assert f"could not save 1 file(s) (traces/rank0.pt.trace.json.gz) to {run_dir}" in line
    assert "No space left on device; those are lost" in line
    first_record = next(i for i, n in enumerate(order) if n.startswith(".run.json."))
    first_trace = next(i for i, n in enumerate(order) if n.startswith(".rank0.pt.trace"))
    assert first_record < first_trace  # the small record first, then the large files

    saved = read_run(run_dir)
    assert saved.status == "incomplete" and saved.error == delivery_module.NOT_FINALISED
    rank = saved.ranks[0]
    assert len(rank.steps) == STEPS and rank.traces == []
    assert (
        "writer: could not save traces/rank0.pt.trace.json.gz: No space left on device"
        in rank.warnings
    )
    assert leftovers(run_dir) == []

    from mgprof.run.finalize import finalize  # the launcher's last word replaces the placeholder

    final = finalize(run_dir, initial, 0, [], False)
    assert final.status == "complete" and final.error is None
    assert read_run(run_dir).status == "complete"


def test_a_ranks_partial_record_is_saved_before_its_traces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 1 of 2 with no process group to carry its record: its partial record first."""
    run_dir, _ = launcher_run_dir(tmp_path, monkeypatch)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    real = atomic._write

    def traces_do_not_fit(fd: int, data: Any) -> int:
        if f"/{rundir.TRACES}/" in fd_path(fd):
            raise ENOSPC
        return real(fd, data)

    monkeypatch.setattr(atomic, "_write", traces_do_not_fit)
    with pytest.warns(MgprofWarning) as record, profile(tmp_path / "out") as prof:
        got = train(prof)
    assert same(got)
    (line,) = saved_lines(record)
    assert "could not save 1 file(s) (traces/rank1.pt.trace.json.gz)" in line
    (partial,) = rundir.read_partials(run_dir)
    assert partial.rank == 1 and len(partial.steps) == STEPS and partial.traces == []
    assert any("could not save traces/rank1.pt.trace.json.gz" in w for w in partial.warnings)

    def full(fd: int, data: Any) -> int:
        raise ENOSPC

    monkeypatch.setattr(atomic, "_write", full)
    with pytest.warns(MgprofWarning) as record, profile(tmp_path / "out") as prof:
        train(prof)
    (line,) = saved_lines(record)
    where = run_dir / "ranks" / "rank1.json"
    assert f"could not save rank 1's record to {where}: No space left on device" in line
    assert "this rank's measurements are lost" in line
    assert rundir.read_partials(run_dir) == [partial]  # the earlier file stays as it was


def test_trace_writer_that_meets_a_full_disk_says_so_and_leaves_no_partial_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(*args: Any, **kwargs: Any) -> Any:
        raise ENOSPC

    monkeypatch.setattr(torch_profiler.shutil, "copyfileobj", full)
    with pytest.warns(MgprofWarning) as record, profile(tmp_path) as prof:
        got = train(prof)
    assert same(got)
    (line,) = saved_lines(record)
    assert "could not save rank 0's trace to" in line and "rank0.pt.trace.json.gz" in line
    assert "No space left on device; this rank's trace is lost" in line
    rank = read_run(prof.run_dir).ranks[0]  # type: ignore[arg-type]
    assert len(rank.steps) == STEPS and rank.traces == []

    class Prof:
        def export_chrome_trace(self, path: str) -> None:
            Path(path).write_text('{"traceEvents": []}')

    failures: list[OSError] = []
    writer = TraceWriter(tmp_path / "staged", "rank0", on_error=lambda p, e: failures.append(e))
    writer(Prof())  # type: ignore[arg-type]
    assert failures and failures[0].errno == errno.ENOSPC
    assert list((tmp_path / "staged").iterdir()) == [] and writer.written == []


# -- the reserve --------------------------------------------------------------------------------


class FakeDisk:
    """Free bytes of a pretend disk: record writes and the reserve take from it, releasing the
    reserve gives back."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, free: int) -> None:
        self.free = free
        real_write = atomic._write
        real_release = staging_module.release_space

        def write(fd: int, data: Any) -> int:
            size = len(memoryview(data).cast("B"))
            if size > self.free:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            self.free -= size
            return real_write(fd, data)

        def no_fallocate(*args: Any) -> None:
            raise OSError(errno.EOPNOTSUPP, "not supported")  # the reserve is written, counted

        def release(path: str | os.PathLike[str]) -> int:
            freed = real_release(path)
            self.free += freed
            return freed

        monkeypatch.setattr(atomic, "_write", write)
        monkeypatch.setattr(atomic.os, "posix_fallocate", no_fallocate)
        monkeypatch.setattr(staging_module, "release_space", release)


@pytest.mark.parametrize("reserve", [True, False])
def test_the_reserve_makes_room_for_the_record_on_a_disk_that_filled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reserve: bool
) -> None:
    if not reserve:
        monkeypatch.setattr(staging_module, "RESERVE_BYTES", 0)
    disk = FakeDisk(monkeypatch, free=64 << 20)
    expect = pytest.warns(MgprofWarning) if not reserve else _no_warning()
    with expect as record, profile(tmp_path) as prof:
        got = train(prof)
        disk.free = 0  # the script's checkpoint filled the disk
    assert same(got)
    assert prof.run_dir is not None
    if reserve:
        rank = read_run(prof.run_dir).ranks[0]
        assert len(rank.steps) == STEPS and rank.traces == ["traces/rank0.pt.trace.json.gz"]
    else:
        assert not (prof.run_dir / "run.json").exists()
        (line,) = saved_lines(record)
        assert LOST in line


class _no_warning:
    """``pytest.warns``'s shape for the branch that expects no mgprof warning at all."""

    def __enter__(self) -> list[Any]:
        self._catch = warnings.catch_warnings(record=True)
        self.record = self._catch.__enter__()
        warnings.simplefilter("always")
        return self.record

    def __exit__(self, *exc: object) -> None:
        self._catch.__exit__(*exc)
        assert not [w for w in self.record if issubclass(w.category, MgprofWarning)]


def test_reserve_space_holds_and_releases_real_bytes(tmp_path: Path) -> None:
    path = tmp_path / "reserve"
    assert atomic.reserve_space(path, 3 << 20)
    assert path.stat().st_size == 3 << 20
    assert path.stat().st_blocks * 512 >= 3 << 20  # allocated, not sparse
    assert atomic.release_space(path) == 3 << 20 and not path.exists()
    assert atomic.release_space(path) == 0


def test_a_failed_atomic_write_keeps_the_previous_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "run.json"
    atomic.write_bytes_atomic(target, b"v1")
    real = atomic._write

    def half(fd: int, data: Any) -> int:
        view = memoryview(data).cast("B")
        if len(view) > 4:
            real(fd, view[:4])  # some bytes land, then the disk is full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, data)

    monkeypatch.setattr(atomic, "_write", half)
    with pytest.raises(OSError) as caught:
        atomic.write_bytes_atomic(target, b"version two")
    assert caught.value.errno == errno.ENOSPC
    assert target.read_bytes() == b"v1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]


# -- real processes under a file size limit -----------------------------------------------------

SCRIPT = """
import contextlib, hashlib, os, resource, sys
import torch
import mgprof

mode, limit = sys.argv[1], int(sys.argv[2])
torch.manual_seed(0)
model = torch.nn.Linear(64, 64)
opt = torch.optim.SGD(model.parameters(), lr=0.01)

def loop(step):
    for i in range(8):
        with step():
            for _ in range(20):
                model(torch.randn(8, 64)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()

resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))  # SIGXFSZ keeps its default: death
if mode == "plain":
    loop(contextlib.nullcontext)
else:
    with mgprof.profile(out="runs", name="full", sample=False, skip=1, warmup=1, active=2,
                        quiet=True) as prof:
        loop(lambda: prof.step(torch.zeros(8)))
digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters()))
print("params", digest.hexdigest())
sys.exit(3)
"""


def run_limited(tmp_path: Path, mode: str, limit: int, **env: str) -> Any:
    script = write_script(tmp_path, "train.py", SCRIPT)
    extra = {"PYTHONDONTWRITEBYTECODE": "1", **env}
    return run(python_args(script, mode, str(limit)), cwd=tmp_path, env=clean_env(**extra))


def digest_of(stdout: str) -> str:
    (line,) = [ln for ln in stdout.splitlines() if ln.startswith("params ")]
    return line


@pytest.mark.slow
def test_real_process_whose_traces_pass_the_file_size_limit_keeps_its_record(
    tmp_path: Path,
) -> None:
    """64 KiB per file: the trace export fails (EFBIG), run.json fits. The process is not
    killed by SIGXFSZ, its output and exit code are its own, and run.json is not ``running``."""
    plain = run_limited(tmp_path, "plain", 64 << 10)
    assert plain.returncode == 3, plain.explain()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    rundir.write_run(run_dir, RunRecord(run_id="run", world_size=1, status="running"))
    result = run_limited(tmp_path, "profiled", 64 << 10, MGPROF_RUN_DIR=str(run_dir))
    assert result.returncode == 3, result.explain()
    assert digest_of(result.stdout) == digest_of(plain.stdout)
    assert "could not save rank 0's trace to" in result.stderr, result.explain()
    assert "raise the file size limit (ulimit -f) and re-run" in result.stderr
    assert "Traceback" not in result.stderr, result.explain()
    saved = read_run(run_dir)
    assert saved.status != "running" and saved.error == delivery_module.NOT_FINALISED
    assert len(saved.ranks[0].steps) == 8 and saved.ranks[0].traces == []
    assert any("could not save rank 0's trace" in w for w in saved.ranks[0].warnings)
    assert leftovers(run_dir) == []


@pytest.mark.slow
def test_real_process_that_can_write_nothing_says_what_is_lost_in_one_line(
    tmp_path: Path,
) -> None:
    plain = run_limited(tmp_path, "plain", 16)
    result = run_limited(tmp_path, "profiled", 16)
    assert result.returncode == 3, result.explain()
    assert digest_of(result.stdout) == digest_of(plain.stdout)
    lost = [ln for ln in result.stderr.splitlines() if "could not save rank 0's record" in ln]
    assert len(lost) == 1, result.explain()
    assert "File too large; the measurements of this run are lost" in lost[0]
    runs = tmp_path / "runs"
    assert not runs.exists() or list(runs.iterdir()) == [], list(runs.rglob("*"))


# -- umask: read, never changed -----------------------------------------------------------------


def spy_umask(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = os.umask

    def umask(mask: int) -> int:
        calls.append(mask)
        return real(mask)

    monkeypatch.setattr(os, "umask", umask)
    return calls


def test_current_umask_reads_proc_without_setting_it(monkeypatch: pytest.MonkeyPatch) -> None:
    old = os.umask(0o027)
    try:
        calls = spy_umask(monkeypatch)
        assert atomic.current_umask() == 0o027
        assert calls == []
    finally:
        os.umask(old)


def test_tensorboard_scalars_never_change_the_umask(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("tensorboard")
    from mgprof.view.scalars import write_scalars

    with profile(tmp_path) as prof:
        train(prof)
    assert prof.run_dir is not None
    old = os.umask(0o027)
    try:
        calls = spy_umask(monkeypatch)
        target = write_scalars(prof.run_dir, read_run(prof.run_dir))
        assert calls == []  # never set, not even for an instant
        assert target.stat().st_mode & 0o777 == 0o750  # still follows the umask
    finally:
        os.umask(old)
