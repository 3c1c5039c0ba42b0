"""``mgprof trace`` per MB on CPU-only vs GPU traces, and its whole-process time against HTA.

Every measurement is one fresh process, as a user runs it: ``python -m mgprof trace FILE --json
--workers 1`` (stdout discarded), timed from start to exit; peak memory is the process's own
``ru_maxrss`` (one process: ``--workers 1``). ``--workers auto`` runs ``mgprof trace FILE --json``
as typed, where every core may help (a large trace is then read by two processes; the peak is
the larger of the two, the CPU time their sum). Cases are run in turn, ``--repeat`` rounds, and
each figure is the median (min beside it), so every tool and version sees the same machine load.

Cases (one rank each):
  startup   ``cpu-gloo-fragment`` (25 KB): start-up alone (imports, argument parsing, exit);
  gpu-*     the real GPU fixtures (``gpu-nccl-a100-rank0of2`` 9.8 MB, ``gpu-v100-single``
            15.4 MB, ``gpu-resnet50-v100-old-schema`` 35.2 MB, all gzipped);
  mtia-87   a real MTIA accelerator trace from HTA's own tests
            (``peers/hta-mtia_trace_single_rank``, 86.9 MB), the largest real single trace here;
  gpu-100   the A100 fixture repeated with shifted times to ~100 MB (``bench_trace``'s method);
  cpu-100, cpu-350
            the real CPU gloo DDP fixture (``cpu-gloo-ddp-mlp-2ranks`` rank 0) scaled to ~100 /
            ~350 MB: its ProfilerStep block repeated with shifted timestamps, new step numbers
            and ids, written in Kineto's own layout, so the event mix is a real one.
Per MB figures subtract the start-up case's median: ``ms/MB`` = (wall − start-up) / MB of JSON.

Versions and tools, side by side in the same rounds:
  mgprof      this checkout, or ``--tree DIR``;
  baseline    ``--baseline DIR``: the same command with another checkout first on the path
              (e.g. ``git worktree add ../base <commit>``), for before/after figures;
  HTA         ``--hta`` (HolisticTraceAnalysis importable, or ``--hta-path DIR`` added to its
              PYTHONPATH): ``TraceAnalysis`` + ``get_temporal_breakdown`` +
              ``get_comm_comp_overlap`` on a folder holding the one file, as in bench_trace.py
              (device cases only: gpu-*, mtia-87).

Python caches compiled modules (``.pyc``); an installed package has them. Runs use a private
``PYTHONPYCACHEPREFIX`` warmed once, unless ``--no-bytecode`` (every module compiled at every
start, as under ``PYTHONDONTWRITEBYTECODE=1``).

``gpu-100`` uses bench_trace.py's generator, which needs orjson (see README.md).

Targets (exit 1 when one is missed): CPU ms/MB ≤ 1.5 × GPU ms/MB (cpu-100 vs gpu-100); with
``--hta``, mgprof ≥ 10x faster than HTA on each real device fixture.

    python benchmarks/bench_cpu_trace.py [--repeat 5] [--tree DIR] [--baseline DIR]
        [--hta [--hta-path DIR]] [--cases startup,gpu-v100,cpu-100] [--no-bytecode] [--json F]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "tests" / "data" / "traces"
CPU_SOURCE = TRACES / "cpu-gloo-ddp-mlp-2ranks"
GPU_FIXTURES = {
    "gpu-a100": TRACES / "gpu-nccl-a100-rank0of2",
    "gpu-v100": TRACES / "gpu-v100-single",
    "gpu-resnet50": TRACES / "gpu-resnet50-v100-old-schema",
    # an accelerator (MTIA) trace from HTA's own tests: the largest real single-rank trace here
    "mtia-87": TRACES / "peers" / "hta-mtia_trace_single_rank",
}
CPU_PER_MB_TARGET = 1.5
HTA_SPEEDUP_TARGET = 10.0

_HTA = """
import sys
from hta.trace_analysis import TraceAnalysis
a = TraceAnalysis(trace_dir=sys.argv[1])
print(a.get_temporal_breakdown(visualize=False).to_string()[:200])
print(a.get_comm_comp_overlap(visualize=False).to_string()[:200])
"""


# --- scaled traces ----------------------------------------------------------------------------


def _num(v: object) -> str:
    return f"{v:.3f}" if isinstance(v, float) else json.dumps(v)


def _kineto_event(e: dict[str, Any]) -> str:
    """One event as Kineto writes it: a key per line, ``args`` on one line after a lone comma."""
    body = ",\n".join(
        f"    {json.dumps(k)}: {_num(v) if k in ('ts', 'dur') else json.dumps(v)}"
        for k, v in e.items()
        if k != "args"
    )
    if "args" in e:
        args = ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in e["args"].items())
        body += '\n    ,\n    "args": {\n      ' + args + "\n    }"
    return "  {\n" + body + "\n  }"


def scale_cpu_trace(out: Path, target_mb: float) -> float:
    """Repeat the CPU fixture's ProfilerStep block until the file holds ~``target_mb`` MB."""
    src = sorted(CPU_SOURCE.glob("rank0.*.json.gz"))[0]
    doc = json.loads(gzip.decompress(src.read_bytes()))
    events = doc["traceEvents"]
    steps = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
    lo = min(e["ts"] for e in steps)
    hi = max(e["ts"] + e["dur"] for e in steps)
    period = hi - lo + 500.0

    def in_block(e: dict[str, Any]) -> bool:
        return e.get("ph") != "M" and "ts" in e and lo <= e["ts"] < hi and e.get("cat") != "Trace"

    block = [e for e in events if in_block(e)]
    copies = max(1, round(target_mb * 1e6 / sum(len(_kineto_event(e)) + 2 for e in block)))
    with out.open("w") as fh:
        fh.write("{\n")
        for k, v in doc.items():
            if k not in ("traceEvents", "traceName"):
                fh.write(f"  {json.dumps(k)}: {json.dumps(v)},\n")
        fh.write('  "traceEvents": [\n')
        rest = [e for e in events if not in_block(e)]
        for i, e in enumerate(rest):
            if e.get("cat") == "Trace":  # the profiler's own span covers every copy
                e = {**e, "dur": e["dur"] + (copies - 1) * period}
            elif "ts" in e and e["ts"] >= hi:
                e = {**e, "ts": e["ts"] + (copies - 1) * period}
            fh.write(("" if i == 0 else ",\n") + _kineto_event(e))
        for k in range(copies):
            for e in block:
                e2 = dict(e, ts=e["ts"] + k * period)
                name = str(e.get("name", ""))
                if name.startswith("ProfilerStep#"):
                    e2["name"] = f"ProfilerStep#{int(name[13:]) + k * len(steps)}"
                if isinstance(e2.get("id"), int):
                    e2["id"] += k * 1_000_000
                if isinstance(e2.get("args"), dict):
                    args = dict(e2["args"])
                    for key in ("External id", "Ev Idx", "Sequence number"):
                        if isinstance(args.get(key), int) and args[key] > 0:
                            args[key] += k * 1_000_000
                    e2["args"] = args
                fh.write(",\n" + _kineto_event(e2))
        fh.write('\n  ],"traceName": "scaled.pt.trace.json" }\n')
    return out.stat().st_size / 1e6


