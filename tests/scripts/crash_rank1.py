"""A torchrun-style DDP script whose rank 1 fails after two optimizer steps.

Used by tests/test_failure_reports.py: ``mgprof analyze tests/scripts/crash_rank1.py --gpus 2``
must name rank 1 and its ``ValueError`` and keep each rank's output in ``logs/rank<N>.log``.
"""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
model = DDP(torch.nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)

for step in range(10):
    x = torch.randn(4, 8)
    model(x).sum().backward()
    opt.step()
    opt.zero_grad()
    print(f"rank {rank} step {step} done", flush=True)
    if step == 1 and rank == 1:
        raise ValueError("bad batch shape on purpose")

dist.destroy_process_group()
