"""Run-report figure sections, step time to findings: each built from the analysis alone."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mgprof.analyze.readers import as_dict as _dict
from mgprof.analyze.readers import num as _num
from mgprof.analyze.readers import rank_dicts as _ranks
from mgprof.report.run.section_model import (
    Cells,
    Fmt,
    Footnotes,
    Section,
    Table,
    cpu_only,
    fixed,
    job_of,
    ms_from_us,
    who_of,
)

TOP_KERNELS = 5
"""Kernels listed per rank: the heaviest few say where compute time goes; more is noise here."""


def step_time_section(analysis: Mapping[str, Any]) -> Section:
    sec = Section("Step time per rank")
    notes = Footnotes()
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
    two = fixed(2)
    for rank in _ranks(analysis):
        c = Cells(notes, rank, who_of(rank))
        st = _dict(rank.get("step_time_ms"))
        steps = f"{rank.get('steps_measured', 0)}/{rank.get('steps_total', 0)}"
        row = [str(rank.get("rank")), steps]
        for key in ("mean", "p50", "p95", "min", "max"):
            row.append(c.get(st.get(key), two, "step_time_ms", label="step time"))
        row.append(c.get(rank.get("samples_per_s"), fixed(1), "samples_per_s"))
        table.rows.append(row)
    job = job_of(analysis)
    jc = Cells(notes, job, "job")
    job_rate = jc.get(job.get("samples_per_s"), fixed(1), "samples_per_s")
    table.rows.append(["job", "", "", "", "", "", "", job_rate])
    sec.tables.append(table)
    sec.notes.append("Steady-state steps: all but the first step of each rank (when it has 3+).")
    sec.footnotes = notes.lines()
    return sec


def _no_cpu_load(rank: Mapping[str, Any]) -> str:
    if rank.get("sampler") == "none":
        return "no sampler ran on this rank (sampling was off or failed)"
    return "the CPU sampler recorded no load for this rank"


def _cpu_utilisation_section(analysis: Mapping[str, Any]) -> Section:
    """CPU run: trace busy and the CPU sampler's load; the GPU columns would all be n/a."""
    sec = Section("Utilisation")
    notes = Footnotes()
    table = Table(["rank", "device", "trace busy %", "CPU %"], numeric_from=2)
    one = fixed(1)
    for rank in _ranks(analysis):
        c = Cells(notes, rank, who_of(rank))
        devices = [d for d in rank.get("devices", []) if isinstance(d, dict)]
        cpu = next((d.get("cpu_pct") for d in devices if d.get("cpu_pct") is not None), None)
        label = f"{rank.get('device', '?')} {rank.get('device_name') or ''}".strip()
        table.rows.append(
            [
                str(rank.get("rank")),
                label,
                c.get(rank.get("trace_busy_pct"), one, "trace_busy_pct"),
                c.get(cpu, one, "cpu_pct", label="CPU %")
                if cpu is not None
                else notes.mark("CPU %", _no_cpu_load(rank), who_of(rank)),
            ]
        )
    sec.tables.append(table)
    sec.notes.append(
        "CPU run: trace busy is the share of the trace window covered by operators and "
        "collectives; CPU % is the rank's process load (100 = one core). NVML utilisation, "
        "TFLOP/s and MFU are GPU figures."
    )
    sec.footnotes = notes.lines()
    return sec


def utilisation_section(analysis: Mapping[str, Any]) -> Section:
    if cpu_only(analysis):
        return _cpu_utilisation_section(analysis)
    sec = Section("Utilisation")
    notes = Footnotes()
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
    one = fixed(1)
    for rank in _ranks(analysis):
        c = Cells(notes, rank, who_of(rank))
        devices = [d for d in rank.get("devices", []) if isinstance(d, dict)]
        busy = c.get(rank.get("trace_busy_pct"), one, "trace_busy_pct")
        # Achieved/peak/MFU share one reason (the MFU one): one footnote, not three.
        achieved = c.get(rank.get("achieved_tflops"), fixed(2), "mfu_pct", label="mfu_pct")
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