def scale_gpu_trace(out_dir: Path, target_mb: float) -> float:
    """The A100 fixture repeated to ~``target_mb`` MB (bench_trace.py's generator, one rank)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from bench_trace import make_large_job

    return make_large_job(out_dir, 1, target_mb)


def json_mb(path: Path) -> float:
    """MB of JSON in a trace file or a folder's one trace (decompressed)."""
    if path.is_dir():
        (path,) = [p for p in path.iterdir() if p.name.endswith((".json", ".json.gz"))]
    if path.name.endswith(".gz"):
        with gzip.open(path) as fh:
            return sum(len(b) for b in iter(lambda: fh.read(1 << 20), b"")) / 1e6
    return path.stat().st_size / 1e6


# --- measuring --------------------------------------------------------------------------------


def run_once(
    cmd: list[str], env: dict[str, str], cwd: Path, timeout: float
) -> tuple[float, float, float]:
    """(wall seconds, peak RSS MiB, CPU seconds) of one process, start to exit. CPU time
    (user + system) moves less than wall time when other work shares the machine."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    deadline = t0 + timeout
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.perf_counter() > deadline:
            proc.kill()
            raise SystemExit(f"timed out after {timeout} s: {' '.join(cmd)}")
        time.sleep(0.002)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode() if proc.stderr else ""
    if proc.returncode != 0:
        raise RuntimeError(f"exit {proc.returncode}: {' '.join(cmd)}\n{err[-1500:]}")
    return wall, usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime


def tool_command(tool: str, folder: Path, workers: str = "1") -> list[str]:
    """The process that analyses the one trace in ``folder``."""
    if tool == "HTA":
        return [sys.executable, "-c", _HTA, str(folder)]
    flags = [] if workers == "auto" else ["--workers", workers]
    return [sys.executable, "-m", "mgprof", "trace", str(folder), "--json", *flags]


def tool_env(tool: str, args: argparse.Namespace, cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "OPENBLAS_NUM_THREADS")}
    path = {"mgprof": args.tree, "baseline": args.baseline, "HTA": args.hta_path}.get(tool)
    if path:
        env["PYTHONPATH"] = path
    env["MGPROF_NO_CACHE"] = "1"  # a cached summary would time a file read, not an analysis
    if args.no_bytecode:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    else:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(cache / tool)
    return env


def versions(hta_path: str | None) -> str:
    from importlib.metadata import PackageNotFoundError, distributions, version

    parts = [f"python {platform.python_version()}", f"cores {os.cpu_count()}"]
    for pkg in ("numpy", "msgspec", "pandas"):
        try:
            parts.append(f"{pkg} {version(pkg)}")
        except PackageNotFoundError:
            parts.append(f"{pkg} not installed here")
    search = [hta_path, *sys.path] if hta_path else sys.path
    hta = [
        d.version
        for d in distributions(path=search)
        if (d.metadata["Name"] or "").lower() == "holistictraceanalysis"
    ]
    parts.append(f"HolisticTraceAnalysis {hta[0] if hta else 'not found'}")
    return ", ".join(parts)


def make(name: str, mb: float, folder: Path) -> None:
    """Write the scaled trace of case ``name`` into ``folder`` (run as ``--make``)."""
    if name.startswith("gpu"):
        scale_gpu_trace(folder, mb)
    else:
        scale_cpu_trace(folder / "rank0.pt.trace.json", mb)


def main() -> int:
    if sys.argv[1:2] == ["--make"]:
        make(sys.argv[2], float(sys.argv[3]), Path(sys.argv[4]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5, help="rounds over every case (5)")
    ap.add_argument("--tree", metavar="DIR", default=str(ROOT), help="mgprof's root (this one)")
    ap.add_argument("--baseline", metavar="DIR", help="another checkout's root, run beside")
    ap.add_argument("--hta", action="store_true", help="also run HolisticTraceAnalysis")
    ap.add_argument("--hta-path", metavar="DIR", help="put DIR on HTA's PYTHONPATH")
    ap.add_argument("--cases", help="comma-separated subset of the case names")
    ap.add_argument("--no-bytecode", action="store_true", help="no .pyc: compile at each start")
    ap.add_argument("--timeout", type=float, default=600.0, help="per process, seconds")
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    ap.add_argument(
        "--workers",
        default="1",
        help="mgprof's --workers: 1 (one process, the default) or auto (as typed: every core)",
    )
    args = ap.parse_args()
    tools = ["mgprof"] + (["baseline"] if args.baseline else []) + (["HTA"] if args.hta else [])
    load_start = os.getloadavg()[0]

    with tempfile.TemporaryDirectory(prefix="mgprof-bench-cpu-") as tmp_name:
        tmp = Path(tmp_name)
        cases: dict[str, Path] = {"startup": TRACES / "cpu-gloo-fragment"}
        cases.update(GPU_FIXTURES)
        wanted = set(args.cases.split(",")) if args.cases else None
        for name, mb in (("gpu-100", 100.0), ("cpu-100", 100.0), ("cpu-350", 350.0)):
            if wanted is not None and name not in wanted:
                continue
            folder = tmp / name
            folder.mkdir()
            t0 = time.perf_counter()
            # In a child process: a process forked from a big parent reports the parent's
            # memory as its own peak (ru_maxrss counts the pages it started with).
            subprocess.run(
                [sys.executable, __file__, "--make", name, str(mb), str(folder)], check=True
            )
            cases[name] = folder
            print(f"generated {name} in {time.perf_counter() - t0:.0f} s", flush=True)
        if wanted is not None:
            cases = {k: v for k, v in cases.items() if k in wanted or k == "startup"}
        sizes = {name: json_mb(path) for name, path in cases.items()}
        cache = tmp / "pycache"
        envs = {tool: tool_env(tool, args, cache) for tool in tools}
        # HTA is compared on the device cases only (the claim at stake); its CPU-only support
        # is not what this measures.
        jobs = [(n, t) for n in cases for t in tools if t != "HTA" or not n.startswith("cpu")]
        failed = set()
        for name, tool in jobs:  # warm the bytecode and page caches once
            try:
                run_once(
                    tool_command(tool, cases[name], args.workers), envs[tool], tmp, args.timeout
                )
            except RuntimeError as exc:
                print(f"  {tool} fails on {name}: {str(exc).splitlines()[0]}", flush=True)
                failed.add((name, tool))
        runs: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
        for rnd in range(args.repeat):
            for name, tool in jobs:
                if (name, tool) not in failed:
                    got = run_once(
                        tool_command(tool, cases[name], args.workers), envs[tool], tmp, args.timeout
                    )
                    runs.setdefault((tool, name), []).append(got)
            print(f"round {rnd + 1}/{args.repeat} done", flush=True)

    rows = report(runs, sizes, tools, args)
    print(versions(args.hta_path) + f"; mgprof --workers {args.workers}")
    load_end = os.getloadavg()[0]
    print(
        f"load average (1 min) at the start {load_start:.1f}, at the end {load_end:.1f} "
        "(above 0: other work shared the machine)"
    )
    ok = check_targets(rows, tools)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0 if ok else 1


def _median(got: list[tuple[float, float, float]], i: int) -> float:
    return statistics.median(x[i] for x in got) if got else 0.0


def report(
    runs: dict[tuple[str, str], list[tuple[float, float, float]]],
    sizes: dict[str, float],
    tools: list[str],
    args: argparse.Namespace,
) -> list[dict[str, Any]]:
    """One row per (case, tool); per MB figures net of the tool's own start-up case."""
    start_s = {t: _median(runs.get((t, "startup"), []), 0) for t in tools}
    start_mib = {t: _median(runs.get((t, "startup"), []), 1) for t in tools}
    print(
        f"\n{'case':14}{'MB':>7}  {'tool':9}{'median s':>9}{'min s':>8}{'cpu s':>8}{'MiB':>7}"
        f"{'ms/MB':>8}{'MiB/MB':>8}"
    )
    rows = []
    for name, mb in sizes.items():
        for tool in tools:
            got = runs.get((tool, name))
            if not got:
                continue
            wall, mib, cpu = _median(got, 0), _median(got, 1), _median(got, 2)
            per_mb = name != "startup" and tool != "HTA"  # HTA has no start-up case here
            row = {
                "case": name,
                "mb": mb,
                "tool": tool,
                "median_s": wall,
                "min_s": min(g[0] for g in got),
                "cpu_s": cpu,
                "peak_mib": mib,
                "ms_per_mb": 1000 * (wall - start_s[tool]) / mb if per_mb else None,
                "mib_per_mb": (mib - start_mib[tool]) / mb if per_mb else None,
                "repeat": len(got),
                "bytecode": not args.no_bytecode,
            }
            rows.append(row)
            ms = "" if row["ms_per_mb"] is None else f"{row['ms_per_mb']:8.1f}"
            mem = "" if row["mib_per_mb"] is None else f"{row['mib_per_mb']:8.2f}"
            print(
                f"{name:14}{mb:7.1f}  {tool:9}{wall:9.3f}{row['min_s']:8.3f}{cpu:8.3f}{mib:7.0f}"
                f"{ms:>8}{mem:>8}"
            )
    return rows


