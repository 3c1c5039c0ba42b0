"""Whether a run's ranks really synchronised their gradients, from each rank's own evidence.

A multi-rank figure (job throughput, speedup, scaling efficiency, the comm share) means what its
label says only when the ranks trained one model together. Each rank counts the forwards of a
DDP module with gradient sync on, the outermost forwards of an FSDP-sharded model (FSDP
reduce-scatters in backward), the forwards of a DataParallel module over 2+ devices, and the
``all_reduce`` calls the script made itself; a run whose ranks show none of these trained
independent replicas, and is never labelled ddp.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from mgprof.records import AutoWrapRecord, RankRecord, RunRecord

Status = Literal["synchronised", "independent", "partial", "unknown", "not applicable"]

INDEPENDENT_LABEL = "independent replicas"


class GradSync(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    """The run's verdict and the evidence behind it."""

    status: Status
    """``synchronised``, ``independent`` (replicas that never synchronised), ``partial``,
    ``unknown`` (records from an mgprof that did not count) or ``not applicable``."""
    how: str | None = None
    """``ddp`` / ``fsdp`` / ``dp`` / ``script all_reduce``: what synchronised the gradients."""
    synced_ranks: list[int] = msgspec.field(default_factory=list)
    independent_ranks: list[int] = msgspec.field(default_factory=list)
    detail: str = ""
    """The evidence, in words."""
    auto_wrap: AutoWrapRecord | None = None
    """Rank 0's auto-wrap record (what mgprof wrapped, or why it wrapped nothing)."""


def rank_sync(rec: RankRecord) -> str | None:
    """How this rank's gradients were synchronised; "" when they were not; None when unknown
    (a record from an mgprof that did not count)."""
    t = rec.training
    if t.cpu_threads is None:  # counted since the same version that records threads
        return None
    if t.ddp_sync_forwards:
        return "ddp"
    if t.fsdp_forwards:
        return "fsdp"
    if t.dp_forwards:
        return "dp"
    if t.script_all_reduces:
        return "script all_reduce"
    return ""


def grad_sync(run: RunRecord) -> GradSync:
    """The verdict for ``run``: synchronised, independent replicas, partial, or unknown."""
    wrap = next((r.training.auto_wrap for r in run.ranks if r.training.auto_wrap), None)
    auto = wrap
    if run.strategy == "single" or (run.strategy != "dp" and run.world_size < 2):
        return GradSync(
            status="not applicable", detail="one model replica: nothing to synchronise",
            auto_wrap=auto,
        )  # fmt: skip
    if run.strategy == "dp" and run.ranks and max(r.devices_used for r in run.ranks) < 2:
        return GradSync(
            status="not applicable",
            detail="DataParallel over one device: nothing to synchronise",
            auto_wrap=auto,
        )
    if not run.ranks:
        return GradSync(status="unknown", detail="no rank reported", auto_wrap=auto)
    verdicts = {r.rank: rank_sync(r) for r in run.ranks}
    if any(v is None for v in verdicts.values()):
        return GradSync(
            status="unknown",
            detail="these records predate gradient-sync evidence; re-run to check",
            auto_wrap=auto,
        )
    synced = sorted(k for k, v in verdicts.items() if v)
    independent = sorted(k for k, v in verdicts.items() if not v)
    hows = sorted({v for v in verdicts.values() if v})
    how = ", ".join(hows) if hows else None
    if not independent:
        detail = {
            "ddp": "every rank ran DistributedDataParallel forwards with gradient sync on",
            "dp": "DataParallel replicated each forward over two or more devices",
            "fsdp": (
                "sharded (FSDP: reduce-scatter): every rank ran forwards of the script's "
                "FSDP-sharded model, whose backward reduce-scatters the gradients"
            ),
            "script all_reduce": (
                "the script called all_reduce itself on every rank (mgprof cannot tell "
                "whether those were gradients)"
            ),
        }.get(how or "", f"synchronised by {how}")
        if how == "fsdp" and auto is not None and auto.wrapper == "fsdp":
            detail = detail.replace("the script's FSDP-sharded model", "the model mgprof sharded")
        return GradSync(
            status="synchronised", how=how, synced_ranks=synced, detail=detail, auto_wrap=auto
        )
    if not synced:
        reason = auto.reason if auto else None
        detail = (
            "no rank ran a DDP, FSDP or DataParallel forward or called all_reduce: each rank "
            "trained "
            "its own copy of the model, so their throughputs add up to no job's and there is "
            "no speedup to report"
        )
        if reason:
            detail += f" (auto-wrap: {reason})"
        elif auto is None and run.strategy in ("ddp", "dp", "fsdp", "fsdp-noreshard"):
            detail += " (auto-wrap was off)"
        return GradSync(
            status="independent", independent_ranks=independent, detail=detail, auto_wrap=auto
        )
    return GradSync(
        status="partial",
        how=how,
        synced_ranks=synced,
        independent_ranks=independent,
        detail=f"rank(s) {', '.join(map(str, independent))} never synchronised gradients",
        auto_wrap=auto,
    )


def strategy_label(run: RunRecord, sync: GradSync) -> str:
    """What to call the run's strategy: never ``ddp`` for ranks that did not synchronise."""
    if sync.status == "independent":
        return f"{INDEPENDENT_LABEL} (launched as {run.strategy})"
    if sync.status == "partial":
        return f"{run.strategy} (partly unsynchronised)"
    if sync.auto_wrap and sync.auto_wrap.wrapper:
        return f"{run.strategy} (auto-wrapped)"
    if sync.how == "ddp" and run.strategy.startswith("fsdp"):
        return f"ddp (the script's own; launched as {run.strategy})"
    if sync.how == "fsdp":
        if run.strategy.startswith("fsdp"):
            return f"{run.strategy} (the script's own FSDP)"
        return f"fsdp (the script's own; launched as {run.strategy})"
    return run.strategy
