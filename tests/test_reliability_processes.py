"""The launcher and its processes under faults an adversarial probe found (docs/reliability.md):
a rank left running after its peer ended, a daemon the script double-forks, a gigantic line of
output, records lost to a full disk, the exit code after a stop, and torchrun's tracebacks.

Every test runs real ``mgprof analyze`` launches (torchrun + gloo CPU ranks) and asserts what
mgprof did, in bounded time.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from _spawn import clean_env, python_args, write_script
from test_reliability import DDP_PREAMBLE, analyze, finish, the_run

from mgprof.records import read_run

pytestmark = pytest.mark.slow


def test_a_rank_left_running_after_its_peer_ended_is_stopped_and_named(tmp_path: Path) -> None:
    """Rank 1 sleeps after its loop with no collective left: rank 0's record gather times out
    after --collective-timeout (5 s) and it exits; rank 1 then has 5 s more before mgprof stops
    it. It used to wait for ever with run.json ``running``."""
    script = write_script(
        tmp_path,
        "linger.py",
        DDP_PREAMBLE
        + """
for i in range(8):
    step()
if rank == 1:
    time.sleep(3600)
""",
    )
    args = ("--gpus", "2", "--collective-timeout", "5", "--trace-steps", "0")
    code, err, took = finish(*analyze(tmp_path, script, *args))
    assert took < 60, f"took {took:.0f} s"
    assert code != 0, err[-3000:]
    _, run = the_run(tmp_path)
    assert run.status == "incomplete", run.status
    error = run.error or ""
    assert error.startswith("rank 1 did not end within 5 s after rank 0 had ended"), error
    assert "mgprof stopped it" in error, error
    lines = script.read_text().splitlines()
    sleeping = next(i for i, ln in enumerate(lines, 1) if "time.sleep(3600)" in ln)
    assert f"when stopped: rank 1 at linger.py:{sleeping} in <module>" in error, error
    # what was recorded is kept: rank 0's steps are in the record
    zero = [r for r in run.ranks if r.rank == 0]
    assert zero and len(zero[0].steps) >= 4, [(r.rank, len(r.steps)) for r in run.ranks]
    assert run.exit_code == code


def _gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def test_a_double_forked_daemon_does_not_outlive_the_run(tmp_path: Path) -> None:
    """``fork; setsid; fork; exec sleep``: the middle process ends at once, so the daemon left
    the process tree before any scan could see it and ran on after mgprof. mgprof is the
    launch's child subreaper now: the daemon becomes its child and is ended with the run."""
    pid_file = tmp_path / "daemon.pid"
    script = write_script(
        tmp_path,
        "daemon.py",
        """
        import os, sys, time
        import torch
        model = torch.nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(4):
            model(torch.randn(4, 8)).sum().backward(); opt.step(); opt.zero_grad()
        middle = os.fork()
        if middle == 0:
            os.setsid()
            if os.fork() == 0:
                with open(sys.argv[1] + ".tmp", "w") as fh:
                    fh.write(str(os.getpid()))
                os.rename(sys.argv[1] + ".tmp", sys.argv[1])
                os.execvp("sleep", ["sleep", "600"])
            os._exit(0)
        os.waitpid(middle, 0)
        while not os.path.exists(sys.argv[1]):
            time.sleep(0.05)
        print("daemon started", flush=True)
        """,
    )
    code, err, _ = finish(*analyze(tmp_path, script, "--trace-steps", "0", "--", str(pid_file)))
    assert code == 0, err[-3000:]
    daemon = int(pid_file.read_text())
    try:
        assert _gone(daemon, within_s=5), f"the script's daemon {daemon} outlived the run"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(daemon, signal.SIGKILL)
    assert "ended 1 process(es) the script left running" in err, err[-3000:]
    _, run = the_run(tmp_path)
    assert run.status == "complete", run.error


def _peak_rss_mib(pid: int) -> int:
    """The process's peak resident memory so far (``VmHWM``), 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) // 1024
    except OSError:
        pass
    return 0


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmHWM from /proc")
def test_a_line_of_200_mb_keeps_mgprofs_memory_bounded(tmp_path: Path) -> None:
    """200 MB without a newline: mgprof read whole lines and held 787 MiB here (4.3 GB for
    1 GiB); now it reads chunks, shows the first 64 KiB of the line with a note, and stays at
    the size of a run without it."""
    script = write_script(
        tmp_path,
        "shout.py",
        """
        import sys, torch
        model = torch.nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(4):
            model(torch.randn(4, 8)).sum().backward(); opt.step(); opt.zero_grad()
        sys.stdout.write("x" * 200_000_000)
        sys.stdout.flush()
        sys.stdout.write("\\nafter the long line\\n")
        """,
    )
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with open(out, "wb") as out_fh, open(err, "wb") as err_fh:
        proc = subprocess.Popen(
            python_args("-m", "mgprof", "analyze", script, "--quiet", "--out", "runs",
                        "--trace-steps", "0"),
            cwd=tmp_path, env=clean_env(), stdout=out_fh, stderr=err_fh,
        )  # fmt: skip
        peak, deadline = 0, time.monotonic() + 90
        while proc.poll() is None and time.monotonic() < deadline:
            peak = max(peak, _peak_rss_mib(proc.pid))
            time.sleep(0.05)
        if proc.poll() is None:
            proc.kill()
            pytest.fail("mgprof analyze did not end within 90 s")
    shown = out.read_bytes()
    assert proc.returncode == 0, err.read_bytes()[-3000:]
    assert peak > 0, "no memory figure was read: the bound below would prove nothing"
    assert peak < 150, f"mgprof's peak RSS was {peak} MiB for a 200 MB line"
    assert len(shown) < 1_000_000, len(shown)  # the line was cut for the terminal
    assert b"\nafter the long line\n" in shown
    assert b"bytes are not shown" in shown
    run_dir, run = the_run(tmp_path)
    assert run.status == "complete", run.error
    log = (run_dir / "logs" / "rank0.log").read_bytes()
    assert len(log) < 3 * 1024 * 1024 and b"after the long line" in log


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="needs root and unshare(1) to mount a 100 KiB tmpfs as --out in a private namespace",
)
def test_records_lost_to_a_full_disk_are_said_lost_with_the_steps_made(tmp_path: Path) -> None:
    """--out on a 100 KiB tmpfs under --gpus 2: both ranks make 8 steps and cannot save their
    records (ENOSPC). run.json said "the script made no optimizer step"; it says the records
    were lost, why, and how many steps each rank made."""
    script = write_script(
        tmp_path,
        "full.py",
        DDP_PREAMBLE
        + """
