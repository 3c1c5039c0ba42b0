"""A plain loop over a model compiled with ``torch.compile`` (``--backend``: inductor by
default, as users write it; tests pass ``aot_eager`` to skip the C++ build of each kernel)."""

import argparse

import torch
from torch import nn


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(32, 128)
        self.mid = nn.Linear(128, 128)
        self.out = nn.Linear(128, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.mid(torch.relu(self.up(x)))))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--backend", default="inductor")
    parser.add_argument("--sequential", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = Net()
    if args.sequential:  # torch's own container: dynamo would skip its forward inside DDP
        model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 1))
    model = torch.compile(model, backend=args.backend)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(args.steps):
        x, y = torch.randn(64, 32), torch.randn(64, 1)
        loss = ((model(x) - y) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