def energy_section(analysis: Mapping[str, Any]) -> Section:
    sec = Section("Energy")
    if cpu_only(analysis):
        sec.brief = "not measured on a CPU run (NVML's energy counter is a GPU counter)"
        return sec
    notes = Footnotes()
    table = Table(["rank", "energy J", "J/sample"])
    for record, who in [(r, who_of(r)) for r in _ranks(analysis)] + [(job_of(analysis), "job")]:
        c = Cells(notes, record, who)
        table.rows.append(
            [
                str(record.get("rank", "job")),
                c.get(record.get("energy_j"), fixed(1), "energy_j"),
                c.get(record.get("energy_per_sample_j"), fixed(4), "energy_per_sample_j"),
            ]
        )
    sec.tables.append(table)
    sec.footnotes = notes.lines()
    return sec


def _no_communication(analysis: Mapping[str, Any]) -> bool:
    """One process whose trace holds no communication at all."""
    ranks = _ranks(analysis)
    if len(ranks) != 1:
        return False
    comm = _dict(ranks[0].get("comm"))
    return bool(comm) and not _num(comm.get("comm_us")) and not comm.get("collectives")


def communication_section(analysis: Mapping[str, Any]) -> Section:
    sec = Section("Communication")
    if _no_communication(analysis):
        sec.brief = "none in the trace (one process, no collective)"
        return sec
    notes = Footnotes()
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
    one = fixed(1)
    for rank in _ranks(analysis):
        c = Cells(notes, rank, who_of(rank))
        comm = rank.get("comm")
        if not isinstance(comm, dict):
            na = c.get(None, one, "comm", label="communication")
            table.rows.append([str(rank.get("rank"))] + [na] * 7)
            continue
        table.rows.append(
            [
                str(rank.get("rank")),
                c.get(comm.get("comm_us"), ms_from_us, "comm_us"),
                c.get(comm.get("comm_overlap_us"), ms_from_us, "comm_overlap_us"),
                c.get(comm.get("exposed_comm_us"), ms_from_us, "exposed_comm_us"),
                c.get(comm.get("comm_pct"), one, "comm_pct"),
                c.get(comm.get("comm_overlap_pct"), one, "comm_overlap_pct"),
                c.get(comm.get("exposed_comm_pct"), one, "exposed_comm_pct"),
                c.get(comm.get("busbw_gbps"), fixed(2), "busbw_gbps"),
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
                    c.get(f.get("total_us"), ms_from_us, "collective total_us"),
                    c.get(f.get("exposed_us"), ms_from_us, "collective exposed_us"),
                    f"{bw:,.2f}"
                    if bw is not None
                    else notes.mark(
                        f"{ctype} busbw", bw_reason or "bytes or group size unknown", who_of(rank)
                    ),
                ]
            )
    sec.tables.append(table)
    if collectives.rows:
        sec.tables.append(collectives)
    sec.footnotes = notes.lines()
    return sec


def _cpu_memory_section(analysis: Mapping[str, Any]) -> Section:
    sec = Section("Memory & headroom")
    notes = Footnotes()
    table = Table(["rank", "device", "peak RSS MiB"], numeric_from=2)
    for rank in _ranks(analysis):
        c = Cells(notes, rank, who_of(rank))
        mem = _dict(rank.get("memory"))
        rss = c.get(mem.get("peak_rss_mib"), fixed(0), "peak_rss_mib", "memory")
        table.rows.append([str(rank.get("rank")), str(rank.get("device", "?")), rss])
    sec.tables.append(table)
    sec.notes.append(
        "CPU run: peak resident memory of each rank's process; CUDA allocator peaks and device "
        "headroom are GPU figures."
    )
    sec.footnotes = notes.lines()
    return sec


