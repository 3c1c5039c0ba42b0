"""nanoGPT's loop in miniature: no DataLoader, a random-token ``get_batch``, and a fixed number of
sequences per iteration whatever the world size (``batch_size = global // world_size``, as nanoGPT
divides gradient accumulation steps by the world size): strong scaling. A plain script: it reads
the world size from the environment and wraps nothing itself."""

import argparse
import os

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--global-batch", type=int, default=16)
parser.add_argument("--block", type=int, default=16)
parser.add_argument("--iters", type=int, default=40)
args = parser.parse_args()

world = int(os.environ.get("WORLD_SIZE", "1"))
batch_size = args.global_batch // world
vocab = 64
torch.manual_seed(1337 + int(os.environ.get("RANK", "0")))


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, 64)
        self.mlp = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64))
        self.head = nn.Linear(64, vocab)

    def forward(self, idx, targets=None):
        logits = self.head(self.mlp(self.emb(idx)))
        loss = None
        if targets is not None:
            loss = nn.functional.cross_entropy(logits.view(-1, vocab), targets.view(-1))
        return logits, loss


def get_batch():
    x = torch.randint(0, vocab, (batch_size, args.block))
    y = torch.roll(x, -1, dims=1)
    return x, y


model = TinyLM()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for it in range(args.iters):
    X, Y = get_batch()
    _, loss = model(X, Y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if it % 10 == 0:
        print(f"iter {it}: loss {loss.item():.4f}")
