"""Plain, versioned records of what a run measured: one ``RankRecord`` per rank, one ``RunRecord``.

Records are msgspec Structs: JSON-serialisable, validated on decode (a run.json is untrusted input,
never unpickled), and importable without torch so a saved run can be analysed anywhere.
Units are in the field names (``_ms``, ``_mib``, ``_w``, ``_j``, ``_s``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import msgspec

from mgprof.errors import RunRecordError
from mgprof.safe_read import file_problem, read_regular

SCHEMA_VERSION = 1
"""Bump when a field changes meaning or is removed; adding optional fields keeps the version."""


class Struct(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    """Base for all records: keyword-only, tolerant of fields added by newer minor versions."""


class DeviceInfo(Struct):
    """The device a rank ran on. ``kind`` is ``cuda`` or ``cpu``."""

    kind: Literal["cuda", "cpu"]
    index: int | None = None
    name: str | None = None
    total_memory_mib: float | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    capability: str | None = None


class StepRecord(Struct):
    """One training step as the step timer saw it."""

    index: int
    duration_ms: float
    batch_size: int | None = None
    fingerprint: str | None = None
    """Cheap hash of a few values of the batch: equal across ranks means identical data."""
    traced: bool = False
    dataloader_ms: float | None = None
    """Time spent waiting for the next batch from a DataLoader before this step, when timed."""


class RegionRecord(Struct):
    """Totals of one ``mgprof.region(name)`` across the steps of a rank.

    Regions nest: ``path`` is the names of the enclosing regions, outermost first, ending with
    ``name``; the same name under two parents is two records. The quantiles come from the
    region's durations (all of them up to ``REGION_DURATIONS_KEPT``, then a uniform sample).
    """

    name: str
    count: int
    total_ms: float
    max_ms: float
    path: list[str] = msgspec.field(default_factory=list)
    """Enclosing regions outermost first, then ``name`` (empty in runs recorded before nesting)."""
    min_ms: float | None = None
    p50_ms: float | None = None
    p95_ms: float | None = None


class DeviceSamples(Struct):
    """Time series of one device's sampler readings, columnar (one list per metric)."""

    device: str
    """``cuda:N`` (CUDA index in this process) or ``cpu``."""
    t_s: list[float] = msgspec.field(default_factory=list)
    columns: dict[str, list[float | None]] = msgspec.field(default_factory=dict)
    summary: dict[str, float | None] = msgspec.field(default_factory=dict)
    """mean/max of each column plus derived figures (e.g. ``energy_j`` over the run)."""
    facts: dict[str, Any] = msgspec.field(default_factory=dict)
    """Static facts from the sampler: NVML uuid, bus id, name, power limit, throttle reasons."""


class SamplerRecord(Struct):
    """Which sampler ran on a rank, why, and what it saw."""

    kind: Literal["nvml", "cpu", "none"]
    reason: str = ""
    """Why this sampler: e.g. ``NVML not available: NVMLError_LibraryNotFound``."""
    interval_s: float | None = None
    devices: list[DeviceSamples] = msgspec.field(default_factory=list)
    errors: list[str] = msgspec.field(default_factory=list)


class MemoryRecord(Struct):
    """Peak memory of a rank. CUDA fields are None on CPU and vice versa."""

    kind: Literal["cuda", "cpu"]
    peak_allocated_mib: float | None = None
    peak_reserved_mib: float | None = None
    total_mib: float | None = None
    peak_rss_mib: float | None = None
    per_device: dict[str, dict[str, float | None]] = msgspec.field(default_factory=dict)
    """For DataParallel: ``cuda:N`` -> peak allocated/reserved, to show rank-0 imbalance."""
    tracked: bool = False
    """Memory tracking was on (``--memory``): profiler memory events, and on CUDA the
    allocator's history with snapshots."""
    snapshots: list[str] = msgspec.field(default_factory=list)
    """Allocator snapshots (JSON, PyTorch's ``_snapshot()`` format) relative to the run
    directory: ``memory/rank<N>.window.json`` at the end of the traced steps, ``.oom.json`` at an
    out-of-memory error."""
    oom: bool = False
    """The rank ran out of memory (CUDA OutOfMemoryError, or MemoryError on CPU)."""
    step_marks: list[tuple[int, float, float]] = msgspec.field(default_factory=list)
    """Tracked steps on the host wall clock: (step index, start µs, end µs since the epoch), the
    clock of the allocator's trace entries, to name the step of the peak."""
    phase_marks: list[tuple[str, float, float]] = msgspec.field(default_factory=list)
    """``mgprof.region`` blocks of the tracked steps (path joined by " / ", start µs, end µs)."""


