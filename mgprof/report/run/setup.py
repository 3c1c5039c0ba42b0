"""Run-report Setup section: what ran and how (sync, auto-wrap, threads), read off the RunRecord."""

from __future__ import annotations

from mgprof.analyze.run.grad_sync import GradSync
from mgprof.analyze.run.precision import setting_label
from mgprof.analyze.run.schema import PrecisionAnalysis, RunAnalysis, given
from mgprof.records import CompileRecord, FsdpRecord, RunRecord
from mgprof.report.run.section_model import Section, Table


def setup_section(run: RunRecord, analysis: RunAnalysis) -> Section:
    sec = Section("Setup")
    reported = len(run.ranks)
    world = f"{run.world_size}" + (f" ({reported} reported)" if reported != run.world_size else "")
    status = run.status + (f" (exit code {run.exit_code})" if run.exit_code is not None else "")
    job = analysis.job
    label = job.strategy_label if job is not None else None
    sec.facts = [
        ("run", run.run_id or "-"),
        ("created (UTC)", run.created_utc or "-"),
        ("script", " ".join([run.script or "-", *run.script_args])),
        ("strategy", label if label is not None else run.strategy),
        ("world size", world),
        ("nodes", str(run.nnodes)),
        ("backend", run.backend or "-"),
        ("status", status),
    ]
    samplers = bool(run.ranks) and all(r.training.distributed_sampler for r in run.ranks)
    if job is not None and job.grad_sync is not None:
        sec.facts.extend(_sync_facts(job.grad_sync, samplers))
    fsdp = next((r.training.fsdp for r in run.ranks if r.training.fsdp is not None), None)
    if fsdp is not None:
        sec.facts.append(("FSDP", fsdp_text(fsdp)))
    compiled = next((r.training.compile for r in run.ranks if r.training.compile), None)
    if compiled is not None:
        sec.facts.append(("torch.compile", compile_text(compiled)))
    precision = given(analysis.precision)
    if precision is not None:
        sec.facts.append(("precision", _precision_fact(precision)))
    threads = _threads(run)
    if threads:
        sec.facts.append(("CPU threads", threads))
    if run.missing_ranks:
        sec.facts.append(("missing ranks", ", ".join(str(r) for r in sorted(run.missing_ranks))))
    if run.error:
        sec.facts.append(("error", run.error))
    if run.exit_note:
        sec.facts.append(("exit", run.exit_note))
    table = Table(["rank", "host", "device", "name", "devices used", "sampler"], numeric_from=6)
    for rec in sorted(run.ranks, key=lambda r: r.rank):
        dev = rec.device
        label = dev.kind if dev.index is None else f"{dev.kind}:{dev.index}"
        table.rows.append(
            [
                str(rec.rank),
                rec.host or "-",
                label,
                dev.name or "-",
                str(rec.devices_used),
                rec.sampler.kind + (f" ({rec.sampler.reason})" if rec.sampler.reason else ""),
            ]
        )
        if rec.error:
            sec.notes.append(f"rank {rec.rank} error: {rec.error}")
        sec.notes.extend(f"rank {rec.rank} warning: {w}" for w in rec.warnings)
    sec.tables.append(table)
    if run.cpu_fallback:
        notice = job.cpu_fallback_notice if job is not None else None
        sec.notice = (
            notice
            if notice is not None
            else f"This run used the CPU, not GPUs: {run.cpu_fallback_reason or 'no CUDA device'}."
        )
    sec.notes.extend(f"analysis warning: {w}" for w in analysis.warnings)
    return sec


def _sync_facts(sync: GradSync, samplers: bool = False) -> list[tuple[str, str]]:
    """Gradient sync and auto-wrap lines: what the multi-rank figures below rest on."""
    status = sync.status
    if status == "not applicable":
        return []
    facts = [("gradient sync", f"{status}: {sync.detail}".rstrip(": "))]
    wrap = sync.auto_wrap
    if wrap is not None and wrap.wrapper:
        what = f"{wrap.module_class} ({_count(wrap.parameters)} parameters)"
        how = {
            "ddp": "DistributedDataParallel",
            "dp": "DataParallel",
            "fsdp": "FSDP2 (fully_shard per unit and on the root)",
        }.get(wrap.wrapper, wrap.wrapper)
        extra = []
        if wrap.optimizer_params_repointed is not None:
            extra.append(
                f"optimizer re-pointed at the shards ({wrap.optimizer_params_repointed} parameters)"
            )
        if wrap.bucket_cap_mb is not None:
            extra.append(f"bucket_cap_mb {wrap.bucket_cap_mb:g}")
        if wrap.devices:
            extra.append("devices " + ",".join(str(d) for d in wrap.devices))
        if wrap.initialized_process_group:
            extra.append("process group initialised by mgprof")
        if wrap.compile_order:
            extra.append(f"compiled as {wrap.compile_order}")
        tail = f"; {', '.join(extra)}" if extra else ""
        facts.append(("auto-wrap", f"{what} under {how}{tail} (--no-auto-wrap turns it off)"))
        if wrap.wrapper in ("ddp", "fsdp") and not samplers:
            facts.append(
                (
                    "data",
                    "no DistributedSampler: every rank reads the whole dataset (right for "
                    "measuring speed, wrong for training; shard it with DistributedSampler)",
                )
            )
    elif wrap is not None and wrap.reason:
        facts.append(("auto-wrap", f"nothing wrapped: {wrap.reason}"))
    return facts