def check_targets(rows: list[dict[str, Any]], tools: list[str]) -> bool:
    def get(case: str, tool: str) -> dict[str, Any] | None:
        return next((r for r in rows if r["case"] == case and r["tool"] == tool), None)

    ok = True
    cpu, gpu = get("cpu-100", "mgprof"), get("gpu-100", "mgprof")
    if cpu and gpu:
        ratio = cpu["ms_per_mb"] / gpu["ms_per_mb"]
        met = ratio <= CPU_PER_MB_TARGET
        ok &= met
        print(
            f"CPU vs GPU per MB (cpu-100 {cpu['ms_per_mb']:.1f} vs gpu-100 "
            f"{gpu['ms_per_mb']:.1f} ms/MB): {ratio:.2f}x, target <= {CPU_PER_MB_TARGET}x: "
            f"{'met' if met else 'MISSED'}; memory {cpu['mib_per_mb']:.2f} vs "
            f"{gpu['mib_per_mb']:.2f} MiB per MB"
        )
    for tool in tools:
        if tool == "HTA":
            continue
        for case in GPU_FIXTURES:
            mine, hta = get(case, tool), get(case, "HTA")
            if mine and hta:
                x = hta["median_s"] / mine["median_s"]
                met = x >= HTA_SPEEDUP_TARGET
                ok &= met or tool != "mgprof"
                print(
                    f"{tool} vs HTA on {case}: {mine['median_s']:.3f} s vs {hta['median_s']:.2f}"
                    f" s = {x:.1f}x (target >= {HTA_SPEEDUP_TARGET:.0f}x"
                    f"{': met' if met else ': MISSED'})"
                )
    return ok


if __name__ == "__main__":
    raise SystemExit(main())