class TrainingFacts(Struct):
    """Facts about how the script trains, observed by hooks; None when not observed."""

    dataloader_num_workers: int | None = None
    dataloader_pin_memory: bool | None = None
    distributed_sampler: bool | None = None
    set_epoch_called: bool | None = None
    find_unused_parameters: bool | None = None
    autocast_used: bool | None = None
    ddp_bucket_cap_mb: float | None = None
    ddp_sync_forwards: int | None = None
    """Forwards of a DistributedDataParallel module with gradient sync on (its backward then
    all-reduces the gradients): evidence that this rank's gradients were synchronised."""
    dp_forwards: int | None = None
    """Forwards of a DataParallel module over two or more devices (gradients summed on device 0)."""
    script_all_reduces: int | None = None
    """``torch.distributed.all_reduce`` calls made by the script itself (hand-written gradient
    averaging, or metrics: mgprof cannot tell which)."""
    auto_wrap: AutoWrapRecord | None = None
    """What mgprof's auto-wrap did on this rank (None: auto-wrap was not in play)."""
    batch_size_read: bool | None = None
    """True when the script read the launcher's batch size with ``mgprof.batch_size()``."""
    batch_size_applied: list[str] | None = None
    """DataLoaders mgprof resized to the trial's size: ``DataLoader(batch_size=32) -> 8``."""
    batch_size_refused: list[str] | None = None
    """DataLoaders whose batch size could not be set, and why."""
    batch_source: Literal["forward", "dataloader"] | None = None
    """Where the automatic session's step batches came from: ``forward`` (the trained module's
    own inputs, seen by auto-wrap's route) or ``dataloader`` (the batches the DataLoader yielded,
    when the model's calls were not seen); None for a script's own ``prof.step``."""
    untrained_samples: int | None = None
    """Samples the DataLoader yielded that the trained module was never called with (a script
    that peeks with ``next(iter(loader))``): not counted in any step."""
    cpu_threads: int | None = None
    """``torch.get_num_threads()`` on this rank: intra-op threads for CPU operators."""
    omp_num_threads: str | None = None
    """``OMP_NUM_THREADS`` as the rank saw it (None: unset)."""
    cpu_cores: int | None = None
    """CPU cores this rank's process may run on (its affinity mask; ``os.cpu_count()`` where
    there is none). Advice on loader workers divides these among the ranks of the host."""
    ddp_gradient_mib: float | None = None
    """Size of the gradients a DistributedDataParallel module all-reduces per step (its trainable
    parameters' bytes), to compare with ``ddp_bucket_cap_mb``."""
    precision: PrecisionRecord | None = None
    """What ``--precision`` did on this rank (None: not asked)."""
    fsdp_forwards: int | None = None
    """Forwards of the outermost FSDP module with gradients on (FSDP reduce-scatters the
    gradients in the backward that follows); None when the script uses no FSDP."""
    fsdp: FsdpRecord | None = None
    """The script's FSDP units and settings (None: no FSDP)."""
    model_state: ModelStateRecord | None = None
    """Parameters, gradients and optimizer state on this rank after the first update."""
    compile: CompileRecord | None = None
    """What ``torch.compile`` compiled in this process (None: nothing)."""
    grad_check_updates: list[int] | None = None
    """Optimizer updates (0-based, per optimizer) whose gradients were checked
    (``mgprof.collect.grad_check``: the first few, then one in 64)."""
    grad_norms: list[float | None] | None = None
    """Total L2 norm of the gradients the optimizer applied at each checked update (None: no
    parameter it holds had a gradient, or the norm was not finite: see ``grad_nonfinite``)."""
    grad_nonfinite: list[int] | None = None
    """Positions in ``grad_norms`` whose norm was NaN or inf (JSON has no such number)."""


class AutoWrapRecord(Struct):
    """The model mgprof wrapped for a script that did not wrap it itself, or why it did not."""

    wrapper: Literal["ddp", "dp", "fsdp"] | None = None
    """What the trained module was routed through (``fsdp``: sharded in place by
    ``fully_shard``); None when nothing was wrapped."""
    module_class: str | None = None
    parameters: int | None = None
    """Trainable parameters (elements) of the wrapped module."""
    bucket_cap_mb: float | None = None
    devices: list[int] = msgspec.field(default_factory=list)
    """CUDA indices for DataParallel; empty for DDP on CPU."""
    initialized_process_group: bool = False
    """True when mgprof initialised the process group (the script had none)."""
    reason: str | None = None
    """Why nothing was wrapped (the script wraps itself, no optimizer, ...)."""
    optimizer_params_repointed: int | None = None
    """``fsdp``: optimizer parameter entries pointed at FSDP's sharded parameters."""
    compile_order: str | None = None
    """A compiled model: ``compile(ddp(model))`` when mgprof compiled the DDP wrapper with
    the script's options, ``ddp(compiled)`` when it could only wrap the compiled module."""


