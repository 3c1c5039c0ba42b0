"""A training script resumed from a checkpoint of a finished run: it makes no optimizer step.

``python resume_finished.py --resume ckpt.pt --epochs 3`` loads the model and the epoch the
checkpoint was saved at; with ``epoch == epochs`` there is nothing left to train and the script
exits 0. Used by tests/test_failure_reports.py: mgprof must say that nothing was measured, not
that ranks went missing.
"""

import argparse

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--resume", required=True, help="checkpoint saved by an earlier run")
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--steps-per-epoch", type=int, default=5)
args = parser.parse_args()

model = nn.Linear(8, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
checkpoint = torch.load(args.resume)
model.load_state_dict(checkpoint["model"])
start = checkpoint["epoch"]
print(f"resumed at epoch {start} of {args.epochs}")

for epoch in range(start, args.epochs):
    for _ in range(args.steps_per_epoch):
        optimizer.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        optimizer.step()
    print(f"epoch {epoch} done")

print("training finished")
