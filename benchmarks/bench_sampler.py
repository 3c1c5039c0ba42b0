"""Sampler cost: CPU time the sampler thread takes per second of training, at 10 Hz and 100 Hz.

The main thread sleeps, so the process's CPU time is the sampler's own. Runs the real sampler
this machine gets (NVML on a GPU machine, the psutil CPU sampler otherwise) and, for the NVML
code path without a GPU, the same sampler over ``mgprof.testing.FakeNvml`` (Python overhead only:
a real driver call costs more, see docs/benchmarks.md for the figures measured on an H200).

    python benchmarks/bench_sampler.py [--seconds 3]

Target: under 2 % of one core at 10 Hz for the real sampler. Exits non-zero when missed.
"""

from __future__ import annotations

import argparse
import sys
import time

from mgprof.collect.devices.sampler import start_sampler
from mgprof.testing import FakeNvml

TARGET_10HZ_PCT = 2.0


def cost(make, seconds: float) -> tuple[float, int, str]:  # type: ignore[no-untyped-def]
    """(percent of one core, samples taken, sampler kind) over ``seconds`` of idle main thread."""
    sampler = make()
    c0, w0 = time.process_time(), time.perf_counter()
    time.sleep(seconds)
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    record = sampler.stop()
    samples = len(record.devices[0].t_s) if record.devices else 0
    return 100.0 * cpu / wall, samples, record.kind


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args()
    try:
        import torch

        cuda = [0] if torch.cuda.is_available() else None
    except ImportError:
        cuda = None
    rows = []
    for hz in (10, 100):
        rows.append(
            (
                f"real ({'cuda:0' if cuda else 'cpu'})",
                hz,
                *cost(lambda hz=hz: start_sampler(cuda, interval_s=1 / hz), args.seconds),
            )
        )
        rows.append(
            (
                "FakeNvml (Python path)",
                hz,
                *cost(
                    lambda hz=hz: start_sampler(
                        [0],
                        interval_s=1 / hz,
                        nvml_module=FakeNvml(),
                        identify=lambda i: (None, None),
                        environ={"CUDA_VISIBLE_DEVICES": "0"},
                    ),
                    args.seconds,
                ),
            )
        )
    print(f"{'sampler':<24}{'Hz':>5}{'% of a core':>14}{'samples':>9}  kind")
    for name, hz, pct, n, kind in rows:
        print(f"{name:<24}{hz:>5}{pct:>14.2f}{n:>9}  {kind}")
    real_10 = rows[0][2]
    print(f"real sampler at 10 Hz: {real_10:.2f} % of a core (target < {TARGET_10HZ_PCT} %)")
    return 0 if real_10 < TARGET_10HZ_PCT else 1


if __name__ == "__main__":
    sys.exit(main())
