"""A classifier whose labels are all one class and whose output has one logit: cross-entropy over
a single class is identically 0, so every gradient is exactly 0 and the model never learns (the
DDP tutorial's ``nn.Linear(20, 1)`` under ``CrossEntropyLoss`` does the same)."""

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(20, 16), nn.ReLU(), nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loss_fn = nn.CrossEntropyLoss()
for _step in range(30):
    x = torch.randn(32, 20)
    y = torch.zeros(32, dtype=torch.long)
    optimizer.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
print(f"final loss {loss.item():.6f}")
