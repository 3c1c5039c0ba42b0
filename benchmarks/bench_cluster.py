"""Large jobs: time and peak memory per worker of ``analyze_job`` over 1 to 1,024 ranks, run
serially, on local processes and on a Dask LocalCluster of 1 and 2 workers, with and without the
summary cache; and the cache's format, msgpack against Parquet.

Synthetic jobs: the real A100 NCCL rank (``gpu-nccl-a100-rank0of2``) replicated with time shifts
until a rank holds ``--target-mb`` MB of JSON, one ``rank-N.pt.trace.json.gz`` per rank whose
``distributedInfo`` says rank N of the job's rank count. Each file is two gzip members (a gzip
reader reads them as one stream): a small one with the file's own metadata, and the events,
compressed once and shared byte for byte by every rank, so a 1,024 × 25 MB job takes ~2 GB of
disk instead of 25 GB and is written in seconds. Every rank is parsed in full, as a real rank
would be; as the files are in the page cache, the figures are CPU time, not disk reads.

Each measurement runs in a fresh subprocess (this script with ``--measure``): the time is that of
``analyze_job`` alone (process start, imports and the LocalCluster's start are reported apart);
peak memory is the peak RSS (VmHWM) of the process itself and of its largest descendant (the
local worker processes, or the Dask worker processes, which the LocalCluster's nannies start as
children of that process), read every 50 ms (the mark only grows, so little is missed).

Targets (exit 1 when missed), at the largest rank count:
  - cold (no cache), best executor: ≤ 180 s;
  - warm (every summary from the cache): ≤ 10 s;
  - peak RSS per worker ≤ 1.5 × the peak of a process that analyses one rank;
  - Dask with 2 workers ≥ 1.7 × as fast as with 1.

    python benchmarks/bench_cluster.py [--ranks 1,8,64,256,1024] [--target-mb 25] [--json F]
    python benchmarks/bench_cluster.py --quick     # 1, 8, 64 ranks × 8 MB, about a minute

Needs ``pip install 'mgprof[dask]' psutil``; ``pyarrow`` for the format comparison (skipped
without it). Generated traces go to a temporary folder (``--tmp``), removed at the end.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "tests" / "data" / "traces" / "gpu-nccl-a100-rank0of2" / "rank-0.json.gz"

COLD_TARGET_S = 180.0
WARM_TARGET_S = 10.0
MEMORY_TARGET = 1.5
DASK_SPEEDUP_TARGET = 1.7


# -- synthetic jobs -------------------------------------------------------------------------


def make_body(target_mb: float) -> tuple[bytes, dict[str, Any], int]:
    """The events member (gzip) of every rank, the metadata to put before it, and its size in
    bytes once decompressed."""
    doc = msgspec.json.decode(gzip.decompress(SOURCE.read_bytes()))
    events = doc.pop("traceEvents")
    xs = [e for e in events if e.get("ph") == "X" and "dur" in e]
    span = max(e["ts"] + e["dur"] for e in xs) - min(e["ts"] for e in xs)
    lines: list[bytes] = []
    size = 0
    k = 0
    while size < target_mb * 1e6:
        shift = k * (span + 1000.0)
        for e in events:
            e2 = dict(e)
            if "ts" in e2:
                e2["ts"] = e2["ts"] + shift
            args = e2.get("args")
            if isinstance(args, dict) and "correlation" in args:
                e2["args"] = {**args, "correlation": args["correlation"] + k * 10_000_000}
            line = msgspec.json.encode(e2)
            lines.append(line)
            size += len(line) + 2
            if size >= target_mb * 1e6:
                break
        k += 1
    body = b'  "traceEvents": [\n' + b",\n".join(lines) + b"\n  ]\n}\n"
    return gzip.compress(body, compresslevel=6, mtime=0), doc, len(body)


def write_job(folder: Path, ranks: int, body_gz: bytes, meta: dict[str, Any]) -> None:
    folder.mkdir(parents=True)
    for r in range(ranks):
        m = dict(meta)
        m["distributedInfo"] = {
            **(meta.get("distributedInfo") or {}),
            "rank": r,
            "world_size": ranks,
        }
        head = b"{\n" + b"".join(
            f"  {json.dumps(k)}: {json.dumps(v)},\n".encode() for k, v in m.items()
        )
        (folder / f"rank-{r}.pt.trace.json.gz").write_bytes(gzip.compress(head, mtime=0) + body_gz)


# -- one measurement, in its own process -----------------------------------------------------


def _hwm_mib(pid: int | str) -> float:
    """The process's peak resident set (VmHWM, Linux), MiB; 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class PeakWatch:
    """Peak RSS of every process below this one (worker processes come and go), read from
    VmHWM every 50 ms: the high-water mark only grows, so a sample misses at most what a worker
    gained in its last 50 ms. ``getrusage`` cannot be used: Linux carries a parent's peak over
    into a forked child (and across exec), so a worker would show its parent's size."""

    def __init__(self) -> None:
        import threading

        self.peaks: dict[int, float] = {}
        self.cpu: dict[int, float] = {}
        """CPU seconds (user + system) of each descendant, last seen."""
        self.cpu_at_start = dict(self._cpu_now())
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import psutil

        me = psutil.Process()
        while not self._stop.wait(0.05):
            self.sample(me)

    def sample(self, me: Any) -> None:
        import psutil

        try:
            children = me.children(recursive=True)
        except psutil.Error:
            return
        for child in children:
            hwm = _hwm_mib(child.pid)
            if hwm > self.peaks.get(child.pid, 0.0):
                self.peaks[child.pid] = hwm
            try:
                t = child.cpu_times()
                self.cpu[child.pid] = t.user + t.system
            except psutil.Error:
                pass

    @staticmethod
    def _cpu_now() -> list[tuple[int, float]]:
        import psutil

        out = []
        for p in [psutil.Process(), *psutil.Process().children(recursive=True)]:
            try:
                t = p.cpu_times()
                out.append((p.pid, t.user + t.system))
            except psutil.Error:
                pass
        return out

    def stop(self) -> float:
        """The largest peak of any one descendant, MiB (0: none ran)."""
        import psutil

        self.sample(psutil.Process())
        self._stop.set()
        self._thread.join()
        return max(self.peaks.values(), default=0.0)

    def cpu_seconds(self) -> float:
        """CPU time of this process and its descendants since the watch started (descendants
        that ended count as last sampled)."""
        import os as _os

        me = _os.getpid()
        now = dict(self._cpu_now())
        total = now[me] - self.cpu_at_start.get(me, 0.0)
        for pid, cpu in {**self.cpu, **{k: v for k, v in now.items() if k != me}}.items():
            total += cpu - self.cpu_at_start.get(pid, 0.0)
        return total


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """Run in a fresh process: ``analyze_job`` over ``spec["folder"]`` with one executor."""
    t_import = time.perf_counter()
    from mgprof.analyze.execution.cache import TraceCache
    from mgprof.analyze.execution.executor import DaskExecutor, ProcessExecutor
    from mgprof.analyze.trace.job import analyze_job, find_trace_files

    (files,) = find_trace_files([spec["folder"]]).values()
    imported = time.perf_counter() - t_import
    cache: Any = TraceCache(spec["cache"]) if spec.get("cache") else False
    cluster = None
    started = 0.0
    if spec["executor"].startswith("dask"):
        import dask
        from distributed import LocalCluster

        # "dask2-noprofile": workers without Dask's statistical profiler (a thread that samples
        # the task's stack every 10 ms and keeps an hour of history), the only worker setting
        # varied here
        name, _, variant = spec["executor"].partition("-")
        if variant == "noprofile":
            dask.config.set({"distributed.worker.profile.enabled": False})
        t0 = time.perf_counter()
        cluster = LocalCluster(
            n_workers=int(name[4:]),
            threads_per_worker=1,
            processes=True,
            dashboard_address=":0",
            host="127.0.0.1",
            memory_limit=0,
        )
        executor: Any = DaskExecutor(cluster.scheduler_address)
        started = time.perf_counter() - t0
    else:
        executor = ProcessExecutor(int(spec["executor"][9:] or 1))
    load0 = os.getloadavg()[0]
    watch = PeakWatch()
    t0 = time.perf_counter()
    job = analyze_job(files, executor=executor, cache=cache)
    wall = time.perf_counter() - t0
    load1 = os.getloadavg()[0]
    child_peak = watch.stop()
    cpu = watch.cpu_seconds()
    executor.close()
    if cluster is not None:
        cluster.close()
    out = {
        **spec,
        "ranks_analysed": len(job.ranks),
        "skipped": job.not_applicable.get("skipped_files"),
        "seconds": wall,
        "import_s": imported,
        "cluster_start_s": started,
        "main_peak_mib": _hwm_mib("self"),
        "child_peak_mib": child_peak,
        "cpu_s": cpu,
        "load_before": load0,
        "load_after": load1,
    }
    if isinstance(cache, TraceCache):
        out.update(hits=cache.hits, writes=cache.writes)
    return out


