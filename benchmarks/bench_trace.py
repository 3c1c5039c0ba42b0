"""Side-by-side: ``mgprof`` trace analysis vs HolisticTraceAnalysis (HTA) on the same folders.

Each tool runs in its own fresh subprocess (imports included, as a user would run it); wall time
is measured around the subprocess and peak memory is the largest summed PSS (proportional set
size: shared pages split between the processes that share them, so forked workers are not counted
twice) of the subprocess and all its children, sampled every 50 ms with psutil; both tools use
worker processes, so a single process's ru_maxrss would undercount either one.

Cases: (a) a real multi-rank fixture folder; (b) a large job synthesised by replicating a real
GPU trace with time shifts (default 8 ranks × ~20 MB, ``distributedInfo.rank`` set per file).

Exit status 1 unless mgprof is ≥10x faster and uses ≤1/4 of HTA's peak memory on case (b).
Run: ``python benchmarks/bench_trace.py`` (needs ``pip install HolisticTraceAnalysis psutil``).
"""

from __future__ import annotations

import argparse
import gzip
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
import psutil

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT.parent / "shared" / "fixtures" / "traces"
SOURCE = TRACES / "gpu-nccl-a100-rank0of2" / "rank-0.json.gz"


def make_large_job(out: Path, ranks: int, target_mb: float) -> float:
    """Write ``ranks`` files of about ``target_mb`` MB each; return the mean file size in MB."""
    doc = orjson.loads(gzip.decompress(SOURCE.read_bytes()))
    events = doc["traceEvents"]
    one_copy = len(orjson.dumps(events)) / 1e6
    copies = max(1, round(target_mb / one_copy))
    xs = [e for e in events if e.get("ph") == "X" and "dur" in e]
    span = max(e["ts"] + e["dur"] for e in xs) - min(e["ts"] for e in xs)
    sizes = []
    for rank in range(ranks):
        out_events = []
        for k in range(copies):
            shift = k * (span + 1000.0) + rank * 3.0  # ranks drift a little, as real ones do
            for e in events:
                e2 = dict(e)
                if "ts" in e2:
                    e2["ts"] = e2["ts"] + shift
                args = e2.get("args")
                if isinstance(args, dict) and "correlation" in args:
                    e2["args"] = {**args, "correlation": args["correlation"] + k * 10_000_000}
                out_events.append(e2)
        info = dict(doc.get("distributedInfo") or {})
        info.update(rank=rank, world_size=ranks)
        meta = {k: v for k, v in doc.items() if k != "traceEvents"}
        meta["distributedInfo"] = info
        # Kineto's layout: metadata with ", "/": " separators (HTA finds the rank by the regex
        # '"rank":\\s+(\\d+)'), then one event per line.
        head = b"".join(f"  {json.dumps(k)}: {json.dumps(v)},\n".encode() for k, v in meta.items())
        data = (
            b"{\n"
            + head
            + b'  "traceEvents": [\n'
            + b",\n".join(orjson.dumps(e) for e in out_events)
            + b"\n  ]\n}\n"
        )
        (out / f"rank-{rank}.json").write_bytes(data)
        sizes.append(len(data) / 1e6)
    return sum(sizes) / len(sizes)


_MGPROF = """
import sys
from mgprof.analyze.trace_summary import analyze_job, find_trace_files
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


def measure(code: str, folder: Path, timeout: float) -> tuple[float, float, str]:
    """Run ``code`` on ``folder`` in a subprocess: (wall seconds, peak tree PSS MiB, stdout)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(folder)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
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
            proc.kill()
            raise SystemExit(f"timed out after {timeout} s on {folder}")
        time.sleep(0.05)
    wall = time.perf_counter() - t0
    out = proc.stdout.read().decode() if proc.stdout else ""
    if proc.returncode != 0:
        raise SystemExit(f"benchmark subprocess failed (exit {proc.returncode}) on {folder}")
    return wall, peak / 2**20, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--target-mb", type=float, default=20.0)
    ap.add_argument("--timeout", type=float, default=240.0)
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = ap.parse_args()

    from importlib.metadata import version

    import hta  # noqa: F401 - fail early with a clear error when HTA is missing

    results = []
    with tempfile.TemporaryDirectory(prefix="mgprof-bench-") as tmp:
        large = Path(tmp) / "large"
        large.mkdir()
        mb = make_large_job(large, args.ranks, args.target_mb)
        cases = [
            (
                "(a) fixture gpu-nccl-128ranks-sampled, 2 ranks",
                TRACES / "gpu-nccl-128ranks-sampled",
            ),
            (f"(b) synthetic {args.ranks} ranks × {mb:.1f} MB", large),
        ]
        for label, folder in cases:
            m_wall, m_mem, _ = measure(_MGPROF, folder, args.timeout)
            h_wall, h_mem, _ = measure(_HTA, folder, args.timeout)
            results.append(
                {
                    "case": label,
                    "mgprof_s": m_wall,
                    "hta_s": h_wall,
                    "speedup": h_wall / m_wall,
                    "mgprof_peak_mib": m_mem,
                    "hta_peak_mib": h_mem,
                    "memory_ratio": m_mem / h_mem,
                }
            )
    print(
        f"python {platform.python_version()}, cores {psutil.cpu_count()}, "
        f"RAM {psutil.virtual_memory().total / 2**30:.0f} GiB, "
        f"HTA {version('HolisticTraceAnalysis')}, msgspec {version('msgspec')}"
    )
    print(
        f"{'case':52} {'mgprof s':>9} {'HTA s':>8} {'speedup':>8} "
        f"{'mgprof MiB':>11} {'HTA MiB':>8} {'mem ratio':>9}"
    )
    for r in results:
        print(
            f"{r['case']:52} {r['mgprof_s']:9.2f} {r['hta_s']:8.2f} {r['speedup']:7.1f}x "
            f"{r['mgprof_peak_mib']:11.0f} {r['hta_peak_mib']:8.0f} {r['memory_ratio']:9.2f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    big = results[-1]
    ok = big["speedup"] >= 10 and big["memory_ratio"] <= 0.25
    if not ok:
        print("FAIL: mgprof must be >=10x faster and use <=1/4 of HTA's peak memory on (b)")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
