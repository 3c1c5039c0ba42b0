"""End to end on CPU: ``mgprof analyze`` launches real gloo ranks through torchrun."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from mgprof.records import read_run

ROOT = Path(__file__).resolve().parents[1]
MLP = ROOT / "examples" / "mlp_context.py"
CNN = ROOT / "examples" / "cnn_decorator.py"


def mgprof(*args: str, cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "mgprof", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def only_run_dir(out: Path) -> Path:
    dirs = [p for p in out.iterdir() if p.is_dir()]
    assert len(dirs) == 1, dirs
    return dirs[0]


@pytest.fixture(scope="module")
def ddp_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path_factory.mktemp("analyze")
    proc = mgprof(
        "analyze", str(MLP), "--gpus", "2", "--out", "runs", "--", "--steps", "8", cwd=out
    )
    return proc, out / "runs"


def test_two_rank_run_directory_is_complete(
    ddp_run: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    proc, out = ddp_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = only_run_dir(out)
    run = read_run(run_dir)
    assert run.status == "complete" and run.exit_code == 0
    assert run.strategy == "ddp" and run.world_size == 2 and run.backend == "gloo"
    assert run.cpu_fallback and "gloo" in (run.cpu_fallback_reason or "")
    assert [r.rank for r in run.ranks] == [0, 1] and not run.missing_ranks
    for rank in run.ranks:
        assert len(rank.steps) == 8
        assert all(s.batch_size == 64 for s in rank.steps)
        assert rank.traces == [f"traces/rank{rank.rank}.pt.trace.json.gz"]
        assert (run_dir / rank.traces[0]).stat().st_size > 1000
        assert (run_dir / "samples" / f"rank{rank.rank}.csv").exists()
    assert (run_dir / "report.md").read_text().startswith("# mgprof report")
    assert run.analysis is not None and len(run.analysis["ranks"]) == 2
    # the terminal report names the fallback and the sections
    assert "CPU fallback" in proc.stdout and "Communication" in proc.stdout


def test_report_renders_every_format_from_run_json(
    ddp_run: tuple[subprocess.CompletedProcess[str], Path], tmp_path: Path
) -> None:
    _, out = ddp_run
    run_dir = only_run_dir(out)
    term = mgprof("report", str(run_dir), cwd=tmp_path)
    assert term.returncode == 0 and "Step time per rank" in term.stdout
    as_json = mgprof("report", str(run_dir), "--format", "json", cwd=tmp_path)
    assert json.loads(as_json.stdout)["world_size"] == 2
    md = mgprof("report", str(run_dir), "--format", "md", cwd=tmp_path)
    assert md.stdout.startswith("# mgprof report")


def test_auto_instrumented_steps_limit(tmp_path: Path) -> None:
    """An unmodified script (no mgprof import) is stopped after warmup + steps updates."""
    script = tmp_path / "plain.py"
    script.write_text(
        "import torch\n"
        "from torch.utils.data import DataLoader, TensorDataset\n"
        "m = torch.nn.Linear(8, 2)\n"
        "opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "ds = TensorDataset(torch.randn(4000, 8), torch.randn(4000, 2))\n"
        "data = DataLoader(ds, batch_size=16)\n"
        "for x, y in data:\n"
        "    loss = (m(x) - y).pow(2).mean()\n"
        "    opt.zero_grad(); loss.backward(); opt.step()\n"
        "raise SystemExit('ran to the end: the step limit did not stop it')\n"
    )
    proc = mgprof(
        "analyze",
        str(script),
        "--steps",
        "4",
        "--warmup",
        "1",
        "--quiet",
        "--out",
        "runs",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = read_run(only_run_dir(tmp_path / "runs"))
    assert run.status == "complete" and run.strategy == "single"
    steps = run.ranks[0].steps
    assert len(steps) == 5
    assert all(s.batch_size == 16 for s in steps)
    assert all(s.dataloader_ms is not None and s.dataloader_ms >= 0 for s in steps)


def test_failing_script_keeps_exit_code_and_leaves_incomplete_run(tmp_path: Path) -> None:
    script = tmp_path / "boom.py"
    script.write_text(
        "import torch\n"
        "m = torch.nn.Linear(4, 1); opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for i in range(5):\n"
        "    m(torch.randn(2, 4)).sum().backward(); opt.step()\n"
        "    if i == 3:\n"
        "        raise ValueError('bad batch 3')\n"
    )
    proc = mgprof("analyze", str(script), "--quiet", "--out", "runs", cwd=tmp_path)
    assert proc.returncode == 1
    assert "ValueError: bad batch 3" in proc.stderr and "Traceback" in proc.stderr
    run = read_run(only_run_dir(tmp_path / "runs"))
    assert run.status == "incomplete" and run.exit_code == 1
    assert "bad batch 3" in (run.error or "")
    assert run.ranks and "ValueError" in (run.ranks[0].error or "")


def test_script_exit_code_is_preserved(tmp_path: Path) -> None:
    script = tmp_path / "three.py"
    script.write_text("import sys\nsys.exit(3)\n")
    proc = mgprof("analyze", str(script), "--quiet", "--out", "runs", cwd=tmp_path)
    assert proc.returncode == 3
    assert read_run(only_run_dir(tmp_path / "runs")).status == "incomplete"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing.py"], "not found"),
        (["{script}", "--gpus", "0"], "--gpus must be at least 1"),
        (["{script}", "--gpus", "-1"], "--gpus must be at least 1"),
        (["{script}", "--steps", "0"], "--steps must be at least 1"),
        (["{script}", "--strategy", "dp", "--gpus", "2"], "DataParallel needs CUDA"),
        (["{script}", "--nnodes", "2"], "--rdzv-endpoint"),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    script = tmp_path / "ok.py"
    script.write_text("print('hi')\n")
    argv = [a.format(script=script) for a in args]
    proc = mgprof("analyze", *argv, "--out", "runs", cwd=tmp_path, timeout=60)
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and not ln.startswith("USDT")]
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert not (tmp_path / "runs").exists()  # nothing started, nothing written


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_two_node_run_on_one_machine_gathers_all_ranks(tmp_path: Path) -> None:
    """Two launchers with --nnodes 2 (as on two hosts) make one job; rank 0's node reports."""
    endpoint = f"127.0.0.1:{_free_port()}"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def node(rank: int) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mgprof",
                "analyze",
                str(CNN),
                "--gpus",
                "1",
                "--nnodes",
                "2",
                "--node-rank",
                str(rank),
                "--rdzv-endpoint",
                endpoint,
                "--quiet",
                "--out",
                f"node{rank}",
                "--",
                "--steps",
                "6",
            ],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )

    procs = [node(0), node(1)]
    outs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
    # c10d rendezvous gives rank 0 to whichever node arrives first: that launcher reports
    runs = {n: read_run(only_run_dir(tmp_path / f"node{n}")) for n in (0, 1)}
    home = next(n for n, r in runs.items() if r.ranks)
    other = 1 - home
    run = runs[home]
    assert run.world_size == 2 and run.nnodes == 2 and run.status == "complete"
    assert [r.rank for r in run.ranks] == [0, 1]
    assert {p.name for p in (only_run_dir(tmp_path / f"node{home}") / "traces").iterdir()} == {
        f"{r.host}_rank{r.rank}.pt.trace.json.gz" for r in run.ranks
    }
    assert "Step time per rank" in outs[home][0]
    assert runs[other].status == "complete" and not runs[other].ranks
    assert "sent its records to rank 0" in outs[other][1]