class CompileRecord(Struct):
    """What ``torch.compile`` did in one rank's process, from dynamo's own counters
    (``mgprof.collect.wrapping.compile_watch``)."""

    graphs: int
    """Distinct graphs dynamo compiled (``unique_graphs``)."""
    graph_breaks: int
    """Graph breaks: places dynamo stopped a graph and fell back to Python."""
    break_reasons: list[str] = msgspec.field(default_factory=list)
    """The most frequent break reasons, ``"3x <reason>"``."""
    frames_ok: int | None = None
    frames_total: int | None = None
    """Python frames dynamo converted / looked at."""
    recompiles: int | None = None
    """Recompilations (guard failures), when dynamo counted them."""


class ModelStateRecord(Struct):
    """The trained model's state on one rank after its first update
    (``mgprof.collect.model_state``): the tensors the optimizer holds, this rank's share only."""

    parameters_mib: float
    gradients_mib: float
    optimizer_mib: float
    """Optimizer state tensors (Adam's two moments: twice the parameters)."""
    parameters: int
    """Parameter elements of the whole model (a shard counts as its full tensor)."""
    sharded: bool = False
    """True when the parameters are DTensor shards (FSDP2): the sizes are this rank's part."""


class FsdpRecord(Struct):
    """A script's own FSDP, as its modules say (``mgprof.collect.wrapping.fsdp_watch``)."""

    api: Literal["fully_shard", "FullyShardedDataParallel", "unknown"]
    """``fully_shard`` (FSDP2) or ``FullyShardedDataParallel`` (FSDP1)."""
    units: int = 0
    """FSDP units holding parameters (each all-gathers and reduce-scatters its own)."""
    unit_classes: dict[str, int] = msgspec.field(default_factory=dict)
    """The script's module class of each unit, with its count (``Block: 4``)."""
    reshard_after_forward: list[bool] = msgspec.field(default_factory=list)
    """FSDP2: the distinct settings over the units (True frees the gathered parameters after
    forward and gathers them again in backward; False keeps them, ZeRO-2-like)."""
    sharding_strategy: str | None = None
    """FSDP1's ``ShardingStrategy`` name (``FULL_SHARD``, ``SHARD_GRAD_OP``...)."""
    param_dtype: str | None = None
    reduce_dtype: str | None = None
    """The mixed-precision policy's dtypes (None: the parameters' own)."""
    mesh_shape: list[int] | None = None
    """FSDP2: the device mesh's shape (``[2]``; ``[replicas, shards]`` for HSDP)."""
    world: int | None = None
    """Ranks the parameters are sharded or replicated over."""
    unit_parameters: list[int] = msgspec.field(default_factory=list)
    """FSDP2: the parameter elements each unit gathers (whole tensors), largest first."""


class PrecisionRecord(Struct):
    """The numeric precision one rank trained in under ``--precision``, and the loss it reached.

    mgprof applies ``torch.autocast`` around the trained module's forward (found as auto-wrap
    finds it); the loss is read from the scalar each ``Tensor.backward`` starts from.
    """

    requested: str
    """``fp32``, ``bf16`` or ``fp16`` (``mgprof.collect.wrapping.precision.PRECISIONS``)."""
    applied: bool = False
    """The trained module's forward ran under mgprof's autocast setting."""
    device_type: str | None = None
    module_class: str | None = None
    reason: str | None = None
    """Why the setting was not applied (no trained module found, ...)."""
    script_autocast: str | None = None
    """The dtype of the script's own autocast around the model's forward (``bfloat16``), which
    mgprof's setting replaced there; None when the script used none."""
    script_grad_scaler: bool = False
    """The script made an enabled ``GradScaler`` of its own."""
    loss_scaling: Literal["inserted", "script", "none"] | None = None
    """fp16: ``inserted`` (mgprof's GradScaler at backward and optimizer.step), ``script`` (the
    script's own), ``none`` (speed only: ``loss_scaling_note`` says why)."""
    loss_scaling_note: str | None = None
    skipped_updates: int = 0
    """Optimizer steps mgprof's GradScaler skipped because gradients were inf/NaN."""
    losses: list[float | None] = msgspec.field(default_factory=list)
    """Per optimizer update (from the first): the sum of the scalar losses backpropagated in
    it (several with gradient accumulation); None for an update without one, or whose loss
    was inf/NaN (JSON has neither: see ``nonfinite``)."""
    nonfinite: list[int] = msgspec.field(default_factory=list)
    """Indices into ``losses`` of the updates whose loss was inf or NaN."""
    losses_truncated: bool = False
    """More updates ran than ``MAX_LOSSES``; the later ones were not recorded."""


