"""The fault table of docs/reliability.md as tests: bad input, faults during a run, nothing lost.

Process tests run real ``mgprof analyze`` launches (torchrun + gloo CPU ranks), one at a time;
the rest run in-process. Each asserts what mgprof did and that nothing was lost or overwritten.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from _spawn import clean_env, python_args, quiet, write_script

from mgprof import cli, rundir
from mgprof.collect import hooks
from mgprof.records import RankRecord, RunRecord, decode_run, encode_run, read_run
from mgprof.run import launcher as launch
from mgprof.run.failures import collective_of, describe_exits, parse_torchrun_failures

PACKAGE = Path(__file__).resolve().parents[1] / "mgprof"
BOUND_S = 90
"""A faulty run must end within this many seconds (the hang test's timeout is 5 s)."""

DDP_PREAMBLE = """
import os, signal, sys, time
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
rank = dist.get_rank()
model = DDP(torch.nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
def step():
    model(torch.randn(4, 8)).sum().backward(); opt.step(); opt.zero_grad()
"""


def analyze(
    tmp_path: Path, script: Path, *args: str, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[str], float]:
    """Start ``mgprof analyze`` in its own process group (so a test can Ctrl-C all of it)."""
    proc = subprocess.Popen(
        python_args("-m", "mgprof", "analyze", script, "--quiet", "--out", "runs", *args),
        cwd=tmp_path,
        env={**clean_env(), **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    return proc, time.monotonic()


def finish(proc: subprocess.Popen[str], started: float) -> tuple[int, str, float]:
    try:
        _, err = proc.communicate(timeout=BOUND_S + 30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        pytest.fail(f"mgprof analyze still running after {BOUND_S + 30} s:\n{quiet(err)[-3000:]}")
    return proc.returncode, quiet(err), time.monotonic() - started


def the_run(tmp_path: Path) -> tuple[Path, RunRecord]:
    dirs = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()]
    assert len(dirs) == 1, dirs
    return dirs[0], read_run(dirs[0])  # read_run validates: a truncated run.json would fail


# -- faults during a run (real processes) ------------------------------------------------------


@pytest.mark.slow
def test_sigkill_of_one_rank_ends_the_run_and_names_the_rank(tmp_path: Path) -> None:
    script = write_script(
        tmp_path,
        "kill.py",
        DDP_PREAMBLE
        + """
for i in range(100000):
    step()
    if i == 20 and rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
""",
    )
    code, err, took = finish(*analyze(tmp_path, script, "--gpus", "2"))
    assert took < BOUND_S, f"took {took:.0f} s"
    # torchrun's ChildFailedError traceback is kept in the run's log, not printed under
    # mgprof's own last line (rank 0's own traceback, its collective broken, is relayed)
    assert code != 0 and "ChildFailedError" not in err, err[-2000:]
    assert "torch/distributed/run.py" not in err
    run_dir, run = the_run(tmp_path)
    assert "ChildFailedError" in (run_dir / "logs" / "torchrun.log").read_text()
    assert run.status == "incomplete"
    error = run.error or ""
    assert "rank 1 was killed by SIGKILL (exit code -9)" in error, error
    assert 1 in run.missing_ranks and "no record from rank(s)" in error
    dead = [e for e in run.rank_exits if e.root_cause]
    assert [(e.rank, e.exit_code, e.signal) for e in dead] == [(1, -9, "SIGKILL")]
    report = (run_dir / "report.md").read_text()
    assert "rank 1 was killed by SIGKILL" in report


@pytest.mark.slow
def test_rank_hung_in_a_collective_times_out_naming_it(tmp_path: Path) -> None:
    """--collective-timeout reaches the script's own ``init_process_group`` (no timeout there)."""
    script = write_script(
        tmp_path,
        "hang.py",
        DDP_PREAMBLE
        + """
for i in range(3):
    step()
if rank == 1:
    time.sleep(3600)
dist.all_reduce(torch.ones(4))
""",
    )
    recorder = {"TORCH_FR_BUFFER_SIZE": "2000"}  # torch's flight recorder, turned on by the user
    code, err, took = finish(
        *analyze(tmp_path, script, "--gpus", "2", "--collective-timeout", "5", env=recorder)
    )
    assert took < BOUND_S, f"took {took:.0f} s"
    assert code == 1, err[-3000:]
    _, run = the_run(tmp_path)
    error = run.error or ""
    assert run.status == "incomplete"
    assert "Timed out waiting 5000ms" in error, error  # gloo's words: the 5 s reached the group
    assert "(in all_reduce)" in error and "rank 0" in error and "rank 1" in error, error
    assert "--collective-timeout" in error
    assert {e.rank for e in run.rank_exits} == {0, 1}
    # the rank that never arrived was stopped: its stack says where it was
    assert "when stopped: rank 1 at hang.py:" in error and "in <module>" in error, error
    lines = script.read_text().splitlines()
    sleeping = next(i for i, ln in enumerate(lines, 1) if "time.sleep(3600)" in ln)
    assert f"hang.py:{sleeping} in <module>" in error, error
    # the flight recorder: the collective rank 0 entered and rank 1 never reached
    assert "collectives (flight recorder): rank(s) 0 entered all_reduce #" in error, error
    assert "which rank(s) 1 never reached (rank 1 last entered " in error, error


@pytest.mark.slow
def test_ctrl_c_leaves_a_valid_interrupted_run(tmp_path: Path) -> None:
    script = write_script(
        tmp_path,
        "slow.py",
        DDP_PREAMBLE
        + """
for i in range(100000):
    step()
    time.sleep(0.05)
""",
    )
    proc, started = analyze(tmp_path, script, "--gpus", "2")
    while time.monotonic() - started < BOUND_S:
        progress = list((tmp_path / "runs").glob("*/.progress/rank1"))
        text = progress[0].read_text().strip() if progress else ""
        if text.isdigit() and int(text) >= 5:
            break
        time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    code, err, took = finish(proc, started)
    assert code == 130, err[-3000:]
    assert took < BOUND_S
    _, run = the_run(tmp_path)
    assert run.status == "interrupted" and run.error == "interrupted (Ctrl-C)"
    assert sorted(r.rank for r in run.ranks) == [0, 1]  # the steps measured so far are kept
    assert all(r.steps for r in run.ranks)


@pytest.mark.slow
def test_output_folder_lost_mid_run_keeps_the_scripts_result(tmp_path: Path) -> None:
    """The run directory becomes a file mid-run (unwritable, even for root): one error line,
    the script's exit code and its own output file unaffected, no traceback from mgprof."""
    script = write_script(
        tmp_path,
        "lose.py",
        """
        import os, shutil, torch
        model = torch.nn.Linear(4, 1); opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(6):
            model(torch.randn(2, 4)).sum().backward(); opt.step()
        run_dir = os.environ["MGPROF_RUN_DIR"]
        shutil.rmtree(run_dir); open(run_dir, "w").close()
        open("result.txt", "w").write("trained")
        raise SystemExit(3)
        """,
    )
    code, err, _ = finish(*analyze(tmp_path, script))
    assert code == 3, err[-3000:]
    assert (tmp_path / "result.txt").read_text() == "trained"
    assert "Traceback" not in err, err[-3000:]
    assert "mgprof: error: cannot write" in err and "exit code" in err


# -- output folder unwritable before the run, user's umask, nothing overwritten ----------------


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("USDT:")]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def test_out_under_a_regular_file_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "ok.py").write_text("print('never runs')\n")
    blocker = tmp_path / "afile"
    blocker.write_text("mine")
    code = cli.main(["analyze", str(tmp_path / "ok.py"), "--out", str(blocker / "runs")])
    assert code == 2
    line = one_error_line(capsys)
    assert "cannot create output folder" in line and "--out" in line
    assert blocker.read_text() == "mine"


def test_session_writer_permission_error_leaves_training_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    import mgprof
    from mgprof.collect.failopen import MgprofWarning

    def train(profile: bool) -> torch.Tensor:
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        prof = mgprof.profile(out=tmp_path, trace=False, sample=False) if profile else None
        with prof if prof is not None else contextlib.nullcontext():
            for _ in range(5):
                x = torch.randn(3, 4)
                model(x).pow(2).sum().backward()
                opt.step()
                opt.zero_grad()
                if prof is not None:
                    prof.step(x)
        return model.weight.detach().clone()

    def denied(*args: Any, **kwargs: Any) -> Any:
        raise PermissionError(13, "Permission denied")

    expected = train(profile=False)
    monkeypatch.setattr("mgprof.rundir.write_run", denied)
    with pytest.warns(MgprofWarning, match="writer: PermissionError"):
        got = train(profile=True)
    assert torch.equal(got, expected)


@pytest.fixture
def umask_of() -> Iterator[Any]:
    old = os.umask(0o022)
    os.umask(old)
    yield os.umask
    os.umask(old)


@pytest.mark.parametrize(
    ("mask", "file_mode", "dir_mode"), [(0o077, 0o600, 0o700), (0o022, 0o644, 0o755)]
)
def test_files_follow_the_users_umask(
    tmp_path: Path, umask_of: Any, mask: int, file_mode: int, dir_mode: int
) -> None:
    import torch

    import mgprof

    umask_of(mask)
    with mgprof.profile(out=tmp_path, name="umask", sample=False, skip=1, warmup=1, active=1) as p:
        for _ in range(6):
            torch.nn.Linear(4, 2)(torch.randn(2, 4)).sum().backward()
            p.step()
    assert p.run_dir is not None
    written = [p.run_dir / "run.json", *sorted((p.run_dir / "traces").iterdir())]
    assert len(written) >= 2  # run.json and at least one trace
    for path in written:
        assert path.stat().st_mode & 0o777 == file_mode, path
    assert p.run_dir.stat().st_mode & 0o777 == dir_mode


def sample_run() -> RunRecord:
    return RunRecord(
        run_id="r",
        world_size=2,
        ranks=[RankRecord(rank=0, world_size=2)],
        missing_ranks=[1],
        status="incomplete",
    )


@pytest.mark.parametrize(
    "content",
    [
        json.dumps({"schema_version": 999, "run_id": "x"}).encode(),
        b"\x00\x01garbage\xff",
        b"",
        encode_run(sample_run())[:40],  # truncated
        b'{"schema_version": 1, "ranks": [{"rank": "zero"}]}',
    ],
    ids=["newer-schema", "garbage", "empty", "truncated", "wrong-types"],
)
def test_report_never_modifies_a_bad_run_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes
) -> None:
    run_json = tmp_path / "run.json"
    run_json.write_bytes(content)
    os.utime(run_json, ns=(1_000_000_000, 1_000_000_000))
    before = sorted(tmp_path.iterdir())
    for fmt in ("term", "json", "md"):
        assert cli.main(["report", str(tmp_path), "--format", fmt]) == 2
        line = one_error_line(capsys)
        assert "run.json" in line
    assert run_json.read_bytes() == content
    assert run_json.stat().st_mtime_ns == 1_000_000_000
    assert sorted(tmp_path.iterdir()) == before