def compile_text(c: CompileRecord) -> str:
    """``4 graphs, 2 graph breaks (top: 2x ...), 40/42 frames (rank 0's dynamo counters)``."""
    text = f"{c.graphs} graph(s), {c.graph_breaks} graph break(s)"
    if c.break_reasons:
        text += f" (most: {c.break_reasons[0]})"
    if c.frames_total:
        text += f", {c.frames_ok or 0}/{c.frames_total} frames compiled"
    if c.recompiles:
        text += f", {c.recompiles} recompilation(s)"
    return text + " (dynamo's counters, first rank)"


def fsdp_text(fsdp: FsdpRecord) -> str:
    """``fully_shard (FSDP2): 5 units (Block x4, Net x1), reshard_after_forward True, ...``."""
    api = {"fully_shard": "fully_shard (FSDP2)", "FullyShardedDataParallel": "FSDP1"}.get(
        fsdp.api, fsdp.api
    )
    classes = ", ".join(f"{name} x{n}" for name, n in fsdp.unit_classes.items())
    parts = [f"{api}: {fsdp.units} unit{'s' if fsdp.units != 1 else ''}"]
    if classes:
        parts[0] += f" ({classes})"
    if fsdp.reshard_after_forward:
        values = "/".join(str(v) for v in fsdp.reshard_after_forward)
        parts.append(f"reshard_after_forward {values}")
    if fsdp.sharding_strategy:
        parts.append(f"sharding {fsdp.sharding_strategy}")
    if fsdp.param_dtype or fsdp.reduce_dtype:
        parts.append(
            f"mixed precision: params {fsdp.param_dtype or 'as stored'}, "
            f"reduce {fsdp.reduce_dtype or 'as params'}"
        )
    else:
        parts.append("no mixed-precision policy")
    if fsdp.mesh_shape:
        parts.append("mesh " + " x ".join(str(n) for n in fsdp.mesh_shape))
    elif fsdp.world:
        parts.append(f"{fsdp.world} ranks")
    return ", ".join(parts)


def _count(value: int | None) -> str:
    return f"{float(value):,.0f}" if value is not None else "?"


def _threads(run: RunRecord) -> str | None:
    """``1 per rank (OMP_NUM_THREADS=1)``: step times on CPU depend on it, so say it."""
    seen = {(r.training.cpu_threads, r.training.omp_num_threads) for r in run.ranks}
    seen.discard((None, None))
    if not seen:
        return None
    parts = []
    for threads, omp in sorted(seen, key=str):
        env = f"OMP_NUM_THREADS={omp}" if omp is not None else "OMP_NUM_THREADS unset"
        parts.append(f"{threads if threads is not None else '?'} per rank ({env})")
    return "; ".join(parts)


def _precision_fact(precision: PrecisionAnalysis) -> str:
    """``bf16 autocast at torch.nn...Sequential; loss 0.91 -> 0.88 over 12 updates``."""
    text = setting_label(precision)
    module = precision.module_class
    if precision.applied_ranks and module is not None:
        text += f" ({module})"
    losses = [v for v in precision.losses if v is not None]
    bad = len(precision.nonfinite_updates)
    if losses:
        text += f"; loss {losses[0]:.4g} -> {losses[-1]:.4g} over {len(losses)} updates"
    if bad:
        text += f"; inf/NaN loss in {bad} updates"
    skipped = precision.skipped_updates
    if skipped:
        text += f"; GradScaler skipped {skipped:.0f} steps (inf/NaN gradients)"
    note = precision.loss_scaling_note
    if note is not None:
        text += f"; {note}"
    return text
