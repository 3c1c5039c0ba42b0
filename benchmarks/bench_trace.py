"""Side-by-side trace analysis: ``mgprof`` vs HolisticTraceAnalysis (HTA) vs the TensorBoard plugin.

Each tool runs in its own fresh subprocess (imports included, as a user would run it) on the same
folder; wall time is measured around the subprocess and peak memory is the largest summed PSS
(proportional set size: shared pages split between the processes that share them, so forked
workers are not counted twice) of the subprocess and all its children, sampled every 50 ms with
psutil; all three tools use worker processes, so a single process's ru_maxrss would undercount.

Tools:
  mgprof  ``analyze_job`` over the folder (per-rank breakdown, kernels, comm/comp overlap,
          cross-rank collective matching).
  HTA     ``TraceAnalysis(trace_dir=...)``, ``get_temporal_breakdown()``,
          ``get_comm_comp_overlap()``.
  TB      ``torch_tb_profiler.profiler.RunLoader(name, dir, Cache).load()``: what TensorBoard's
          PyTorch profiler plugin runs when it opens a run (overview / operator / kernel / trace
          views per worker and the distributed view). It spawns one process per trace file.

Cases (comparison mode, the default):
  (a) the real 2-rank fixture ``gpu-nccl-128ranks-sampled`` (symlinked under the file names the
      TensorBoard plugin requires, ``*.pt.trace.json[.gz]``; the other tools read the same links);
  (b) a large job synthesised by replicating the real A100 NCCL trace with time shifts
      (default 8 ranks × ~20 MB, ``distributedInfo.rank`` set per file).
  Target on (b): mgprof ≥ 10x faster than HTA with ≤ 1/4 of its peak memory.

Scaling mode (``--scale``, mgprof alone): one synthetic job of ``--ranks`` files (default 64 ×
~8 MB), analysed as its first 1, first 8 and all ranks. Target: peak memory does not grow with
the rank count (peak for all ranks ≤ 1.25 × peak for 8 ranks), i.e. it is bounded by what one
rank's trace needs per worker process.

Exit status 1 when a target is missed. Generated traces live in a temporary folder, removed at
the end.

    python benchmarks/bench_trace.py [--ranks 8] [--target-mb 20] [--no-tb] [--json FILE]
    python benchmarks/bench_trace.py --scale [--ranks 64] [--target-mb 8]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
import psutil

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "tests" / "data" / "traces"
SOURCE = TRACES / "gpu-nccl-a100-rank0of2" / "rank-0.json.gz"
FIXTURE = TRACES / "gpu-nccl-128ranks-sampled"

SPEEDUP_TARGET = 10.0
MEMORY_RATIO_TARGET = 0.25
SCALE_GROWTH_TARGET = 1.25


def make_large_job(out: Path, ranks: int, target_mb: float) -> float:
    """Write ``ranks`` files of about ``target_mb`` MB each; return the mean file size in MB."""
    doc = orjson.loads(gzip.decompress(SOURCE.read_bytes()))
    events = doc["traceEvents"]
    one_copy = len(orjson.dumps(events)) / 1e6
    copies = max(1, round(target_mb / one_copy))
    xs = [e for e in events if e.get("ph") == "X" and "dur" in e]
    span = max(e["ts"] + e["dur"] for e in xs) - min(e["ts"] for e in xs)
    # One rank's events, built once; each rank differs by a small time drift (as real ranks do)
    # applied while writing, and by its distributedInfo.
    base = []
    for k in range(copies):
        shift = k * (span + 1000.0)
        for e in events:
            e2 = dict(e)
            if "ts" in e2:
                e2["ts"] = e2["ts"] + shift
            args = e2.get("args")
            if isinstance(args, dict) and "correlation" in args:
                e2["args"] = {**args, "correlation": args["correlation"] + k * 10_000_000}
            base.append(e2)
    sizes = []
    for rank in range(ranks):
        drift = rank * 3.0
        lines = []
        for e in base:
            if "ts" in e:
                e = {**e, "ts": e["ts"] + drift}
            lines.append(orjson.dumps(e))
        info = dict(doc.get("distributedInfo") or {})
        info.update(rank=rank, world_size=ranks)
        meta = {k: v for k, v in doc.items() if k != "traceEvents"}
        meta["distributedInfo"] = info
        # Kineto's layout: metadata with ", "/": " separators (HTA finds the rank by the regex
        # '"rank":\\s+(\\d+)'), then one event per line.
        head = b"".join(f"  {json.dumps(k)}: {json.dumps(v)},\n".encode() for k, v in meta.items())
        data = b"{\n" + head + b'  "traceEvents": [\n' + b",\n".join(lines) + b"\n  ]\n}\n"
        # *.pt.trace.json: the name torch.profiler's tensorboard handler writes, and the only
        # one the TensorBoard plugin's loader accepts.
        (out / f"rank-{rank}.pt.trace.json").write_bytes(data)
        sizes.append(len(data) / 1e6)
    return sum(sizes) / len(sizes)


def link_subset(src: Path, dst: Path, ranks: int) -> Path:
    """A folder of symlinks to the first ``ranks`` rank files of ``src``."""
    dst.mkdir()
    for r in range(ranks):
        name = f"rank-{r}.pt.trace.json"
        (dst / name).symlink_to(src / name)
    return dst


_MGPROF = """
import sys
from mgprof.analyze.trace.job import analyze_job, find_trace_files
for files in find_trace_files([sys.argv[1]]).values():
    job = analyze_job(files)
    print(len(job.ranks), [round(r.totals.busy_pct or 0, 2) for r in job.ranks][:2])
