"""What ``--precision`` itself costs a step, as ratios measured side by side in one process.

A precision row must measure the precision, not mgprof. Three loops train identical models on
the same data, rounds interleaved so drift hits all equally:

- ``bare``: the script as written, ``model(x)``;
- ``script``: ``--precision script``: mgprof's route around the forward (no autocast change)
  and the loss capture (patched ``Tensor.backward``, one loss closed per update);
- ``fp32``: ``--precision fp32``: the same with ``torch.autocast(device, enabled=False)``
  entered around each forward.

Both mgprof loops against ``bare`` are the overhead (target: < 1 % of a step). ``bf16`` against
``fp32`` is the figure a precision row reports, shown for reference.

Whole steps on a shared 2-core machine vary by a few percent between rounds, more than what is
measured, so the two costs are also timed on their own, best of several repeats: the route (a
tiny model called under ``no_grad`` through it, against directly) and the loss capture per
update (``Tensor.backward``'s patch on a scalar, and closing the update). Their sum over the
bare step is the figure the target applies to.

    python benchmarks/bench_precision.py [--device cpu|cuda] [--rounds 9] [--steps 40]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from bench_autowrap import make_model  # the same model as the auto-wrap benchmark's route
from torch import nn

from mgprof.collect.wrapping.precision import PrecisionControl

TARGET_OVERHEAD_PCT = 1.0


def run_steps(
    call: Callable[[torch.Tensor], torch.Tensor],
    opt: torch.optim.Optimizer,
    x: torch.Tensor,
    steps: int,
    device: str,
    on_update: Callable[[], None] | None,
) -> float:
    """Mean ms per training step (forward, loss, backward, update)."""
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        call(x).square().mean().backward()
        opt.step()
        if on_update is not None:
            on_update()
    if device == "cuda":
        torch.cuda.synchronize()
    return 1000.0 * (time.perf_counter() - start) / steps


def best_us(fn: Callable[[], Any], calls: int, repeats: int = 7) -> float:
    """Best mean µs per call of ``fn`` over ``repeats`` timings of ``calls`` calls."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, 1e6 * (time.perf_counter() - start) / calls)
    return best


def isolated_costs(device: str, calls: int) -> dict[str, float]:
    """µs per forward of the route (script: no autocast change; fp32: autocast disabled) and
    µs per update of the loss capture."""
    tiny = nn.Linear(4, 4).to(device)
    x = torch.randn(2, 4, device=device)
    out = {}
    routes = {name: PrecisionControl(name).route(tiny, tiny) for name in ("script", "fp32")}
    best = {name: float("inf") for name in ("direct", *routes)}
    with torch.no_grad():
        for _ in range(7):  # interleaved: drift hits the direct and routed calls alike
            best["direct"] = min(best["direct"], best_us(lambda: tiny(x), calls, repeats=1))
            for name, call in routes.items():
                best[name] = min(best[name], best_us(lambda c=call: c(x), calls, repeats=1))
    for name in routes:
        out[f"route {name}"] = best[name] - best["direct"]
    control = PrecisionControl("script")
    loss = torch.ones((), device=device, requires_grad=True)

    def capture() -> None:
        control._on_backward(loss)
        control.on_update()

    out["loss capture"] = best_us(capture, calls)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args()
    device = args.device
    x = torch.randn(args.batch, args.width, device=device)

    loops: dict[str, Any] = {}
    for name in ("bare", "script", "fp32", "bf16"):
        model = make_model(device, args.width)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        control = None if name == "bare" else PrecisionControl(name)
        call = model if control is None else control.route(model, model)
        loops[name] = (call, opt, control)
    times: dict[str, list[float]] = {name: [] for name in loops}
    for _ in range(args.rounds):
        for name, (call, opt, control) in loops.items():
            if control is not None:
                control.install()  # only one control patches Tensor.backward at a time
            try:
                ms = run_steps(
                    call, opt, x, args.steps, device, control.on_update if control else None
                )
            finally:
                if control is not None:
                    control.uninstall()
            times[name].append(ms)
    med = {name: statistics.median(t) for name, t in times.items()}
    print(
        f"device {device}, width {args.width}, batch {args.batch}, {args.rounds} rounds x "
        f"{args.steps} steps (median ms/step)"
    )
    for name, ms in med.items():
        print(f"  {name:7s} {ms:8.3f} ms")
    for name in ("script", "fp32"):
        pct = 100.0 * (med[name] - med["bare"]) / med["bare"]
        print(f"  {name} vs bare: {pct:+.2f} % per step (whole steps: noise-bound, see below)")
    print(f"  bf16 vs fp32: {med['fp32'] / med['bf16']:.2f}x (the row's figure, for reference)")
    costs = isolated_costs(device, 4000)
    capture = costs["loss capture"]
    print(f"isolated, best of 7 (µs): {', '.join(f'{k} {v:.2f}' for k, v in costs.items())}")
    missed = False
    for name in ("script", "fp32"):
        pct = 100.0 * (costs[f"route {name}"] + capture) / (1000.0 * med["bare"])
        verdict = "met" if pct < TARGET_OVERHEAD_PCT else "missed"
        missed = missed or verdict == "missed"
        print(
            f"  {name}: route + loss capture = {pct:.3f} % of the bare step "
            f"(target < {TARGET_OVERHEAD_PCT:g} %: {verdict})"
        )
    for name in ("script", "fp32", "bf16"):
        control = loops[name][2]
        assert control is not None
        recorded = len(control.snapshot().losses)
        assert recorded == args.rounds * args.steps, (name, recorded)
    sys.exit(1 if missed else 0)


if __name__ == "__main__":
    main()
