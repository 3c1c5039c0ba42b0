"""A stream of samples through an IterableDataset and a batching DataLoader."""

import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset


class Stream(IterableDataset):
    def __init__(self, samples: int) -> None:
        self.samples = samples

    def __iter__(self):
        for _ in range(self.samples):
            x = torch.randn(12)
            yield x, x.sum(dim=0, keepdim=True)


model = nn.Sequential(nn.Linear(12, 24), nn.ReLU(), nn.Linear(24, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
loader = DataLoader(Stream(320), batch_size=20)
for x, y in loader:
    optimizer.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()
with torch.no_grad():
    total = sum(p.double().sum().item() for p in model.parameters())
print(f"param-checksum {total:.17g}")
