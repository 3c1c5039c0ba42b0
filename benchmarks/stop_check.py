"""Stop a running ``mgprof analyze`` with SIGTERM and check that nothing it started survives.

On a GPU machine this is the check that matters most: an orphaned rank keeps the GPU busy and
its memory allocated. Prints the exit code, the run's status, how long the stop took, which
processes survived (by PID) and, with CUDA, the compute processes NVML still lists.

    python benchmarks/stop_check.py --gpus 1 [--after 20]
Exits 1 when something survived or the run did not end ``interrupted``.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil

LOOP = """
import time, torch
device = "cuda" if torch.cuda.is_available() else "cpu"
model = torch.nn.Linear(512, 512).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(10**7):
    model(torch.randn(64, 512, device=device)).sum().backward()
    opt.step(); opt.zero_grad()
    time.sleep(0.01)
"""


def gpu_processes() -> list[int] | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        pids = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            pids += [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)]
        pynvml.nvmlShutdown()
        return pids
    except Exception:
        return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument("--after", type=float, default=20.0, help="seconds before SIGTERM")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "long_loop.py"
        script.write_text(textwrap.dedent(LOOP))
        cmd = [sys.executable, "-m", "mgprof", "analyze", str(script), "--gpus", str(args.gpus)]
        proc = subprocess.Popen(
            [*cmd, "--quiet", "--out", str(Path(tmp) / "runs")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        time.sleep(args.after)
        tree = psutil.Process(proc.pid).children(recursive=True)
        began = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
        took = time.monotonic() - began
        _, alive = psutil.wait_procs(tree, timeout=10)
        runs = list((Path(tmp) / "runs").glob("*/run.json"))
        status = json.loads(runs[0].read_text())["status"] if runs else "no run.json"
        time.sleep(2)
        on_gpu = gpu_processes()
        mine = [p for p in (on_gpu or []) if p in {t.pid for t in tree}]
        print(f"exit code {proc.returncode} after SIGTERM, stop took {took:.1f} s")
        print(f"run.json status: {status}")
        print(f"processes below mgprof before the stop: {len(tree)}; survived: "
              f"{[p.pid for p in alive]}")  # fmt: skip
        print(f"GPU compute processes after: {on_gpu} (of this run: {mine})")
        for p in alive:
            p.kill()
        if alive or mine or status != "interrupted" or proc.returncode != 143:
            print(err[-2000:])
            return 1
        return 0


if __name__ == "__main__":
    sys.exit(main())
