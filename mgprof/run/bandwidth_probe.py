"""The attainable collective bandwidth of this machine, measured the way nccl-tests does.

``mgprof doctor --bandwidth`` launches this module under torchrun (N ranks; NCCL on CUDA, gloo
on CPU). Each rank times all-reduce, all-gather and reduce-scatter at each message size: warm-up
calls, then ``iters`` calls between barriers, the device synchronised before each clock read.
``algbw = bytes / time`` and ``busbw = algbw × factor`` with nccl-tests' factors (2(n−1)/n for
all-reduce, (n−1)/n for all-gather and reduce-scatter), where bytes is nccl-tests' buffer size
(the full output of an all-gather, the full input of a reduce-scatter). Rank 0 writes the result
as JSON. An operation the backend does not support is recorded with the error, not faked.

    python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        -m mgprof.run.bandwidth_probe --sizes 1024,1048576 --iters 10 --out bw.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

OPS = ("all_reduce", "all_gather", "reduce_scatter")
BANDWIDTH_SCHEMA_VERSION = 1


def buffer_elements(nbytes: int, world: int) -> int:
    """float32 elements of the probe's buffer: about ``nbytes``, divisible by the group size."""
    return max(world, nbytes // 4 // world * world)


def _time_op(op: str, elems: int, world: int, device: Any, iters: int, warmup: int) -> float:
    """Mean seconds per call of ``op`` on a buffer of ``elems`` float32 elements."""
    import torch
    import torch.distributed as dist

    if op == "all_reduce":
        buf = torch.ones(elems, device=device)

        def call() -> None:
            dist.all_reduce(buf)
    elif op == "all_gather":
        shard = torch.ones(elems // world, device=device)
        out = torch.empty(elems, device=device)

        def call() -> None:
            dist.all_gather_into_tensor(out, shard)
    else:
        full = torch.ones(elems, device=device)
        out = torch.empty(elems // world, device=device)

        def call() -> None:
            dist.reduce_scatter_tensor(out, full)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(warmup):
        call()
    sync()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        call()
    sync()
    elapsed = (time.perf_counter() - start) / iters
    dist.barrier()
    return elapsed


def measure(sizes: list[int], iters: int, warmup: int) -> dict[str, Any]:
    """Every op at every size on the job's default group; call on every rank."""
    import torch
    import torch.distributed as dist

    from mgprof.analyze.trace.comm import busbw_factor

    cuda = torch.cuda.is_available()
    if cuda:
        local = int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count()
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo")
    world = dist.get_world_size()
    rows: list[dict[str, Any]] = []
    for op in OPS:
        for size in sizes:
            row: dict[str, Any] = {"op": op, "bytes": size, "group_size": world}
            elems = buffer_elements(size, world)
            try:
                seconds = _time_op(op, elems, world, device, iters, warmup)
            except (RuntimeError, NotImplementedError, ValueError) as exc:
                row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                rows.append(row)
                continue
            actual = elems * 4
            algbw = actual / seconds / 1e9
            factor = busbw_factor(op, world)
            row.update(
                bytes=actual,
                time_us=seconds * 1e6,
                algbw_gbps=algbw,
                busbw_gbps=None if factor is None else algbw * factor,
            )
            rows.append(row)
    result = {
        "schema_version": BANDWIDTH_SCHEMA_VERSION,
        "backend": dist.get_backend(),
        "device": "cuda" if cuda else "cpu",
        "world_size": world,
        "iters": iters,
        "warmup": warmup,
        "torch": torch.__version__,
        "rows": rows,
    }
    dist.destroy_process_group()
    return result


def run_probe(
    ranks: int, sizes: list[int], iters: int = 10, warmup: int = 2, timeout_s: float = 600.0
) -> dict[str, Any]:
    """Launch the probe on ``ranks`` local processes (torchrun) and return rank 0's result.

    Raises UsageError with the workers' last line when the launch fails or times out.
    """
    import subprocess
    import tempfile

    from mgprof.errors import UsageError

    with tempfile.TemporaryDirectory(prefix="mgprof-bw-") as tmp:
        out = Path(tmp) / "bandwidth.json"
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--local-addr=127.0.0.1",  # not the host name: it may map to 127.0.1.1 (launcher)
            f"--nproc-per-node={ranks}", "-m", "mgprof.run.bandwidth_probe",
            "--sizes", ",".join(str(s) for s in sizes), "--iters", str(iters),
            "--warmup", str(warmup), "--out", str(out),
        ]  # fmt: skip
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise UsageError(
                f"the bandwidth probe did not finish in {timeout_s:g} s; try fewer or smaller "
                "--sizes"
            ) from None
        if proc.returncode != 0 or not out.exists():
            lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and "USDT:" not in ln]
            last = lines[-1].strip() if lines else f"exit code {proc.returncode}"
            raise UsageError(f"the bandwidth probe failed: {last}")
        result: dict[str, Any] = json.loads(out.read_text())
        return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", required=True, help="comma-separated message sizes in bytes")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    result = measure(sizes, args.iters, args.warmup)
    if int(os.environ.get("RANK", 0)) == 0:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
