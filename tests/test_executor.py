"""Executors for per-rank work: serial, local processes and a Dask cluster give byte-identical
``mgprof trace`` JSON; a missing file, a dead worker or a silent cluster is a per-rank error."""

from __future__ import annotations

import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _data import TRACES

from mgprof.analyze.execution.executor import DaskExecutor, ProcessExecutor, TaskLost, make_executor
from mgprof.analyze.trace import summary as trace_summary
from mgprof.analyze.trace.job import analyze_job, find_trace_files
from mgprof.commands.trace import _dumps
from mgprof.errors import TraceError, UsageError
from mgprof.report.trace_terminal import jobs_to_json

ROOT = Path(__file__).resolve().parents[1]
JOBS = ["gpu-nccl-128ranks-sampled", "cpu-gloo-ddp-mlp-2ranks", "gpu-nccl-a100-rank0of2", "misc"]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """A Dask LocalCluster of 2 worker processes: the code path of a real cluster (the client
    talks to a scheduler over TCP, workers are other processes). A task that kills its worker
    once is lost (no retries to wait for). Two threads per worker: the analyses share a
    process, as on a cluster run with several threads per worker."""
    import dask
    from distributed import LocalCluster

    with (
        dask.config.set({"distributed.scheduler.allowed-failures": 0}),
        LocalCluster(
            n_workers=2,
            threads_per_worker=2,
            processes=True,
            dashboard_address=":0",
            host="127.0.0.1",
        ) as c,
    ):
        yield c


@pytest.fixture(scope="module")
def dask_executor(cluster: Any) -> Iterator[DaskExecutor]:
    with DaskExecutor(cluster.scheduler_address) as ex:
        yield ex


def _json(jobs: list[Any]) -> str:
    return _dumps(jobs_to_json(jobs))


def _run_all(folder: str, executor: Any) -> str:
    groups = find_trace_files([folder])
    return _json([analyze_job(f, executor=executor, cache=False) for f in groups.values()])


