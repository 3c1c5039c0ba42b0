"""Findings on the input pipeline: DataLoader stalls, identical batches across ranks, set_epoch."""

from __future__ import annotations

from typing import Any

from mgprof.analyze.findings.core import Finding, _facts, _mean_step_ms, _rank_list, finding_id
from mgprof.analyze.findings.fit import cores_per_rank, grad_sync_status, ranks_per_host, uses_gpu
from mgprof.analyze.run.results import JobAnalysis
from mgprof.analyze.run.schema import RunAnalysis
from mgprof.records import RunRecord

# --------------------------------------------------------------------------------------------
# Thresholds

DATALOADER_SHARE_PCT = 10.0
"""Waiting 10 % of step time for data: more than the cost of a few loader workers."""
DATALOADER_HIGH_PCT = 30.0
"""A third of the step waiting for data: the model runs at loader speed."""


# --------------------------------------------------------------------------------------------
# Rules


def dataloader_stall(run: RunRecord, figures: RunAnalysis) -> Finding | None:
    """Steps waiting for the next batch: the input pipeline is slower than the model."""
    shares = [
        (share, rank.rank, rank)
        for rank in figures.ranks
        if (share := rank.dataloader_share_pct) is not None
    ]
    job_share = figures.job.dataloader_share_pct if figures.job is not None else None
    if not shares:
        return None
    worst, worst_rank, rank = max(shares, key=lambda s: (s[0], -s[1]))
    if worst < DATALOADER_SHARE_PCT:
        return None
    figs: dict[str, Any] = {
        "dataloader_share_pct": worst,
        "rank": worst_rank,
        "threshold_dataloader_share_pct": DATALOADER_SHARE_PCT,
        "threshold_high_dataloader_share_pct": DATALOADER_HIGH_PCT,
    }
    evidence = (
        f"rank {worst_rank} waits for the DataLoader {worst:.1f} % of step time "
        f"(fires ≥ {DATALOADER_SHARE_PCT:.0f} %, high ≥ {DATALOADER_HIGH_PCT:.0f} %)"
    )
    if job_share is not None:
        evidence += f"; all ranks: {job_share:.1f} %"
        figs["job_dataloader_share_pct"] = job_share
    workers = next(iter(_facts(run, "dataloader_num_workers").values()), None)
    pinned = next(iter(_facts(run, "dataloader_pin_memory").values()), None)
    if workers is not None:
        evidence += f"; num_workers={workers}"
        figs["num_workers"] = workers
    if pinned is not None:
        evidence += f", pin_memory={pinned}"
        figs["pin_memory"] = pinned
    loader = _loader_advice(run, workers, pinned, figs)
    evidence += loader.evidence
    step_ms = _mean_step_ms(rank)
    saving = None
    if step_ms is not None:
        saving = f"up to {step_ms * worst / 100.0:,.2f} ms of the {step_ms:,.2f} ms mean step"
        figs["mean_step_ms"] = step_ms
    return Finding(
        id=finding_id("dataloader_stall"),
        rule="dataloader_stall",
        severity="high" if worst >= DATALOADER_HIGH_PCT else "medium",
        title="Training waits for the data loader",
        evidence=evidence,
        cause=(
            "batches are loaded and collated in the training process (or by too few workers), "
            "so the step stops until the next one is ready."
        ),
        change=loader.change,
        fix=loader.fix,
        saving=saving,
        figures=figs,
    )


class _LoaderAdvice:
    def __init__(self) -> None:
        self.evidence = ""
        self.change = ""
        self.fix: list[str] = []


def _loader_advice(
    run: RunRecord, workers: int | None, pinned: bool | None, figs: dict[str, Any]
) -> _LoaderAdvice:
    """DataLoader arguments that fit the machine: never more workers than a rank's cores, pinned
    memory only for CUDA, persistent workers only when there are workers."""
    out = _LoaderAdvice()
    cores = cores_per_rank(run)
    wanted = 4 if not workers else workers * 2
    worker_arg: str | None = None
    room = True  # whether more workers than advised could still fit
    if cores is None:
        # Cores not recorded (older records): an expression the script evaluates on its machine.
        per_host = max((ranks_per_host(run, r.host) for r in run.ranks), default=1)
        share = "os.cpu_count()" if per_host == 1 else f"os.cpu_count() // {per_host}"
        worker_arg = f"num_workers=min({wanted}, {share})"
    else:
        figs["cores_per_rank"] = cores
        out.evidence = f"; {cores} CPU core(s) per rank"
        advised = min(wanted, cores)
        room = advised < cores
        if advised > (workers or 0):
            worker_arg = f"num_workers={advised}"
            figs["advised_num_workers"] = advised
        else:
            out.evidence += ", all in use by the loader's workers" if workers else ""
    args = [worker_arg] if worker_arg else []
    if pinned is not True and uses_gpu(run):
        args.append("pin_memory=True")
    if worker_arg or (workers or 0) > 0:
        args.append("persistent_workers=True")
    parts = [f"`DataLoader(dataset, ..., {', '.join(args)})`"] if args else []
    out.fix = [f"DataLoader({', '.join(args)})"] if args else []
    if worker_arg and room:
        more = f" ({cores})" if cores is not None else ""
        parts.append(f"if the wait remains, add workers up to the CPU cores per rank{more}")
    else:
        parts.append(
            "make each batch cheaper to produce: decode and pre-process once and cache the "
            "result, or batch the transforms"
        )
        out.fix.append("cache pre-processed samples")
    out.change = "; ".join(parts)
    return out


