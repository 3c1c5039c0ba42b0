"""A plain single-device training loop, as a first tutorial writes it: no torch.distributed."""

import torch
from torch import nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
loss_fn = nn.MSELoss()

for step in range(12):
    x = torch.randn(16, 32, device=device)  # no seed: every process draws its own data
    y = torch.randn(16, 4, device=device)
    optimizer.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    if step == 0:
        print(f"first-batch-checksum {x.double().sum().item():.17g}")

with torch.no_grad():
    total = sum(p.double().sum().item() for p in model.parameters())
print(f"param-checksum {total:.17g}")
