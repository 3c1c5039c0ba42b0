"""The noise scale's per-step cost under DDP, as ratios measured side by side in one job.

Four DDP copies of the same model train in one 2-rank gloo job (CPU, or NCCL with
``--device cuda``), interleaved step by step (order rotated) so load and drift hit all equally:
  builtin   DDP's own C++ averaging (``MGPROF_NOISE_SCALE=0``: mgprof installs nothing)
  hook      mgprof's comm hook without the norms (what ``mgprof compare``'s A/B installs)
  norms     mgprof's comm hook with the norms at every sync (``--noise-scale``)
  sampled   DDP's own averaging, the norms read on one sync in 16 without a hook (the default):
            the builtin model itself with mgprof's sampled probe switched on for these steps
            only, so the two share every byte of memory and differ by the probe alone (two
            model copies alone differ by a few percent per step here)
All run inside one ``mgprof.profile`` session (trace and sampler off), so the step bookkeeping
is in every figure and the difference is the hook's and the norms' own cost.

Target: the default's cost, sampled/builtin - 1, < 1 % per step, amortised: the median over
rounds of (the round's sampled steps' total / its builtin steps' total - 1), since one step in 16
carries the cost (a median of per-step ratios would hide it). Exits 1 when a model misses it.
hook % and norms % are medians of per-step ratios, as before. The "passes" columns time the
three extra memory passes alone (best of 7), a floor on the cost that a loaded machine cannot
inflate.

    python benchmarks/bench_noise_scale.py [--device cpu|cuda] [--rounds 9] [--steps 20]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from typing import Any

TARGET_PCT = 1.0
VARIANTS = ("builtin", "hook", "norms", "sampled")
MODELS = {
    # name: (width, layers, batch per rank); the extra passes scale with the parameters, the
    # step's compute with parameters x samples, so the share falls as the batch grows
    "mlp-1M-b32": (512, 4, 32),
    "mlp-1M-b512": (512, 4, 512),
    "mlp-17M-b64": (2048, 4, 64),
}


def _launch(argv: list[str]) -> int:
    """Re-run this script under torchrun with 2 ranks (one thread each on CPU); rank 0 writes
    the table to a file, so a missed target is this process's exit code, not a worker's."""
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    with tempfile.TemporaryDirectory() as folder:
        result = os.path.join(folder, "result.txt")
        code = subprocess.call([*cmd, __file__, "--worker", "--result", result, *argv], env=env)
        if code != 0 or not os.path.exists(result):
            print(f"bench_noise_scale: the job failed (exit code {code})", file=sys.stderr)
            return 2
        with open(result) as fh:
            text = fh.read()
    print(text, end="")
    return 1 if text.rstrip().endswith(": missed") else 0


def _build(variant: str, width: int, layers: int, device: Any) -> Any:
    import torch
    from torch import nn

    import mgprof
    from mgprof.collect import noise_scale
    from mgprof.collect.wrapping.wrap import _switchable_allreduce

    torch.manual_seed(0)
    mods: list[nn.Module] = []
    for _ in range(layers):
        mods += [nn.Linear(width, width), nn.ReLU()]
    model = nn.Sequential(*mods, nn.Linear(width, 10)).to(device)
    if variant == "hook":
        os.environ["MGPROF_NOISE_SCALE"] = "0"
        ddp = mgprof.wrap(model)
        noise_scale.install(ddp, _switchable_allreduce, record=False)
    else:
        os.environ["MGPROF_NOISE_SCALE"] = "1" if variant == "norms" else "0"
        ddp = mgprof.wrap(model)
    os.environ.pop("MGPROF_NOISE_SCALE", None)
    return ddp


def _step(model: Any, opt: Any, job: tuple[Any, ...]) -> float:
    """One training step (and its ``prof.step``) in ms."""
    import torch

    loss_fn, x, y, batch, prof, cuda = job
    t = time.perf_counter()
    opt.zero_grad()
    loss_fn(model(x), y).backward()
    opt.step()
    prof.step(batch_size=batch)
    if cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - t) * 1000.0


def _passes_ms(params: int, device: Any) -> float:
    """The hook's and the norms' own memory passes over a gradient of ``params`` fp32 values
    (scale, norm before, norm after), best of 7: a floor on their cost that load cannot raise."""
    import torch

    buf = torch.randn(params, device=device)
    best = math.inf
    for _ in range(7):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        torch.linalg.vector_norm(buf, dtype=torch.float32)
        buf.mul_(1.0)
        torch.linalg.vector_norm(buf, dtype=torch.float32)
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return best * 1000.0


def _measure(name: str, args: argparse.Namespace, device: Any, out: str) -> tuple[Any, ...]:
    import torch

    import mgprof
    from mgprof.collect import noise_scale
    from mgprof.collect.envknobs import NOISE_SCALE_EVERY

    width, layers, batch = MODELS[name]
    models = {v: _build(v, width, layers, device) for v in VARIANTS if v != "sampled"}
    models["sampled"] = models["builtin"]
    probe = noise_scale.SampledNorms(models["builtin"], NOISE_SCALE_EVERY)
    noise_scale.recorder.probes.append(probe)
    models["builtin"].register_forward_pre_hook(probe.forward)
    opts = {v: torch.optim.SGD(m.parameters(), lr=1e-3) for v, m in models.items()}
    opts["sampled"] = opts["builtin"]
    x = torch.randn(batch, width, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    per: dict[str, list[float]] = {v: [] for v in VARIANTS}
    with mgprof.profile(out=out, name=f"bench-{name}", trace=False, sample=False, quiet=True) as p:
        job = (torch.nn.CrossEntropyLoss(), x, y, batch, p, device.type == "cuda")
        for v in VARIANTS:  # warm-up: buckets rebuilt, the lazy hook installed
            for _ in range(5):
                probe.broken = v != "sampled"  # the probe reads only the sampled steps
                _step(models[v], opts[v], job)
        n = len(VARIANTS)
        for r in range(args.rounds * args.steps):  # one step of each, order rotated
            for v in VARIANTS[r % n :] + VARIANTS[: r % n]:
                probe.broken = v != "sampled"
                per[v].append(_step(models[v], opts[v], job))
    base = per["builtin"]
    hook = statistics.median(h / b - 1 for h, b in zip(per["hook"], base)) * 100
    norms = statistics.median(n / b - 1 for n, b in zip(per["norms"], base)) * 100
    k = args.steps
    rounds = [
        sum(per["sampled"][i : i + k]) / sum(base[i : i + k]) - 1 for i in range(0, len(base), k)
    ]
    sampled = statistics.median(rounds) * 100
    params = sum(q.numel() for q in models["builtin"].parameters())
    passes = _passes_ms(params, device)
    medians = [statistics.median(per[v]) for v in VARIANTS]
    return (name, params, *medians, hook, norms, sampled, passes, 100 * passes / medians[0])


def _worker(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist

    import mgprof

    warnings.simplefilter("ignore")
    device = mgprof.device() if args.device == "cuda" else torch.device("cpu")
    with tempfile.TemporaryDirectory() as out:
        rows = [_measure(name, args, device, out) for name in args.models.split(",")]
    missed = any(row[8] >= TARGET_PCT for row in rows)
    if dist.get_rank() == 0:
        head = (
            "model", "params", "builtin ms", "hook ms", "norms ms", "sampled ms", "hook %",
            "norms %", "sampled %", "passes ms", "passes %",
        )  # fmt: skip
        lines = [
            f"{args.device}, 2 ranks, {args.rounds} rounds x {args.steps} steps of each variant "
            f"(interleaved step by step), torch {torch.__version__}",
            "| " + " | ".join(head) + " |",
            "|" + "---|" * len(head),
        ]
        for name, params, b, h, n, sm, hp, np_, sp, pm, pp in rows:
            lines.append(
                f"| {name} | {params:,} | {b:.3f} | {h:.3f} | {n:.3f} | {sm:.3f} | {hp:+.2f} "
                f"| {np_:+.2f} | {sp:+.2f} | {pm:.3f} | {pp:.2f} |"
            )
        lines.append(
            "hook %/norms %: median over step sets of (variant / builtin - 1); sampled %: median "
            "over rounds of (round total / builtin round total - 1); passes: one scale and two "
            "norm passes over the gradient alone, best of 7, % of the builtin step; target "
            f"sampled < {TARGET_PCT} %: {'missed' if missed else 'met'}"
        )
        with open(args.result, "w") as fh:
            fh.write("\n".join(lines) + "\n")
    dist.destroy_process_group()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument(
        "--models", default=",".join(MODELS), help="comma-separated: " + ", ".join(MODELS)
    )
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--result", default=os.devnull, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if not args.worker:
        return _launch(sys.argv[1:])
    return _worker(args)


if __name__ == "__main__":
    sys.exit(main())
