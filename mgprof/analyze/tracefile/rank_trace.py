"""RankTrace: what one rank's trace reduces to (arrays and records), and its KIND_* row codes.

The records are msgspec Structs rather than dataclasses: a dataclass builds its methods with
``exec`` at every import (about a millisecond each), and ``mgprof trace`` imports these on
every run.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np

from mgprof.analyze.intervals import FloatArray

__all__ = [
    "KIND_COMM",
    "KIND_COMPUTE",
    "KIND_MEMCPY",
    "KIND_MEMSET",
    "CommArgs",
    "CpuCommOp",
    "HostOps",
    "RankTrace",
    "Step",
]

KIND_COMPUTE, KIND_COMM, KIND_MEMCPY, KIND_MEMSET = 0, 1, 2, 3


class CommArgs(msgspec.Struct, frozen=True):
    """What a trace says about one collective call (``record_param_comms``-style args)."""

    collective: str | None = None
    in_nelems: int | None = None
    out_nelems: int | None = None
    dtype: str | None = None
    group_size: int | None = None
    pg_name: str | None = None
    seq: str | None = None


class Step(msgspec.Struct, frozen=True):
    """One ``ProfilerStep#N`` span on the CPU side."""

    number: int
    start: float
    end: float
    tid: str


class CpuCommOp(msgspec.Struct, frozen=True):
    """A ``gloo:*`` / ``nccl:*`` CPU event: the communication work of a CPU-only trace."""

    name: str
    start: float
    end: float
    tid: str
    nbytes: int | None
    ext: int | None = None
    """``External id``: on a GPU trace, the NCCL kernel this ``nccl:*`` op launched has it too."""
    comm: CommArgs | None = None
    """NCCL args on the op itself (``In msg nelems``, ``dtype``, ``Group size``), when present."""


class HostOps(msgspec.Struct):
    """Host operators (``cat`` ``cpu_op``; 2021 schema ``Operator``), one row each, sorted by
    (thread, start, longer first) so that a parent precedes the ops nested in it."""

    start: FloatArray
    end: FloatArray
    thread: np.ndarray  # int32 index into threads
    name: np.ndarray  # int32 index into names
    shape: np.ndarray  # int32 index into shapes; 0: no Input Dims
    names: list[str]
    shapes: list[bytes]  # raw Input Dims JSON, e.g. b"[[64, 256], [512, 256]]"; shapes[0] == b""
    threads: list[str]

    @property
    def size(self) -> int:
        return int(self.start.size)


class RankTrace(msgspec.Struct):
    """One rank's trace reduced to what the analyses need (see module docstring)."""

    path: Path
    rank: int | None
    rank_source: str
    world_size: int | None
    backend: str | None
    pg_sizes: dict[str, int]
    device_properties: list[dict[str, object]]
    n_events: int
    skipped_device_events: int
    # Device events, one row each: start/end (us), kind (KIND_*), correlation id (-1: none),
    # index into kernel_names (-1 for memcpy/memset).
    dev_start: FloatArray
    dev_end: FloatArray
    dev_kind: np.ndarray
    dev_corr: np.ndarray
    dev_name: np.ndarray
    kernel_names: list[str]
    comm_args: dict[int, CommArgs]  # device row -> collective args carried by the kernel
    # CPU side
    launch_corr: np.ndarray  # correlation ids of runtime/driver calls, sorted
    launch_ts: FloatArray  # matching launch timestamps
    launch_tid: list[str]
    steps: list[Step]
    dataloader: tuple[FloatArray, FloatArray]
    param_comms: list[tuple[str, float, float, CommArgs]]  # record_param_comms spans
    cpu_comm_ops: list[CpuCommOp]
    main_tid: str | None
    main_thread: tuple[FloatArray, FloatArray]  # compute events on the main thread
    cpu_window_all: tuple[float, float] | None  # first start .. last end of CPU events
    flops_total: float | None
    flops_ops: int
    # Timestamps above are relative to time_base_us (the first complete event's ts in the file),
    # so that end = start + dur keeps sub-ns precision for large absolute timestamps.
    time_base_us: float = 0.0
    # External id of each device row's launching op (-1: none), and PREC_* of GEMM/conv ops.
    dev_ext: np.ndarray = msgspec.field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    gemm_precision: dict[int, int] = msgspec.field(default_factory=dict)
    gemm_host_us: dict[str, float] = msgspec.field(default_factory=dict)
    """Host time of the innermost GEMM/conv ops by operand precision (``leaf_gemm_time``)."""
    flops_source: str | None = None
    flops_estimate_skipped: dict[str, int] = msgspec.field(default_factory=dict)
    notes: list[str] = msgspec.field(default_factory=list)
    dev_stream: np.ndarray = msgspec.field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    """Per device row, an index of its stream (the device event's ``tid``)."""
    graph_launches: int = 0
    runtime: tuple[FloatArray, FloatArray] = msgspec.field(
        default_factory=lambda: (np.zeros(0), np.zeros(0))
    )
    """Spans of the runtime/driver calls (launches, synchronisations) on the CPU."""
    """``cudaGraphLaunch`` calls: kernels replayed from a CUDA graph have no launch of their own."""
    unknown_categories: dict[str, int] = msgspec.field(default_factory=dict)
    """Event categories torch.profiler does not write (``cat`` -> events), counted as host work."""
    runtime_tid: list[str] = msgspec.field(default_factory=list)
    """Thread of each runtime/driver call (rows of ``runtime``)."""
    launch_rows: np.ndarray = msgspec.field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """Row in ``runtime`` of each launch in ``launch_corr``."""
    host_ops: HostOps | None = None
    """The host operators, for the Operators view (None when the trace has none)."""
    trace_start_us: float = 0.0
    """Start of the earliest complete event mgprof reads, relative to ``time_base_us``."""

    @property
    def has_device_events(self) -> bool:
        return bool(self.dev_start.size)