@pytest.mark.parametrize("folder", JOBS)
def test_serial_processes_dask_byte_identical(
    folder: str, dask_executor: DaskExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Relative paths, as a user types them: Dask workers get absolute ones, and the JSON must
    still show the paths as given."""
    monkeypatch.chdir(TRACES)
    serial = _run_all(folder, ProcessExecutor(1))
    assert serial == _run_all(folder, ProcessExecutor(2))
    assert serial == _run_all(folder, dask_executor)
    assert f'"source": "{folder}/' in serial


def test_cli_dask_flag_matches_workers_1(cluster: Any, tmp_path: Path) -> None:
    """``mgprof trace --dask ADDRESS`` end to end (a fresh process, as a user runs it), against
    ``--workers 1``; and $MGPROF_DASK_SCHEDULER does the same."""
    folder = str(TRACES / "gpu-nccl-128ranks-sampled")
    env = {**os.environ, "MGPROF_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("MGPROF_DASK_SCHEDULER", None)

    def trace(*extra: str, **more: str) -> str:
        proc = subprocess.run(
            [sys.executable, "-m", "mgprof", "trace", "--json", *extra, folder],
            capture_output=True,
            text=True,
            env={**env, **more},
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        assert proc.stderr == ""  # piped: no progress display
        return proc.stdout

    serial = trace("--workers", "1", "--no-cache")
    assert trace("--dask", cluster.scheduler_address, "--no-cache") == serial
    assert trace("--no-cache", MGPROF_DASK_SCHEDULER=cluster.scheduler_address) == serial


def test_workers_and_dask_together_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    from mgprof.cli import main

    assert main(["trace", "--workers", "2", "--dask", "tcp://127.0.0.1:1", "x.json"]) == 2
    assert "pass one of them" in capsys.readouterr().err


def test_unreachable_scheduler_is_one_line() -> None:
    ex = DaskExecutor("tcp://127.0.0.1:9", connect_timeout_s=0.5)
    with pytest.raises(
        UsageError, match=re.escape("cannot reach the Dask scheduler at tcp://127.0.0.1:9")
    ):
        ex.map_unordered(len, [("x",)], lambda i, r: None)


def test_make_executor_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MGPROF_DASK_SCHEDULER", raising=False)
    assert isinstance(make_executor(), ProcessExecutor)
    assert make_executor(1).description == "this process"
    monkeypatch.setenv("MGPROF_DASK_SCHEDULER", "tcp://10.0.0.1:8786")
    assert isinstance(make_executor(), DaskExecutor)
    assert isinstance(make_executor(2), ProcessExecutor)  # an explicit --workers wins
    assert make_executor(None, "tcp://h:1").description == "Dask at tcp://h:1"


def test_dask_is_imported_only_when_chosen() -> None:
    code = (
        "import sys\n"
        "from mgprof.analyze.trace.job import analyze_job\n"
        "import mgprof.commands.trace\n"
        "bad = sorted(m for m in ('dask', 'distributed', 'pyarrow', 'torch') if m in sys.modules)\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def _copy_job(tmp_path: Path) -> list[Path]:
    src = TRACES / "gpu-nccl-128ranks-sampled"
    out = []
    for f in sorted(src.glob("*.json.gz")):
        out.append(Path(shutil.copy(f, tmp_path / f.name)))
    return out


@pytest.mark.parametrize("kind", ["serial", "processes", "dask"])
def test_file_missing_at_analysis_is_a_rank_error(
    kind: str, tmp_path: Path, dask_executor: DaskExecutor
) -> None:
    files = _copy_job(tmp_path)
    ex = {"serial": ProcessExecutor(1), "processes": ProcessExecutor(2), "dask": dask_executor}[
        kind
    ]

    class RemoveSecond:
        """Deletes rank 1's file once the job has started (found and stamped, not yet read)."""

        def start(self, label: str, ranks: int, nbytes: int, where: str) -> None:
            files[1].unlink()

        def advance(self, nbytes: int, cached: bool) -> None:
            pass

        def finish(self) -> None:
            pass

    job = analyze_job(files, executor=ex, cache=False, progress=RemoveSecond())
    assert [r.rank for r in job.ranks] == [0]
    skipped = job.not_applicable["skipped_files"]
    assert skipped.startswith(f"{files[1]}: ") and "no such file" in skipped


def _crash_on_two(x: int) -> int:
    if x == 2:
        os._exit(3)  # what the kernel's OOM killer does to a worker, as far as the pool sees
    return x * 10


@pytest.mark.slow
def test_process_worker_death_loses_only_its_task() -> None:
    results: dict[int, Any] = {}
    ProcessExecutor(2).map_unordered(_crash_on_two, [(x,) for x in range(6)], results.__setitem__)
    assert {i: r for i, r in results.items() if i != 2} == {i: i * 10 for i in (0, 1, 3, 4, 5)}
    assert isinstance(results[2], TaskLost) and "died" in results[2].reason


@pytest.mark.slow
@pytest.mark.skipif(
    multiprocessing.get_start_method() != "fork",
    reason="the patched loader reaches the workers only through fork",
)
def test_job_with_a_worker_killed_names_the_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = _copy_job(tmp_path)
    real = trace_summary.analyze_trace_file

    def dies_on_rank_1(path: Any, top: int = 10, processes: int = 1) -> Any:
        if str(path).endswith("rank-1.json.gz"):
            os._exit(9)
        return real(path, top, processes)

    monkeypatch.setattr(trace_summary, "analyze_trace_file", dies_on_rank_1)
    job = analyze_job(files, executor=ProcessExecutor(2), cache=False)
    assert [r.rank for r in job.ranks] == [0]
    assert job.not_applicable["skipped_files"].startswith(f"{files[1]}: the worker process died")


@pytest.mark.slow
def test_dask_worker_death_is_a_task_error_not_a_hang(dask_executor: DaskExecutor) -> None:
    """Dask blames every task a dead worker held: the crash waits until the quick tasks,
    running beside it on the worker's other thread, are done."""

    # a closure is sent by value, so the workers need not import this test module
    def crash_on_two(x: int) -> int:
        if x == 2:
            time.sleep(1.5)
            os._exit(3)
        return x * 10

    results: dict[int, Any] = {}
    dask_executor.map_unordered(crash_on_two, [(x,) for x in range(5)], results.__setitem__)
    assert {i: r for i, r in results.items() if i != 2} == {i: i * 10 for i in (0, 1, 3, 4)}
    assert isinstance(results[2], TaskLost) and "died" in results[2].reason


@pytest.mark.slow
def test_dask_cluster_without_workers_times_out_per_task() -> None:
    from distributed import LocalCluster

    with LocalCluster(n_workers=0, dashboard_address=":0", host="127.0.0.1") as empty:
        results: dict[int, Any] = {}
        with DaskExecutor(empty.scheduler_address, stall_timeout_s=1.0) as ex:
            ex.map_unordered(abs, [(-1,), (-2,)], results.__setitem__)
    assert sorted(results) == [0, 1]
    assert all(isinstance(r, TaskLost) and "no result" in r.reason for r in results.values())


def test_dask_stall_names_every_rank_then_fails_the_job(tmp_path: Path) -> None:
    """With no rank analysed the job fails with one line naming the files, as for bad files."""
    from distributed import LocalCluster

    files = _copy_job(tmp_path)
    with (
        LocalCluster(n_workers=0, dashboard_address=":0", host="127.0.0.1") as empty,
        DaskExecutor(empty.scheduler_address, stall_timeout_s=1.0) as ex,
        pytest.raises(TraceError, match="none of the 2 trace files could be read"),
    ):
        analyze_job(files, executor=ex, cache=False)


def test_bug_in_the_task_propagates() -> None:
    """An exception the function raises is a bug: it is not turned into a lost task."""
    with pytest.raises(ZeroDivisionError):
        ProcessExecutor(1).map_unordered(lambda x: 1 // x, [(0,)], lambda i, r: None)


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_progress_line_on_a_terminal() -> None:
    import io

    from rich.console import Console

    from mgprof.report.progress import RankProgress

    out = io.StringIO()
    clock = _Clock()
    p = RankProgress(Console(file=out, force_terminal=True, width=120), clock=clock)
    p.start("traces/job", ranks=4, nbytes=400_000_000, where="2 local processes")
    p.advance(100_000_000, cached=True)
    clock.now += 0.2
    p.advance(100_000_000, cached=False)
    assert out.getvalue() == ""  # short analyses draw nothing
    clock.now += 1.8
    p.advance(100_000_000, cached=False)
    drawn = out.getvalue()
    assert "traces/job" in drawn and "3/4" in drawn
    assert "100 MB/s · 1 from cache · on 2 local processes" in drawn  # 200 MB in 2 s
    clock.now += 2.0
    p.advance(100_000_000, cached=False)
    p.finish()
    assert "traces/job: 4 ranks in 4.0 s · 75 MB/s · 1 from cache" in out.getvalue()


def test_progress_is_silent_when_not_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    from mgprof.report.progress import RankProgress

    p = RankProgress.on_terminal()  # pytest captures stdout and stderr: not terminals
    p.start("x", ranks=2, nbytes=2, where="this process")
    for _ in range(2):
        p.advance(1, cached=False)
    p.finish()
    assert capsys.readouterr() == ("", "")


def test_progress_shows_a_hostile_folder_name_as_text() -> None:
    import io

    from rich.console import Console

    from mgprof.report.progress import RankProgress

    out = io.StringIO()
    clock = _Clock()
    p = RankProgress(Console(file=out, force_terminal=True, width=150), clock=clock)
    p.start("runs/[red]x\x1b[2J", ranks=3, nbytes=3, where="Dask at tcp://h:1")
    clock.now += 1.0
    p.advance(1, cached=False)
    drawn = out.getvalue()
    assert "runs/[red]x\\x1b[2J" in drawn and "\x1b[2J" not in drawn
