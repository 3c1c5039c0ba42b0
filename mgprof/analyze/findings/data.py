"""Findings on the input pipeline: DataLoader stalls, identical batches across ranks, set_epoch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mgprof.analyze.findings.core import (
    Finding,
    _cuda_ranks,
    _facts,
    _job,
    _mean_step_ms,
    _rank_list,
)
from mgprof.analyze.readers import num as _num
from mgprof.analyze.readers import rank_dicts as _ranks
from mgprof.records import RunRecord

# --------------------------------------------------------------------------------------------
# Thresholds

DATALOADER_SHARE_PCT = 10.0
"""Waiting 10 % of step time for data: more than the cost of a few loader workers."""
DATALOADER_HIGH_PCT = 30.0
"""A third of the step waiting for data: the model runs at loader speed."""


# --------------------------------------------------------------------------------------------
# Rules


def dataloader_stall(run: RunRecord, figures: Mapping[str, Any]) -> Finding | None:
    """Steps waiting for the next batch: the input pipeline is slower than the model."""
    shares = [
        (share, rank)
        for rank in _ranks(figures)
        if (share := _num(rank.get("dataloader_share_pct"))) is not None
    ]
    job_share = _num(_job(figures).get("dataloader_share_pct"))
    if not shares:
        return None
    worst, rank = max(shares, key=lambda s: s[0])
    if worst < DATALOADER_SHARE_PCT:
        return None
    evidence = f"rank {rank.get('rank')} waits for the DataLoader {worst:.1f} % of step time"
    if job_share is not None:
        evidence += f" (all ranks: {job_share:.1f} %)"
    workers = next(iter(_facts(run, "dataloader_num_workers").values()), None)
    pinned = next(iter(_facts(run, "dataloader_pin_memory").values()), None)
    changes = []
    if workers is not None:
        evidence += f"; num_workers={workers}"
        if workers == 0:
            changes.append("num_workers=4")
        else:
            changes.append(f"num_workers={workers * 2}")
    else:
        changes.append("num_workers=4")
    if pinned is not None:
        evidence += f", pin_memory={pinned}"
    if pinned is not True and _cuda_ranks(run):
        changes.append("pin_memory=True")
    changes.append("persistent_workers=True")
    step_ms = _mean_step_ms(rank)
    saving = None
    if step_ms is not None:
        saving = f"up to {step_ms * worst / 100.0:,.2f} ms of the {step_ms:,.2f} ms mean step"
    return Finding(
        rule="dataloader_stall",
        severity="high" if worst >= DATALOADER_HIGH_PCT else "medium",
        title="Training waits for the data loader",
        evidence=evidence,
        cause=(
            "batches are loaded and collated in the training process (or by too few workers), "
            "so the step stops until the next one is ready."
        ),
        change=(
            f"`DataLoader(dataset, ..., {', '.join(changes)})`; if the wait remains, add workers "
            "up to the CPU cores available per rank"
        ),
        saving=saving,
        figures={
            "dataloader_share_pct": worst,
            "rank": rank.get("rank"),
            "job_dataloader_share_pct": job_share,
            "num_workers": workers,
            "pin_memory": pinned,
        },
    )


def identical_batches(run: RunRecord, figures: Mapping[str, Any]) -> Finding | None:
    """Every rank trained on the same batches: N GPUs doing one GPU's worth of learning."""
    job = _job(figures)
    if job.get("identical_batches") is not True:
        return None
    compared = int(_num(job.get("fingerprint_steps_compared")) or 0)
    same = job.get("identical_batch_steps")
    n_same = len(same) if isinstance(same, list) else compared
    n_ranks = len(run.ranks)
    samplers = _facts(run, "distributed_sampler")
    evidence = (
        f"batch fingerprints equal on all {n_ranks} ranks in {n_same}/{compared} compared steps"
    )
    if samplers:
        without = [r for r, v in samplers.items() if v is False]
        evidence += (
            f"; no DistributedSampler on ranks {_rank_list(without)}"
            if without
            else "; DistributedSampler in use"
        )
    uses_sampler = bool(samplers) and all(samplers.values())
    cause = (
        "each rank builds or shuffles its data from the same seed, so the DistributedSampler's "
        "shards hold the same values (e.g. synthetic data from one `torch.manual_seed`)"
        if uses_sampler
        else "the DataLoader has no DistributedSampler, so every rank iterates the whole "
        "dataset in the same order"
    )
    return Finding(
        rule="identical_batches",
        severity="high",
        title="All ranks train on the same batches",
        evidence=evidence,
        cause=cause + _consequence(job),
        change=(
            "`DataLoader(dataset, batch_size=..., sampler=DistributedSampler(dataset))` "
            "(and no `shuffle=True`); seed per-rank randomness with `seed + rank`"
        ),
        saving=(
            f"the job learns from 1/{n_ranks} of the samples it pays for: fixing it gives "
            f"{n_ranks}x the distinct samples per second"
        ),
        figures={"ranks": n_ranks, "identical_steps": n_same, "compared_steps": compared},
    )


def set_epoch_missing(run: RunRecord, figures: Mapping[str, Any]) -> Finding | None:
    """DistributedSampler without ``set_epoch``: the same shuffle every epoch."""
    samplers = _facts(run, "distributed_sampler")
    called = _facts(run, "set_epoch_called")
    missing = [r for r, used in samplers.items() if used is True and called.get(r) is False]
    if not missing:
        return None
    steps = max((len(r.steps) for r in run.ranks if r.rank in missing), default=0)
    return Finding(
        rule="set_epoch_missing",
        severity="medium",
        title="DistributedSampler.set_epoch() is never called",
        evidence=(
            f"DistributedSampler in use on ranks {_rank_list(missing)}; set_epoch() not called "
            f"during {steps} recorded steps"
        ),
        cause=(
            "the sampler shuffles with a seed derived from the epoch; without set_epoch every "
            "epoch repeats the first epoch's order on every rank."
        ),
        change="call `sampler.set_epoch(epoch)` at the start of each epoch, before iterating",
        figures={"ranks": missing},
    )


def _consequence(job: Mapping[str, Any]) -> str:
    """What identical batches cost depends on whether the ranks synchronised at all."""
    sync = job.get("grad_sync")
    status = sync.get("status") if isinstance(sync, Mapping) else None
    if status == "independent":
        return "; the ranks also never synchronised, so each trained its own copy on the same data."
    return "; the gradients are then averaged over copies of one batch."
