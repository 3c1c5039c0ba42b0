"""``mgprof view``, the TensorBoard launcher and mgprof's TensorBoard scalars, on a real run.

One real 2-rank CPU run (``mgprof analyze --gpus 2``) is made per module; a real TensorBoard with
torch-tb-profiler serves it and is queried through the plugins' HTTP APIs, the way the browser
does. Tests that need the ``tensorboard`` extra are skipped without it; the error paths are not.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from mgprof.cli import build_parser, main
from mgprof.records import RunRecord, read_run
from mgprof.view import tensorboard as viewer

HAVE_EXTRA = not viewer.missing_extra()
needs_tensorboard = pytest.mark.skipif(
    not HAVE_EXTRA, reason="needs the tensorboard extra: pip install 'mgprof[tensorboard]'"
)
if HAVE_EXTRA:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from mgprof.view.scalars import SCALARS_DIR, scalars_stale, write_scalars

REPO = Path(__file__).resolve().parents[1]
SERVER_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real run directory: 2 CPU ranks over gloo, 8 steps, traces for both ranks."""
    work = tmp_path_factory.mktemp("view")
    example = REPO / "examples" / "mlp_context.py"
    cmd = [sys.executable, "-m", "mgprof", "analyze", str(example), "--gpus", "2", "--quiet"]
    cmd += ["--out", "runs", "--", "--steps", "8"]
    done = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = (work / "runs").iterdir()
    assert sorted(p.name for p in (path / "traces").iterdir()) == [
        "rank0.pt.trace.json.gz",
        "rank1.pt.trace.json.gz",
    ]
    return path


@pytest.fixture(scope="module")
def record(run_dir: Path) -> RunRecord:
    return read_run(run_dir)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(base: str, path: str, **params: str) -> Any:
    url = base + path + ("?" + urllib.parse.urlencode(params) if params else "")
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def _poll(what: str, fetch: Any, ok: Any, deadline: float) -> Any:
    """Call ``fetch`` until ``ok(result)``; the plugins load runs in background threads."""
    last = None
    while time.monotonic() < deadline:
        last = fetch()
        if ok(last):
            return last
        time.sleep(0.5)
    raise AssertionError(f"{what}: not there within {SERVER_TIMEOUT_S:g} s; last answer {last!r}")


def _scalars(event_dir: Path) -> Any:
    acc = EventAccumulator(str(event_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return acc


# --- scalars ------------------------------------------------------------------------------------


@needs_tensorboard
def test_scalars_hold_the_records_values(run_dir: Path, record: RunRecord, tmp_path: Path) -> None:
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns(SCALARS_DIR))
    out = write_scalars(copy, record)
    assert out == copy / SCALARS_DIR
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["rank0", "rank1"]
    assert not list((copy / "traces").glob("*tfevents*")), "scalars must stay out of traces/"

    for rank in record.ranks:
        acc = _scalars(out / f"rank{rank.rank}")
        steps = acc.Scalars("mgprof/step_time_ms")
        assert [e.step for e in steps] == [s.index for s in rank.steps]
        assert [e.value for e in steps] == pytest.approx([s.duration_ms for s in rank.steps])
        tput = acc.Scalars("mgprof/throughput_samples_per_s")
        expected = [s.batch_size / (s.duration_ms / 1000) for s in rank.steps if s.batch_size]
        assert expected and [e.value for e in tput] == pytest.approx(expected, rel=1e-6)

        (dev,) = rank.sampler.devices
        assert dev.columns, "the CPU sampler records columns"
        for column, values in dev.columns.items():
            points = acc.Scalars(f"mgprof/util/{dev.device}/{column}")
            kept = [(i, v) for i, v in enumerate(values) if v is not None]
            assert [(e.step, e.value) for e in points] == [
                (i, pytest.approx(v, rel=1e-6, abs=1e-6)) for i, v in kept
            ]
            gaps = [b.wall_time - a.wall_time for a, b in itertools.pairwise(points)]
            t_gaps = [dev.t_s[j] - dev.t_s[i] for (i, _), (j, _) in itertools.pairwise(kept)]
            assert gaps == pytest.approx(t_gaps, abs=1e-3), "wall time follows the sample times"

        assert rank.memory is not None and rank.memory.peak_rss_mib is not None
        (peak,) = acc.Scalars("mgprof/memory/peak_rss_mib")
        assert peak.value == pytest.approx(rank.memory.peak_rss_mib, rel=1e-6)
        assert "mgprof/memory/peak_allocated_mib" not in acc.Tags()["scalars"], "None on CPU"


@needs_tensorboard
def test_rewriting_scalars_replaces_them(run_dir: Path, record: RunRecord, tmp_path: Path) -> None:
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns(SCALARS_DIR))
    assert scalars_stale(copy)
    write_scalars(copy, record)
    assert not scalars_stale(copy)
    write_scalars(copy, record)
    for rank in record.ranks:
        files = list((copy / SCALARS_DIR / f"rank{rank.rank}").glob("*tfevents*"))
        assert len(files) == 1, files
        steps = _scalars(files[0].parent).Scalars("mgprof/step_time_ms")
        assert len(steps) == len(rank.steps), "no doubled points after a rewrite"
    assert not [p for p in copy.iterdir() if p.name.startswith(".tb")], "temp folders left"

    run_json = copy / "run.json"
    os.utime(run_json, ns=(run_json.stat().st_atime_ns, run_json.stat().st_mtime_ns + 10**9))
    assert scalars_stale(copy), "a newer run.json makes the scalars stale"


