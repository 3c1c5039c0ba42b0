"""Run-report figure sections, step time to findings: each built from the analysis alone."""

from __future__ import annotations

from mgprof.analyze.run.results import RankAnalysis, StepTimeStats
from mgprof.analyze.run.schema import RunAnalysis, given
from mgprof.report.run.fsdp import fsdp_table
from mgprof.report.run.section_model import (
    Cells,
    Fmt,
    Footnotes,
    Section,
    Table,
    cpu_only,
    fixed,
    job_reasons,
    ms_from_us,
    who_of,
)

TOP_KERNELS = 5
"""Kernels listed per rank: the heaviest few say where compute time goes; more is noise here."""


def halfwidth(st: StepTimeStats | None) -> float | None:
    """Half the 95 % interval of a rank's mean step (None: fewer than two steps, or an
    analysis made before the interval was computed)."""
    if st is None or st.ci95_low is None or st.ci95_high is None:
        return None
    return (st.ci95_high - st.ci95_low) / 2.0


def step_time_section(analysis: RunAnalysis) -> Section:
    sec = Section("Step time per rank")
    notes = Footnotes()
    table = Table(
        [
            "rank",
            "steps",
            "mean ms",
            "± ms",
            "p50 ms",
            "p95 ms",
            "min ms",
            "max ms",
            "samples/s",
        ],
        numeric_from=2,
    )
    two = fixed(2)
    for rank in analysis.ranks:
        c = Cells(notes, rank.not_applicable, who_of(rank))
        st = rank.step_time_ms
        steps = f"{rank.steps_measured}/{rank.steps_total}"
        row = [str(rank.rank), steps]
        values = [st.mean, st.p50, st.p95, st.min, st.max] if st is not None else [None] * 5
        for value in values[:1]:
            row.append(c.get(value, two, "step_time_ms", label="step time"))
        row.append(two(half) if (half := halfwidth(st)) is not None else "-")
        for value in values[1:]:
            row.append(c.get(value, two, "step_time_ms", label="step time"))
        row.append(c.get(rank.samples_per_s, fixed(1), "samples_per_s"))
        table.rows.append(row)
    job = analysis.job
    jc = Cells(notes, job_reasons(analysis), "job")
    job_rate = jc.get(job.samples_per_s if job else None, fixed(1), "samples_per_s")
    table.rows.append(["job", "", "", "", "", "", "", "", job_rate])
    sec.tables.append(table)
    sec.notes.append("Steady-state steps: all but the first step of each rank (when it has 3+).")
    sec.notes.append(
        "± ms: half the 95 % interval of the mean step (Student's t over the steady-state "
        "steps; '-' with fewer than two)."
    )
    if job is not None and job.samples_per_s_ci95:
        low, high = (fixed(1)(v) for v in job.samples_per_s_ci95)
        sec.notes.append(
            f"Job samples/s, 95 % interval: from {low} to {high} (the slowest rank's step-time "
            "interval: a synchronised job moves at its pace)."
        )
    sec.footnotes = notes.lines()
    return sec


def _no_cpu_load(rank: RankAnalysis) -> str:
    if rank.sampler == "none":
        return "no sampler ran on this rank (sampling was off or failed)"
    return "the CPU sampler recorded no load for this rank"


