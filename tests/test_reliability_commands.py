"""Commands that start or reach other processes end cleanly, refuse bad input before any work,
and never replace what the user has.

``mgprof doctor --bandwidth`` runs real torchrun + gloo CPU ranks: a SIGTERM leaves none of its
processes and no temporary folder, and every socket they listen on is on loopback.
``mgprof timeline RUN`` replaces the timeline mgprof analyze wrote only with ``--force``.
"""

from __future__ import annotations

import ctypes
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from _data import TRACES
from _spawn import clean_env, python_args

from mgprof.cli import main

BOUND_S = 60


def mgprof(*args: str, cwd: Path, env: dict[str, str] | None = None, **kw: Any) -> Any:
    return subprocess.run(
        python_args("-m", "mgprof", *args),
        cwd=cwd,
        env=env or clean_env(),
        capture_output=True,
        text=True,
        timeout=BOUND_S,
        **kw,
    )


def one_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip() and not ln.startswith("USDT:")]
    assert len(lines) == 1, stderr
    return lines[0]


# ---------------------------------------------------------------- doctor --bandwidth


def _is_rank(proc: psutil.Process) -> bool:
    """A rank of the probe: torchrun gives its workers LOCAL_RANK, and has none itself."""
    try:
        return "LOCAL_RANK" in proc.environ()
    except psutil.Error:
        return False


def _listening(proc: psutil.Process) -> set[str]:
    try:
        conns = proc.net_connections(kind="inet")
    except psutil.Error:
        return set()
    return {c.laddr.ip for c in conns if c.status == psutil.CONN_LISTEN}


def test_sigterm_to_doctor_bandwidth_leaves_no_process_and_no_folder(tmp_path: Path) -> None:
    """While both ranks time all-reduces, every process of the tree listens on loopback only;
    a SIGTERM then ends doctor (143, one line), torchrun and both ranks, and the mgprof-bw-*
    folder (torchrun's own temporary files inside it) is gone."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.Popen(
        python_args("-m", "mgprof", "doctor", "--bandwidth", "--sizes", "256K", "--iters",
                    "100000"),
        cwd=tmp_path,
        env=clean_env(TMPDIR=str(tmp)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # the test plays the terminal: it signals doctor alone
    )  # fmt: skip
    seen: dict[int, psutil.Process] = {}
    listening: dict[int, set[str]] = {}
    deadline = time.monotonic() + BOUND_S
    try:
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            for child in psutil.Process(proc.pid).children(recursive=True):
                seen.setdefault(child.pid, child)
                listening.setdefault(child.pid, set()).update(_listening(child))
            ranks = [p for p in seen.values() if _is_rank(p)]
            if len(ranks) == 2 and all(listening.get(r.pid) for r in ranks):
                break  # both ranks joined gloo: they are timing collectives
            time.sleep(0.2)
        else:
            pytest.fail("the probe's ranks never started listening")
        assert sorted(set().union(*listening.values())) == ["127.0.0.1"], listening
        assert [p.name[:10] for p in tmp.iterdir()] == ["mgprof-bw-"]
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=BOUND_S)
    finally:
        if proc.poll() is None:  # the test failed before the SIGTERM: end what it started
            for p in [*seen.values(), psutil.Process(proc.pid)]:
                try:
                    p.kill()
                except psutil.Error:
                    pass
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert one_line(err) == "mgprof doctor: interrupted (SIGTERM)"
    _, alive = psutil.wait_procs(list(seen.values()), timeout=15)
    for p in alive:  # clean up before failing
        p.kill()
    assert not alive, [(p.pid, p.cmdline()) for p in alive]
    assert list(tmp.iterdir()) == []


def test_a_probe_that_fails_says_why_in_one_line(tmp_path: Path) -> None:
    """Both ranks fail in gloo's set-up (no such interface): the line is their error, not the
    last line of torchrun's report (a rule of '='), and the temporary folder is gone."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = clean_env(TMPDIR=str(tmp), GLOO_SOCKET_IFNAME="nosuch0")
    result = mgprof("doctor", "--bandwidth", "--sizes", "64K", "--iters", "1", cwd=tmp_path,
                    env=env)  # fmt: skip
    line = one_line(result.stderr)
    assert result.returncode == 2, result.stderr
    assert line.startswith("mgprof doctor: error: the bandwidth probe failed: RuntimeError: ")
    assert "nosuch0" in line and "===" not in line
    assert list(tmp.iterdir()) == []


