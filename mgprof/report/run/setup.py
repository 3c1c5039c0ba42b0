"""Run-report Setup section: what ran and how (sync, auto-wrap, threads), read off the RunRecord."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mgprof.analyze.readers import as_dict as _dict
from mgprof.analyze.readers import num as _num
from mgprof.analyze.run.precision import setting_label
from mgprof.records import RunRecord
from mgprof.report.run.section_model import Section, Table, job_of


def setup_section(run: RunRecord, analysis: Mapping[str, Any]) -> Section:
    sec = Section("Setup")
    reported = len(run.ranks)
    world = f"{run.world_size}" + (f" ({reported} reported)" if reported != run.world_size else "")
    status = run.status + (f" (exit code {run.exit_code})" if run.exit_code is not None else "")
    job = job_of(analysis)
    label = job.get("strategy_label")
    sec.facts = [
        ("run", run.run_id or "-"),
        ("created (UTC)", run.created_utc or "-"),
        ("script", " ".join([run.script or "-", *run.script_args])),
        ("strategy", label if isinstance(label, str) else run.strategy),
        ("world size", world),
        ("nodes", str(run.nnodes)),
        ("backend", run.backend or "-"),
        ("status", status),
    ]
    samplers = bool(run.ranks) and all(r.training.distributed_sampler for r in run.ranks)
    sec.facts.extend(_sync_facts(job, samplers))
    precision = analysis.get("precision")
    if isinstance(precision, Mapping):
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
        notice = job.get("cpu_fallback_notice")
        sec.notice = (
            notice
            if isinstance(notice, str)
            else f"This run used the CPU, not GPUs: {run.cpu_fallback_reason or 'no CUDA device'}."
        )
    warnings = analysis.get("warnings")
    if isinstance(warnings, list):
        sec.notes.extend(f"analysis warning: {w}" for w in warnings if isinstance(w, str))
    return sec


def _sync_facts(job: Mapping[str, Any], samplers: bool = False) -> list[tuple[str, str]]:
    """Gradient sync and auto-wrap lines: what the multi-rank figures below rest on."""
    sync = _dict(job.get("grad_sync"))
    status = sync.get("status")
    if not isinstance(status, str) or status == "not applicable":
        return []
    facts = [("gradient sync", f"{status}: {sync.get('detail', '')}".rstrip(": "))]
    wrap = _dict(sync.get("auto_wrap"))
    if wrap.get("wrapper"):
        what = f"{wrap.get('module_class', '?')} ({_count(wrap.get('parameters'))} parameters)"
        how = "DistributedDataParallel" if wrap["wrapper"] == "ddp" else "DataParallel"
        extra = []
        if wrap.get("bucket_cap_mb") is not None:
            extra.append(f"bucket_cap_mb {wrap['bucket_cap_mb']:g}")
        if wrap.get("devices"):
            extra.append("devices " + ",".join(str(d) for d in wrap["devices"]))
        if wrap.get("initialized_process_group"):
            extra.append("process group initialised by mgprof")
        tail = f"; {', '.join(extra)}" if extra else ""
        facts.append(("auto-wrap", f"{what} under {how}{tail} (--no-auto-wrap turns it off)"))
        if wrap["wrapper"] == "ddp" and not samplers:
            facts.append(
                (
                    "data",
                    "no DistributedSampler: every rank reads the whole dataset (right for "
                    "measuring speed, wrong for training; shard it with DistributedSampler)",
                )
            )
    elif wrap.get("reason"):
        facts.append(("auto-wrap", f"nothing wrapped: {wrap['reason']}"))
    return facts


def _count(value: Any) -> str:
    num = _num(value)
    return f"{num:,.0f}" if num is not None else "?"


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


def _precision_fact(precision: Mapping[str, Any]) -> str:
    """``bf16 autocast at torch.nn...Sequential; loss 0.91 -> 0.88 over 12 updates``."""
    text = setting_label(precision)
    module = precision.get("module_class")
    if precision.get("applied_ranks") and isinstance(module, str):
        text += f" ({module})"
    losses = [v for v in precision.get("losses") or [] if _num(v) is not None]
    bad = len(precision.get("nonfinite_updates") or [])
    if losses:
        text += f"; loss {losses[0]:.4g} -> {losses[-1]:.4g} over {len(losses)} updates"
    if bad:
        text += f"; inf/NaN loss in {bad} updates"
    skipped = _num(precision.get("skipped_updates")) or 0
    if skipped:
        text += f"; GradScaler skipped {skipped:.0f} steps (inf/NaN gradients)"
    note = precision.get("loss_scaling_note")
    if isinstance(note, str):
        text += f"; {note}"
    return text