# --- a real TensorBoard -------------------------------------------------------------------------


@needs_tensorboard
def test_tensorboard_serves_profiler_runs_and_scalars(
    run_dir: Path, record: RunRecord, tmp_path: Path
) -> None:
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns(SCALARS_DIR))
    write_scalars(copy, record)
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    proc = viewer.start_tensorboard(copy, "127.0.0.1", port, quiet=True)
    try:
        deadline = time.monotonic() + SERVER_TIMEOUT_S
        viewer.wait_until_serving(viewer.profiler_url("127.0.0.1", port), SERVER_TIMEOUT_S, proc)

        prof = "/data/plugin/pytorch_profiler"
        runs = _poll(
            "profiler run 'traces'",
            lambda: _get(base, f"{prof}/runs"),
            lambda r: "traces" in r["runs"],
            deadline,
        )
        assert runs["runs"] == ["traces"]
        views = _get(base, f"{prof}/views", run="traces")
        assert "Overview" in views
        workers = _get(base, f"{prof}/workers", run="traces", view="Overview")
        assert workers == ["rank0", "rank1"]

        tags = _poll(
            "scalar tags of tb/rank0",
            lambda: _get(base, "/data/plugin/scalars/tags"),
            lambda t: "mgprof/step_time_ms" in t.get("tb/rank0", {}),
            deadline,
        )
        assert "mgprof/step_time_ms" in tags["tb/rank1"]
        points = _get(
            base, "/data/plugin/scalars/scalars", run="tb/rank0", tag="mgprof/step_time_ms"
        )
        rank0 = next(r for r in record.ranks if r.rank == 0)
        assert [p[1] for p in points] == [s.index for s in rank0.steps]
        assert [p[2] for p in points] == pytest.approx([s.duration_ms for s in rank0.steps])
    finally:
        assert viewer.stop_tensorboard(proc) is not None
    assert proc.poll() is not None


