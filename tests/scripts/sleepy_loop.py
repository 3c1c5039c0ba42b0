"""A plain training loop with an optional ``time.sleep`` in every step (``--sleep-ms``): a
slowdown of known size that no operator or kernel contains, as a logging call or a blocking read
would add. No mgprof code: ``mgprof analyze`` instruments it."""

import argparse
import time

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--sleep-ms", type=float, default=0.0)
parser.add_argument("--iters", type=int, default=20)
args = parser.parse_args()

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
loss_fn = nn.CrossEntropyLoss()
for _ in range(args.iters):
    x = torch.randn(64, 256)
    y = torch.randint(0, 10, (64,))
    if args.sleep_ms:
        time.sleep(args.sleep_ms / 1000.0)  # e.g. a blocking read, a logging call
    optimizer.zero_grad()
    loss_fn(model(x), y).backward()
    optimizer.step()