def test_newer_schema_message_says_what_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "run.json").write_text(json.dumps({"schema_version": 999}))
    assert cli.main(["report", str(tmp_path)]) == 2
    assert "pip install -U mgprof" in one_error_line(capsys)


# -- every command's bad input -----------------------------------------------------------------


def _registered() -> list[str]:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return [c for c in cli.COMMANDS if c in sub.choices]  # type: ignore[operator]


LAUNCH_CASES = {
    "gpus-0": (["{script}", "--gpus", "0"], "--gpus"),
    "gpus-negative": (["{script}", "--gpus", "-1"], "--gpus"),
    "steps-0": (["{script}", "--steps", "0"], "--steps"),
    "warmup-negative": (["{script}", "--warmup", "-1"], "--warmup"),
    "missing-script": (["{tmp}/missing.py"], "not found"),
    "script-is-folder": (["{tmp}"], "not a file"),
    "gpus-not-a-number": (["{script}", "--gpus", "two"], "--gpus"),
    # every count has a ceiling, checked before anything starts
    "steps-huge": (["{script}", "--steps", "99999999999999999999"], "10,000,000"),
    "warmup-huge": (["{script}", "--warmup", "99999999999999999999"], "10,000,000"),
}
EXTRA_CASES = {
    "analyze": {
        "collective-timeout-0": (["{script}", "--collective-timeout", "0"], "--collective-timeout"),
        "collective-timeout-nan": (
            ["{script}", "--collective-timeout", "nan"],
            "--collective-timeout",
        ),
        # out of c10d's range: auto-wrap failed on every rank and the ranks trained unsynchronised
        "collective-timeout-huge": (["{script}", "--collective-timeout", "1e308"], "7 days"),
        "collective-timeout-tiny": (["{script}", "--collective-timeout", "1e-300"], "between 1"),
        "trace-steps-huge": (["{script}", "--trace-steps", "99999999999999999999"], "at most"),
    },
    "sweep": {
        "range-huge": (["{script}", "--range", "8:99999999999999999999"], "at most"),
        "batch-sizes-huge": (["{script}", "--batch-sizes", "8,99999999999999999999"], "1 to"),
        "budget-huge": (["{script}", "--memory-budget-mib", "99999999999999999999"], "1 PiB"),
        "range-backwards": (["{script}", "--range", "64:8"], "backwards"),
        "range-garbage": (["{script}", "--range", "big"], "--range"),
        "batch-sizes-0": (["{script}", "--batch-sizes", "0,8"], "--batch-sizes"),
    },
    "compare": {
        "batch-size-huge": (["{script}", "--batch-size", "99999999999999999999"], "1 to"),
        "nosync-huge": (["{script}", "--nosync-steps", "99999999999999999999"], "0 to"),
        "strategies-unknown": (["{script}", "--strategies", "tpu"], ""),
        # comparison.py says "not found" for a folder (reported); one line, exit 2 all the same
        "script-is-folder": (["{tmp}"], "{tmp}"),
    },
}
PATH_CASES = {
    "missing": ("{tmp}/nope", ""),
    "empty-file": ("{tmp}/empty.json", ""),
    "not-a-trace": ("{tmp}/notes.txt", ""),
    "empty-folder": ("{tmp}/emptydir", ""),
}
PATH_COMMANDS = ("trace", "report", "view")


