"""A plain loop whose process aborts at interpreter exit, after the training is done: what
torch's gloo teardown does now and then ("terminate called without an active exception")."""

import atexit
import os

import torch
from torch import nn

atexit.register(os.abort)
model = nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(8):
    optimizer.zero_grad()
    model(torch.randn(4, 8)).pow(2).mean().backward()
    optimizer.step()
print("training done")