"""
_HTA = """
import sys
from hta.trace_analysis import TraceAnalysis
a = TraceAnalysis(trace_dir=sys.argv[1])
print(a.get_temporal_breakdown(visualize=False).to_string()[:200])
print(a.get_comm_comp_overlap(visualize=False).to_string()[:200])
"""
_TB = """
import sys, tempfile
from torch_tb_profiler import io
from torch_tb_profiler.profiler import RunLoader
with tempfile.TemporaryDirectory() as cache_dir:
    run = RunLoader("bench", sys.argv[1], io.Cache(cache_dir)).load()
    profiles = run.get_profiles()
    workers = [p.worker for p in profiles]
    print(len(profiles), workers)
    n = len([f for f in __import__("os").listdir(sys.argv[1]) if ".pt.trace.json" in f])
    if "All" not in workers or len(profiles) != n + 1:
        sys.exit(f"TB loader gave {len(profiles)} profiles for {n} files: {workers}")
"""
TOOLS = {"mgprof": _MGPROF, "HTA": _HTA, "TB": _TB}


def measure(code: str, folder: Path, timeout: float) -> tuple[float, float, str]:
    """Run ``code`` on ``folder`` in a subprocess: (wall seconds, peak tree PSS MiB, stdout)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(folder)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    ps = psutil.Process(proc.pid)
    peak = 0
    while proc.poll() is None:
        total = 0
        try:
            for p in [ps, *ps.children(recursive=True)]:
                try:
                    total += p.memory_full_info().pss
                except psutil.Error:
                    pass
        except psutil.Error:
            pass
        peak = max(peak, total)
        if time.perf_counter() - t0 > timeout:
            for p in ps.children(recursive=True):
                p.kill()
            proc.kill()
            raise SystemExit(f"timed out after {timeout} s on {folder}")
        time.sleep(0.05)
    wall = time.perf_counter() - t0
    out = proc.stdout.read().decode() if proc.stdout else ""
    err = proc.stderr.read().decode() if proc.stderr else ""
    if proc.returncode != 0:
        raise SystemExit(
            f"benchmark subprocess failed (exit {proc.returncode}) on {folder}:\n{err[-2000:]}"
        )
    return wall, peak / 2**20, out


def versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    parts = [
        f"python {platform.python_version()}",
        f"cores {psutil.cpu_count()}",
        f"RAM {psutil.virtual_memory().total / 2**30:.0f} GiB",
    ]
    for pkg in ("mgprof", "msgspec", "HolisticTraceAnalysis", "torch-tb-profiler", "pandas"):
        try:
            parts.append(f"{pkg} {version(pkg)}")
        except PackageNotFoundError:
            parts.append(f"{pkg} missing")
    return ", ".join(parts)