for i in range(8):
    step()
dist.destroy_process_group()
""",
    )
    full, kept = tmp_path / "full", tmp_path / "kept"
    full.mkdir()
    analyze = " ".join(
        python_args("-m", "mgprof", "analyze", script, "--gpus", "2", "--quiet", "--out", full)
    )
    inner = (
        f"mount -t tmpfs -o size=100k mgfull {full} || exit 99; "
        f"{analyze}; code=$?; cp -r {full} {kept}; exit $code"
    )
    proc = subprocess.run(
        ["unshare", "-m", "sh", "-c", inner],
        cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    if proc.returncode == 99 or "unshare:" in proc.stderr:
        pytest.skip(f"no private tmpfs here: {proc.stderr.strip()[-300:]}")
    assert proc.returncode == 0, proc.stderr[-3000:]  # the training's own result
    (run_json,) = kept.glob("*/run.json")
    run = read_run(run_json.parent)
    error = run.error or ""
    assert run.status == "incomplete", error
    assert "no optimizer step" not in error, error
    assert error.startswith("the ranks' records were lost: could not save the records"), error
    assert "No space left on device (ENOSPC)" in error, error
    assert "rank 0 made 8 optimizer steps, rank 1 made 8 optimizer steps" in error, error
    assert run.exit_code == 0


LOOP = """
import time, torch
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
while True:
    model(torch.randn(4, 8)).sum().backward(); opt.step(); opt.zero_grad()
    time.sleep(0.05)
"""


def _wait_for_a_step(tmp_path: Path, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        found = list((tmp_path / "runs").glob("*/.progress/rank0"))
        text = found[0].read_text().strip() if found else ""
        if text.isdigit() and int(text) >= 2:
            return
        time.sleep(0.2)
    pytest.fail("the script never made its steps")


@pytest.mark.parametrize(
    ("signals", "code"),
    [((signal.SIGHUP,), 129), ((signal.SIGINT, signal.SIGINT), 130)],
    ids=["SIGHUP", "double-Ctrl-C"],
)
def test_run_json_records_the_exit_code_mgprof_exits_with(
    tmp_path: Path, signals: tuple[int, ...], code: int
) -> None:
    """run.json recorded 143 after SIGHUP (mgprof exits 129: torchrun's or the rank's code after
    the forwarded SIGTERM) and 0 after a double Ctrl-C."""
    script = write_script(tmp_path, "loop.py", LOOP)
    proc, started = analyze(tmp_path, script, "--trace-steps", "0")
    _wait_for_a_step(tmp_path, proc)
    for sig in signals:
        proc.send_signal(sig)
        time.sleep(0.3)
    got, err, _ = finish(proc, started)
    assert got == code, err[-3000:]
    _, run = the_run(tmp_path)
    assert run.status == "interrupted", run.error
    assert run.exit_code == code, (run.exit_code, run.error)


def test_torchrun_killed_by_a_rank_is_said_as_such(tmp_path: Path) -> None:
    """Rank 1 SIGKILLs torchrun: the run's error was a line of torchrun's banner; it says
    torchrun was killed, not by mgprof, and how its ranks ended."""
    script = write_script(
        tmp_path,
        "parricide.py",
        DDP_PREAMBLE
        + """
for i in range(100000):
    step()
    if i == 5 and rank == 1:
        os.kill(os.getppid(), signal.SIGKILL)
    time.sleep(0.01)
""",
    )
    code, err, _ = finish(*analyze(tmp_path, script, "--gpus", "2", "--trace-steps", "0"))
    assert code == 137, err[-3000:]
    _, run = the_run(tmp_path)
    error = run.error or ""
    assert run.status == "incomplete" and run.exit_code == 137, error
    assert error.startswith(
        "torchrun, which runs the ranks, was killed by SIGKILL (exit code -9), not by mgprof"
    ), error
    assert "rank 0: exited with code 143" in error and "rank 1: exited with code 143" in error


def test_an_unknown_rendezvous_backend_is_one_line_before_anything_starts(tmp_path: Path) -> None:
    """It ran torchrun, which printed a 30-line traceback, exited 1 and left an incomplete run
    folder; torchrun accepts c10d, static, etcd and etcd-v2 (and plugins' names)."""
    script = write_script(tmp_path, "never.py", "raise SystemExit('must not run')\n")
    result = subprocess.run(
        python_args("-m", "mgprof", "analyze", script, "--gpus", "2", "--nnodes", "2",
                    "--rdzv-endpoint", "127.0.0.1:29999", "--rdzv-backend", "bogus",
                    "--out", "runs"),
        cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "--rdzv-backend 'bogus'" in lines[0] and "c10d, static, etcd, etcd-v2" in lines[0]
    assert not (tmp_path / "runs").exists()
