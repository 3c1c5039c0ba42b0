"""A small MLP with named regions and knobs that make a run slower in a known place.

``--sleep-ms`` sleeps inside the ``augment`` region of every step (a slowdown with a known size
and place), ``--hidden`` grows the model (more time in the matrix multiplies), ``--batch-size``
changes the batch. Used by the ``mgprof diff`` tests.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

import mgprof


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=14)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--sleep-ms", type=float, default=0.0)
    parser.add_argument("--out", default="mgprof-runs")
    args = parser.parse_args()

    mgprof.seed_everything(0)
    model = mgprof.wrap(
        nn.Sequential(nn.Linear(128, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 10))
    )
    batch = mgprof.batch_size(args.batch_size)
    device = mgprof.device()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    with mgprof.profile(out=args.out, name="diff_target") as prof:
        for _ in range(args.steps):
            x = torch.randn(batch, 128, device=device)
            y = torch.randint(0, 10, (batch,), device=device)
            with prof.step(batch_size=batch):
                with mgprof.region("augment"):
                    x = x * 1.0
                    if args.sleep_ms:
                        time.sleep(args.sleep_ms / 1000.0)
                with mgprof.region("forward"):
                    loss = loss_fn(model(x), y)
                with mgprof.region("backward"):
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                optimizer.step()
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