@needs_tensorboard
def test_mgprof_view_serves_a_folder_of_runs_until_ctrl_c(run_dir: Path, tmp_path: Path) -> None:
    parent = tmp_path / "mgprof-runs"
    copy = parent / run_dir.name
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns(SCALARS_DIR))
    port = _free_port()
    cmd = [sys.executable, "-m", "mgprof", "view", str(parent), "--port", str(port)]
    proc = subprocess.Popen(
        [*cmd, "--no-browser"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,  # its own process group, so killpg is a terminal's Ctrl-C
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # printed once TensorBoard answers
        assert f"http://127.0.0.1:{port}/#pytorch_profiler" in line, line
        assert (copy / SCALARS_DIR / "rank0").is_dir(), "view writes missing scalars first"
        assert not scalars_stale(copy)
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    with socket.socket() as sock:  # the server is gone with it
        assert sock.connect_ex(("127.0.0.1", port)) != 0


@needs_tensorboard
@pytest.mark.parametrize(
    ("sig", "code"),
    [(signal.SIGTERM, 143), (signal.SIGHUP, 129), (signal.SIGKILL, -signal.SIGKILL)],
)
def test_mgprof_view_takes_tensorboard_with_it(
    run_dir: Path, tmp_path: Path, sig: signal.Signals, code: int
) -> None:
    """A signal to mgprof alone (not its group): TensorBoard stops too and frees its port, even
    after SIGKILL (the kernel's parent-death signal); the run shows under its run id."""
    import psutil

    port = _free_port()
    cmd = [sys.executable, "-m", "mgprof", "view", str(run_dir), "--port", str(port)]
    proc = subprocess.Popen(
        [*cmd, "--no-browser"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert f"127.0.0.1:{port}" in line, line
        children = psutil.Process(proc.pid).children(recursive=True)
        assert children, "TensorBoard should run as mgprof's child"
        if sig == signal.SIGTERM:  # once is enough: the run's name in the profiler plugin
            runs = _poll(
                "profiler run named by its run id",
                lambda: _get(f"http://127.0.0.1:{port}", "/data/plugin/pytorch_profiler/runs"),
                lambda r: bool(r["runs"]),
                time.monotonic() + SERVER_TIMEOUT_S,
            )
            assert runs["runs"] == [run_dir.name]
        proc.send_signal(sig)
        assert proc.wait(timeout=20) == code
        _, alive = psutil.wait_procs(children, timeout=10)
        assert not alive, [p.pid for p in alive]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    with socket.socket() as sock:  # nothing listens on the port any more
        assert sock.connect_ex(("127.0.0.1", port)) != 0


# --- errors and defaults ------------------------------------------------------------------------


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    return err


def test_view_missing_dir_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["view", str(tmp_path / "nope")]) == 2
    assert "does not exist" in _one_error_line(capsys)


def test_view_folder_without_runs_is_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "notes.txt").write_text("hi")
    assert main(["view", str(tmp_path)]) == 2
    assert "no run.json" in _one_error_line(capsys)


def test_view_without_the_tensorboard_extra(
    run_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any, **kwargs: Any) -> Any:
        return None if name == "torch_tb_profiler" else real(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    assert viewer.missing_extra() == ["torch_tb_profiler"]
    assert main(["view", str(run_dir), "--no-browser"]) == 2
    assert "TensorBoard is not installed: pip install 'mgprof[tensorboard]'" in _one_error_line(
        capsys
    )


@needs_tensorboard
def test_view_port_in_use_is_exit_2(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["view", str(run_dir), "--port", str(port), "--no-browser"]) == 2
    err = _one_error_line(capsys)
    assert f"port {port}" in err and "in use" in err


def test_default_host_is_loopback() -> None:
    args = build_parser().parse_args(["view", "somewhere"])
    assert args.host == "127.0.0.1" and args.port == 6006 and not args.no_browser
    cmd = viewer.tensorboard_command("somewhere", args.host, args.port)
    assert cmd[:3] == [sys.executable, "-m", "tensorboard.main"]
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1"
    assert cmd[cmd.index("--logdir") + 1] == "somewhere"
    assert cmd[cmd.index("--port") + 1] == "6006"
    assert viewer.profiler_url("0.0.0.0", 6006) == "http://127.0.0.1:6006/#pytorch_profiler"