def run_measure(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, __file__, "--measure", json.dumps(spec)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise SystemExit(f"measurement failed: {spec}\n{proc.stderr[-3000:]}")
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    row["process_s"] = time.perf_counter() - t0
    # in-process runs (one rank, or serial) have no worker: the process is the worker
    row["worker_peak_mib"] = (
        row["child_peak_mib"] if row["child_peak_mib"] > 0 else row["main_peak_mib"]
    )
    return row


def cli_warm(folder: str, cache: str, ranks: int, out: Path, timeout: float) -> dict[str, Any]:
    """``mgprof trace FOLDER --json --out FILE`` end to end with every summary cached: process
    start, imports, cross-rank matching and writing the JSON included."""
    env = {**os.environ, "MGPROF_CACHE_DIR": cache}
    env.pop("MGPROF_NO_CACHE", None)
    cmd = [sys.executable, "-m", "mgprof", "trace", folder, "--json", "--out", str(out), "--force"]
    t0 = time.perf_counter()
    # run from the output's folder: `python -m` puts the working directory first on sys.path,
    # and the repository root would shadow the mgprof being measured
    subprocess.run(cmd, check=True, env=env, cwd=out.parent, timeout=timeout, capture_output=True)
    wall = time.perf_counter() - t0
    size = out.stat().st_size
    out.unlink()
    return {
        "ranks": ranks,
        "executor": "mgprof trace --json --out",
        "phase": "cache warm, CLI",
        "seconds": wall,
        "ranks_analysed": ranks,
        "json_mb": size / 1e6,
        "worker_peak_mib": 0.0,
        "child_peak_mib": 0.0,
        "main_peak_mib": 0.0,
        "load_before": os.getloadavg()[0],
        "load_after": os.getloadavg()[0],
    }


# -- the cache's format ------------------------------------------------------------------------


def formats(rank_file: Path, repeat: int = 200) -> dict[str, Any]:
    """msgpack (what the cache writes) against Parquet (collective calls as columns, the rest of
    the summary as msgpack in the file's metadata) for one rank's summary."""
    from mgprof.analyze.trace.comm_types import CollectiveCall
    from mgprof.analyze.trace.summary import RankTraceSummary, analyze_trace_file

    t0 = time.perf_counter()
    summary = analyze_trace_file(rank_file)
    parse_s = time.perf_counter() - t0
    dec = msgspec.msgpack.Decoder(RankTraceSummary)
    tmp = Path(tempfile.mkdtemp(prefix="mgprof-fmt-"))
    out: dict[str, Any] = {
        "parse_json_s": parse_s,
        "collective_calls": len(summary.collective_calls),
    }

    def mp_write(p: Path) -> None:
        p.write_bytes(msgspec.msgpack.encode(summary))

    def mp_read(p: Path) -> Any:
        return dec.decode(p.read_bytes())

    cases: list[tuple[str, Any, Any]] = [("msgpack", mp_write, mp_read)]
    try:
        t0 = time.perf_counter()
        import pyarrow as pa
        import pyarrow.parquet as pq

        out["pyarrow_import_s"] = time.perf_counter() - t0
        fields = CollectiveCall.__struct_fields__
        schema = pa.schema(
            [
                ("type", pa.string()),
                ("start_us", pa.float64()),
                ("dur_us", pa.float64()),
                ("exposed_us", pa.float64()),
                ("bytes", pa.int64()),
                ("group_size", pa.int64()),
                ("pg", pa.string()),
                ("seq", pa.string()),
                ("launch_only", pa.bool_()),
            ]
        )

        def pq_write(p: Path) -> None:
            rest = msgspec.structs.replace(summary, collective_calls=[])
            cols = {f: [getattr(c, f) for c in summary.collective_calls] for f in fields}
            meta = {b"summary": msgspec.msgpack.encode(rest)}
            pq.write_table(pa.table(cols, schema=schema.with_metadata(meta)), p)

        def pq_read(p: Path) -> Any:
            t = pq.read_table(p)
            rest = dec.decode(t.schema.metadata[b"summary"])
            cols = t.to_pydict()
            calls = [CollectiveCall(*row) for row in zip(*(cols[f] for f in fields))]
            return msgspec.structs.replace(rest, collective_calls=calls)

        cases.append(("parquet", pq_write, pq_read))
    except ImportError:
        out["parquet"] = "pyarrow not installed"
    want = msgspec.to_builtins(summary)
    for name, write, read in cases:
        p = tmp / f"entry.{name}"
        t0 = time.perf_counter()
        for _ in range(repeat):
            write(p)
        w = (time.perf_counter() - t0) / repeat
        t0 = time.perf_counter()
        for _ in range(repeat):
            got = read(p)
        r = (time.perf_counter() - t0) / repeat
        assert msgspec.to_builtins(got) == want, name
        out[name] = {"write_ms": w * 1e3, "read_ms": r * 1e3, "kb": p.stat().st_size / 1e3}
    shutil.rmtree(tmp)
    return out


# -- the whole benchmark -------------------------------------------------------------------------


def versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    import psutil

    parts = [
        f"python {platform.python_version()}",
        f"cores {os.cpu_count()}",
        f"RAM {psutil.virtual_memory().total / 2**30:.0f} GiB",
    ]
    for pkg in ("mgprof", "msgspec", "numpy", "dask", "distributed", "pyarrow"):
        try:
            parts.append(f"{pkg} {version(pkg)}")
        except PackageNotFoundError:
            parts.append(f"{pkg} missing")
    return ", ".join(parts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--measure", help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="1, 8, 64 ranks × 8 MB")
    ap.add_argument("--ranks", help="comma-separated rank counts (1,8,64,256,1024)")
    ap.add_argument("--target-mb", type=float, help="MB of JSON per rank (25)")
    ap.add_argument(
        "--executors",
        default="serial,processes2,dask1,dask2",
        help="executors to time without the cache (serial, processesN, daskN, daskN-noprofile)",
    )
    ap.add_argument(
        "--serial-up-to",
        type=int,
        default=1 << 30,
        help="run serial and dask1 only up to this many ranks (they take twice as long)",
    )
    ap.add_argument(
        "--repeat", type=int, default=1, help="times each uncached executor runs (alternated)"
    )
    ap.add_argument("--tmp", default=None, help="folder for the generated traces (default: TMPDIR)")
    ap.add_argument("--timeout", type=float, default=1800.0, help="per measurement, seconds")
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = ap.parse_args()
    if args.measure:
        print(json.dumps(measure(json.loads(args.measure))))
        return 0
    counts = [
        int(x) for x in (args.ranks or ("1,8,64" if args.quick else "1,8,64,256,1024")).split(",")
    ]
    mb = args.target_mb or (8.0 if args.quick else 25.0)
    executors = args.executors.split(",")
    print(versions(), flush=True)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="mgprof-cluster-", dir=args.tmp) as tmp_s:
        tmp = Path(tmp_s)
        t0 = time.perf_counter()
        body, meta, body_bytes = make_body(mb)
        for n in counts:
            write_job(tmp / f"job{n}", n, body, meta)
        disk = sum(f.stat().st_size for f in tmp.rglob("*.gz"))
        per_rank_mb = (body_bytes + 4000) / 1e6
        print(
            f"generated {sum(counts)} rank files of {per_rank_mb:.1f} MB JSON "
            f"({len(body) / 1e6:.2f} MB gzip), {disk / 1e9:.2f} GB on disk, in "
            f"{time.perf_counter() - t0:.0f} s",
            flush=True,
        )
        fmt = formats(tmp / f"job{counts[0]}" / "rank-0.pt.trace.json.gz")
        print(f"formats: {json.dumps(fmt)}", flush=True)
        for n in counts:
            folder = str(tmp / f"job{n}")
            plan = [e for e in executors if n <= args.serial_up_to or e not in ("serial", "dask1")]
            for rep in range(args.repeat):
                # alternate the order, so that a change in the machine's load between runs
                # does not always favour the same executor
                for e in plan if rep % 2 == 0 else plan[::-1]:
                    spec = {"folder": folder, "executor": e, "ranks": n, "repeat": rep}
                    row = run_measure(spec, args.timeout)
                    rows.append(row)
                    _print_row(row, flush=True)
            cache = str(tmp / f"cache{n}")
            for e, phase in (("processes2", "cache cold"), ("processes2", "cache warm")):
                spec = {"folder": folder, "executor": e, "ranks": n, "cache": cache, "phase": phase}
                row = run_measure(spec, args.timeout)
                rows.append(row)
                _print_row(row, flush=True)
            if "dask2" in executors:
                spec = {
                    "folder": folder,
                    "executor": "dask2",
                    "ranks": n,
                    "cache": cache,
                    "phase": "cache warm",
                }
                row = run_measure(spec, args.timeout)
                rows.append(row)
                _print_row(row, flush=True)
            rows.append(cli_warm(folder, cache, n, tmp / "out.json", args.timeout))
            _print_row(rows[-1], flush=True)
            shutil.rmtree(cache)
    ok = summarize(rows, counts, per_rank_mb, fmt)
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "formats": fmt}, indent=2))
    return 0 if ok else 1