class NoiseScaleRecord(Struct):
    """One rank's gradient norms for the gradient noise scale (McCandlish et al. 2018, App. A.1).

    Per measured step (columnar, one list per field, like ``DeviceSamples``): the squared norm of
    this rank's own gradient before averaging (``local_sq``) and of the gradient after it
    (``avg_sq``), and the samples this rank put into the step. The analysis combines the ranks
    per step (``mgprof.analyze.run.noise_scale``); nothing here is an estimate yet.
    """

    version: int = 1
    """Layout of this record; bumped when a field changes meaning."""
    every: int = 1
    """One gradient sync in ``every`` was measured (16 by default, 1 with ``--noise-scale``)."""
    source: Literal["ddp", "accumulation"] | None = None
    """``ddp``: mgprof's DDP comm hook saw each rank's gradient before and after the all-reduce;
    ``accumulation``: one process, the first micro-batch's gradient against the accumulated one.
    None: nothing was measured (``reason`` says why)."""
    reason: str | None = None
    """Why the norms were not measured on this rank (one rank and no accumulation, a comm hook
    of the script's own, a DDP model the script built itself, turned off)."""
    group_size: int = 1
    """Ranks whose gradients were averaged (``ddp``); 1 for ``accumulation``."""
    index: list[int] = msgspec.field(default_factory=list)
    """Step index of each measurement (the ``StepRecord.index`` it belongs to)."""
    local_sq: list[float] = msgspec.field(default_factory=list)
    """|g_local|^2: this rank's gradient before averaging (``accumulation``: the first
    micro-batch's), summed over all buckets, computed in fp32."""
    avg_sq: list[float] = msgspec.field(default_factory=list)
    """|g_avg|^2: the gradient DDP averaged over the ranks (``accumulation``: the accumulated
    gradient divided by the micro-batches)."""
    batch_size: list[int | None] = msgspec.field(default_factory=list)
    """Samples this rank put into the step's update (all micro-batches), when known."""
    micro_batches: list[int] = msgspec.field(default_factory=list)
    """Backward passes the accumulated gradient spans (``accumulation``); 1 under DDP, whose
    local gradient is the rank's whole update."""
    dropped: dict[str, int] = msgspec.field(default_factory=dict)
    """Steps left out, by reason (two gradient syncs in one step, a non-finite norm, ...)."""


class RankRecord(Struct):
    """Everything one rank measured."""

    rank: int
    world_size: int
    local_rank: int = 0
    host: str = ""
    pid: int = 0
    strategy: str = "single"
    backend: str | None = None
    device: DeviceInfo = msgspec.field(default_factory=lambda: DeviceInfo(kind="cpu"))
    devices_used: int = 1
    steps: list[StepRecord] = msgspec.field(default_factory=list)
    step_form: Literal["call", "with", "auto"] | None = None
    """How steps were marked: ``prof.step()`` calls, ``with prof.step():`` blocks (which
    exclude the DataLoader wait between them), or mgprof analyze's optimizer hook."""
    regions: list[RegionRecord] = msgspec.field(default_factory=list)
    sampler: SamplerRecord = msgspec.field(default_factory=lambda: SamplerRecord(kind="none"))
    memory: MemoryRecord | None = None
    training: TrainingFacts = msgspec.field(default_factory=TrainingFacts)
    traces: list[str] = msgspec.field(default_factory=list)
    """Trace files relative to the run directory."""
    versions: dict[str, str | None] = msgspec.field(default_factory=dict)
    warnings: list[str] = msgspec.field(default_factory=list)
    """Fail-open notes: what broke inside mgprof while the training went on."""
    error: str | None = None
    noise_scale: NoiseScaleRecord | None = None
    """Gradient norms for the gradient noise scale; None in runs recorded before mgprof
    measured them."""


