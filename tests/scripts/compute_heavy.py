"""A plain loop whose compute dwarfs its DDP all-reduce: a batch of 1024 through four 256-wide
layers (260k parameters). With one thread per process, two CPU ranks over gloo do twice the work
of one in about the same step time (weak scaling: each rank draws the same batch), so DDP is
measurably faster than single."""

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(*(m for _ in range(4) for m in (nn.Linear(256, 256), nn.ReLU())))
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
for _step in range(60):
    x = torch.randn(1024, 256)
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
