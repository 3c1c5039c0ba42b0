"""A DDP script whose rank HOG_RANK (default 1) holds an extra 64 MiB inside region "hog"
each step, unchanged by mgprof (it uses only mgprof.region). With HOG_OOM=1 that rank asks, at
step 3, for far more than it may have (HOG_CUDA_GIB GiB on CUDA, 4 GiB on CPU: beyond the
test's address-space cap), as a real out-of-memory error would happen. Runs on CUDA (NCCL) when
a GPU is visible, else on the CPU (gloo)."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import nn

import mgprof


def main() -> None:
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(rank)
    model = nn.parallel.DistributedDataParallel(nn.Linear(64, 64).to(device))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    hog_rank = int(os.environ.get("HOG_RANK", "1"))
    oom_gib = int(os.environ.get("HOG_CUDA_GIB", "4")) if cuda else 4
    for step in range(8):
        x = torch.randn(32, 64, device=device)
        with mgprof.region("forward"):
            loss = model(x).pow(2).mean()
        keep = None
        if rank == hog_rank:
            with mgprof.region("hog"):
                keep = torch.ones(16 * 2**20, device=device)  # 64 MiB, live until the step ends
                if os.environ.get("HOG_OOM") == "1" and step == 3:
                    keep = torch.ones(oom_gib * 2**28, device=device)  # oom_gib GiB of float32
        loss.backward()
        opt.step()
        opt.zero_grad()
        del keep
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
