"""What the advice may assume about the device and the machine the run used.

Advice must fit what was measured: no NVML or ``nvidia-smi`` advice on a CPU run, no more
DataLoader workers than the cores a rank has, no bucket-size advice when the gradients fit in one
DDP bucket, and no DDP-bucket advice for communication the script issued itself.
"""

from __future__ import annotations

import math
from collections import Counter

from mgprof.analyze.run.schema import RunAnalysis
from mgprof.records import RunRecord

DDP_DEFAULT_BUCKET_CAP_MB = 25.0
"""``DistributedDataParallel``'s default ``bucket_cap_mb``, assumed when no cap was recorded."""


def uses_gpu(run: RunRecord) -> bool:
    """True when a rank ran on a CUDA device and the run was not a CPU fallback: only then may
    advice name GPUs, NVML, tensor cores or pinned memory."""
    return not run.cpu_fallback and any(r.device.kind == "cuda" for r in run.ranks)


def device_word(run: RunRecord) -> str:
    """``GPU`` or ``rank`` for phrases like "per-GPU batch"."""
    return "GPU" if uses_gpu(run) else "rank"


def ranks_per_host(run: RunRecord, host: str) -> int:
    """Ranks sharing ``host``: those reported from it, and at least the launcher's share of the
    world (``world_size / nnodes``), so a rank that did not report still counts."""
    reported = Counter(r.host for r in run.ranks)[host]
    share = math.ceil(run.world_size / max(run.nnodes, 1))
    return max(reported, share, 1)


def cores_per_rank(run: RunRecord) -> int | None:
    """Usable CPU cores of one rank: its process's cores divided among the ranks of its host,
    the smallest over ranks; None when no rank recorded its cores (older records)."""
    shares = [
        r.training.cpu_cores // ranks_per_host(run, r.host)
        for r in run.ranks
        if r.training.cpu_cores is not None
    ]
    return min(shares) if shares else None


def grad_sync_status(analysis: RunAnalysis) -> tuple[str | None, str]:
    """(status, how) of the analysis's gradient-sync verdict; (None, "") when absent."""
    sync = analysis.job.grad_sync if analysis.job is not None else None
    if sync is None:
        return None, ""
    return sync.status, sync.how or ""


def ddp_buckets(run: RunRecord) -> tuple[float, float] | None:
    """(gradient MiB, bucket cap MB) of the DDP model when the gradients were measured; None when
    ``ddp_gradient_mib`` is unknown (then no bucket-size advice is given)."""
    for rec in sorted(run.ranks, key=lambda r: r.rank):
        grad = rec.training.ddp_gradient_mib
        if grad is not None:
            cap = rec.training.ddp_bucket_cap_mb
            return float(grad), float(cap if cap is not None else DDP_DEFAULT_BUCKET_CAP_MB)
    return None
