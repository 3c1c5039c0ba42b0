"""A small MLP on synthetic data, profiled with ``mgprof.profile`` (the context manager).

Runs as a plain script on CPU in seconds, under ``torchrun``, or under
``mgprof analyze examples/mlp_context.py --gpus 2``; ``mgprof.wrap`` picks single, DP or DDP.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import mgprof


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=12, help="training steps")
    parser.add_argument("--batch-size", type=int, default=64, help="per-device batch size")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--out", default="mgprof-runs", help="parent folder of run directories")
    args = parser.parse_args()

    mgprof.seed_everything(0)
    model = mgprof.wrap(
        nn.Sequential(
            nn.Linear(256, args.hidden),
            nn.ReLU(),
            nn.Linear(args.hidden, args.hidden),
            nn.ReLU(),
            nn.Linear(args.hidden, 10),
        )
    )
    device = mgprof.device()
    batch_size = mgprof.batch_size(args.batch_size)
    data = TensorDataset(
        torch.randn(batch_size * args.steps * 8, 256),
        torch.randint(0, 10, (batch_size * args.steps * 8,)),
    )
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    sampler: DistributedSampler[tuple[torch.Tensor, ...]] | None = (
        DistributedSampler(data) if distributed else None
    )
    loader = DataLoader(data, batch_size=batch_size, sampler=sampler, shuffle=sampler is None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()

    with mgprof.profile(out=args.out, name="mlp_context") as prof:
        if sampler is not None:
            sampler.set_epoch(0)
        for step, (x, y) in enumerate(loader):
            if step >= args.steps:
                break
            with prof.step(batch=x):
                x, y = x.to(device), y.to(device)
                with mgprof.region("forward"):
                    loss = loss_fn(model(x), y)
                with mgprof.region("backward"):
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                optimizer.step()
    if distributed:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
