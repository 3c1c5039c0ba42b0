"""A model whose activations exceed float16's range (65504): fine in fp32 and bf16, inf in fp16.

Large inputs and weights, as an un-normalised regression on raw features can have."""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
data = TensorDataset(torch.randn(256, 64) * 300.0, torch.randn(256, 1))
loader = DataLoader(data, batch_size=32)
model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 1)).to(device)
with torch.no_grad():
    for p in model.parameters():
        p.mul_(20.0)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-12)
for x, y in loader:
    x, y = x.to(device), y.to(device)
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
print(f"final-loss {loss.item():.6g}")
