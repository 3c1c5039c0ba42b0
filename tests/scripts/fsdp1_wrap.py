"""A plain FSDP1 script: ``FullyShardedDataParallel`` around a small MLP with an auto-wrap policy,
as the PyTorch FSDP1 tutorial writes it. FSDP1 needs an accelerator (CUDA), so only
``benchmarks/gpu_checks.sh`` runs it."""

import functools
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy


def main() -> None:
    dist.init_process_group("nccl")
    local = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local)
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1)
    ).cuda()
    policy = functools.partial(size_based_auto_wrap_policy, min_num_params=100_000)
    model = FSDP(model, auto_wrap_policy=policy, device_id=local)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(20):
        loss = model(torch.randn(32, 256, device="cuda")).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
