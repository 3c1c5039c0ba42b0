"""Nothing outlives mgprof, the script's exit code is mgprof's, and a run stays on this machine.

Real ``mgprof analyze`` launches (torchrun + gloo CPU ranks): each test collects the PIDs of
every process below mgprof while it runs, stops mgprof the way a user or a scheduler would, and
asserts by PID that none of them survives a bounded wait.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from _spawn import clean_env, python_args, quiet, write_script

from mgprof.errors import UsageError
from mgprof.records import read_run
from mgprof.run import entry
from mgprof.run.launcher import LaunchConfig, plan

BOUND_S = 60
DDP_LOOP = """
import os, sys, time
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
rank = dist.get_rank()
model = DDP(torch.nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for i in range(100000):
    model(torch.randn(4, 8)).sum().backward(); opt.step(); opt.zero_grad()
    time.sleep(0.05)
"""


MGPROF = Path(sys.executable).parent / "mgprof"
"""The installed command: ``python -m mgprof`` would itself put the working directory first."""


def start(tmp_path: Path, script: Path, *args: str, env: dict[str, str] | None = None):
    proc = subprocess.Popen(
        [str(MGPROF), "analyze", str(script), "--quiet", "--out", "runs", *args],
        cwd=tmp_path,
        env={**clean_env(), **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # the test plays the terminal: it signals mgprof alone
    )
    return proc, time.monotonic()


def wait_for_steps(tmp_path: Path, proc: subprocess.Popen[str], rank: int, steps: int) -> None:
    deadline = time.monotonic() + BOUND_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, quiet(proc.communicate()[1])[-3000:]
        found = list((tmp_path / "runs").glob(f"*/.progress/rank{rank}"))
        text = found[0].read_text().strip() if found else ""
        if text.isdigit() and int(text) >= steps:
            return
        time.sleep(0.2)
    pytest.fail("the ranks never reached their steps")


def descendants(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children(recursive=True)


def assert_none_survive(procs: list[psutil.Process], bound_s: float = 15) -> None:
    _gone, alive = psutil.wait_procs(procs, timeout=bound_s)
    for proc in alive:  # clean up before failing
        proc.kill()
    assert not alive, [(p.pid, p.cmdline()) for p in alive]


def finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    """mgprof's exit code and its output (stdout then stderr)."""
    try:
        out, err = proc.communicate(timeout=BOUND_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("mgprof did not end")
    return proc.returncode, quiet(out + err)  # the script's lines and mgprof's


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sig", "code", "label"),
    [(signal.SIGTERM, 143, "SIGTERM"), (signal.SIGHUP, 129, "SIGHUP")],
)
def test_a_signal_to_mgprof_ends_torchrun_and_every_worker(
    tmp_path: Path, sig: int, code: int, label: str
) -> None:
    """``kill``, ``timeout``, a CI cancel or a closed terminal: the workers stop too, write what
    they measured, and run.json ends ``interrupted``."""
    script = write_script(tmp_path, "loop.py", DDP_LOOP)
    proc, _ = start(tmp_path, script, "--gpus", "2")
    wait_for_steps(tmp_path, proc, 1, 5)
    tree = descendants(proc.pid)
    assert len(tree) >= 3  # torchrun and two workers
    proc.send_signal(sig)
    rc, err = finish(proc)
    assert rc == code, err[-3000:]
    assert_none_survive(tree)
    run = read_run(next((tmp_path / "runs").iterdir()))
    assert run.status == "interrupted" and run.error == f"interrupted ({label})"
    assert sorted(r.rank for r in run.ranks) == [0, 1] and all(r.steps for r in run.ranks)
    assert "Traceback" not in err


@pytest.mark.slow
def test_a_second_ctrl_c_kills_the_whole_tree_at_once(tmp_path: Path) -> None:
    """The second Ctrl-C does not wait for the grace period, and reaches the workers (which
    torchrun puts in sessions of their own), not only torchrun."""
    script = write_script(
        tmp_path,
        "stubborn.py",
        DDP_LOOP.replace(
            "for i in range(100000):",
            "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nfor i in range(100000):",
        ),
    )
    proc, _ = start(tmp_path, script, "--gpus", "2")
    wait_for_steps(tmp_path, proc, 1, 3)
    tree = descendants(proc.pid)
    proc.send_signal(signal.SIGINT)
    time.sleep(1.0)
    began = time.monotonic()
    proc.send_signal(signal.SIGINT)
    rc, err = finish(proc)
    assert rc == 130, err[-3000:]
    assert time.monotonic() - began < 15  # not the 20 s grace
    assert_none_survive(tree, bound_s=5)


@pytest.mark.slow
def test_a_hung_single_process_script_ends_on_sigterm_after_the_grace(tmp_path: Path) -> None:
    """``timeout 60 mgprof analyze hung.py`` (--gpus 1): a script that ignores SIGTERM is killed
    once the grace period is over, and so is anything it started."""
    script = write_script(
        tmp_path,
        "hung.py",
        """
        import signal, subprocess, sys, time, torch
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        model = torch.nn.Linear(4, 1); opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(4):
            model(torch.randn(2, 4)).sum().backward(); opt.step()
        helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                                  start_new_session=True)
        print("hung", flush=True)
        while True:
            time.sleep(1)
        """,
    )
    proc, _ = start(tmp_path, script, env={"MGPROF_STOP_GRACE_S": "3"})
    deadline = time.monotonic() + BOUND_S
    while len(descendants(proc.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(0.5)
    tree = descendants(proc.pid)
    assert len(tree) >= 2, tree  # the script and the helper it started in its own session
    began = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    rc, err = finish(proc)
    assert rc == 143, err[-3000:]
    assert time.monotonic() - began < 15
    assert_none_survive(tree, bound_s=5)
    assert read_run(next((tmp_path / "runs").iterdir())).status == "interrupted"


@pytest.mark.slow
def test_workers_end_when_mgprof_itself_is_killed(tmp_path: Path) -> None:
    """SIGKILL cannot be forwarded: torchrun's parent-death signal stops it, and it stops the
    workers; a worker whose torchrun is killed stops by its own parent-death signal."""
    script = write_script(tmp_path, "loop.py", DDP_LOOP)
    proc, _ = start(tmp_path, script, "--gpus", "2")
    wait_for_steps(tmp_path, proc, 1, 3)
    tree = descendants(proc.pid)
    proc.kill()
    proc.communicate()
    assert_none_survive(tree, bound_s=45)  # torchrun's own SIGTERM -> SIGKILL escalation


@pytest.mark.slow
def test_rendezvous_and_gloo_listen_on_loopback_only(tmp_path: Path) -> None:
    script = write_script(tmp_path, "loop.py", DDP_LOOP)
    proc, _ = start(tmp_path, script, "--gpus", "2")
    try:
        wait_for_steps(tmp_path, proc, 1, 3)
        listening = []
        for p in [psutil.Process(proc.pid), *descendants(proc.pid)]:
            try:
                conns = p.net_connections(kind="inet")
            except psutil.Error:
                continue
            listening += [(p.pid, c.laddr.ip, c.laddr.port) for c in conns if c.status == "LISTEN"]
        assert listening, "no listening socket found: the check would prove nothing"
        outside = [x for x in listening if x[1] not in ("127.0.0.1", "::1", "::ffff:127.0.0.1")]
        assert not outside, outside
    finally:
        proc.send_signal(signal.SIGTERM)
        finish(proc)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("ending", "code"),
    [("sys.exit(3)", 3), ("os._exit(7) if rank == 1 else time.sleep(30)", 7)],
)
def test_the_first_failing_ranks_exit_code_is_mgprofs(
    tmp_path: Path, ending: str, code: int
) -> None:
    """torchrun exits 1 whatever its workers did; mgprof exits (and records) the script's own
    code: the first failing rank's."""
    script = write_script(
        tmp_path,
        "fails.py",
        DDP_LOOP.replace("range(100000)", "range(4)").replace("time.sleep(0.05)", "pass")
        + ending
        + "\n",
    )
    proc, _ = start(tmp_path, script, "--gpus", "2")
    rc, err = finish(proc)
    assert rc == code, err[-3000:]
    run = read_run(next((tmp_path / "runs").iterdir()))
    assert run.exit_code == code and f"code {code}" in (run.error or "")


@pytest.mark.slow
def test_a_module_in_the_working_directory_shadows_nothing(tmp_path: Path) -> None:
    """``./inspect.py`` beside the user does not break torch under mgprof, as it does not under
    ``python train/script.py``; the script's own folder still comes first, as in Python."""
    (tmp_path / "inspect.py").write_text('raise SystemExit("the standard library was shadowed")\n')
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "helpers.py").write_text("VALUE = 41\n")
    script = write_script(
        tmp_path / "train",
        "script.py",
        """
        import torch
        from helpers import VALUE
        model = torch.nn.Linear(4, 1); opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            model(torch.randn(2, 4)).sum().backward(); opt.step()
        print("value", VALUE + 1)
        """,
    )
    plain = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=clean_env(), capture_output=True, text=True
    )
    assert plain.returncode == 0, plain.stderr[-2000:]
    for gpus in ("1", "2"):
        proc, _ = start(tmp_path, script, "--gpus", gpus)
        rc, output = finish(proc)
        assert rc == 0, output[-3000:]
        assert "shadowed" not in output
        # each rank's own log holds its line whole (two unbuffered ranks printing at once may
        # interleave on the terminal: a CI run showed "valuevalue  4242")
        run_dir = max((tmp_path / "runs").iterdir(), key=lambda d: d.stat().st_mtime)
        for rank in range(int(gpus)):
            log = (run_dir / "logs" / f"rank{rank}.log").read_text()
            assert "value 42" in log, log[-2000:]


