"""A DDP script whose rank 1 holds an extra 64 MiB inside region "hog" each step, unchanged
by mgprof (it uses only mgprof.region). With HOG_OOM=1 rank 1 asks for far more than its
address-space cap at step 3, as a real out-of-memory error would happen."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import nn

import mgprof


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    model = nn.parallel.DistributedDataParallel(nn.Linear(64, 64))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(8):
        x = torch.randn(32, 64)
        with mgprof.region("forward"):
            loss = model(x).pow(2).mean()
        keep = None
        if rank == 1:
            with mgprof.region("hog"):
                keep = torch.ones(16 * 2**20)  # 64 MiB, live until the step ends
                if os.environ.get("HOG_OOM") == "1" and step == 3:
                    keep = torch.ones(2**30)  # 4 GiB: beyond the test's 1 GiB cap
        loss.backward()
        opt.step()
        opt.zero_grad()
        del keep
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