def _cpu_utilisation_section(analysis: RunAnalysis) -> Section:
    """CPU run: trace busy and the CPU sampler's load; the GPU columns would all be n/a."""
    sec = Section("Utilisation")
    notes = Footnotes()
    table = Table(["rank", "device", "trace busy %", "CPU %"], numeric_from=2)
    one = fixed(1)
    for rank in analysis.ranks:
        c = Cells(notes, rank.not_applicable, who_of(rank))
        cpu = next((d.cpu_pct for d in rank.devices if d.cpu_pct is not None), None)
        label = f"{rank.device} {rank.device_name or ''}".strip()
        table.rows.append(
            [
                str(rank.rank),
                label,
                c.get(rank.trace_busy_pct, one, "trace_busy_pct"),
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


def utilisation_section(analysis: RunAnalysis) -> Section:
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
    for rank in analysis.ranks:
        c = Cells(notes, rank.not_applicable, who_of(rank))
        devices = rank.devices
        busy = c.get(rank.trace_busy_pct, one, "trace_busy_pct")
        # Achieved/peak/MFU share one reason (the MFU one): one footnote, not three.
        achieved = c.get(rank.achieved_tflops, fixed(2), "mfu_pct", label="TFLOP/s and MFU")
        peak = c.get(rank.peak_tflops, one, "mfu_pct", label="TFLOP/s and MFU")
        if rank.peak_tflops is not None and rank.peak_dtype:
            peak += f" ({rank.peak_dtype})"
        mfu = c.get(rank.mfu_pct, one, "mfu_pct", label="TFLOP/s and MFU")
        name = rank.device_name or ""
        # DataParallel: one row per device (NVML per device), trace figures on the rank's row.
        if len(devices) > 1:
            for i, dev in enumerate(devices):
                util = c.get(dev.gpu_util_pct, one, "nvml_gpu_util_pct")
                label = f"{dev.device} {dev.name or ''}".strip()
                if i == 0:
                    table.rows.append([str(rank.rank), label, util, busy, achieved, peak, mfu])
                else:
                    table.rows.append(["", label, util, "", "", "", ""])
        else:
            util = c.get(rank.nvml_gpu_util_pct, one, "nvml_gpu_util_pct")
            label = f"{rank.device} {name}".strip()
            table.rows.append([str(rank.rank), label, util, busy, achieved, peak, mfu])
    sec.tables.append(table)
    sec.notes.append(
        "NVML utilisation counts sample periods with any kernel running; trace busy is the share "
        "of the trace window covered by device events (CPU traces: by ops and collectives)."
    )
    sec.footnotes = notes.lines()
    return sec


def energy_section(analysis: RunAnalysis) -> Section:
    sec = Section("Energy")
    if cpu_only(analysis):
        sec.brief = "not measured on a CPU run (NVML's energy counter is a GPU counter)"
        return sec
    notes = Footnotes()
    table = Table(["rank", "energy J", "J/sample"])
    for rank in analysis.ranks:
        c = Cells(notes, rank.not_applicable, who_of(rank))
        table.rows.append(
            [
                str(rank.rank),
                c.get(rank.energy_j, fixed(1), "energy_j"),
                c.get(rank.energy_per_sample_j, fixed(4), "energy_per_sample_j"),
            ]
        )
    job = analysis.job
    c = Cells(notes, job_reasons(analysis), "job")
    table.rows.append(
        [
            "job",
            c.get(job.energy_j if job else None, fixed(1), "energy_j"),
            c.get(job.energy_per_sample_j if job else None, fixed(4), "energy_per_sample_j"),
        ]
    )
    sec.tables.append(table)
    sec.footnotes = notes.lines()
    return sec


def _no_communication(analysis: RunAnalysis) -> bool:
    """One process whose trace holds no communication at all."""
    ranks = analysis.ranks
    if len(ranks) != 1:
        return False
    comm = ranks[0].comm
    return comm is not None and not comm.comm_us and not comm.collectives


def communication_section(analysis: RunAnalysis) -> Section:
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
    for rank in analysis.ranks:
        c = Cells(notes, rank.not_applicable, who_of(rank))
        comm = rank.comm
        if comm is None:
            na = c.get(None, one, "comm", label="communication")
            table.rows.append([str(rank.rank)] + [na] * 7)
            continue
        table.rows.append(
            [
                str(rank.rank),
                c.get(comm.comm_us, ms_from_us, "comm_us"),
                c.get(comm.comm_overlap_us, ms_from_us, "comm_overlap_us"),
                c.get(comm.exposed_comm_us, ms_from_us, "exposed_comm_us"),
                c.get(comm.comm_pct, one, "comm_pct"),
                c.get(comm.comm_overlap_pct, one, "comm_overlap_pct"),
                c.get(comm.exposed_comm_pct, one, "exposed_comm_pct"),
                c.get(comm.busbw_gbps, fixed(2), "busbw_gbps"),
            ]
        )
        for ctype, f in sorted(comm.collectives.items()):
            bw_reason = given(f.not_applicable)
            bw = given(f.busbw_gbps)
            count = given(f.count)
            collectives.rows.append(
                [
                    str(rank.rank),
                    ctype,
                    "-" if count is None else str(count),
                    c.get(given(f.total_us), ms_from_us, "collective time"),
                    c.get(given(f.exposed_us), ms_from_us, "exposed collective time"),
                    f"{bw:,.2f}"
                    if bw is not None
                    else notes.mark(
                        f"{ctype} bus bandwidth",
                        bw_reason or "bytes or group size unknown",
                        who_of(rank),
                    ),
                ]
            )
    sec.tables.append(table)
    if collectives.rows:
        sec.tables.append(collectives)
    fsdp = fsdp_table(analysis, notes)
    if fsdp is not None:
        sec.tables.append(fsdp[0])
        sec.notes.extend(fsdp[1])
    sec.footnotes = notes.lines()
    return sec


def _cpu_memory_section(analysis: RunAnalysis) -> Section:
    sec = Section("Memory & headroom")
    notes = Footnotes()
    table = Table(["rank", "device", "peak RSS MiB"], numeric_from=2)
    for rank in analysis.ranks:
        c = Cells(notes, rank.not_applicable, who_of(rank))
        rss_mib = rank.memory.peak_rss_mib if rank.memory is not None else None
        rss = c.get(rss_mib, fixed(0), "peak_rss_mib", "memory")
        table.rows.append([str(rank.rank), rank.device, rss])
    sec.tables.append(table)
    sec.notes.append(
        "CPU run: peak resident memory of each rank's process; CUDA allocator peaks and device "
        "headroom are GPU figures."
    )
    sec.footnotes = notes.lines()
    return sec


def memory_section(analysis: RunAnalysis) -> Section:
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
    for rank in analysis.ranks:
        c = Cells(notes, rank.not_applicable, who_of(rank))
        mem = rank.memory
        if mem is None:
            na = c.get(None, zero, "memory")
            table.rows.append([str(rank.rank), rank.device] + [na] * 6)
            continue
        table.rows.append(
            [
                str(rank.rank),
                rank.device,
                c.get(mem.peak_allocated_mib, zero, "peak_allocated_mib", label="CUDA memory"),
                c.get(mem.peak_reserved_mib, zero, "peak_reserved_mib", label="CUDA memory"),
                c.get(mem.total_mib, zero, "total_mib", label="CUDA memory"),
                c.get(mem.headroom_mib, zero, "headroom_pct", label="headroom"),
                c.get(mem.headroom_pct, fixed(1), "headroom_pct", label="headroom"),
                c.get(mem.peak_rss_mib, zero, "peak_rss_mib"),
            ]
        )
        # DataParallel: one row per device, to show rank-0 (device 0) imbalance (one device
        # would only repeat the rank's row)
        per_device = mem.per_device
        for dev, p in sorted(per_device.items()) if len(per_device) > 1 else []:
            values = (
                given(p.peak_allocated_mib),
                given(p.peak_reserved_mib),
                given(p.total_mib),
                given(p.headroom_mib),
                given(p.headroom_pct),
            )
            cells = []
            for (key, fmt), value in zip(_PER_DEVICE_MEMORY, values, strict=True):
                cells.append(
                    fmt(value)
                    if value is not None
                    else notes.mark(key, "not recorded for this device", dev)
                )
            table.rows.append(["", dev, *cells, ""])
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


def data_loading_section(analysis: RunAnalysis) -> Section:
    sec = Section("Data loading")
    notes = Footnotes()
    table = Table(["rank", "DataLoader wait % of step time"])
    for rank in analysis.ranks:
        c = Cells(notes, rank.not_applicable, who_of(rank))
        share = c.get(rank.dataloader_share_pct, fixed(1), "dataloader_share_pct")
        table.rows.append([str(rank.rank), share])
    job = analysis.job
    c = Cells(notes, job_reasons(analysis), "job")
    share = c.get(job.dataloader_share_pct if job else None, fixed(1), "dataloader_share_pct")
    table.rows.append(["job", share])
    sec.tables.append(table)
    sec.footnotes = notes.lines()
    return sec


def slowest_section(analysis: RunAnalysis) -> Section:
    sec = Section("Slowest rank")
    if len(analysis.ranks) < 2:
        sec.brief = "one rank: nothing to compare across ranks"
        return sec
    notes = Footnotes()
    job = analysis.job
    c = Cells(notes, job_reasons(analysis), "")
    two = fixed(2)
    slow = job.slowest_rank if job is not None else None
    if job is not None and slow is not None:
        how = f"; {job.slowest_rank_basis}" if job.slowest_rank_basis is not None else ""
        sec.facts.append(
            (
                "slowest rank",
                f"{slow} (mean step {two(float(job.slowest_mean_step_ms or 0.0))} ms{how})",
            )
        )
        fast, fast_ms = job.fastest_rank, job.fastest_mean_step_ms
        if fast is not None and fast_ms is not None:
            sec.facts.append(("fastest rank", f"{fast} (mean step {two(fast_ms)} ms)"))
        else:
            sec.facts.append(("fastest rank", c.get(None, two, "fastest_rank")))
    else:
        sec.facts.append(("slowest rank", c.get(None, two, "slowest_rank")))
    spread = job.step_time_spread_pct if job is not None else None
    sec.facts.append(
        (
            "step-time spread (max-min)/min",
            f"{spread:.1f} %" if spread is not None else c.get(None, two, "step_time_spread_pct"),
        )
    )
    trace_job = analysis.traces.job
    last = trace_job.slowest_rank if trace_job is not None else None
    if trace_job is not None and last is not None:
        waits = trace_job.cross_rank.per_rank if trace_job.cross_rank is not None else []
        wait_text = ", ".join(
            f"rank {w.rank} waited {ms_from_us(float(w.wait_us))} ms" for w in waits
        )
        sec.facts.append(
            (
                "last to arrive at collectives (trace)",
                f"rank {last}" + (f"; {wait_text}" if wait_text else ""),
            )
        )
    identical = job.identical_batches if job is not None else None
    if job is not None and identical is not None:
        compared = job.fingerprint_steps_compared
        n_same = len(job.identical_batch_steps)
        verdict = "YES: every rank trained on the same batches" if identical else "no"
        sec.facts.append(
            ("identical batches across ranks", f"{verdict} ({n_same}/{compared} steps identical)")
        )
    else:
        sec.facts.append(("identical batches across ranks", c.get(None, two, "identical_batches")))
    sec.footnotes = notes.lines()
    return sec


def top_kernels_section(analysis: RunAnalysis) -> Section | None:
    traces = analysis.traces.ranks
    table = Table(
        ["rank", "count", "total ms", "% of compute", "kernel"],
        numeric_from=1,
        text_last=True,
        kernel_names=4,
    )
    for rank_key in sorted(traces, key=lambda k: (len(k), k)):
        for summary in traces[rank_key]:
            for k in summary.top_kernels[:TOP_KERNELS]:
                table.rows.append(
                    [
                        rank_key,
                        str(k.count),
                        ms_from_us(float(k.total_us)),
                        f"{k.pct_of_compute:.1f}",
                        k.name,
                    ]
                )
    if not table.rows:
        return None
    sec = Section("Top kernels")
    sec.tables.append(table)
    return sec


def findings_section(analysis: RunAnalysis) -> Section:
    sec = Section("Findings")
    sec.findings = list(given(analysis.findings) or [])
    if not sec.findings:
        sec.notes.append("no findings")
    return sec
