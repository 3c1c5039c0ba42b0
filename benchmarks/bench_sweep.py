"""Batch-size search: mgprof's planner vs a naive doubling search, trials and time to the answer.

Both searches run against synthetic but realistic curves (so the benchmark takes seconds and the
true answer is known exactly): per-device throughput ``T(x)`` of several shapes (saturating,
knee then flat, falling past a point, memory-bound linear, saturating with 2 % noise) and memory
``M(x) = a + b·x`` against a device capacity (a trial above capacity is an out-of-memory trial).

  mgprof            ``SweepPlanner`` (grow ×2, stop on a throughput plateau, bisect the memory
                    boundary, skip sizes the ``a + b·x`` model predicts over the margin)
  mgprof until-oom  the same with ``stop_on_plateau=False`` (what ``--until-oom`` does)
  naive doubling    LO, 2·LO, 4·LO, ... until the first out-of-memory trial or HI: no
                    bisection, no plateau stop, no memory model (the usual "largest batch"
                    finder)

All three answers come from the same ``summarize`` (sweet spot = smallest measured batch within
the 10 % memory margin reaching 95 % of the best measured throughput; largest fit = largest
measured batch within the margin). The truth is computed over every integer batch in the range.
Time to the answer is modelled per trial as ``launch_s + (warmup + steps) · x / T(x)`` (an
out-of-memory trial costs ``launch_s``); ``launch_s`` defaults to the per-trial wall time of a
real ``mgprof sweep`` on this machine when ``--real`` is given, else 5 s.

Targets (exit 1 when missed): on every shape mgprof's sweet spot fits within the margin and
reaches ≥ 95 % of the true best throughput within the margin, and mgprof runs no more trials
than its ``max_trials`` bound.

    python benchmarks/bench_sweep.py [--real] [--launch-s 5] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mgprof.analyze.sweep.result import SweepPlanner, Trial, max_trials, summarize

ROOT = Path(__file__).resolve().parents[1]
LO, HI, MARGIN, FRACTION = 8, 4096, 0.1, 0.95
WARMUP, STEPS = 1, 3


@dataclass
class Shape:
    name: str
    throughput: Callable[[int], float]  # samples/s per device at batch x
    intercept_mib: float
    slope_mib: float
    capacity_mib: float

    def memory(self, x: int) -> float:
        return self.intercept_mib + self.slope_mib * x


def _noisy(base: Callable[[int], float], pct: float, seed: int) -> Callable[[int], float]:
    cache: dict[int, float] = {}
    rng = random.Random(seed)

    def f(x: int) -> float:
        if x not in cache:  # one measurement per batch size, as in a sweep
            cache[x] = base(x) * (1 + rng.uniform(-pct, pct))
        return cache[x]

    return f


def shapes() -> list[Shape]:
    h100 = 81559.0  # MiB, an 80 GB device
    return [
        Shape("saturating x/(x+64), memory-bound", lambda x: 9000 * x / (x + 64), 6000, 40, h100),
        Shape("saturates early x/(x+16)", lambda x: 4000 * x / (x + 16), 3000, 8, h100),
        Shape("knee at 256 then flat", lambda x: 12000 * min(1.0, x / 256), 2000, 150, h100),
        Shape(
            "falls past 512 (thrashing)",
            lambda x: 8000 * x / (x + 48) * (1 - 0.15 * max(0.0, math.log2(x / 512))),
            4000,
            12,
            h100,
        ),
        Shape("linear up to OOM (24 GiB)", lambda x: 50.0 * x, 1000, 300, 24576.0),
        Shape(
            "saturating x/(x+64), ±2 % noise",
            _noisy(lambda x: 9000 * x / (x + 64), 0.02, seed=1),
            6000,
            40,
            h100,
        ),
    ]


def trial(shape: Shape, x: int) -> Trial:
    mem = shape.memory(x)
    if mem > shape.capacity_mib:
        return Trial(batch_size=x, status="oom", global_batch=x, error="CUDA out of memory")
    t = shape.throughput(x)
    return Trial(
        batch_size=x,
        status="ok",
        global_batch=x,
        samples_per_s=t,
        samples_per_s_per_device=t,
        step_time_ms=1000 * x / t,
        peak_memory_mib=mem,
    )


def cost_s(shape: Shape, x: int, launch_s: float) -> float:
    if shape.memory(x) > shape.capacity_mib:
        return launch_s
    return launch_s + (WARMUP + STEPS) * x / shape.throughput(x)


def run_planner(shape: Shape, stop_on_plateau: bool) -> list[Trial]:
    planner = SweepPlanner(
        LO, HI, capacity_mib=shape.capacity_mib, margin=MARGIN, stop_on_plateau=stop_on_plateau
    )
    while (b := planner.next_size()) is not None:
        planner.record(trial(shape, b))
    return planner.trials


def run_naive(shape: Shape) -> list[Trial]:
    trials, b = [], LO
    while b <= HI:
        trials.append(trial(shape, b))
        if trials[-1].status == "oom":
            break
        b *= 2
    return trials


def truth(shape: Shape) -> tuple[int, int, float]:
    """(true largest fit within the margin, true sweet spot, best throughput within the margin)."""
    limit = (1 - MARGIN) * shape.capacity_mib
    fits = [x for x in range(LO, HI + 1) if shape.memory(x) <= limit]
    best = max(shape.throughput(x) for x in fits)
    sweet = min(x for x in fits if shape.throughput(x) >= FRACTION * best)
    return max(fits), sweet, best


def real_cli(steps: int, warmup: int) -> dict | None:
    """One real ``mgprof sweep`` of the MLP example on CPU: trials and wall time."""
    with tempfile.TemporaryDirectory(prefix="mgprof-sweep-") as out:
        cmd = [
            sys.executable, "-m", "mgprof", "sweep", "examples/mlp_context.py", "--gpus", "1",
            "--range", "8:4096", "--steps", str(steps), "--warmup", str(warmup),
            "--out", out, "--format", "json",
        ]  # fmt: skip
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=280)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            print(f"real sweep failed (exit {proc.returncode}): {proc.stderr[-1500:]}")
            return None
        files = list(Path(out).glob("*/sweep.json"))
        res = json.loads(files[0].read_text()) if files else json.loads(proc.stdout)
    ran = [t for t in res["trials"] if t["status"] != "skipped"]
    return {
        "command": " ".join(["mgprof", *cmd[3:-4]]),
        "wall_s": wall,
        "trials": len(ran),
        "sizes": [t["batch_size"] for t in ran],
        "sweet_spot": res.get("sweet_spot"),
        "largest_fit": res.get("largest_fit"),
        "stop_reason": res.get("stop_reason"),
        "per_trial_s": wall / max(1, len(ran)),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--real", action="store_true", help="also run one real mgprof sweep (CPU)")
    ap.add_argument("--launch-s", type=float, help="modelled fixed cost per trial (s)")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    real = real_cli(STEPS, WARMUP) if args.real else None
    launch_s = args.launch_s or (real["per_trial_s"] if real else 5.0)
    bound = max_trials(LO, HI)
    rows, ok = [], True
    for shape in shapes():
        true_fit, true_sweet, best = truth(shape)
        limit = (1 - MARGIN) * shape.capacity_mib
        for method, run in (
            ("mgprof", lambda s=shape: run_planner(s, True)),
            ("mgprof until-oom", lambda s=shape: run_planner(s, False)),
            ("naive doubling", lambda s=shape: run_naive(s)),
        ):
            t0 = time.perf_counter()
            trials = run()
            res = summarize(trials, shape.capacity_mib, MARGIN, fraction=FRACTION)
            plan_ms = 1000 * (time.perf_counter() - t0)
            ran = [t for t in trials if t.status != "skipped"]
            sweet = res.sweet_spot
            got = shape.throughput(sweet) / best if sweet else 0.0
            row = {
                "shape": shape.name,
                "method": method,
                "trials": len(ran),
                "skipped": len(trials) - len(ran),
                "ooms": sum(t.status == "oom" for t in ran),
                "time_s": sum(cost_s(shape, t.batch_size, launch_s) for t in ran),
                "plan_ms": plan_ms,
                "sweet_spot": sweet,
                "true_sweet_spot": true_sweet,
                "throughput_vs_best": got,
                "largest_fit": res.largest_fit,
                "predicted_max": res.predicted_max_batch,
                "true_largest_fit": true_fit,
            }
            rows.append(row)
            if method == "mgprof":
                fits = sweet is not None and shape.memory(sweet) <= limit
                row_ok = fits and got >= FRACTION - 1e-9 and len(ran) <= bound
                ok &= row_ok
                row["target_met"] = row_ok
    print(
        f"range {LO}:{HI}, margin {MARGIN}, sweet spot = smallest batch at >= {FRACTION:.0%} of "
        f"the best throughput; modelled trial = {launch_s:.1f} s launch + "
        f"{WARMUP + STEPS} steps; max_trials bound {bound}"
    )
    print(
        f"{'shape':36}{'method':18}{'trials':>7}{'OOM':>4}{'time s':>8}{'sweet':>7}"
        f"{'true':>6}{'T/best':>8}{'fit':>6}{'pred':>6}{'true fit':>9}"
    )
    for r in rows:
        pred = "-" if r["predicted_max"] is None else str(r["predicted_max"])
        print(
            f"{r['shape']:36}{r['method']:18}{r['trials']:>7}{r['ooms']:>4}{r['time_s']:>8.1f}"
            f"{r['sweet_spot'] or '-':>7}{r['true_sweet_spot']:>6}{r['throughput_vs_best']:>8.3f}"
            f"{r['largest_fit'] or '-':>6}{pred:>6}{r['true_largest_fit']:>9}"
        )
    tot = {
        m: (
            sum(r["trials"] for r in rows if r["method"] == m),
            sum(r["time_s"] for r in rows if r["method"] == m),
        )
        for m in ("mgprof", "mgprof until-oom", "naive doubling")
    }
    for m, (n, s) in tot.items():
        print(f"total over shapes, {m:17}: {n:3d} trials, {s:7.1f} s modelled")
    if real:
        print(
            f"real: {real['command']}: {real['trials']} trials {real['sizes']} in "
            f"{real['wall_s']:.1f} s ({real['per_trial_s']:.1f} s/trial), sweet spot "
            f"{real['sweet_spot']}, largest fit {real['largest_fit']}; stop: {real['stop_reason']}"
        )
    print(
        "target: mgprof's sweet spot fits and reaches >= 95 % of the true best throughput on "
        f"every shape, within {bound} trials: {'met' if ok else 'MISSED'}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "real": real}, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
