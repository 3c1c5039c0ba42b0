"""A plain FSDP2 script, as the PyTorch FSDP2 tutorial writes it: ``fully_shard`` on each block and
on the root, AdamW, torchrun's environment (gloo on CPU, NCCL on GPUs); ``--checkpoint`` wraps
each block in activation checkpointing (its forward runs again in backward)."""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.utils.checkpoint import checkpoint


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.ff = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.ff(self.norm(x))


class Net(nn.Module):
    def __init__(self, dim: int, depth: int) -> None:
        super().__init__()
        self.inp = nn.Linear(32, dim)
        self.layers = nn.ModuleList(Block(dim) for _ in range(depth))
        self.out = nn.Linear(dim, 1)
        self.checkpoint = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for layer in self.layers:
            # with checkpointing the block runs again in backward, as HF gradient checkpointing
            h = checkpoint(layer, h, use_reentrant=False) if self.checkpoint else layer(h)
        return self.out(h)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--checkpoint", action="store_true", help="activation checkpointing")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else None
    if device is not None:
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    model = Net(args.dim, args.depth).to(device or "cpu")
    model.checkpoint = args.checkpoint
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    torch.manual_seed(1 + dist.get_rank())
    for _ in range(args.steps):
        x = torch.randn(16, 32, device=device)
        loss = model(x).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
