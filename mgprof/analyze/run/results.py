"""Result records and figure definitions of the run analysis, shared by the modules filling them."""

from __future__ import annotations

import msgspec
from msgspec import UNSET, UnsetType

from mgprof.analyze.run.grad_sync import GradSync

DEFINITIONS: dict[str, str] = {
    "regions": (
        "per rank and mgprof.region (nested regions under their parent): count, total, mean, "
        "p50/p95 (linear interpolation over its durations; a uniform sample of 4096 when there "
        "were more), max; share_pct = 100 * region total / sum of the rank's recorded step "
        "times (both over every step, warm-up included; a region outside steps can exceed 100)"
    ),
    "steady_state_steps": (
        "the steps a figure is computed over: all recorded steps of a rank but the first (its "
        "warm-up: allocator growth, cuDNN autotuning, lazy init) when the rank has 3 or more "
        "steps, otherwise all of them"
    ),
    "step_time_ms": (
        "wall time of one step as the step timer measured it (CUDA events on GPU, perf_counter "
        "on CPU), over the steady-state steps: mean, p50, p95 (linear interpolation, numpy's "
        "default), min, max; ci95_low/ci95_high: the 95 % interval of the mean, mean ± "
        "t(0.975, n-1) × sd / sqrt(n) (consecutive steps are not independent draws, so it "
        "says how well the mean is pinned by these steps, not how a rerun will vary)"
    ),
    "samples_per_s": (
        "per rank: sum of batch sizes / sum of step durations, over the steady-state steps "
        "whose batch size is known"
    ),
    "job_samples_per_s": (
        "sum over ranks of each rank's samples_per_s (each DDP rank trains on its own batches); "
        "for a single process (single device or DataParallel) that process's samples_per_s; "
        "samples_per_s_ci95: its 95 % interval, from the slowest rank's step-time interval "
        "(a synchronised job moves at the pace of its slowest rank)"
    ),
    "nvml_gpu_util_pct": (
        "mean of NVML's utilization.gpu over the sampling period: percent of sample periods in "
        "which at least one kernel ran; says nothing about how much of the GPU the kernel used"
    ),
    "trace_busy_pct": (
        "100 * |union of device events| / trace window (see the trace definitions); time-weighted "
        "over a rank's trace files"
    ),
    "mfu_pct": (
        "model FLOP utilisation: FLOPs counted in the trace (torch.profiler with_flops) / trace "
        "window / (devices used * peak dense FLOP/s of the device for the dtype); bf16/fp16 peak "
        "when autocast was seen, else fp32 (non-TF32) peak"
    ),
    "energy_j": (
        "NVML total energy counter difference over the sampling period, summed over devices"
    ),
    "energy_per_sample_j": (
        "energy_j / samples in all recorded steps; the sampling period also covers time outside "
        "the steps, so this is an upper bound"
    ),
    "comm_us": "time in communication (trace comm: NCCL kernels, or gloo/nccl ops on CPU traces)",
    "comm_overlap_us": "communication time overlapped by compute: |compute ∩ comm|",
    "exposed_comm_us": "communication time not overlapped by compute: comm - overlap",
    "comm_overlap_pct": "100 * overlap / comm (HTA's comp_comm_overlap)",
    "exposed_comm_pct": "100 * exposed comm / trace window",
    "busbw_gbps": (
        "collective bus bandwidth as nccl-tests defines it (algbw scaled by 2(n-1)/n for "
        "all-reduce, (n-1)/n for all-gather and reduce-scatter), from the trace engine"
    ),
    "headroom_mib": "device total memory - peak reserved by PyTorch's caching allocator",
    "headroom_pct": "100 * headroom_mib / device total memory",
    "dataloader_share_pct": (
        "100 * sum of time waiting on the DataLoader / sum of iteration time, over the "
        "steady-state steps whose DataLoader wait was timed; iteration time is the step time "
        "where the wait falls inside the step (prof.step() calls, mgprof analyze's automatic "
        "steps) and step time + wait for `with prof.step():` blocks, which exclude the wait"
    ),
    "slowest_rank": "the rank the others wait for: it arrives last in the most matched "
    "collective calls (ties: least total wait); without matched collectives, the rank with the "
    "highest mean steady-state step time; slowest_rank_basis says which (mgprof trace uses the "
    "same definition, collectives only). Named only beyond the run's own noise: its count of "
    "last arrivals must be one that chance (every rank equally likely last) gives less than 5 % "
    "of the time over the ranks, each traced step counted as one draw, or its mean step must "
    "exceed the fastest rank's by more than their interval (Welch, Student's t, 95 % over every "
    "pair of ranks); otherwise n/a with the figures",
    "fastest_rank": (
        "the rank with the lowest mean steady-state step time among the ranks other than the "
        "slowest; n/a when that is longer than the slowest rank's (collectives and step times "
        "disagree on who is slow)"
    ),
    "step_time_spread_pct": (
        "100 * (highest - lowest) / lowest of the ranks' mean steady-state step times"
    ),
    "identical_batches": (
        "true when, for every step index that all ranks fingerprinted, every rank's batch "
        "fingerprint is the same: the ranks train on the same data (no DistributedSampler?)"
    ),
}