def _label(row: dict[str, Any]) -> str:
    return row["executor"] + (f" ({row['phase']})" if row.get("phase") else "")


def _print_row(row: dict[str, Any], flush: bool = False) -> None:
    extra = f", {row['hits']} hits / {row['writes']} writes" if "hits" in row else ""
    if "json_mb" in row:
        extra = f", {row['json_mb']:.0f} MB of JSON written"
    print(
        f"  {row['ranks']:>5} ranks  {_label(row):<24} {row['seconds']:8.2f} s  "
        f"worker peak {row['worker_peak_mib']:6.0f} MiB  "
        f"main peak {row['main_peak_mib']:6.0f} MiB  "
        f"load {row['load_before']:.1f}->{row['load_after']:.1f}{extra}",
        flush=flush,
    )
    if row["ranks_analysed"] != row["ranks"]:
        print(f"    only {row['ranks_analysed']} ranks analysed: {row['skipped']}", flush=flush)


def summarize(
    rows: list[dict[str, Any]], counts: list[int], mb: float, fmt: dict[str, Any]
) -> bool:
    top = max(counts)
    by = {(r["ranks"], _label(r)): r for r in rows}
    one = by.get((1, "serial"))
    print()
    print(
        f"{'ranks':>6} {'executor':<26}{'s':>9}{'s/rank':>8}{'MB/s':>8}{'worker MiB':>11}"
        f"{'/ 1 rank':>9}{'main MiB':>10}"
    )
    for r in rows:
        ref = one["worker_peak_mib"] if one else float("nan")
        print(
            f"{r['ranks']:>6} {_label(r):<26}{r['seconds']:>9.2f}{r['seconds'] / r['ranks']:>8.3f}"
            f"{r['ranks'] * mb / r['seconds']:>8.0f}{r['worker_peak_mib']:>11.0f}"
            f"{r['worker_peak_mib'] / ref:>9.2f}{r['main_peak_mib']:>10.0f}"
        )
    ok = True
    cold = [r for r in rows if r["ranks"] == top and r.get("phase") in (None, "cache cold")]
    if cold:
        best = min(cold, key=lambda r: r["seconds"])
        met = best["seconds"] <= COLD_TARGET_S
        ok &= met
        print(
            f"cold, {top} ranks: {best['seconds']:.1f} s ({_label(best)}) "
            f"<= {COLD_TARGET_S:.0f} s: {'met' if met else 'MISSED'}"
        )
    warm = [r for r in rows if r["ranks"] == top and r.get("phase") == "cache warm"]
    if warm:
        worst = max(warm, key=lambda r: r["seconds"])
        met = worst["seconds"] <= WARM_TARGET_S and all(r["hits"] == top for r in warm)
        ok &= met
        print(
            f"warm, {top} ranks: {worst['seconds']:.2f} s <= {WARM_TARGET_S:.0f} s: "
            f"{'met' if met else 'MISSED'}"
        )
    if one:
        for r in rows:
            if r["ranks"] != top or not r["child_peak_mib"]:
                continue  # no worker ran (one rank, serial, or every summary from the cache)
            ratio = r["worker_peak_mib"] / one["worker_peak_mib"]
            met = ratio <= MEMORY_TARGET
            ok &= met
            same = by.get((1, _label(r)))
            growth = (
                f"; {r['worker_peak_mib'] / same['worker_peak_mib']:.2f} × its own peak at 1 rank"
                if same
                else ""
            )
            print(
                f"peak per worker, {top} ranks, {_label(r)}: {ratio:.2f} × one rank's "
                f"({r['worker_peak_mib']:.0f} / {one['worker_peak_mib']:.0f} MiB) "
                f"<= {MEMORY_TARGET}: {'met' if met else 'MISSED'}{growth}"
            )
    d1s = [r["seconds"] for r in rows if r["ranks"] == top and _label(r) == "dask1"]
    d2s = [r["seconds"] for r in rows if r["ranks"] == top and _label(r) == "dask2"]
    if d1s and d2s:
        import statistics

        speedup = statistics.median(a / b for a, b in zip(d1s, d2s))
        if len(d1s) > 1:
            print(
                "Dask 1 worker / 2 workers, each repeat: "
                + ", ".join(f"{a:.1f}/{b:.1f} s = {a / b:.2f}x" for a, b in zip(d1s, d2s))
            )
        met = speedup >= DASK_SPEEDUP_TARGET
        ok &= met
        print(
            f"Dask 2 workers vs 1, {top} ranks: {speedup:.2f}x >= {DASK_SPEEDUP_TARGET}: "
            f"{'met' if met else 'MISSED'}"
        )
    if "parquet" in fmt and isinstance(fmt["parquet"], dict):
        m, p = fmt["msgpack"], fmt["parquet"]
        print(
            f"cache format, one rank: msgpack write {m['write_ms']:.2f} ms, "
            f"read {m['read_ms']:.2f} ms, {m['kb']:.0f} kB; Parquet write {p['write_ms']:.2f} ms, "
            f"read {p['read_ms']:.2f} ms, {p['kb']:.0f} kB, + {fmt['pyarrow_import_s']:.2f} s to "
            f"import pyarrow; parsing the JSON {fmt['parse_json_s']:.2f} s"
        )
    return ok


if __name__ == "__main__":
    raise SystemExit(main())
