"""One side of ``mgprof diff``: the figures of a run (or a folder of traces) that a diff compares.

A run directory gives step-timer samples for every steady-state step, batch sizes, regions,
memory and findings; a folder of torch.profiler traces gives only its traced steps and what the
traces hold. Both reduce to a :class:`Side`, so the comparison (``diff``) does not care which it
got; when one side is a run and the other a trace folder, the run is read as its traces, so both
sides' figures mean the same thing.

The job's step time is, per step index, the slowest rank's duration: a synchronous data-parallel
step ends when its last rank does. Work inside a step is attributed per step (ms/step) to named
components: leaf regions, compute kernels (GPU traces) or host operators by self time (CPU
traces), each collective type's exposed time, and the DataLoader wait.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mgprof.analyze.readers import as_dict, num
from mgprof.analyze.run.precision import setting_label
from mgprof.analyze.run.steps import steady_state_steps
from mgprof.records import RunRecord

COMM_OP_PREFIXES = ("c10d::", "gloo:", "nccl:", "record_param_comms")
"""Host operators that are communication: their time shows as the collectives' exposed time, so
listing them as operators too would count the same wait twice."""


@dataclass(frozen=True)
class Component:
    """Time per step spent in one named thing (mean over the ranks that have it)."""

    kind: str
    """``region``, ``kernel``, ``operator``, ``comm`` or ``dataloader``."""
    name: str
    ms_per_step: float
    leaf: bool = True
    """False for a region that has child regions (its time holds theirs)."""


@dataclass
class Side:
    """What a diff needs of one run or trace folder; every figure may be None (with a reason)."""

    path: str
    kind: str
    """``run`` (run.json: step timer) or ``traces`` (torch.profiler files only)."""
    label: str
    step_ms: list[float] = field(default_factory=list)
    step_indices: list[int] = field(default_factory=list)
    step_source: str = ""
    step_batch: list[int | None] = field(default_factory=list)
    """Samples of the whole job at each of ``step_indices`` (None where a rank did not say)."""
    global_batch: int | None = None
    facts: dict[str, str] = field(default_factory=dict)
    figures: dict[str, float | None] = field(default_factory=dict)
    components: list[Component] = field(default_factory=list)
    buckets: list[Component] = field(default_factory=list)
    """Where a traced step's time went, as parts that add up to the step (``trace_buckets``)."""
    findings: dict[str, dict[str, str]] = field(default_factory=dict)
    not_applicable: dict[str, str] = field(default_factory=dict)


STEP_SOURCE_RUN = (
    "step timer, steady-state steps (all but the first when there are three or more); per step "
    "index the slowest rank's duration"
)
STEP_SOURCE_TRACES = (
    "traced ProfilerStep#N spans: per step the TensorBoard plugin's step time (CPU span extended "
    "to the step's last device event), per step number the slowest rank's"
)


