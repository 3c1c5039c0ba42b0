"""The torchrun DDP tutorial style: argparse, init_process_group, DDP, DistributedSampler,
checkpoint/resume on rank 0. Run with ``torchrun --nproc-per-node 2 ddp_tutorial.py``."""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--checkpoint", default="")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = nn.Sequential(nn.Linear(20, 32), nn.Tanh(), nn.Linear(32, 2))
    ddp_model = DDP(model)
    optimizer = torch.optim.Adam(ddp_model.parameters(), lr=1e-2)
    start = 0
    if args.checkpoint and os.path.exists(args.checkpoint):
        state = torch.load(args.checkpoint, map_location="cpu")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["epoch"]
    gen = torch.Generator().manual_seed(0)
    data = TensorDataset(
        torch.randn(256, 20, generator=gen), torch.randint(0, 2, (256,), generator=gen)
    )
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(start, args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            loss_fn(ddp_model(x), y).backward()
            optimizer.step()
        if rank == 0 and args.checkpoint:
            torch.save(
                {
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "epoch": epoch + 1,
                },
                args.checkpoint,
            )
    with torch.no_grad():
        total = sum(p.double().sum().item() for p in model.parameters())
    print(f"param-checksum {total:.17g}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
