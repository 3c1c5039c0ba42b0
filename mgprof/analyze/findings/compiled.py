"""Findings for runs with ``torch.compile``: DDP wrapped around the compiled module, and steps
that run mostly outside compiled graphs.

Both fire on what was measured: the auto-wrap record says which order ran, the ranks'
communication figures say how much of the gradient all-reduce overlapped, dynamo's counters say
how many graph breaks there were, and the trace's compiled regions say how much of the step the
compiled graphs covered.
"""

from __future__ import annotations

from typing import Any

from mgprof.analyze.findings.core import Finding, _facts, _trace_summaries, finding_id
from mgprof.analyze.run.schema import RunAnalysis
from mgprof.analyze.stats import percentile
from mgprof.records import RunRecord

LOW_COMPILED_PCT = 50.0
"""Under half of the traced steps inside compiled graphs, with graph breaks counted: most of the
training runs as eager Python the compiler never saw."""


def ddp_around_compiled(run: RunRecord, figures: RunAnalysis) -> Finding | None:
    """Auto-wrap had to put DDP around the script's compiled module (``DDP(compiled)``)."""
    wrap = next(iter(_facts(run, "auto_wrap").values()), None)
    order = getattr(wrap, "compile_order", None)
    if not order or not order.startswith("ddp(compiled)"):
        return None
    figs: dict[str, Any] = {"compile_order": order}
    evidence = f"auto-wrap ran {order}"
    overlaps = [
        r.comm.comm_overlap_pct
        for r in figures.ranks
        if r.comm is not None and r.comm.comm_overlap_pct is not None
    ]
    if overlaps:
        median = percentile(overlaps, 50.0)
        figs["median_comm_overlap_pct"] = median
        figs["ranks_measured"] = len(overlaps)
        evidence += (
            f"; {median:.1f} % of the communication overlapped compute (median of "
            f"{len(overlaps)} ranks)"
        )
    torch_own = "torch's own" in order
    return Finding(
        id=finding_id("ddp_around_compiled"),
        rule="ddp_around_compiled",
        severity="medium" if overlaps and figs["median_comm_overlap_pct"] < 50 else "low",
        title="DDP wraps the compiled module: its gradient buckets cannot overlap the graph",
        evidence=evidence,
        cause=(
            "DDP overlaps each gradient bucket's all-reduce with the rest of the backward; "
            "around a compiled module it sees one opaque backward, so the all-reduce waits for "
            "all of it. Compiling the DDP wrapper lets dynamo split the graph at bucket "
            "boundaries (DDPOptimizer)."
        ),
        change=(
            "define the model as a class of your own (dynamo does not compile torch's own "
            "containers inside DDP), then wrap before compiling: `model = "
            "DistributedDataParallel(model)` and `model = torch.compile(model)`"
            if torch_own
            else "wrap before compiling: `model = DistributedDataParallel(model)`, then "
            "`model = torch.compile(model)`"
        ),
        fix=["model = torch.compile(DistributedDataParallel(model))"],
        figures=figs,
    )


def mostly_uncompiled(run: RunRecord, figures: RunAnalysis) -> Finding | None:
    """Graph breaks, and under half of the traced steps inside compiled graphs."""
    counted = _facts(run, "compile")
    if not counted:
        return None
    rank, record = next(iter(counted.items()))
    if record.graph_breaks < 1:
        return None
    regions = [s.compiled for s in _trace_summaries(figures, rank) if s.compiled is not None]
    if not regions:
        return None
    window = sum(r.window_us for r in regions)
    inside = sum((r.compiled_pct or 0.0) * r.window_us / 100.0 for r in regions if r.window_us > 0)
    if window <= 0:
        return None
    pct = 100.0 * inside / window
    if pct >= LOW_COMPILED_PCT:
        return None
    per_step = sum(r.regions for r in regions) / max(1, sum(r.steps for r in regions))
    figs: dict[str, Any] = {
        "rank": rank,
        "compiled_pct": pct,
        "threshold_compiled_pct": LOW_COMPILED_PCT,
        "graph_breaks": record.graph_breaks,
        "regions_per_step": per_step,
    }
    evidence = (
        f"rank {rank}: {pct:.1f} % of the traced steps inside compiled graphs (fires < "
        f"{LOW_COMPILED_PCT:.0f} %), {per_step:.1f} compiled regions per step, "
        f"{record.graph_breaks} graph break(s)"
    )
    if record.break_reasons:
        evidence += f"; most frequent: {record.break_reasons[0]}"
    return Finding(
        id=finding_id("mostly_uncompiled"),
        rule="mostly_uncompiled",
        severity="medium",
        title="Most of the step runs outside torch.compile's graphs",
        evidence=evidence,
        cause=(
            "dynamo stops a graph where it cannot trace (a graph break) and runs the rest as "
            "Python until the next frame it can compile; what runs between graphs gets none of "
            "the compiler's fusion."
        ),
        change=(
            "find the breaks with `TORCH_LOGS=graph_breaks python script.py` or "
            "`torch._dynamo.explain(model)(batch)`, and move what breaks (prints, .item(), "
            "data-dependent Python) out of the compiled forward"
        ),
        fix=["TORCH_LOGS=graph_breaks", "torch._dynamo.explain(model)(batch)"],
        figures=figs,
    )