def _drop_dac() -> None:
    """In the child: lose CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH (prctl PR_CAPBSET_DROP),
    so that a folder's mode applies to root as well."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):
        if libc.prctl(24, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def _can_drop_dac() -> bool:
    if os.geteuid() != 0:
        return True
    try:
        subprocess.run([sys.executable, "-c", "pass"], preexec_fn=_drop_dac, check=True)
    except (subprocess.CalledProcessError, OSError):
        return False
    return True


def _bad_bandwidth_args(tmp_path: Path, case: str) -> list[str]:
    if case == "existing out":
        (tmp_path / "bw.json").write_text("{}")
        return ["--out", "bw.json"]
    if case == "out is a folder":
        return ["--out", "."]
    if case == "read-only folder":
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        return ["--out", str(ro / "bw.json")]
    return case.split()


BAD_BANDWIDTH = {
    "--gpus 99999999": "at most",
    "--gpus 1": "needs --gpus 2 or more",
    "--sizes 999999999999G": "larger than the most allowed",
    "--sizes 900T": "beyond the largest message the probe times",
    "--sizes 64K,65G": "beyond the largest message the probe times",
    "--iters 0": "--iters must be between 1 and",
    "--iters 1000000000": "--iters must be between 1 and",
    "existing out": "bw.json exists; choose another --out",
    "out is a folder": "is a folder",
    "read-only folder": "not writable",
}


@pytest.mark.parametrize("case", list(BAD_BANDWIDTH))
def test_bad_bandwidth_request_is_one_line_exit_2_before_launching(
    case: str, tmp_path: Path
) -> None:
    """A real doctor: one line, exit 2, the baseline that was there untouched, no temporary
    folder made (the probe's is made just before torchrun starts)."""
    if case == "read-only folder" and not _can_drop_dac():
        pytest.skip("running as root and cannot drop CAP_DAC_OVERRIDE here")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    args = _bad_bandwidth_args(tmp_path, case)
    result = mgprof(
        "doctor", "--bandwidth", *args, cwd=tmp_path, env=clean_env(TMPDIR=str(tmp)),
        preexec_fn=_drop_dac if case == "read-only folder" else None,
    )  # fmt: skip
    line = one_line(result.stderr)
    assert result.returncode == 2 and line.startswith("mgprof doctor: error: "), line
    assert BAD_BANDWIDTH[case] in line
    assert result.stdout == "" and list(tmp.iterdir()) == []
    if case == "existing out":
        assert (tmp_path / "bw.json").read_text() == "{}"
    if case == "read-only folder":
        assert list((tmp_path / "ro").iterdir()) == []


@pytest.mark.parametrize("case", [c for c in BAD_BANDWIDTH if c != "read-only folder"])
def test_bad_bandwidth_request_starts_no_process(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same requests in this process, with process creation made to fail the test."""

    def no_launch(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"a process was started: {args}")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(subprocess, "Popen", no_launch)
    assert main(["doctor", "--bandwidth", *_bad_bandwidth_args(tmp_path, case)]) == 2
    assert BAD_BANDWIDTH[case] in one_line(capsys.readouterr().err)


def test_cpu_ranks_whose_buffers_exceed_memory_are_refused() -> None:
    from mgprof.errors import UsageError
    from mgprof.run.bandwidth_probe import MAX_MESSAGE_BYTES, check_request, cpu_bytes_needed

    free = psutil.virtual_memory().available
    size = free // 2  # 2 ranks hold 1.5x the message each: 3x in all
    assert cpu_bytes_needed(2, size) > free
    expected = "of memory" if size <= MAX_MESSAGE_BYTES else "beyond the largest message"
    with pytest.raises(UsageError, match=expected):
        check_request(2, [1024, size], 10, device_count=0)
    check_request(2, [1024], 10, device_count=0)  # small: allowed
    with pytest.raises(UsageError, match="only 1 CUDA device"):
        check_request(2, [1024], 10, device_count=1)


# ---------------------------------------------------------------- timeline


def _run_with_timeline(tmp_path: Path) -> Path:
    """A run directory of a real 2-rank gloo job's traces, whose timeline.json.gz is made."""
    run = tmp_path / "run"
    shutil.copytree(TRACES / "cpu-gloo-ddp-mlp-2ranks", run / "traces")
    (run / "run.json").write_text("{}")
    result = mgprof("timeline", str(run), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    return run


@pytest.mark.parametrize("extra", [[], ["--steps", "3:4"], ["--min-dur", "5"]])
def test_timeline_keeps_the_run_timeline_without_force(tmp_path: Path, extra: list[str]) -> None:
    """mgprof analyze wrote RUN/timeline.json.gz: making it again, whole or cut to some steps,
    is refused in one line naming --force, and the file is left as it was."""
    run = _run_with_timeline(tmp_path)
    made = (run / "timeline.json.gz").read_bytes()
    result = mgprof("timeline", str(run), *extra, cwd=tmp_path)
    line = one_line(result.stderr)
    assert result.returncode == 2 and line.startswith("mgprof timeline: error: "), line
    assert "timeline.json.gz exists" in line and "--force" in line
    assert result.stdout == ""
    assert (run / "timeline.json.gz").read_bytes() == made
    assert sorted(p.name for p in run.iterdir()) == ["run.json", "timeline.json.gz", "traces"]


def test_timeline_force_replaces_the_run_timeline(tmp_path: Path) -> None:
    run = _run_with_timeline(tmp_path)
    result = mgprof("timeline", str(run), "--steps", "3:4", "--force", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"wrote {run / 'timeline.json.gz'}" in result.stdout
    with gzip.open(run / "timeline.json.gz") as f:
        assert json.load(f)["otherData"]["steps"] == "3:4"


# ---------------------------------------------------------------- trace --dask


def _job(folder: Path, copies: int) -> Path:
    """A job of ``copies`` ranks, each a real NCCL rank's trace (about 0.1 s to analyse)."""
    folder.mkdir()
    src = TRACES / "gpu-nccl-a100-rank0of2" / "rank-0.json.gz"
    for rank in range(copies):
        shutil.copyfile(src, folder / f"rank-{rank}.json.gz")
    return folder


@pytest.mark.parametrize(
    ("address", "says"),
    [
        ("not an address", "is not an address"),
        ("foo://x:1", "unknown scheme 'foo'"),
        ("tcp://127.0.0.1:99999", "port 99999 is outside 1..65535"),
        ("tcp://:8786", "names no host"),
    ],
)
def test_a_bad_dask_address_is_one_line_at_once(tmp_path: Path, address: str, says: str) -> None:
    """distributed's Client took such an address, failed, and its __del__ then held the exit
    for 60 s before a TimeoutError traceback: now one line and nothing after it."""
    job = _job(tmp_path / "job", 1)
    start = time.monotonic()
    result = mgprof("trace", "--dask", address, "--no-cache", str(job), cwd=tmp_path)
    took = time.monotonic() - start
    line = one_line(result.stderr)
    assert result.returncode == 2 and line.startswith("mgprof trace: error: the Dask scheduler ")
    assert says in line and "tcp://HOST:PORT" in line
    assert took < 30, f"{took:.0f} s"  # the half-made client's wait alone was 60 s


def test_distributed_logging_is_left_as_it_was() -> None:
    """The executor moves distributed's handlers aside only while it holds a client."""
    import logging

    import distributed  # noqa: F401 - sets up its handlers

    from mgprof.analyze.execution.dask_client import LOGGERS
    from mgprof.analyze.execution.executor import DaskExecutor
    from mgprof.errors import UsageError

    def state() -> dict[str, tuple[list[logging.Handler], bool]]:
        return {n: (list(logging.getLogger(n).handlers), logging.getLogger(n).propagate)
                for n in LOGGERS}  # fmt: skip

    before = state()
    ex = DaskExecutor("tcp://:1")
    with pytest.raises(UsageError, match="names no host"):
        ex.map_unordered(abs, [(1,)], lambda i, r: None)
    ex.close()
    assert state() == before


class _Logged:
    """A process whose stderr is read line by line in a thread, so the test can wait for a
    line with a deadline."""

    def __init__(self, args: list[str], cwd: Path) -> None:
        import queue
        import threading

        self.lines: queue.Queue[str] = queue.Queue()
        self.proc = subprocess.Popen(
            args, cwd=cwd, env=clean_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stderr:  # type: ignore[union-attr]
            self.lines.put(line)

    def wait_for(self, text: str) -> str:
        import queue

        deadline = time.monotonic() + BOUND_S
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                assert self.proc.poll() is None, f"exited with {self.proc.returncode}"
                continue
            if text in line:
                return line
        pytest.fail(f"no line with {text!r} in {BOUND_S} s")

    def end(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def test_a_scheduler_killed_mid_job_leaves_mgprofs_line_alone(tmp_path: Path) -> None:
    """A real scheduler and worker; the scheduler gets SIGTERM half a second after mgprof's
    client connects. The job ends with the ranks it has (the others marked as lost to the
    scheduler), and stderr holds mgprof's lines only: none of distributed's log (37 lines of
    it, tracebacks included, before), no traceback."""
    job = _job(tmp_path / "job", 24)
    scheduler = _Logged(
        python_args("-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", "0",
                    "--no-dashboard"),
        tmp_path,
    )  # fmt: skip
    worker = None
    trace = None
    try:
        address = scheduler.wait_for("Scheduler at:").split()[-1]
        worker = _Logged(
            python_args("-m", "distributed.cli.dask_worker", address, "--nthreads", "1",
                        "--no-nanny", "--no-dashboard"),
            tmp_path,
        )  # fmt: skip
        scheduler.wait_for("Register worker")
        trace = subprocess.Popen(
            python_args("-m", "mgprof", "trace", "--dask", address, "--no-cache", "--json",
                        str(job)),
            cwd=tmp_path, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        scheduler.wait_for("Receive client connection")
        time.sleep(0.5)
        scheduler.proc.send_signal(signal.SIGTERM)
        out, err = trace.communicate(timeout=BOUND_S)
    finally:
        for proc in (trace, worker, scheduler):
            if isinstance(proc, _Logged):
                proc.end()
            elif proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert all(ln.startswith("mgprof trace: ") for ln in lines), err
    lost = "went away before this file's result came back"
    if trace.returncode == 2:  # not one rank back before the scheduler went
        assert len(lines) == 1 and "none of the 24 trace files could be read" in lines[0]
        assert lost in lines[0]
        return
    assert trace.returncode == 0, err
    (found,) = json.loads(out)["jobs"]
    assert 0 < len(found["ranks"]) < 24
    skipped = found["not_applicable"]["skipped_files"]
    assert skipped.count(lost) == 24 - len(found["ranks"])