def _cases() -> Iterator[Any]:
    registered = _registered()
    for command in ("analyze", "compare", "sweep"):
        cases = {**LAUNCH_CASES, **EXTRA_CASES.get(command, {})}
        for name, (args, message) in cases.items():
            yield pytest.param(
                command,
                args,
                message,
                id=f"{command}-{name}",
                marks=pytest.mark.skipif(
                    command not in registered, reason=f"'{command}' not built yet"
                ),
            )
    for command in PATH_COMMANDS:
        for name, (arg, message) in PATH_CASES.items():
            yield pytest.param(command, [arg], message, id=f"{command}-{name}")


@pytest.mark.parametrize(("command", "args", "message"), list(_cases()))
def test_bad_input_to_every_command_is_one_line_exit_2(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    command: str,
    args: list[str],
    message: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    if command == "view":
        from mgprof.view import tensorboard as viewer

        monkeypatch.setattr(viewer, "missing_extra", lambda *a: [])  # the path is what's tested
    script = tmp_path / "ok.py"
    script.write_text("raise SystemExit('must never run')\n")
    (tmp_path / "empty.json").write_bytes(b"")
    (tmp_path / "notes.txt").write_text("not a trace\n")
    (tmp_path / "emptydir").mkdir()
    before = sorted(p.name for p in tmp_path.iterdir())
    argv = [command, *(a.format(script=script, tmp=tmp_path) for a in args)]
    if command in ("analyze", "compare", "sweep"):
        argv += ["--out", str(tmp_path / "runs")]
    try:
        code = cli.main(argv)
    except SystemExit as exc:  # argparse rejects a non-number itself, also exit 2
        code = exc.code
    assert code == 2, capsys.readouterr()
    line = one_error_line(capsys)
    assert message.format(tmp=tmp_path) in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written


# -- security: no code execution from input ----------------------------------------------------

BANNED_MODULES = {"pickle", "cPickle", "_pickle", "dill", "shelve", "marshal", "cloudpickle"}
BANNED_CALLS = {"eval", "exec", "compile", "__import__"}
BANNED_ATTRS = {("torch", "load"), ("yaml", "load"), ("numpy", "load"), ("np", "load")}
ALLOWED: set[tuple[str, str]] = {
    ("analyze/tracefile/split.py", "pickle"),
    ("analyze/tracefile/split.py", "pickle.loads"),
}
"""(file relative to mgprof/, name) pairs reviewed and allowed. tracefile/split unpickles only what
the child it forked wrote into an anonymous pipe that no other process holds: the child's own
reducer (numbers, strings and containers built from decoded trace fields), never input bytes."""


def _offences(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    rel = str(path.relative_to(PACKAGE))
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [
                a.name.split(".")[0] for a in node.names if a.name.split(".")[0] in BANNED_MODULES
            ]
        elif (
            isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in BANNED_MODULES
        ):
            names = [node.module or ""]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in BANNED_CALLS:
                names = [node.func.id]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            pair = (node.value.id, node.attr)
            loads = node.attr in ("load", "loads") and node.value.id in BANNED_MODULES
            if pair in BANNED_ATTRS or loads:
                names = [f"{node.value.id}.{node.attr}"]
        found += [
            f"{rel}:{getattr(node, 'lineno', 0)}: {n}" for n in names if (rel, n) not in ALLOWED
        ]
    return found


def test_no_pickle_eval_or_exec_in_the_package() -> None:
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 20
    offences = [o for f in files for o in _offences(f)]
    assert offences == []


def test_the_ban_detects_what_it_bans(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bad = PACKAGE / "_probe_not_real.py"
    source = "import pickle\nx = eval('1')\nimport torch\ny = torch.load('f')\n"
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: source)
    assert [o.split(": ")[1] for o in _offences(bad)] == ["pickle", "eval", "torch.load"]


# -- launcher pieces, no processes -------------------------------------------------------------

TORCHRUN_TAIL = """\
E1130 00:52:55 10635 api.py:1002] failed (exitcode: -9) local_rank: 1 (pid: 10655) of binary: py
Failures:
[1]:
  time      : 2026-11-30_00:52:55
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : 143 (pid: 10654)
  error_file: <N/A>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-30_00:52:55
  host      : localhost
  rank      : 3 (local_rank: 1)
  exitcode  : -9 (pid: 10655)  (SIGKILL)
  error_file: <N/A>
============================================================
"""


def test_torchrun_summary_names_the_dead_rank_first() -> None:
    exits = parse_torchrun_failures(TORCHRUN_TAIL.splitlines())
    assert [(e.rank, e.local_rank, e.exit_code, e.signal, e.root_cause) for e in exits] == [
        (3, 1, -9, "SIGKILL", True),
        (0, 0, 143, "SIGTERM", False),
    ]
    assert describe_exits(exits) == (
        "rank 3 was killed by SIGKILL (exit code -9); then rank 0 exited with code 143 (SIGTERM)"
    )


def test_torchrun_log_line_alone_still_names_the_rank() -> None:
    line = TORCHRUN_TAIL.splitlines()[0]
    (one,) = parse_torchrun_failures([line])
    assert (one.rank, one.exit_code, one.signal, one.root_cause) == (1, -9, "SIGKILL", True)
    (multi,) = parse_torchrun_failures([line], single_node=False)
    assert multi.rank is None and "local rank 1 was killed by SIGKILL" in describe_exits([multi])


def test_collective_is_read_from_the_traceback() -> None:
    tb = (
        "RuntimeError: Timed out\nTraceback (most recent call last):\n"
        '  File "/x/torch/distributed/c10d_logger.py", line 83, in wrapper\n'
        '  File "/x/torch/distributed/distributed_c10d.py", line 3252, in all_reduce\n'
    )
    assert collective_of(tb) == "all_reduce"
    assert collective_of("ValueError: bad batch") is None


def _initial(tmp_path: Path) -> RunRecord:
    return RunRecord(run_id=tmp_path.name, world_size=2, strategy="ddp", status="running")


def test_finalize_names_signal_for_a_single_process(tmp_path: Path) -> None:
    run = launch.finalize(tmp_path, _initial(tmp_path), -9, ["====", "some output"], False)
    assert run.error is not None and run.error.startswith(
        "script was killed by SIGKILL (exit code -9): some output"
    )
    assert launch.shell_code(-9) == 137 and launch.shell_code(3) == 3


def test_finalize_survives_an_unwritable_run_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def denied(*args: Any, **kwargs: Any) -> Any:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(rundir, "write_run", denied)
    run = launch.finalize(tmp_path, _initial(tmp_path), 0, [], False)
    assert run.status == "incomplete"  # no rank reported; the point is: no exception
    assert "Permission denied" in one_error_line(capsys)


def test_collective_timeout_reaches_workers_and_init_process_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import datetime

    script = tmp_path / "s.py"
    script.write_text("")
    config = launch.LaunchConfig(script=script, gpus=2, collective_timeout_s=7.5)
    env = launch.worker_env(config, launch.plan(config, device_count=0), tmp_path)
    assert env[launch.COLLECTIVE_TIMEOUT_ENV] == "7.5"
    assert hooks.COLLECTIVE_TIMEOUT_ENV == launch.COLLECTIVE_TIMEOUT_ENV
    seen: list[dict[str, Any]] = []
    monkeypatch.setitem(hooks._originals, "init", lambda *a, **k: seen.append(k))
    monkeypatch.setenv(hooks.COLLECTIVE_TIMEOUT_ENV, "7.5")
    hooks._init_process_group("gloo")
    hooks._init_process_group("gloo", timeout=datetime.timedelta(seconds=1))  # script's own wins
    monkeypatch.delenv(hooks.COLLECTIVE_TIMEOUT_ENV)
    hooks._init_process_group("gloo")
    assert seen == [
        {"timeout": datetime.timedelta(seconds=7.5)},
        {"timeout": datetime.timedelta(seconds=1)},
        {},
    ]


def test_run_json_with_rank_exits_round_trips() -> None:
    run = msgspec.structs.replace(
        sample_run(), rank_exits=parse_torchrun_failures(TORCHRUN_TAIL.splitlines())
    )
    assert decode_run(encode_run(run)) == run
    old = json.loads(encode_run(sample_run()))
    del old["rank_exits"]  # a run.json from before the field still reads
    assert decode_run(json.dumps(old).encode()).rank_exits == []


@pytest.mark.parametrize("command", ["trace", "diff"])
def test_workers_has_a_ceiling(command: str, tmp_path: Path) -> None:
    traces = Path(__file__).parent / "data" / "traces" / "cpu-gloo-ddp-mlp-2ranks"
    paths = [str(traces)] * (2 if command == "diff" else 1)
    proc = subprocess.run(
        [sys.executable, "-m", "mgprof", command, *paths, "--workers", "99999999999999999999"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().count("\n") == 0
    assert "--workers must be from 1 to 4,096" in proc.stderr


def test_a_reader_that_goes_away_ends_the_command_quietly(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``mgprof trace T --json | head``, the reader gone before the write: exit 141 (as a shell
    tool killed by SIGPIPE), no BrokenPipeError traceback, nothing on stderr."""
    from mgprof.cli import main

    traces = Path(__file__).parent / "data" / "traces" / "cpu-gloo-ddp-mlp-2ranks"
    read_end, write_end = os.pipe()
    os.close(read_end)
    with open(write_end, "w", encoding="utf-8") as stream:
        monkeypatch.setattr(sys, "stdout", stream)
        code = main(["trace", str(traces), "--json"])
        monkeypatch.undo()
    assert code == 141
    assert capsys.readouterr().err == ""