def _mean(values: Iterable[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return sum(kept) / len(kept) if kept else None


def _max(values: Iterable[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return max(kept) if kept else None


def _slowest_per_index(per_rank: Sequence[Mapping[int, float]]) -> tuple[list[int], list[float]]:
    """Step indices every rank has, and per index the largest duration."""
    if not per_rank:
        return [], []
    common = set(per_rank[0])
    for steps in per_rank[1:]:
        common &= set(steps)
    indices = sorted(common)
    return indices, [max(steps[i] for steps in per_rank) for i in indices]


def _average_components(
    per_rank: Sequence[Mapping[tuple[str, str], float]],
) -> dict[tuple[str, str], float]:
    """Per (kind, name): mean over the ranks (a rank without it counts as 0: it spent no time)."""
    totals: dict[tuple[str, str], float] = defaultdict(float)
    for comps in per_rank:
        for key, value in comps.items():
            totals[key] += value
    n = max(len(per_rank), 1)
    return {key: value / n for key, value in totals.items()}


def _trace_rank_components(summary: Mapping[str, Any], steps: int) -> dict[tuple[str, str], float]:
    """ms per traced step of one rank trace summary: kernels (GPU) or host operators (CPU), and
    each collective type's exposed time."""
    out: dict[tuple[str, str], float] = defaultdict(float)
    if steps <= 0:
        return out
    if summary.get("kind") == "cpu":
        for op in summary.get("operators_by_name") or []:
            name = str(op.get("name", ""))
            self_us = num(op.get("host_self_us"))
            if self_us is None or name.startswith(COMM_OP_PREFIXES):
                continue
            out[("operator", name)] += self_us / 1000.0 / steps
    else:
        for kernel in summary.get("kernels") or summary.get("top_kernels") or []:
            total = num(kernel.get("total_us"))
            if total is not None:
                out[("kernel", str(kernel.get("name", "")))] += total / 1000.0 / steps
    for coll in summary.get("collectives") or []:
        exposed = num(coll.get("exposed_us"))
        if exposed is not None:
            out[("comm", f"exposed {coll.get('type', 'collective')}")] += exposed / 1000.0 / steps
    return out


HOST_OUTSIDE_OPS = "host time outside operators (Python, sleeps, waits)"
GPU_IDLE = "GPU idle inside the step (the device waited for the host)"
HOST_BEFORE_KERNELS = "host time before the step's first device event"
DATA_LOADING = "data loading (DataLoader spans)"
EXPOSED_COMM = "exposed communication"
OTHER_DEVICE = "other device work (memcpy, memset)"
OTHER_OPERATORS = "other operators"
OTHER_KERNELS = "other kernels"


def trace_buckets(summary: Mapping[str, Any]) -> dict[str, float]:
    """ms per traced step of one rank, in parts that add up to its mean step span (the CPU
    ``ProfilerStep#N`` span, extended to the step's last device event on a GPU trace).

    CPU trace: operators (named by self time, the rest as "other operators"), exposed
    communication, and host time outside operators (Python, ``time.sleep``, waits). GPU trace:
    kernels (named, the rest "other kernels"), exposed communication, other device work, GPU
    idle inside the step's device window, and host time before its first device event. Data
    loading (the ``enumerate(DataLoader)`` spans) is carved out of the host parts first, then
    out of the operators it ran. The parts partition the span, so a change in step time is the
    sum of the parts' changes.
    """
    steps = [st for st in summary.get("steps") or [] if isinstance(st, Mapping)]
    if not steps:
        return {}
    n = len(steps)
    gpu = summary.get("kind") != "cpu"
    sums: dict[str, float] = defaultdict(float)
    for st in steps:
        t = as_dict(st.get("totals"))
        window = num(t.get("window_us")) or 0.0
        span = num(st.get("extended_us")) if gpu else num(st.get("cpu_duration_us"))
        span = max(span or 0.0, window)
        sums["compute"] += num(t.get("compute_us")) or 0.0
        sums["exposed"] += num(t.get("exposed_comm_us")) or 0.0
        idle_us = num(t.get("idle_us")) or 0.0
        # device work outside compute and communication: copies that overlap a kernel are
        # already in the kernel's time (busy = |compute ∪ comm ∪ copies| = window - idle)
        sums["memcpy"] += max(
            0.0,
            window
            - idle_us
            - (num(t.get("compute_us")) or 0.0)
            - (num(t.get("exposed_comm_us")) or 0.0),
        )
        sums["idle"] += idle_us
        sums["before"] += span - window
        sums["loading"] += num(t.get("dataloader_us")) or 0.0
    ms = {k: v / 1000.0 / n for k, v in sums.items()}
    compute = ms["compute"]
    if gpu:
        # loading that ran while the device was busy cost the step nothing
        before, idle = ms["before"], ms["idle"]
        take = min(ms["loading"], before)
        before -= take
        rest = min(ms["loading"] - take, idle)
        idle -= rest
        loading = take + rest
    else:
        # the window is the CPU span: idle there is the span outside operators; loading that
        # the host parts cannot hold ran operators (collate with num_workers=0)
        host = ms["idle"] + ms["before"]
        take = min(ms["loading"], host)
        host -= take
        compute -= ms["loading"] - take
        loading = ms["loading"]
    out: dict[str, float] = {}
    names = _named_work(summary, n, gpu)
    named = sum(names.values())
    out.update(names)
    out[OTHER_KERNELS if gpu else OTHER_OPERATORS] = compute - named
    out[EXPOSED_COMM] = ms["exposed"]
    if gpu:
        out[OTHER_DEVICE] = ms["memcpy"]
        out[GPU_IDLE] = idle
        out[HOST_BEFORE_KERNELS] = before
    else:
        out[HOST_OUTSIDE_OPS] = host
    if loading > 0:
        out[DATA_LOADING] = loading
    return out


def _named_work(summary: Mapping[str, Any], steps: int, gpu: bool) -> dict[str, float]:
    """ms per traced step of each named kernel (GPU) or host operator by self time (CPU)."""
    out: dict[str, float] = defaultdict(float)
    if gpu:
        for kernel in summary.get("kernels") or summary.get("top_kernels") or []:
            total = num(kernel.get("total_us"))
            if total is not None:
                out[f"kernel {kernel.get('name', '')}"] += total / 1000.0 / steps
        return out
    for op in summary.get("operators_by_name") or []:
        name = str(op.get("name", ""))
        self_us = num(op.get("host_self_us"))
        if self_us is None or name.startswith(COMM_OP_PREFIXES):
            continue
        out[f"operator {name}"] += self_us / 1000.0 / steps
    return out


def _bucket_components(summaries: Sequence[Mapping[str, Any]]) -> list[Component]:
    per_rank = [
        {("time", k): v for k, v in trace_buckets(s).items()} for s in summaries if s.get("steps")
    ]
    return [Component(k, n, v) for (k, n), v in _average_components(per_rank).items()]


def _trace_steps(summary: Mapping[str, Any]) -> dict[int, float]:
    """Step number -> ms of one rank trace summary (extended step time, else the CPU span)."""
    steps: dict[int, float] = {}
    for step in summary.get("steps") or []:
        value = num(step.get("extended_us"))
        if value is None:
            value = num(step.get("cpu_duration_us"))
        index = step.get("step")
        if value is not None and isinstance(index, int):
            steps[index] = value / 1000.0
    return steps


def _trace_figures(summaries: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
    """Mean over ranks of the trace-window shares, exposed communication per traced step and the
    bus bandwidth (byte-weighted over each rank's collectives)."""
    busy: list[float | None] = []
    exposed_pct: list[float | None] = []
    exposed_ms: list[float | None] = []
    comm_ms: list[float | None] = []
    busbw: list[float | None] = []
    for s in summaries:
        totals = as_dict(s.get("totals"))
        n = len(s.get("steps") or [])
        window = num(totals.get("window_us"))
        busy.append(num(totals.get("busy_pct")))
        exposed_pct.append(num(totals.get("exposed_comm_pct")))
        if window is not None and n > 0:
            for key, sink in (("exposed_comm_pct", exposed_ms), ("comm_pct", comm_ms)):
                pct = num(totals.get(key))
                sink.append(None if pct is None else pct * window / 100.0 / 1000.0 / n)
        weighted = [
            (num(c.get("busbw_gbps")), num(c.get("bytes"))) for c in s.get("collectives") or []
        ]
        pairs = [(bw, b) for bw, b in weighted if bw is not None and b]
        if pairs:
            busbw.append(sum(bw * b for bw, b in pairs) / sum(b for _, b in pairs))
    return {
        "trace_busy_pct": _mean(busy),
        "exposed_comm_pct": _mean(exposed_pct),
        "comm_ms_per_step": _mean(comm_ms),
        "exposed_comm_ms_per_step": _mean(exposed_ms),
        "busbw_gbps": _mean(busbw),
    }


def _region_components(analysis: Mapping[str, Any]) -> list[Component]:
    """Each region path's time per step (its total over the rank's recorded steps), mean over
    the ranks; a path with a child path is marked not a leaf."""
    per_rank: list[dict[tuple[str, str], float]] = []
    for rank in analysis.get("ranks") or []:
        steps = num(rank.get("steps_total")) or 0
        comps: dict[tuple[str, str], float] = {}
        for row in rank.get("regions") or []:
            path = row.get("path") or [row.get("name", "")]
            total = num(row.get("total_ms"))
            if total is not None and steps > 0:
                comps[("region", " / ".join(str(p) for p in path))] = total / steps
        if comps:
            per_rank.append(comps)
    averaged = _average_components(per_rank)
    names = [name for _, name in averaged]
    return [
        Component(kind, name, ms, leaf=not any(o.startswith(name + " / ") for o in names))
        for (kind, name), ms in averaged.items()
    ]


def _findings(analysis: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    out = {}
    for f in analysis.get("findings") or []:
        ident = str(f.get("id") or f.get("rule") or "")
        if ident:
            out[ident] = {
                "title": str(f.get("title", "")),
                "severity": str(f.get("severity", "")),
                "evidence": str(f.get("evidence", "")),
            }
    return out


def _trace_summaries(analysis: Mapping[str, Any]) -> list[dict[str, Any]]:
    ranks = as_dict(as_dict(analysis.get("traces")).get("ranks"))
    out: list[dict[str, Any]] = []
    for key in sorted(ranks, key=lambda k: int(k) if str(k).isdigit() else 0):
        out.extend(s for s in ranks[key] or [] if isinstance(s, dict))
    return out


def side_from_traces(
    path: str, label: str, summaries: Sequence[Mapping[str, Any]], facts: Mapping[str, str]
) -> Side:
    """A side from per-rank trace summaries (``mgprof trace --json``'s ranks, or a run's)."""
    side = Side(path=path, kind="traces", label=label, step_source=STEP_SOURCE_TRACES)
    side.facts = dict(facts)
    per_rank_steps = [_trace_steps(s) for s in summaries]
    per_rank_steps = [s for s in per_rank_steps if s]
    side.step_indices, side.step_ms = _slowest_per_index(per_rank_steps)
    if not side.step_ms:
        side.not_applicable["step_time"] = "no ProfilerStep#N span found in the traces"
    side.figures = _trace_figures(summaries)
    comps = _average_components(
        [_trace_rank_components(s, len(s.get("steps") or [])) for s in summaries]
    )
    side.components = [Component(k, n, v) for (k, n), v in comps.items()]
    side.buckets = _bucket_components(summaries)
    side.not_applicable["throughput"] = "traces hold no batch size"
    return side


def _trace_facts(summaries: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    kinds = sorted({str(s.get("kind")) for s in summaries})
    sizes = sorted({str(s.get("world_size")) for s in summaries if s.get("world_size")})
    backends = sorted({str(s.get("backend")) for s in summaries if s.get("backend")})
    devices = sorted(
        {str(d.get("name")) for s in summaries for d in s.get("devices") or [] if d.get("name")}
    )
    facts = {"trace kind": ", ".join(kinds), "rank files": str(len(summaries))}
    if sizes:
        facts["world size"] = ", ".join(sizes)
    if backends:
        facts["backend"] = ", ".join(backends)
    if devices:
        facts["device"] = ", ".join(devices)
    return facts


def side_from_job(path: str, job: Mapping[str, Any]) -> Side:
    """A side from a trace folder's job summary (``analyze_job``, as plain data)."""
    summaries = [s for s in job.get("ranks") or [] if isinstance(s, dict)]
    label = str(path).rstrip("/").rsplit("/", 1)[-1] or str(path)
    return side_from_traces(path, label, summaries, _trace_facts(summaries))


def run_as_traces(path: str, run: RunRecord, analysis: Mapping[str, Any]) -> Side:
    """A run read as its traces only (when the other side is a trace folder)."""
    summaries = _trace_summaries(analysis)
    side = side_from_traces(path, run.run_id or path, summaries, _trace_facts(summaries))
    side.findings = _findings(analysis)
    if not summaries:
        side.not_applicable["step_time"] = "the run has no traces to compare with a trace folder"
    return side


def _global_batch(run: RunRecord) -> tuple[dict[int, int], int | None]:
    """Per steady-state step index the samples of the whole job (sum over ranks), and the most
    common of them; None when a rank did not report its batch size."""
    per_index: dict[int, int] = defaultdict(int)
    complete: set[int] | None = None
    for rank in run.ranks:
        sized = {s.index: s.batch_size for s in steady_state_steps(rank.steps) if s.batch_size}
        complete = set(sized) if complete is None else complete & set(sized)
        for index, size in sized.items():
            per_index[index] += int(size or 0)
    kept = {i: per_index[i] for i in sorted(complete or ())}
    if not kept:
        return {}, None
    return kept, Counter(kept.values()).most_common(1)[0][0]


def _run_facts(run: RunRecord, analysis: Mapping[str, Any], batch: int | None) -> dict[str, str]:
    ranks = analysis.get("ranks") or []
    devices = sorted({str(r.get("device_name") or r.get("device") or "") for r in ranks} - {""})
    facts = {
        "script": str(run.script or ""),
        "script arguments": " ".join(run.script_args),
        "strategy": run.strategy,
        "world size": str(run.world_size),
        "nodes": str(run.nnodes),
        "backend": str(run.backend or ""),
        "device": ", ".join(devices) or ("cpu" if run.cpu_fallback else ""),
        "CPU fallback": "yes" if run.cpu_fallback else "no",
        "global batch": "" if batch is None else str(batch),
    }
    per_rank = sorted(
        {
            Counter(s.batch_size for s in steady_state_steps(r.steps) if s.batch_size).most_common(
                1
            )[0][0]
            for r in run.ranks
            if any(s.batch_size for s in r.steps)
        }
    )
    facts["per-rank batch"] = ", ".join(str(b) for b in per_rank)
    precision = analysis.get("precision")
    facts["precision"] = setting_label(precision if isinstance(precision, Mapping) else None)
    job = analysis.get("job")
    sync = job.get("grad_sync") if isinstance(job, Mapping) else None
    status = sync.get("status") if isinstance(sync, Mapping) else None
    if isinstance(status, str) and status != "not applicable":
        facts["gradient sync"] = status
    versions = run.ranks[0].versions if run.ranks else {}
    for key in ("torch", "cuda", "nccl", "python", "mgprof", "driver"):
        if versions.get(key):
            facts[f"{key} version"] = str(versions[key])
    return facts


def side_from_run(path: str, run: RunRecord, analysis: Mapping[str, Any]) -> Side:
    """A side from a run record and its (fresh) analysis."""
    side = Side(path=path, kind="run", label=run.run_id or path, step_source=STEP_SOURCE_RUN)
    per_rank = [
        {s.index: s.duration_ms for s in steady_state_steps(r.steps)} for r in run.ranks if r.steps
    ]
    side.step_indices, side.step_ms = _slowest_per_index(per_rank)
    if not side.step_ms:
        side.not_applicable["step_time"] = "the run recorded no steps"
    batches, side.global_batch = _global_batch(run)
    if side.global_batch is None:
        side.not_applicable["throughput"] = "the run recorded no batch sizes"
    side.step_batch = [batches.get(i) for i in side.step_indices]
    side.facts = _run_facts(run, analysis, side.global_batch)
    ranks = [r for r in analysis.get("ranks") or [] if isinstance(r, dict)]
    memory = [as_dict(r.get("memory")) for r in ranks]
    cuda = any(m.get("kind") == "cuda" for m in memory)
    side.figures = {
        **_trace_figures(_trace_summaries(analysis)),
        "nvml_gpu_util_pct": _mean(num(r.get("nvml_gpu_util_pct")) for r in ranks),
        "mfu_pct": _mean(num(r.get("mfu_pct")) for r in ranks),
        "peak_memory_mib": _max(
            num(m.get("peak_allocated_mib" if cuda else "peak_rss_mib")) for m in memory
        ),
        "dataloader_share_pct": num(as_dict(analysis.get("job")).get("dataloader_share_pct")),
    }
    side.facts["memory figure"] = (
        "peak allocated by PyTorch (max over ranks)" if cuda else "peak RSS (max over ranks)"
    )
    per_rank_comps = [
        _trace_rank_components(s, len(s.get("steps") or [])) for s in _trace_summaries(analysis)
    ]
    comps = _average_components(per_rank_comps)
    side.components = [Component(k, n, v) for (k, n), v in comps.items()]
    side.components += _region_components(analysis)
    side.buckets = _bucket_components(_trace_summaries(analysis))
    waits = [
        _mean(s.dataloader_ms for s in steady_state_steps(r.steps))
        for r in run.ranks
        if any(s.dataloader_ms is not None for s in r.steps)
    ]
    wait = _mean(waits)
    if wait is not None:
        side.components.append(Component("dataloader", "DataLoader wait", wait))
    side.findings = _findings(analysis)
    return side
