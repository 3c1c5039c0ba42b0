"""A plain loop whose DDP all-reduce dwarfs its compute: 8M parameters, a batch of 2. On CPU ranks
over gloo one DDP step takes many times a single-device step, so single is measurably faster
(weak scaling: each rank draws the same batch)."""

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024))
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
for _step in range(60):
    x = torch.randn(2, 1024)
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
