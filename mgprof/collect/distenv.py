"""Where this process sits in the job (rank, local rank, world size, node) and how records travel.

Records and traces go to rank 0 over the job's own process group as raw bytes (msgspec-encoded
records, gzip'd traces) through tensors: no pickle, and no shared filesystem needed.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class RankInfo:
    """Identity of this process in the job, from the process group or torchrun's environment."""

    rank: int
    local_rank: int
    world_size: int
    node_rank: int
    nnodes: int
    host: str

    @property
    def multi_node(self) -> bool:
        return self.nnodes > 1

    @property
    def worker_name(self) -> str:
        """TensorBoard worker name: ``rank<N>``, plus the host when the job spans nodes."""
        return f"{self.host}_rank{self.rank}" if self.multi_node else f"rank{self.rank}"


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def rank_info() -> RankInfo:
    """Current rank identity; the process group wins over the environment when it is up.

    May raise (a broken process group, a host name that cannot be read): callers inside the
    user's training call it under a guard and fall back to :func:`env_rank_info`.
    """
    rank = _env_int("RANK", 0)
    world = _env_int("WORLD_SIZE", 1)
    if dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
    local_world = max(_env_int("LOCAL_WORLD_SIZE", world), 1)
    nnodes = _env_int("MGPROF_NNODES", max(1, -(-world // local_world)))
    return RankInfo(
        rank=rank,
        local_rank=_env_int("LOCAL_RANK", 0),
        world_size=world,
        node_rank=_env_int("GROUP_RANK", _env_int("NODE_RANK", 0)),
        nnodes=nnodes,
        host=socket.gethostname(),
    )


def hostname() -> str:
    """This machine's name, or ``unknown-host`` when it cannot be read. Never raises."""
    try:
        return socket.gethostname() or "unknown-host"
    except Exception:
        return "unknown-host"


def env_rank_info() -> RankInfo:
    """Rank identity from torchrun's environment alone (no process group calls). Never raises:
    the fallback when :func:`rank_info` fails."""
    world = max(_env_int("WORLD_SIZE", 1), 1)
    local_world = max(_env_int("LOCAL_WORLD_SIZE", world), 1)
    return RankInfo(
        rank=_env_int("RANK", 0),
        local_rank=_env_int("LOCAL_RANK", 0),
        world_size=world,
        node_rank=_env_int("GROUP_RANK", _env_int("NODE_RANK", 0)),
        nnodes=max(_env_int("MGPROF_NNODES", max(1, -(-world // local_world))), 1),
        host=hostname(),
    )


def group_ready() -> bool:
    """True when a default process group is up with more than one rank."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _comm_device() -> torch.device:
    """NCCL moves only CUDA tensors; every other backend takes CPU tensors."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def gather_bytes_to_rank0(payload: bytes) -> list[bytes] | None:
    """Send each rank's bytes to rank 0. Rank 0 gets one entry per rank, others get None.

    Sizes are all-gathered first, then every rank sends its buffer point to point, so rank 0
    holds at most one copy of each rank's data and the others hold only their own.
    """
    device = _comm_device()
    world, rank = dist.get_world_size(), dist.get_rank()
    size = torch.tensor([len(payload)], dtype=torch.int64, device=device)
    sizes = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(world)]
    dist.all_gather(sizes, size)
    if rank != 0:
        if payload:
            buf = torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(device)
            dist.send(buf, dst=0)
        return None
    out: list[bytes] = []
    for src in range(world):
        n = int(sizes[src].item())
        if src == 0:
            out.append(payload)
        elif n == 0:
            out.append(b"")
        else:
            buf = torch.empty(n, dtype=torch.uint8, device=device)
            dist.recv(buf, src=src)
            out.append(buf.cpu().numpy().tobytes())
    return out