class RankExit(Struct):
    """How one worker process ended, as torchrun reported it (only for failed workers)."""

    rank: int | None
    """Global rank; None when torchrun named only the local rank on a multi-node job."""
    exit_code: int
    """Negative: killed by that signal (-9 is SIGKILL); 128+N: exited on signal N's handler."""
    local_rank: int | None = None
    signal: str | None = None
    """``SIGKILL``, ``SIGTERM``... when the exit code says a signal ended the process."""
    root_cause: bool = False
    """The first failure torchrun observed; the others were usually stopped because of it."""


class RunRecord(Struct):
    """One run: all ranks gathered on rank 0, plus what the launcher knows."""

    schema_version: int = SCHEMA_VERSION
    run_id: str = ""
    created_utc: str = ""
    script: str | None = None
    script_args: list[str] = msgspec.field(default_factory=list)
    strategy: str = "single"
    world_size: int = 1
    nnodes: int = 1
    backend: str | None = None
    cpu_fallback: bool = False
    cpu_fallback_reason: str | None = None
    status: Literal["complete", "incomplete", "interrupted", "running"] = "complete"
    error: str | None = None
    exit_code: int | None = None
    ranks: list[RankRecord] = msgspec.field(default_factory=list)
    missing_ranks: list[int] = msgspec.field(default_factory=list)
    rank_exits: list[RankExit] = msgspec.field(default_factory=list)
    """Failed worker processes (rank, exit code, signal) from torchrun's failure summary."""
    exit_note: str | None = None
    """Set when every failed process had finished its script first (its records are complete):
    the failure came in interpreter teardown (atexit handlers, C++ destructors; torch's gloo
    can abort there), so the run is complete and its exit code says how the processes ended."""
    analysis: dict[str, Any] | None = None
    """Results of ``mgprof.analyze`` on this run (trace figures, findings), filled after the run."""


_encoder = msgspec.json.Encoder()


def encode_run(run: RunRecord) -> bytes:
    """run.json bytes, pretty enough to diff (msgspec output re-indented)."""
    return msgspec.json.format(_encoder.encode(run), indent=1)


def decode_run(data: bytes, source: str = "run.json") -> RunRecord:
    """Parse and validate run.json bytes; any problem becomes one ``RunRecordError`` line."""
    try:
        head = msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        raise RunRecordError(f"{source} is not valid JSON ({exc}); is it a run.json?") from None
    if not isinstance(head, dict) or "schema_version" not in head:
        raise RunRecordError(f"{source} has no schema_version: not an mgprof run.json")
    version = head.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise RunRecordError(f"{source}: schema_version {version!r} is not an integer")
    if version > SCHEMA_VERSION:
        raise RunRecordError(
            f"{source} has schema_version {version}, newer than this mgprof understands "
            f"({SCHEMA_VERSION}); upgrade with 'pip install -U mgprof'"
        )
    if version < 1:
        raise RunRecordError(f"{source}: unknown schema_version {version}")
    try:
        run = msgspec.convert(head, RunRecord)
    except msgspec.ValidationError as exc:
        raise RunRecordError(f"{source} does not match the run.json schema: {exc}") from None
    seen: set[int] = set()
    for rank in run.ranks:
        if rank.rank in seen:
            raise RunRecordError(
                f"{source} holds rank {rank.rank}'s record twice: it was edited or merged by "
                "hand; keep one record per rank"
            )
        seen.add(rank.rank)
    return run


def read_run(path: str | Path) -> RunRecord:
    """Load a run.json file or the run.json inside a run directory.

    Only a regular file is read (a FIFO or ``/dev/zero`` under that name is refused, not read),
    up to the record size limit (``mgprof.safe_read``); every problem is one RunRecordError line.
    """
    p = Path(path)
    if p.is_dir():
        p = p / "run.json"
    if file_problem(p) == "no such file":
        raise RunRecordError(
            f"{p} not found; give a run directory made by 'mgprof analyze' or its run.json"
        )
    data = read_regular(
        p,
        error=RunRecordError,
        hint="give a run directory made by 'mgprof analyze' or its run.json",
    )
    try:
        return decode_run(data, str(p))
    except RecursionError:
        raise RunRecordError(
            f"{p}: JSON is nested too deeply (about 1000 levels or more): not an mgprof run.json"
        ) from None
    except MemoryError:
        raise RunRecordError(f"{p}: ran out of memory while reading it; free memory") from None


def to_builtins(obj: Any) -> Any:
    """Plain dict/list form of a record (for JSON reports)."""
    return msgspec.to_builtins(obj)