@pytest.mark.slow
def test_json_report_owns_stdout(tmp_path: Path) -> None:
    """The script prints; ``--format json`` still gives stdout that parses as one JSON report."""
    script = write_script(
        tmp_path,
        "chatty.py",
        """
        import torch
        model = torch.nn.Linear(4, 1); opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for i in range(4):
            model(torch.randn(2, 4)).sum().backward(); opt.step()
            print("loss", i, flush=True)
        """,
    )
    proc = subprocess.run(
        python_args("-m", "mgprof", "analyze", script, "--quiet", "--out", "runs", "--format",
                    "json"),
        cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=BOUND_S,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout)["status"] == "complete"
    assert "loss 3" in proc.stderr


def test_absurd_and_oversubscribed_rank_counts_are_refused(tmp_path: Path) -> None:
    script = write_script(tmp_path, "s.py", "print(1)\n")
    with pytest.raises(UsageError, match="beyond any real job"):
        LaunchConfig(script=script, gpus=99999999999999999999)
    cores = os.cpu_count() or 1
    many = LaunchConfig(script=script, gpus=4 * cores + 1)
    with pytest.raises(UsageError, match="--max-cpu-ranks"):
        plan(many, device_count=0)
    allowed = LaunchConfig(script=script, gpus=4 * cores + 1, max_cpu_ranks=4 * cores + 1)
    assert plan(allowed, device_count=0).nproc_per_node == 4 * cores + 1
    with pytest.raises(UsageError, match="--max-cpu-ranks must be"):
        LaunchConfig(script=script, max_cpu_ranks=0)


