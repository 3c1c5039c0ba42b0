"""The flight recorder's cost per collective, side by side: 2 gloo ranks time 2,000 small
all-reduces (4 KiB) five times, with torch's flight recorder off and on (mgprof turns it on for
every multi-rank run, ``TORCH_FR_BUFFER_SIZE=2000``), alternating runs.

Run: ``python benchmarks/bench_flight_recorder.py [--pairs 2]`` (starts torchrun itself).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

WORKER = """
import os, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1024)
for _ in range(200):
    dist.all_reduce(t)
runs = []
for _ in range(5):
    dist.barrier()
    start = time.perf_counter()
    for _ in range(2000):
        dist.all_reduce(t)
    runs.append((time.perf_counter() - start) / 2000 * 1e6)
if dist.get_rank() == 0:
    print("US", sorted(runs)[2])
dist.destroy_process_group()
"""


def _one(recorder: bool, script: str) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("TORCH_FR_BUFFER_SIZE", None)
    if recorder:
        env["TORCH_FR_BUFFER_SIZE"] = "2000"
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         script],
        env=env, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return float(next(line for line in out.splitlines() if line.startswith("US")).split()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pairs", type=int, default=2)
    args = parser.parse_args()
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as fh:
        fh.write(WORKER)
        script = fh.name
    try:
        off, on = [], []
        for _ in range(args.pairs):
            off.append(_one(False, script))
            on.append(_one(True, script))
            time.sleep(0.5)
    finally:
        os.unlink(script)
    for a, b in zip(off, on, strict=True):
        print(f"off {a:8.1f} us  on {b:8.1f} us  on/off {b / a:.3f}")


if __name__ == "__main__":
    main()