# --------------------------------------------------------------------------------------------
# Result shapes (converted to plain dicts by ``analyze_run``, read back by
# ``mgprof.analyze.run.schema``; a field's docstring is its entry in docs/reports.md)


class _Out(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    """Base for result records: keyword-only so field order never matters to callers; fields
    added by newer versions are ignored when an older mgprof reads them back."""


class StepTimeStats(_Out):
    """Summary of one rank's steady-state step times, in milliseconds."""

    count: int
    mean: float
    p50: float
    p95: float
    min: float
    max: float
    ci95_low: float | None = None
    ci95_high: float | None = None
    """The 95 % interval of ``mean`` (Student's t over the steps); None with fewer than two
    steps, and absent from analyses made before it was computed."""


class DeviceUtil(_Out):
    """One sampled device of a rank: NVML (or CPU sampler) means and energy."""

    device: str
    name: str | None = None
    gpu_util_pct: float | None = None
    cpu_pct: float | None = None
    energy_j: float | None = None


class RegionFigures(_Out):
    """One ``mgprof.region`` on one rank (``mgprof.analyze.run.regions``)."""

    name: str
    path: list[str]
    depth: int
    count: int
    total_ms: float
    mean_ms: float
    p50_ms: float | None = None
    p95_ms: float | None = None
    max_ms: float | None = None
    share_pct: float | None = None


class CollectiveFigures(_Out):
    """One collective type on one rank, summed over its trace files (counts, times and bytes
    add; bandwidths are time-weighted means). A field the trace engine did not give is absent."""

    type: str | UnsetType = UNSET
    count: int | UnsetType = UNSET
    total_us: float | UnsetType | None = UNSET
    """None when one of the rank's files has no total (launch-only calls)."""
    exposed_us: float | UnsetType | None = UNSET
    bytes: int | UnsetType | None = UNSET
    group_size: int | UnsetType | None = UNSET
    algbw_gbps: float | UnsetType | None = UNSET
    busbw_gbps: float | UnsetType | None = UNSET
    not_applicable: str | UnsetType | None = UNSET
    """Why the bandwidths are missing, when they are."""
    sizes: list[list[int]] | UnsetType = UNSET
    """``[bytes, calls]`` per distinct message size (first trace file), largest first."""


class CommFigures(_Out):
    """A rank's communication time from its traces, summed over trace files."""

    window_us: float
    comm_us: float
    comm_overlap_us: float
    exposed_comm_us: float
    comm_pct: float | None
    comm_overlap_pct: float | None
    exposed_comm_pct: float | None
    busbw_gbps: float | None = None
    collectives: dict[str, CollectiveFigures] = msgspec.field(default_factory=dict)
    """Collective type -> its figures."""


class DevicePeaks(_Out):
    """One device of a rank (DataParallel drives several): the peaks the memory record has for
    it, and its headroom when reserved and total are known. A field not recorded is absent."""

    peak_allocated_mib: float | UnsetType | None = UNSET
    peak_reserved_mib: float | UnsetType | None = UNSET
    total_mib: float | UnsetType | None = UNSET
    headroom_mib: float | UnsetType | None = UNSET
    headroom_pct: float | UnsetType | None = UNSET


class MemoryFigures(_Out):
    """Peak memory of a rank and what was left of the device."""

    kind: str
    peak_allocated_mib: float | None = None
    peak_reserved_mib: float | None = None
    total_mib: float | None = None
    headroom_mib: float | None = None
    headroom_pct: float | None = None
    peak_rss_mib: float | None = None
    per_device: dict[str, DevicePeaks] = msgspec.field(default_factory=dict)
    """Device (``cuda:N``) -> its peaks and headroom."""


class RankAnalysis(_Out):
    """Every per-rank figure; None figures have their reason in ``not_applicable``."""

    rank: int
    host: str = ""
    device: str = "cpu"
    """``cuda:N`` or ``cpu``."""
    device_name: str | None = None
    devices_used: int = 1
    """Devices the rank drove (DataParallel: several)."""
    steps_total: int = 0
    """Steps the step timer recorded."""
    steps_measured: int = 0
    """Steady-state steps the figures are over (``steady_state_steps``)."""
    step_time_ms: StepTimeStats | None = None
    samples_per_s: float | None = None
    sampler: str = "none"
    """``nvml``, ``cpu`` or ``none``."""
    devices: list[DeviceUtil] = msgspec.field(default_factory=list)
    nvml_gpu_util_pct: float | None = None
    trace_busy_pct: float | None = None
    trace_files: list[str] = msgspec.field(default_factory=list)
    """Relative to the run directory."""
    achieved_tflops: float | None = None
    peak_tflops: float | None = None
    peak_dtype: str | None = None
    """The dtype of ``peak_tflops``: ``bf16``/``fp16`` when autocast was seen, else ``fp32``."""
    mfu_pct: float | None = None
    energy_j: float | None = None
    energy_per_sample_j: float | None = None
    comm: CommFigures | None = None
    """From the rank's traces."""
    memory: MemoryFigures | None = None
    dataloader_share_pct: float | None = None
    regions: list[RegionFigures] = msgspec.field(default_factory=list)
    """``mgprof.region`` timings in tree order (a region, then the regions nested in it)."""
    not_applicable: dict[str, str] = msgspec.field(default_factory=dict)
    """Figure name -> why it is None."""


class JobAnalysis(_Out):
    """Figures across ranks; None figures have their reason in ``not_applicable``."""

    strategy: str
    world_size: int
    ranks_reported: int
    strategy_label: str | None = None
    """The strategy as it really ran: ``independent replicas (launched as ddp)`` when no rank
    synchronised gradients, ``ddp (auto-wrapped)`` when mgprof wrapped the model."""
    grad_sync: GradSync | None = None
    """Whether the ranks synchronised gradients: status, how, ranks and the evidence."""
    missing_ranks: list[int] = msgspec.field(default_factory=list)
    """Ranks of the world that sent no record."""
    samples_per_s: float | None = None
    samples_per_s_ci95: list[float] | None = None
    """[low, high]: the 95 % interval of ``samples_per_s`` (see the definitions)."""
    energy_j: float | None = None
    energy_per_sample_j: float | None = None
    dataloader_share_pct: float | None = None
    slowest_rank: int | None = None
    slowest_mean_step_ms: float | None = None
    slowest_rank_basis: str | None = None
    """``last to arrive at collectives (traces)`` or ``highest mean step time``."""
    fastest_rank: int | None = None
    fastest_mean_step_ms: float | None = None
    step_time_spread_pct: float | None = None
    identical_batches: bool | None = None
    fingerprint_steps_compared: int = 0
    identical_batch_steps: list[int] = msgspec.field(default_factory=list)
    """Step indices whose batch fingerprint was the same on every rank."""
    cpu_fallback: bool = False
    cpu_fallback_notice: str | None = None
    """Why a CPU run says nothing about GPU performance, for the report's notice."""
    not_applicable: dict[str, str] = msgspec.field(default_factory=dict)
    """Figure name -> why it is None."""
