"""The run report as a list of titled sections of plain-text tables, shared by every renderer.

Building the content once keeps the terminal, Markdown (and HTML) reports saying the same thing;
each renderer only styles and escapes. A figure the analysis could not compute is the cell
``n/a [k]`` with footnote ``k`` giving the reason, never a number. Cells hold raw text (kernel
and device names straight from traces): escaping is the renderer's job.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mgprof.analyze.readers import as_dict as _dict
from mgprof.analyze.readers import num as _num
from mgprof.analyze.readers import rank_dicts as _ranks
from mgprof.records import RunRecord

TOP_KERNELS = 5
"""Kernels listed per rank: the heaviest few say where compute time goes; more is noise here."""

Fmt = Callable[[float], str]


def _fixed(digits: int) -> Fmt:
    return lambda v: f"{v:,.{digits}f}"


def _ms_from_us(v: float) -> str:
    return f"{v / 1000.0:,.2f}"


@dataclass
class Table:
    """Column headers and rows of already formatted cells."""

    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    numeric_from: int = 1
    """Columns from this index on hold numbers (right-aligned); before it, labels."""


@dataclass
class Section:
    """One report section: key/value facts, tables, a highlighted notice, plain notes."""

    title: str
    facts: list[tuple[str, str]] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    notice: str | None = None
    """Must not be missed (CPU fallback): renderers show it as a panel or a callout."""
    notes: list[str] = field(default_factory=list)
    footnotes: list[str] = field(default_factory=list)
    findings: list[dict[str, str]] = field(default_factory=list)


class _Footnotes:
    """Numbers each distinct (figure, reason) once per section and lists who it applies to."""

    def __init__(self) -> None:
        self._index: dict[tuple[str, str], int] = {}
        self._who: dict[tuple[str, str], list[str]] = {}

    def mark(self, figure: str, reason: str, who: str) -> str:
        key = (figure, reason)
        if key not in self._index:
            self._index[key] = len(self._index) + 1
            self._who[key] = []
        if who and who not in self._who[key]:
            self._who[key].append(who)
        return f"n/a [{self._index[key]}]"

    def lines(self) -> list[str]:
        out = []
        for (figure, reason), k in self._index.items():
            who = ", ".join(self._who[(figure, reason)])
            out.append(f"[{k}] {figure}" + (f" ({who})" if who else "") + f": {reason}")
        return out


class _Cells:
    """Formats the figures of one record (a rank or the job), n/a with a footnote when None."""

    def __init__(self, notes: _Footnotes, record: Mapping[str, Any], who: str) -> None:
        self._notes = notes
        self._na = _dict(record.get("not_applicable"))
        self._who = who

    def reason(self, *keys: str) -> str:
        for key in keys:
            if isinstance(self._na.get(key), str):
                return str(self._na[key])
        return "not computed by this analysis"

    def get(
        self, value: Any, fmt: Fmt, figure: str, *reason_keys: str, label: str | None = None
    ) -> str:
        num = _num(value)
        if num is None:
            return self._notes.mark(label or figure, self.reason(figure, *reason_keys), self._who)
        return fmt(num)


def _job(analysis: Mapping[str, Any]) -> dict[str, Any]:
    return _dict(analysis.get("job"))


def _who(rank: Mapping[str, Any]) -> str:
    return f"rank {rank.get('rank', '?')}"


# --------------------------------------------------------------------------------------------


def _setup(run: RunRecord, analysis: Mapping[str, Any]) -> Section:
    sec = Section("Setup")
    reported = len(run.ranks)
    world = f"{run.world_size}" + (f" ({reported} reported)" if reported != run.world_size else "")
    status = run.status + (f" (exit code {run.exit_code})" if run.exit_code is not None else "")
    job = _job(analysis)
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
    threads = _threads(run)
    if threads:
        sec.facts.append(("CPU threads", threads))
    if run.missing_ranks:
        sec.facts.append(("missing ranks", ", ".join(str(r) for r in sorted(run.missing_ranks))))
    if run.error:
        sec.facts.append(("error", run.error))
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


def _step_time(analysis: Mapping[str, Any]) -> Section:
    sec = Section("Step time per rank")
    notes = _Footnotes()
    table = Table(
        [
            "rank",
            "steps",
            "mean ms",
            "p50 ms",
            "p95 ms",
            "min ms",
            "max ms",
            "samples/s",
        ],
        numeric_from=2,
    )
    two = _fixed(2)
    for rank in _ranks(analysis):
        c = _Cells(notes, rank, _who(rank))
        st = _dict(rank.get("step_time_ms"))
        steps = f"{rank.get('steps_measured', 0)}/{rank.get('steps_total', 0)}"
        row = [str(rank.get("rank")), steps]
        for key in ("mean", "p50", "p95", "min", "max"):
            row.append(c.get(st.get(key), two, "step_time_ms", label="step time"))
        row.append(c.get(rank.get("samples_per_s"), _fixed(1), "samples_per_s"))
        table.rows.append(row)
    job = _job(analysis)
    jc = _Cells(notes, job, "job")
    job_rate = jc.get(job.get("samples_per_s"), _fixed(1), "samples_per_s")
    table.rows.append(["job", "", "", "", "", "", "", job_rate])
    sec.tables.append(table)
    sec.notes.append("Steady-state steps: all but the first step of each rank (when it has 3+).")
    sec.footnotes = notes.lines()
    return sec


def _utilisation(analysis: Mapping[str, Any]) -> Section:
    sec = Section("Utilisation")
    notes = _Footnotes()
    table = Table(
        [
            "rank",
            "device",
            "NVML GPU util %",
            "trace busy %",
            "achieved TFLOP/s",
            "peak TFLOP/s",
            "MFU %",
        ],
        numeric_from=2,
    )
    one = _fixed(1)
    for rank in _ranks(analysis):
        c = _Cells(notes, rank, _who(rank))
        devices = [d for d in rank.get("devices", []) if isinstance(d, dict)]
        busy = c.get(rank.get("trace_busy_pct"), one, "trace_busy_pct")
        # Achieved/peak/MFU share one reason (the MFU one): one footnote, not three.
        achieved = c.get(rank.get("achieved_tflops"), _fixed(2), "mfu_pct", label="mfu_pct")
        peak = c.get(rank.get("peak_tflops"), one, "mfu_pct", label="mfu_pct")
        if _num(rank.get("peak_tflops")) is not None and rank.get("peak_dtype"):
            peak += f" ({rank['peak_dtype']})"
        mfu = c.get(rank.get("mfu_pct"), one, "mfu_pct")
        name = rank.get("device_name") or ""
        # DataParallel: one row per device (NVML per device), trace figures on the rank's row.
        if len(devices) > 1:
            for i, dev in enumerate(devices):
                util = c.get(dev.get("gpu_util_pct"), one, "nvml_gpu_util_pct")
                label = f"{dev.get('device', '?')} {dev.get('name') or ''}".strip()
                if i == 0:
                    table.rows.append(
                        [str(rank.get("rank")), label, util, busy, achieved, peak, mfu]
                    )
                else:
                    table.rows.append(["", label, util, "", "", "", ""])
        else:
            util = c.get(rank.get("nvml_gpu_util_pct"), one, "nvml_gpu_util_pct")
            label = f"{rank.get('device', '?')} {name}".strip()
            table.rows.append([str(rank.get("rank")), label, util, busy, achieved, peak, mfu])
    sec.tables.append(table)
    sec.notes.append(
        "NVML utilisation counts sample periods with any kernel running; trace busy is the share "
        "of the trace window covered by device events (CPU traces: by ops and collectives)."
    )
    sec.footnotes = notes.lines()
    return sec


def _energy(analysis: Mapping[str, Any]) -> Section:
    sec = Section("Energy")
    notes = _Footnotes()
    table = Table(["rank", "energy J", "J/sample"])
    for record, who in [(r, _who(r)) for r in _ranks(analysis)] + [(_job(analysis), "job")]:
        c = _Cells(notes, record, who)
        table.rows.append(
            [
                str(record.get("rank", "job")),
                c.get(record.get("energy_j"), _fixed(1), "energy_j"),
                c.get(record.get("energy_per_sample_j"), _fixed(4), "energy_per_sample_j"),
            ]
        )
    sec.tables.append(table)
    sec.footnotes = notes.lines()
    return sec


def _communication(analysis: Mapping[str, Any]) -> Section:
    sec = Section("Communication")
    notes = _Footnotes()
    table = Table(
        [
            "rank",
            "comm ms",
            "overlap ms",
            "exposed ms",
            "comm %",
            "overlap %",
            "exposed %",
            "busbw GB/s",
        ]
    )
    collectives = Table(
        ["rank", "collective", "count", "total ms", "exposed ms", "busbw GB/s"], numeric_from=2
    )
    one = _fixed(1)
    for rank in _ranks(analysis):
        c = _Cells(notes, rank, _who(rank))
        comm = rank.get("comm")
        if not isinstance(comm, dict):
            na = c.get(None, one, "comm", label="communication")
            table.rows.append([str(rank.get("rank"))] + [na] * 7)
            continue
        table.rows.append(
            [
                str(rank.get("rank")),
                c.get(comm.get("comm_us"), _ms_from_us, "comm_us"),
                c.get(comm.get("comm_overlap_us"), _ms_from_us, "comm_overlap_us"),
                c.get(comm.get("exposed_comm_us"), _ms_from_us, "exposed_comm_us"),
                c.get(comm.get("comm_pct"), one, "comm_pct"),
                c.get(comm.get("comm_overlap_pct"), one, "comm_overlap_pct"),
                c.get(comm.get("exposed_comm_pct"), one, "exposed_comm_pct"),
                c.get(comm.get("busbw_gbps"), _fixed(2), "busbw_gbps"),
            ]
        )
        for ctype, fields in sorted(_dict(comm.get("collectives")).items()):
            f = _dict(fields)
            bw_reason = (
                f.get("not_applicable") if isinstance(f.get("not_applicable"), str) else None
            )
            bw = _num(f.get("busbw_gbps"))
            collectives.rows.append(
                [
                    str(rank.get("rank")),
                    str(ctype),
                    str(f.get("count", "-")),
                    c.get(f.get("total_us"), _ms_from_us, "collective total_us"),
                    c.get(f.get("exposed_us"), _ms_from_us, "collective exposed_us"),
                    f"{bw:,.2f}"
                    if bw is not None
                    else notes.mark(
                        f"{ctype} busbw", bw_reason or "bytes or group size unknown", _who(rank)
                    ),
                ]
            )
    sec.tables.append(table)
    if collectives.rows:
        sec.tables.append(collectives)
    sec.footnotes = notes.lines()
    return sec


def _memory(analysis: Mapping[str, Any]) -> Section:
    sec = Section("Memory & headroom")
    notes = _Footnotes()
    table = Table(
        [
            "rank",
            "device",
            "peak alloc MiB",
            "peak resv MiB",
            "total MiB",
            "headroom MiB",
            "headroom %",
            "peak RSS MiB",
        ],
        numeric_from=2,
    )
    zero = _fixed(0)
    for rank in _ranks(analysis):
        c = _Cells(notes, rank, _who(rank))
        mem = rank.get("memory")
        if not isinstance(mem, dict):
            na = c.get(None, zero, "memory")
            table.rows.append([str(rank.get("rank")), str(rank.get("device", "?"))] + [na] * 6)
            continue
        table.rows.append(
            [
                str(rank.get("rank")),
                str(rank.get("device", "?")),
                c.get(
                    mem.get("peak_allocated_mib"), zero, "peak_allocated_mib", label="CUDA memory"
                ),
                c.get(mem.get("peak_reserved_mib"), zero, "peak_reserved_mib", label="CUDA memory"),
                c.get(mem.get("total_mib"), zero, "total_mib", label="CUDA memory"),
                c.get(mem.get("headroom_mib"), zero, "headroom_pct", label="headroom"),
                c.get(mem.get("headroom_pct"), _fixed(1), "headroom_pct", label="headroom"),
                c.get(mem.get("peak_rss_mib"), zero, "peak_rss_mib"),
            ]
        )
        # DataParallel: one row per device, to show rank-0 (device 0) imbalance.
        for dev, peaks in sorted(_dict(mem.get("per_device")).items()):
            p = _dict(peaks)
            cells = []
            for key, fmt in _PER_DEVICE_MEMORY:
                value = _num(p.get(key))
                cells.append(
                    fmt(value)
                    if value is not None
                    else notes.mark(key, "not recorded for this device", str(dev))
                )
            table.rows.append(["", str(dev), *cells, ""])
    sec.tables.append(table)
    sec.footnotes = notes.lines()
    return sec


_PER_DEVICE_MEMORY: tuple[tuple[str, Fmt], ...] = (
    ("peak_allocated_mib", _fixed(0)),
    ("peak_reserved_mib", _fixed(0)),
    ("total_mib", _fixed(0)),
    ("headroom_mib", _fixed(0)),
    ("headroom_pct", _fixed(1)),
)


def _data_loading(analysis: Mapping[str, Any]) -> Section:
    sec = Section("Data loading")
    notes = _Footnotes()
    table = Table(["rank", "DataLoader wait % of step time"])
    for record, who in [(r, _who(r)) for r in _ranks(analysis)] + [(_job(analysis), "job")]:
        c = _Cells(notes, record, who)
        share = c.get(record.get("dataloader_share_pct"), _fixed(1), "dataloader_share_pct")
        table.rows.append([str(record.get("rank", "job")), share])
    sec.tables.append(table)
    sec.footnotes = notes.lines()
    return sec


def _slowest(analysis: Mapping[str, Any]) -> Section:
    sec = Section("Slowest rank")
    notes = _Footnotes()
    job = _job(analysis)
    c = _Cells(notes, job, "")
    two = _fixed(2)
    slow = job.get("slowest_rank")
    if isinstance(slow, int):
        sec.facts.append(
            ("slowest rank", f"{slow} (mean step {two(float(job['slowest_mean_step_ms']))} ms)")
        )
        fast = job.get("fastest_rank")
        fast_ms = _num(job.get("fastest_mean_step_ms"))
        if isinstance(fast, int) and fast_ms is not None:
            sec.facts.append(("fastest rank", f"{fast} (mean step {two(fast_ms)} ms)"))
    else:
        sec.facts.append(("slowest rank", c.get(None, two, "slowest_rank")))
    spread = _num(job.get("step_time_spread_pct"))
    sec.facts.append(
        (
            "step-time spread (max-min)/min",
            f"{spread:.1f} %" if spread is not None else c.get(None, two, "step_time_spread_pct"),
        )
    )
    trace_job = _dict(_dict(analysis.get("traces")).get("job"))
    last = trace_job.get("slowest_rank")
    if isinstance(last, int):
        waits = _dict(trace_job.get("cross_rank")).get("per_rank")
        wait_text = ", ".join(
            f"rank {w.get('rank')} waited {_ms_from_us(float(w['wait_us']))} ms"
            for w in (waits if isinstance(waits, list) else [])
            if isinstance(w, dict) and _num(w.get("wait_us")) is not None
        )
        sec.facts.append(
            (
                "last to arrive at collectives (trace)",
                f"rank {last}" + (f"; {wait_text}" if wait_text else ""),
            )
        )
    identical = job.get("identical_batches")
    if isinstance(identical, bool):
        compared = job.get("fingerprint_steps_compared", 0)
        same = job.get("identical_batch_steps", [])
        n_same = len(same) if isinstance(same, list) else 0
        verdict = "YES: every rank trained on the same batches" if identical else "no"
        sec.facts.append(
            ("identical batches across ranks", f"{verdict} ({n_same}/{compared} steps identical)")
        )
    else:
        sec.facts.append(("identical batches across ranks", c.get(None, two, "identical_batches")))
    sec.footnotes = notes.lines()
    return sec


def _kernel_rows(summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    for key in ("top_kernels", "kernels"):
        value = summary.get(key)
        if isinstance(value, list):
            return [k for k in value if isinstance(k, dict)]
    return []


def _top_kernels(analysis: Mapping[str, Any]) -> Section | None:
    traces = _dict(_dict(analysis.get("traces")).get("ranks"))
    table = Table(["rank", "kernel", "count", "total ms", "% of compute"], numeric_from=2)
    for rank_key in sorted(traces, key=lambda k: (len(k), k)):
        summaries = traces[rank_key]
        if not isinstance(summaries, list):
            continue
        for summary in summaries:
            if not isinstance(summary, dict):
                continue
            for k in _kernel_rows(summary)[:TOP_KERNELS]:
                pct = _num(k.get("pct_of_compute"))
                total = _num(k.get("total_us"))
                table.rows.append(
                    [
                        rank_key,
                        str(k.get("name", "?")),
                        str(k.get("count", "-")),
                        _ms_from_us(total) if total is not None else "-",
                        f"{pct:.1f}" if pct is not None else "-",
                    ]
                )
    if not table.rows:
        return None
    sec = Section("Top kernels")
    sec.tables.append(table)
    return sec


def _findings(analysis: Mapping[str, Any]) -> Section:
    sec = Section("Findings")
    raw = analysis.get("findings", [])
    sec.findings = [
        {
            k: str(f.get(k) or "")
            for k in ("severity", "title", "evidence", "cause", "change", "saving")
        }
        for f in (raw if isinstance(raw, list) else [])
        if isinstance(f, dict)
    ]
    if not sec.findings:
        sec.notes.append("no findings")
    return sec


def build_sections(run: RunRecord, analysis: Mapping[str, Any]) -> list[Section]:
    """Every section of the run report, in reading order (a missing trace drops Top kernels)."""
    sections = [
        _setup(run, analysis),
        _step_time(analysis),
        _utilisation(analysis),
        _energy(analysis),
        _communication(analysis),
        _memory(analysis),
        _data_loading(analysis),
        _slowest(analysis),
    ]
    kernels = _top_kernels(analysis)
    if kernels is not None:
        sections.append(kernels)
    sections.append(_findings(analysis))
    return sections


def definitions(analysis: Mapping[str, Any]) -> Sequence[tuple[str, str]]:
    """(figure, definition) pairs the analysis stated, for the report's closing glossary."""
    defs = _dict(analysis.get("definitions"))
    return [(str(k), str(v)) for k, v in defs.items()]