def identical_batches(run: RunRecord, figures: RunAnalysis) -> Finding | None:
    """Every rank trained on the same batches: N ranks doing one rank's worth of learning."""
    job = figures.job
    if job is None or job.identical_batches is not True:
        return None
    compared = job.fingerprint_steps_compared
    n_same = len(job.identical_batch_steps)
    n_ranks = len(run.ranks)
    samplers = _facts(run, "distributed_sampler")
    evidence = (
        f"batch fingerprints equal on all {n_ranks} ranks in {n_same}/{compared} compared steps"
    )
    figs: dict[str, Any] = {
        "rank_count": n_ranks,
        "identical_steps": n_same,
        "compared_steps": compared,
    }
    if samplers:
        without = sorted(r for r, v in samplers.items() if v is False)
        figs["ranks_without_sampler"] = without
        evidence += (
            f"; no DistributedSampler on ranks {_rank_list(without)}"
            if without
            else "; DistributedSampler in use"
        )
    status, how = grad_sync_status(figures)
    evidence += _SYNC_EVIDENCE.get(status or "", "")
    uses_sampler = bool(samplers) and all(samplers.values())
    cause = (
        "each rank builds or shuffles its data from the same seed, so the DistributedSampler's "
        "shards hold the same values (e.g. synthetic data from one `torch.manual_seed`)"
        if uses_sampler
        else "the DataLoader has no DistributedSampler, so every rank iterates the whole "
        "dataset in the same order"
    )
    change = (
        "`DataLoader(dataset, batch_size=..., sampler=DistributedSampler(dataset))` "
        "(and no `shuffle=True`); seed per-rank randomness with `seed + rank`"
    )
    fix = [
        "DataLoader(dataset, sampler=DistributedSampler(dataset))",
        "torch.manual_seed(seed + rank)",
    ]
    saving = (
        f"the job learns from 1/{n_ranks} of the samples it pays for: fixing it gives "
        f"{n_ranks}x the distinct samples per second"
    )
    if status == "independent":
        change += "; wrap the model in `DistributedDataParallel(model)` to train one model"
        fix.append("DistributedDataParallel(model)")
        saving = (
            f"the {n_ranks - 1} extra rank(s) add nothing now; trained as one DDP model on "
            f"distinct shards, the job would learn from {n_ranks}x the distinct samples per second"
        )
    return Finding(
        id=finding_id("identical_batches"),
        rule="identical_batches",
        severity="high",
        title="All ranks train on the same batches",
        evidence=evidence,
        cause=cause + _consequence(status, how, job),
        change=change,
        fix=fix,
        saving=saving,
        figures=figs,
    )


_SYNC_EVIDENCE = {
    "synchronised": "; gradients synchronised",
    "independent": "; the ranks never synchronised gradients",
    "partial": "; some ranks never synchronised gradients",
}


def set_epoch_missing(run: RunRecord, figures: RunAnalysis) -> Finding | None:
    """DistributedSampler without ``set_epoch``: the same shuffle every epoch."""
    samplers = _facts(run, "distributed_sampler")
    called = _facts(run, "set_epoch_called")
    missing = sorted(r for r, used in samplers.items() if used is True and called.get(r) is False)
    if not missing:
        return None
    steps = max((len(r.steps) for r in run.ranks if r.rank in missing), default=0)
    return Finding(
        id=finding_id("set_epoch_missing"),
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
        fix=["sampler.set_epoch(epoch)"],
        figures={"ranks": missing, "steps_recorded": steps},
    )


def _consequence(status: str | None, how: str, job: JobAnalysis) -> str:
    """What identical batches cost depends on whether, and how, the ranks synchronised: say
    only what was measured (the analysis's grad_sync verdict)."""
    if status == "synchronised":
        if how == "script all_reduce":
            return (
                "; the script all-reduces on every rank, so if those are gradients, they are "
                "averaged over copies of one batch."
            )
        return "; the gradients are then averaged over copies of one batch."
    if status == "independent":
        return (
            "; the replicas also never synchronised gradients: each trained its own copy on "
            "the same data, so the extra ranks add nothing."
        )
    if status == "partial":
        ranks = job.grad_sync.independent_ranks if job.grad_sync is not None else []
        return (
            f"; ranks {_rank_list(ranks)} never synchronised gradients: they trained their own "
            "copies on the same data."
        )
    return "."