def memory_section(analysis: Mapping[str, Any]) -> Section:
    if cpu_only(analysis):
        return _cpu_memory_section(analysis)
    sec = Section("Memory & headroom")
    notes = Footnotes()
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
    zero = fixed(0)
    for rank in _ranks(analysis):
        c = Cells(notes, rank, who_of(rank))
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
                c.get(mem.get("headroom_pct"), fixed(1), "headroom_pct", label="headroom"),
                c.get(mem.get("peak_rss_mib"), zero, "peak_rss_mib"),
            ]
        )
        # DataParallel: one row per device, to show rank-0 (device 0) imbalance (one device
        # would only repeat the rank's row)
        per_device = _dict(mem.get("per_device"))
        for dev, peaks in sorted(per_device.items()) if len(per_device) > 1 else []:
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
    ("peak_allocated_mib", fixed(0)),
    ("peak_reserved_mib", fixed(0)),
    ("total_mib", fixed(0)),
    ("headroom_mib", fixed(0)),
    ("headroom_pct", fixed(1)),
)


def data_loading_section(analysis: Mapping[str, Any]) -> Section:
    sec = Section("Data loading")
    notes = Footnotes()
    table = Table(["rank", "DataLoader wait % of step time"])
    for record, who in [(r, who_of(r)) for r in _ranks(analysis)] + [(job_of(analysis), "job")]:
        c = Cells(notes, record, who)
        share = c.get(record.get("dataloader_share_pct"), fixed(1), "dataloader_share_pct")
        table.rows.append([str(record.get("rank", "job")), share])
    sec.tables.append(table)
    sec.footnotes = notes.lines()
    return sec


def slowest_section(analysis: Mapping[str, Any]) -> Section:
    sec = Section("Slowest rank")
    if len(_ranks(analysis)) < 2:
        sec.brief = "one rank: nothing to compare across ranks"
        return sec
    notes = Footnotes()
    job = job_of(analysis)
    c = Cells(notes, job, "")
    two = fixed(2)
    slow = job.get("slowest_rank")
    if isinstance(slow, int):
        basis = job.get("slowest_rank_basis")
        how = f"; {basis}" if isinstance(basis, str) else ""
        sec.facts.append(
            (
                "slowest rank",
                f"{slow} (mean step {two(float(job['slowest_mean_step_ms']))} ms{how})",
            )
        )
        fast = job.get("fastest_rank")
        fast_ms = _num(job.get("fastest_mean_step_ms"))
        if isinstance(fast, int) and fast_ms is not None:
            sec.facts.append(("fastest rank", f"{fast} (mean step {two(fast_ms)} ms)"))
        else:
            sec.facts.append(("fastest rank", c.get(None, two, "fastest_rank")))
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
            f"rank {w.get('rank')} waited {ms_from_us(float(w['wait_us']))} ms"
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


def top_kernels_section(analysis: Mapping[str, Any]) -> Section | None:
    traces = _dict(_dict(analysis.get("traces")).get("ranks"))
    table = Table(
        ["rank", "count", "total ms", "% of compute", "kernel"], numeric_from=1, text_last=True
    )
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
                        str(k.get("count", "-")),
                        ms_from_us(total) if total is not None else "-",
                        f"{pct:.1f}" if pct is not None else "-",
                        str(k.get("name", "?")),
                    ]
                )
    if not table.rows:
        return None
    sec = Section("Top kernels")
    sec.tables.append(table)
    return sec


def findings_section(analysis: Mapping[str, Any]) -> Section:
    sec = Section("Findings")
    raw = analysis.get("findings", [])
    sec.findings = [
        {
            k: str(f.get(k) or "")
            for k in ("id", "severity", "title", "evidence", "cause", "change", "saving")
        }
        for f in (raw if isinstance(raw, list) else [])
        if isinstance(f, dict)
    ]
    if not sec.findings:
        sec.notes.append("no findings")
    return sec
