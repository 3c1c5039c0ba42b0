"""Linear regression with Gaussian noise, whose gradient noise scale is known in closed form.

x ~ N(0, I_d), y = x·w* + ε with ε ~ N(0, σ²), loss = mean over the batch of ½(x·w − y)². At
w = w* + δ each example's gradient is g = x(x·δ − ε), so G = E[g] = δ and, by Isserlis,
E[g gᵀ] = |δ|² I + 2 δδᵀ + σ² I, hence Σ = (|δ|² + σ²) I + δδᵀ and
tr(Σ) = (d + 1)|δ|² + d σ², B_simple = ((d + 1)|δ|² + d σ²) / |δ|².

Run under torchrun (DDP through ``mgprof.wrap``) or alone with ``--accum K`` (one process,
K micro-batches per update). With ``--lr 0`` w stays at w* + δ, so the analytic value holds at
every step. Writes ``result<rank>.json``: the analytic B_simple, the trained parameters (as
float hex, for bit-for-bit comparison) and ``mgprof.noise_scale()`` at the end.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

import mgprof
from mgprof.collect.noise_scale import noise_scale

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--name", default="linreg")
parser.add_argument("--steps", type=int, default=100)
parser.add_argument("--batch", type=int, default=8, help="samples per rank per micro-batch")
parser.add_argument("--accum", type=int, default=1, help="micro-batches per update")
parser.add_argument("--dim", type=int, default=8)
parser.add_argument("--sigma", type=float, default=1.0)
parser.add_argument("--delta-sq", type=float, default=1.0)
parser.add_argument("--lr", type=float, default=0.0)
parser.add_argument("--own-hook", action="store_true", help="register a comm hook of our own")
parser.add_argument("--bucket-cap-mb", type=float, default=None)
parser.add_argument("--bucket-views", action="store_true", help="gradient_as_bucket_view=True")
args = parser.parse_args()

d = args.dim
base = torch.Generator().manual_seed(0)
w_star = torch.randn(d, generator=base)
direction = torch.randn(d, generator=base)
delta = direction * (args.delta_sq / direction.pow(2).sum()).sqrt()
analytic = ((d + 1) * args.delta_sq + d * args.sigma**2) / args.delta_sq


class Halves(nn.Module):
    """x·w as two linear layers over the two halves of x: two parameters, so DDP can put them
    in two buckets (``--bucket-cap-mb`` small) and the hook's per-bucket sums are exercised."""

    def __init__(self, w: torch.Tensor) -> None:
        super().__init__()
        self.cut = d // 2
        self.a = nn.Linear(self.cut, 1, bias=False)
        self.b = nn.Linear(d - self.cut, 1, bias=False)
        with torch.no_grad():
            self.a.weight.copy_(w[: self.cut].unsqueeze(0))
            self.b.weight.copy_(w[self.cut :].unsqueeze(0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x[:, : self.cut]) + self.b(x[:, self.cut :])


layer = Halves(w_star + delta)
kwargs: dict[str, Any] = {}
if args.bucket_cap_mb is not None:
    kwargs["bucket_cap_mb"] = args.bucket_cap_mb
if args.bucket_views:
    kwargs["gradient_as_bucket_view"] = True
model = mgprof.wrap(layer, **kwargs)
rank = dist.get_rank() if dist.is_initialized() else 0
if args.own_hook:
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    model.register_comm_hook(None, allreduce_hook)
opt = torch.optim.SGD(model.parameters(), lr=args.lr)
data = torch.Generator().manual_seed(1000 + rank)  # each rank its own samples


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(args.batch, d, generator=data)
    y = x @ w_star + args.sigma * torch.randn(args.batch, generator=data)
    return x, y


with mgprof.profile(out=args.out, name=args.name, trace=False, sample=False, quiet=True) as prof:
    for _ in range(args.steps):
        opt.zero_grad()
        for i in range(args.accum):
            x, y = batch()
            sync = i == args.accum - 1 or not hasattr(model, "no_sync")
            ctx = model.no_sync() if not sync else torch.enable_grad()
            with ctx:
                loss = 0.5 * (model(x).squeeze(1) - y).pow(2).mean() / args.accum
                loss.backward()
        opt.step()
        prof.step(batch_size=args.batch * args.accum)
    latest = noise_scale()

params = [v.hex() for p in layer.parameters() for v in p.detach().flatten().tolist()]
with open(os.path.join(args.out, f"result{rank}.json"), "w") as fh:
    json.dump({"analytic": analytic, "params": params, "api": latest}, fh)
