"""The attainable collective bandwidth of this machine, measured the way nccl-tests does.

``mgprof doctor --bandwidth`` launches this module under torchrun (N ranks; NCCL on CUDA, gloo
on CPU). Each rank times all-reduce, all-gather and reduce-scatter at each message size: warm-up
calls, then ``iters`` calls between barriers, the device synchronised before each clock read.
``algbw = bytes / time`` and ``busbw = algbw × factor`` with nccl-tests' factors (2(n−1)/n for
all-reduce, (n−1)/n for all-gather and reduce-scatter), where bytes is nccl-tests' buffer size
(the full output of an all-gather, the full input of a reduce-scatter). Rank 0 writes the result
as JSON. An operation the backend does not support is recorded with the error, not faked.

``run_probe`` starts it the way ``mgprof analyze`` starts its ranks (``mgprof.run.entry``): the
rendezvous store and gloo on loopback, a parent-death signal in every process, the whole tree
stopped on a stop signal, and the request refused before launching when it cannot run here.
By hand:

    python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        -m mgprof.run.bandwidth_probe --sizes 1024,1048576 --iters 10 --out bw.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
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


MAX_MESSAGE_BYTES = 64 << 30
"""The largest message the probe times (64 GiB): nccl-tests' curves flatten long before, and a
larger buffer fails every op's allocation on any device there is."""
MAX_ITERS = 100_000
STOP_GRACE_S = 5.0
"""After a stop signal, how long the ranks get to end before SIGKILL: they hold no record."""
_WORKER_STUB = (
    "import os,sys;_p=os.getppid();"
    "getattr(sys.flags,'safe_path',False) or sys.path.pop(0);"
    "sys.path.append({root!r});"
    "from mgprof.run.bandwidth_probe import worker_start;worker_start(_p)"
)


def check_request(ranks: int, sizes: list[int], iters: int, device_count: int) -> None:
    """Refuse, before anything starts, a probe that cannot run here: fewer than 2 ranks, more
    ranks than devices (or than ``mgprof analyze`` allows CPU ranks), a message beyond
    :data:`MAX_MESSAGE_BYTES`, CPU ranks whose buffers exceed the memory available."""
    from mgprof.errors import UsageError
    from mgprof.run.launcher import CPU_RANKS_PER_CORE, MAX_RANKS
    from mgprof.safe_read import format_size

    if ranks < 2:
        raise UsageError("--bandwidth needs --gpus 2 or more: a collective needs peers")
    if not 1 <= iters <= MAX_ITERS:
        raise UsageError(f"--iters must be between 1 and {MAX_ITERS:,}, got {iters}")
    if device_count > 0 and ranks > device_count:
        raise UsageError(
            f"--gpus {ranks} asked for, but only {device_count} CUDA device(s) are visible "
            "(check CUDA_VISIBLE_DEVICES or lower --gpus)"
        )
    cores = os.cpu_count() or 1
    cap = MAX_RANKS if device_count > 0 else CPU_RANKS_PER_CORE * cores
    if ranks > cap:
        raise UsageError(
            f"--gpus {ranks} would start {ranks} CPU ranks (no CUDA device visible) on {cores} "
            f"core(s); at most {cap} are allowed: lower --gpus"
        )
    largest = max(sizes)
    if largest > MAX_MESSAGE_BYTES:
        raise UsageError(
            f"--sizes: {format_size(largest)} is beyond the largest message the probe times "
            f"({format_size(MAX_MESSAGE_BYTES)}); give smaller --sizes"
        )
    if device_count == 0:
        need = cpu_bytes_needed(ranks, largest)
        free = _available_memory()
        if free is not None and need > free:
            raise UsageError(
                f"--sizes {format_size(largest)} on {ranks} CPU ranks needs about "
                f"{format_size(need)} of memory and {format_size(free)} is available; give "
                "smaller --sizes or fewer --gpus"
            )