def compare(args: argparse.Namespace, tmp: Path) -> tuple[list[dict], bool]:
    tools = ["mgprof", "HTA"] + ([] if args.no_tb else ["TB"])
    fixture = tmp / "fixture"
    fixture.mkdir()
    for f in sorted(FIXTURE.glob("rank-*.json.gz")):
        (fixture / f.name.replace(".json.gz", ".pt.trace.json.gz")).symlink_to(f)
    large = tmp / "large"
    large.mkdir()
    mb = make_large_job(large, args.ranks, args.target_mb)
    cases = [
        ("(a) fixture gpu-nccl-128ranks-sampled, 2 ranks × 0.12 MB gz", fixture),
        (f"(b) synthetic {args.ranks} ranks × {mb:.1f} MB", large),
    ]
    rows = []
    for label, folder in cases:
        row: dict = {"case": label}
        for tool in tools:
            wall, mem, _ = measure(TOOLS[tool], folder, args.timeout)
            row[f"{tool}_s"], row[f"{tool}_peak_mib"] = wall, mem
            print(f"  {label}: {tool} {wall:.2f} s, {mem:.0f} MiB", flush=True)
        for tool in tools[1:]:
            row[f"speedup_vs_{tool}"] = row[f"{tool}_s"] / row["mgprof_s"]
            row[f"memory_ratio_vs_{tool}"] = row["mgprof_peak_mib"] / row[f"{tool}_peak_mib"]
        rows.append(row)
    print(versions())
    head = f"{'case':58}" + "".join(f"{t + ' s':>10}{t + ' MiB':>11}" for t in tools)
    print(head + "".join(f"{'x vs ' + t:>10}{'mem/' + t:>9}" for t in tools[1:]))
    for r in rows:
        line = f"{r['case']:58}" + "".join(
            f"{r[t + '_s']:10.2f}{r[t + '_peak_mib']:11.0f}" for t in tools
        )
        line += "".join(
            f"{r['speedup_vs_' + t]:9.1f}x{r['memory_ratio_vs_' + t]:9.2f}" for t in tools[1:]
        )
        print(line)
    big = rows[-1]
    ok = (
        big["speedup_vs_HTA"] >= SPEEDUP_TARGET
        and big["memory_ratio_vs_HTA"] <= MEMORY_RATIO_TARGET
    )
    print(
        f"target on (b): >= {SPEEDUP_TARGET:.0f}x faster than HTA "
        f"(measured {big['speedup_vs_HTA']:.1f}x) with <= {MEMORY_RATIO_TARGET} of its peak "
        f"memory (measured {big['memory_ratio_vs_HTA']:.3f}): {'met' if ok else 'MISSED'}"
    )
    return rows, ok


def scale(args: argparse.Namespace, tmp: Path) -> tuple[list[dict], bool]:
    full = tmp / "all"
    full.mkdir()
    t0 = time.perf_counter()
    mb = make_large_job(full, args.ranks, args.target_mb)
    total_mb = sum(f.stat().st_size for f in full.iterdir()) / 1e6
    print(
        f"generated {args.ranks} ranks × {mb:.1f} MB ({total_mb:.0f} MB) in "
        f"{time.perf_counter() - t0:.0f} s",
        flush=True,
    )
    counts = sorted({1, min(8, args.ranks), args.ranks})
    rows = []
    for n in counts:
        folder = full if n == args.ranks else link_subset(full, tmp / f"first{n}", n)
        wall, mem, _ = measure(_MGPROF, folder, args.timeout)
        rows.append({"ranks": n, "rank_file_mb": mb, "mgprof_s": wall, "mgprof_peak_mib": mem})
        print(f"  {n} ranks: {wall:.2f} s, {mem:.0f} MiB", flush=True)
    print(versions())
    print(f"mgprof workers: {os.cpu_count()} (one per core)")
    print(
        f"{'ranks':>6}{'total MB':>10}{'mgprof s':>10}{'s/rank':>8}{'peak MiB':>10}"
        f"{'peak / 1 rank':>14}{'peak / file':>12}"
    )
    one = rows[0]["mgprof_peak_mib"]
    for r in rows:
        print(
            f"{r['ranks']:>6}{r['ranks'] * mb:>10.0f}{r['mgprof_s']:>10.2f}"
            f"{r['mgprof_s'] / r['ranks']:>8.2f}{r['mgprof_peak_mib']:>10.0f}"
            f"{r['mgprof_peak_mib'] / one:>14.2f}{r['mgprof_peak_mib'] / (mb * 1e6 / 2**20):>12.1f}"
        )
    eight = next(r for r in rows if r["ranks"] == min(8, args.ranks))["mgprof_peak_mib"]
    growth = rows[-1]["mgprof_peak_mib"] / eight
    ok = growth <= SCALE_GROWTH_TARGET
    print(
        f"target: peak at {args.ranks} ranks <= {SCALE_GROWTH_TARGET} × peak at 8 ranks "
        f"(measured {growth:.2f}): {'met' if ok else 'MISSED'}"
    )
    return rows, ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", action="store_true", help="mgprof alone on 1, 8 and --ranks ranks")
    ap.add_argument("--ranks", type=int, help="ranks in the synthetic job (8; 64 with --scale)")
    ap.add_argument("--target-mb", type=float, help="MB per rank file (20; 8 with --scale)")
    ap.add_argument("--no-tb", action="store_true", help="skip the TensorBoard plugin's loader")
    ap.add_argument("--timeout", type=float, default=300.0, help="per tool and case, seconds")
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = ap.parse_args()
    if args.ranks is None:
        args.ranks = 64 if args.scale else 8
    if args.target_mb is None:
        args.target_mb = 8.0 if args.scale else 20.0
    if not args.scale:
        import hta  # noqa: F401 - fail early with a clear error when HTA is missing

        if not args.no_tb:
            import torch_tb_profiler  # noqa: F401

    with tempfile.TemporaryDirectory(prefix="mgprof-bench-") as tmp:
        rows, ok = (scale if args.scale else compare)(args, Path(tmp))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
