"""A plain single-device training loop over a block model (no distributed code at all), as a
user would hand it to ``mgprof analyze --strategy fsdp``; ``--save DIR`` writes each rank's
final parameters (full tensors) to ``DIR/<MGPROF_STRATEGY>-rank<RANK>.pt`` for the test to
compare strategies."""

import argparse
import os

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


class Net(nn.Module):
    def __init__(self, dim: int = 64, depth: int = 4) -> None:
        super().__init__()
        self.inp = nn.Linear(16, dim)
        self.layers = nn.ModuleList(Block(dim) for _ in range(depth))
        self.out = nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for layer in self.layers:
            h = layer(h)
        return self.out(h)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--save", default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = Net().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    rank = int(os.environ.get("RANK", 0))
    gen = torch.Generator().manual_seed(100 + rank)  # each rank its own data, as a sampler gives
    for _ in range(args.steps):
        x = torch.randn(32, 16, generator=gen).to(device)
        y = torch.randn(32, 1, generator=gen).to(device)
        loss = ((model(x) - y) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if args.save:
        full = {
            k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().cpu()
            for k, v in model.state_dict().items()
        }
        name = f"{os.environ.get('MGPROF_STRATEGY', 'single')}-rank{rank}.pt"
        torch.save(full, os.path.join(args.save, name))


if __name__ == "__main__":
    main()