def cpu_bytes_needed(ranks: int, nbytes: int) -> int:
    """Memory the CPU ranks hold at once for one message size: each rank's largest op keeps
    the full buffer and a shard (all-gather's output and input, reduce-scatter's)."""
    return ranks * (nbytes + nbytes // ranks)


def _available_memory() -> int | None:
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except (ImportError, OSError):
        return None


def worker_command() -> list[str]:
    """``[python, -c, STUB]``: one rank of the probe, started the way ``mgprof.run.entry``
    starts a worker (the working directory off ``sys.path``, a parent-death signal)."""
    root = str(Path(__file__).resolve().parent.parent.parent)
    return [sys.executable, "-c", _WORKER_STUB.format(root=root)]


def probe_command(ranks: int, sizes: list[int], iters: int, warmup: int, out: Path) -> list[str]:
    """torchrun on one node, its rendezvous on loopback, as ``mgprof analyze`` runs it."""
    from mgprof.run import entry

    return [
        *entry.python_command("torchrun"), "--standalone",
        "--local-addr=127.0.0.1",  # not the host name: it may map to 127.0.1.1 (launcher)
        f"--nproc-per-node={ranks}", "--no-python", *worker_command(),
        "--sizes", ",".join(str(s) for s in sizes), "--iters", str(iters),
        "--warmup", str(warmup), "--out", str(out),
    ]  # fmt: skip


def probe_env(tmp: Path) -> dict[str, str]:
    """This environment, with the store and gloo's pairs listening on loopback only (nothing
    outside this machine has any business with the probe), and ``tmp`` as the temporary
    folder, so that what torchrun keeps there (its ``torchelastic_*`` logs) goes with it."""
    from mgprof.run import entry
    from mgprof.run.launcher import LOOPBACK_IFNAME

    env = dict(os.environ)
    env[entry.LOOPBACK_ENV] = "1"
    env.setdefault("GLOO_SOCKET_IFNAME", LOOPBACK_IFNAME)
    env["PYTHONUNBUFFERED"] = "1"
    env["TMPDIR"] = str(tmp)
    return env


def run_probe(
    ranks: int,
    sizes: list[int],
    iters: int = 10,
    warmup: int = 2,
    timeout_s: float = 600.0,
    device_count: int | None = None,
) -> dict[str, Any]:
    """Launch the probe on ``ranks`` local processes (torchrun) and return rank 0's result.

    Raises UsageError before launching for a request that cannot run here (``check_request``),
    and with the workers' last error when the launch fails or times out; ``Stopped`` when a
    signal ends it. Every process started is ended and the temporary folder removed on each of
    these paths.
    """
    from mgprof.errors import UsageError
    from mgprof.run.launcher import cuda_device_count

    count = cuda_device_count() if device_count is None else device_count
    check_request(ranks, sizes, iters, count)
    import tempfile

    with tempfile.TemporaryDirectory(prefix="mgprof-bw-") as tmp:
        out = Path(tmp) / "bandwidth.json"
        log = Path(tmp) / "probe.log"
        cmd = probe_command(ranks, sizes, iters, warmup, out)
        code = _run_tree(cmd, probe_env(Path(tmp)), log, timeout_s)
        if code is None:
            raise UsageError(
                f"the bandwidth probe did not finish in {timeout_s:g} s; try fewer or smaller "
                "--sizes"
            )
        if code != 0 or not out.exists():
            raise UsageError(f"the bandwidth probe failed: {failure_line(log, code)}")
        result: dict[str, Any] = json.loads(out.read_text())
        return result


def _run_tree(cmd: list[str], env: dict[str, str], log: Path, timeout_s: float) -> int | None:
    """Run ``cmd`` in a session of its own, its output into ``log``; its exit code, or None
    when it ran past ``timeout_s`` (then stopped). A stop signal stops the whole tree and
    raises ``Stopped``."""
    import subprocess

    from mgprof.run.process_tree import ProcessTree, Stopped, stop_signals

    with stop_signals(), open(log, "wb") as sink:
        proc = subprocess.Popen(
            cmd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        tree = ProcessTree(proc.pid)
        deadline = time.monotonic() + timeout_s
        try:
            while proc.poll() is None:
                if time.monotonic() > deadline:
                    stop_tree(proc, tree, signal.SIGTERM)
                    return None
                tree.scan(force=False)
                time.sleep(0.1)
        except Stopped as exc:
            stop_tree(proc, tree, exc.forward)
            raise
        tree.end_leftovers()
        return proc.returncode


def stop_tree(proc: Any, tree: Any, sig: int, grace_s: float = STOP_GRACE_S) -> None:
    """``sig`` to torchrun's group and to every rank seen, then SIGKILL to whatever is left
    after ``grace_s`` (at once on a second signal): the probe's ranks hold nothing to save."""
    from mgprof.run.process_tree import Stopped, ignore_stop_signals, signal_group

    tree.scan()
    signal_group(proc.pid, sig)
    tree.signal_all(sig)  # torchrun gives each rank a session of its own
    deadline = time.monotonic() + grace_s
    try:
        while tree.alive() and time.monotonic() < deadline:
            time.sleep(0.1)
    except Stopped:
        pass
    ignore_stop_signals()
    tree.kill_all()
    proc.wait()


_ERROR_LINE = re.compile(r"^\s*(?:[\w.]+(?:Error|Exception)|error):\s*\S", re.IGNORECASE)


def failure_line(log: Path, code: int) -> str:
    """The line that says why the probe failed: the last exception line of its output (a
    rank's, or torchrun's), else the last line that is not a banner rule or torch's noise."""
    try:
        text = log.read_bytes()[-64 * 1024 :].decode("utf-8", "replace")
    except OSError:
        text = ""
    lines = [
        ln.strip()
        for ln in text.splitlines()
        if ln.strip() and "USDT:" not in ln and ln.strip().strip("=-*") != ""
    ]
    errors = [ln for ln in lines if _ERROR_LINE.match(ln)]
    found = errors[-1] if errors else lines[-1] if lines else f"exit code {code}"
    return found[:300]


def worker_start(parent: int) -> None:
    """The worker stub's body: parent-death signal (a rank whose torchrun died stops), then
    the probe with ``sys.argv[1:]``."""
    from mgprof.parent_death import parent_death_signal

    if parent_death_signal(signal.SIGTERM) and os.getppid() != parent:
        sys.exit(128 + signal.SIGTERM)
    sys.exit(main(sys.argv[1:]))


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