def test_absurd_gpus_on_the_command_line_is_one_line(tmp_path: Path) -> None:
    script = write_script(tmp_path, "s.py", "print(1)\n")
    proc = subprocess.run(
        python_args("-m", "mgprof", "analyze", script, "--gpus", "99999999999999999999"),
        cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "beyond any real job" in lines[0]
    assert not (tmp_path / "mgprof-runs").exists()


def test_the_entry_stub_drops_the_working_directory_and_sets_the_parent_death_signal(
    tmp_path: Path,
) -> None:
    """What ``python -c STUB`` sees: no working directory on sys.path, a parent-death signal."""
    (tmp_path / "inspect.py").write_text('raise SystemExit("shadowed")\n')
    (tmp_path / "sub").mkdir()
    probe = write_script(
        tmp_path / "sub",
        "probe.py",
        """
        import ctypes, os, sys
        libc = ctypes.CDLL(None)
        sig = ctypes.c_int()
        libc.prctl(2, ctypes.byref(sig), 0, 0, 0)  # PR_GET_PDEATHSIG
        print("pdeathsig", sig.value)
        print("cwd on path", os.getcwd() in sys.path or "" in sys.path)
        """,
    )
    cmd = [*entry.python_command("bootstrap"), str(probe)]
    out = subprocess.run(
        cmd, cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"pdeathsig {int(signal.SIGTERM)}" in out.stdout
    assert "cwd on path False" in out.stdout


@pytest.mark.slow
def test_sigterm_stops_a_comparison_before_its_next_strategy(tmp_path: Path) -> None:
    """A study does not swallow the stop: no further strategy is launched, exit 143."""
    script = write_script(
        tmp_path,
        "plain.py",
        """
        import time, torch
        model = torch.nn.Linear(8, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for i in range(100000):
            model(torch.randn(4, 8)).sum().backward(); opt.step(); opt.zero_grad()
            time.sleep(0.05)
        """,
    )
    cmd = [str(MGPROF), "compare", str(script), "--gpus", "2", "--strategies", "single,ddp"]
    proc = subprocess.Popen(
        [*cmd, "--steps", "5000", "--quiet", "--out", "runs"],
        cwd=tmp_path,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + BOUND_S
    while not list((tmp_path / "runs").glob("*/*single*/.progress/rank0")):
        assert time.monotonic() < deadline and proc.poll() is None, quiet(proc.communicate()[1])
        time.sleep(0.2)
    time.sleep(2)
    proc.send_signal(signal.SIGTERM)
    rc, output = finish(proc)
    assert rc == 143, output[-3000:]
    assert "interrupted (SIGTERM)" in output and "Traceback" not in output
    runs = [p.name for p in (tmp_path / "runs").glob("*/*") if p.is_dir()]
    assert len(runs) == 1 and "single" in runs[0], runs  # the ddp row never started
