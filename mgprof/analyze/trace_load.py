"""Load one torch.profiler / Kineto trace (``.json`` or ``.json.gz``) into compact arrays.

Why this shape: a rank's trace can hold millions of events, but the analyses need only a few
columns of a few event classes. msgspec decodes straight into typed Structs that list only those
fields (every other field is skipped without being built), and :func:`load_trace` then reduces
them to numpy arrays and small lists and lets the decoded events go, so memory per rank stays
bounded by the arrays, not by the JSON.

Both Kineto schemas are read: the current one (``cat`` = ``kernel``, ``gpu_memcpy``,
``gpu_memset``, ``cuda_runtime``, ``cpu_op``, ``user_annotation``) and the 2021 one (``Kernel``,
``Memcpy``, ``Memset``, ``Runtime``, ``Operator``; string ``tid`` such as ``"stream 7"``). ROCm
traces use the current names. Timestamps stay floats (fractional microseconds are kept as they
are, never rounded). A device event whose ``dur`` is missing, negative or not finite cannot be
placed on a timeline: it is skipped and counted in :attr:`RankTrace.skipped_device_events`.
"""

from __future__ import annotations

import gzip
import math
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import numpy as np

from mgprof.analyze.intervals import FloatArray
from mgprof.errors import TraceError

__all__ = [
    "COMM_KERNEL_RE",
    "CommArgs",
    "CpuCommOp",
    "RankTrace",
    "Step",
    "load_trace",
    "rank_from_filename",
]

# DESIGN.md: a communication kernel is a kernel whose name matches nccl or rccl.
COMM_KERNEL_RE = re.compile(r"nccl|rccl", re.IGNORECASE)
_RANK_FILE_RE = re.compile(r"(?:rank[-_]?|worker)(\d+)(?![0-9])", re.IGNORECASE)

KIND_COMPUTE, KIND_COMM, KIND_MEMCPY, KIND_MEMSET = 0, 1, 2, 3
_DEVICE_CATS = {
    "kernel": KIND_COMPUTE,
    "gpu_memcpy": KIND_MEMCPY,
    "memcpy": KIND_MEMCPY,
    "gpu_memset": KIND_MEMSET,
    "memset": KIND_MEMSET,
}
_LAUNCH_CATS = {"cuda_runtime", "runtime", "cuda_driver"}
# CPU-side events that are communication rather than compute (DESIGN.md "communication ops").
_CPU_COMM_PREFIXES = ("gloo:", "nccl:")
_CPU_COMM_WRAPPERS = ("c10d::", "record_param_comms")

Num = int | float | None
Text = str | int | float | None


class _Args(msgspec.Struct):
    """The few ``args`` fields mgprof reads; the rest are skipped by the decoder."""

    correlation: Num = None
    collective: Text = msgspec.field(default=None, name="Collective name")
    in_nelems: Num = msgspec.field(default=None, name="In msg nelems")
    out_nelems: Num = msgspec.field(default=None, name="Out msg nelems")
    group_size: Num = msgspec.field(default=None, name="Group size")
    dtype: Text = None
    pg_name: Text = msgspec.field(default=None, name="Process Group Name")
    seq: Text = msgspec.field(default=None, name="Seq")
    flops: Num = None
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Input type")


class _Event(msgspec.Struct):
    ph: str | None = None
    cat: str | None = None
    name: str | None = None
    ts: Num = None
    dur: Num = None
    tid: Text = None
    args: _Args | None = None


class _Trace(msgspec.Struct):
    traceEvents: list[_Event] | None = None
    distributedInfo: msgspec.Raw = msgspec.Raw()
    deviceProperties: msgspec.Raw = msgspec.Raw()


class _PgConfig(msgspec.Struct):
    pg_name: Text = None
    pg_size: Num = None


class _DistInfo(msgspec.Struct):
    rank: Num = None
    world_size: Num = None
    backend: Text = None
    pg_config: list[_PgConfig] | None = None


@dataclass(frozen=True)
class CommArgs:
    """What a trace says about one collective call (``record_param_comms``-style args)."""

    collective: str | None = None
    in_nelems: int | None = None
    out_nelems: int | None = None
    dtype: str | None = None
    group_size: int | None = None
    pg_name: str | None = None
    seq: str | None = None


@dataclass(frozen=True)
class Step:
    """One ``ProfilerStep#N`` span on the CPU side."""

    number: int
    start: float
    end: float
    tid: str


@dataclass(frozen=True)
class CpuCommOp:
    """A ``gloo:*`` / ``nccl:*`` CPU event: the communication work of a CPU-only trace."""

    name: str
    start: float
    end: float
    tid: str
    nbytes: int | None


@dataclass
class RankTrace:
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
    notes: list[str] = field(default_factory=list)

    @property
    def has_device_events(self) -> bool:
        return bool(self.dev_start.size)


def rank_from_filename(path: Path) -> int | None:
    """Rank from names like ``rank-3.json.gz``, ``rank3.pt.trace.json``, ``worker3.*``."""
    m = _RANK_FILE_RE.search(path.name)
    return int(m.group(1)) if m else None


def _read_bytes(path: Path) -> bytes:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file; pass an existing trace file or folder") from None
    except IsADirectoryError:
        raise TraceError(f"{path}: is a folder; pass it as a trace folder") from None
    except OSError as exc:
        raise TraceError(f"{path}: cannot read ({exc.strerror}); check permissions") from None
    if not raw or raw.isspace():
        raise TraceError(f"{path}: file is empty; re-export the trace from torch.profiler")
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (EOFError, OSError, zlib.error) as exc:
            raise TraceError(
                f"{path}: gzip data is truncated or corrupt ({exc}); copy the file again"
            ) from None
        if not raw or raw.isspace():
            raise TraceError(f"{path}: file is empty; re-export the trace from torch.profiler")
    return raw


def _decode(path: Path, raw: bytes) -> _Trace:
    try:
        return msgspec.json.decode(raw, type=_Trace)
    except msgspec.ValidationError as exc:
        msg = str(exc).replace("\n", " ")
        if "Expected `object`" in msg and "$." not in msg:
            msg = "top level is not a JSON object"
        raise TraceError(
            f"{path}: not a Kineto/Chrome trace ({msg}); pass a torch.profiler trace file"
        ) from None
    except msgspec.DecodeError as exc:
        msg = str(exc).replace("\n", " ")
        raise TraceError(
            f"{path}: not valid JSON ({msg}); the file may be truncated, export it again"
        ) from None


def _as_int(v: object) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and math.isfinite(v) and v.is_integer():
        return int(v)
    if isinstance(v, str) and v.strip().lstrip("-").isdigit():
        return int(v)
    return None


def _as_str(v: object) -> str | None:
    if v is None or isinstance(v, bool):
        return None
    return str(v)


_DTYPE_BYTES = {
    "float": 4,
    "float32": 4,
    "f32": 4,
    "int": 4,
    "int32": 4,
    "uint32": 4,
    "half": 2,
    "float16": 2,
    "bfloat16": 2,
    "bf16": 2,
    "f16": 2,
    "short": 2,
    "int16": 2,
    "double": 8,
    "float64": 8,
    "long": 8,
    "int64": 8,
    "uint64": 8,
    "byte": 1,
    "char": 1,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}


def dtype_bytes(dtype: str | None) -> int | None:
    """Bytes per element for a dtype name as traces spell it (``Float``, ``BFloat16``...)."""
    if not dtype:
        return None
    key = dtype.strip().lower().removeprefix("c10::").removeprefix("torch.")
    return _DTYPE_BYTES.get(key)


def _comm_args(a: _Args) -> CommArgs | None:
    if a.collective is None and a.in_nelems is None and a.group_size is None:
        return None
    return CommArgs(
        collective=_as_str(a.collective),
        in_nelems=_as_int(a.in_nelems),
        out_nelems=_as_int(a.out_nelems),
        dtype=_as_str(a.dtype),
        group_size=_as_int(a.group_size),
        pg_name=_as_str(a.pg_name),
        seq=_as_str(a.seq),
    )


def _input_bytes(a: _Args | None) -> int | None:
    """Bytes of the tensor inputs of a ``gloo:*`` op, from ``Input Dims`` × ``Input type``."""
    if a is None or not a.input_dims or not a.input_type:
        return None
    try:
        dims = msgspec.json.decode(a.input_dims)
        types = msgspec.json.decode(a.input_type)
    except msgspec.DecodeError:
        return None
    if not isinstance(dims, list) or not isinstance(types, list):
        return None
    total = 0
    for shape, typ in zip(dims, types):
        size = dtype_bytes(typ) if isinstance(typ, str) else None
        if size is None or not isinstance(shape, list) or not shape:
            continue
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            continue
        total += math.prod(shape) * size
    return total or None


def _dist_info(raw: msgspec.Raw) -> _DistInfo | None:
    if not raw:
        return None
    try:
        return msgspec.json.decode(raw, type=_DistInfo)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None  # malformed metadata must not hide a readable timeline


def _device_props(raw: msgspec.Raw) -> list[dict[str, object]]:
    if not raw:
        return []
    try:
        props = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return []
    keep = ("id", "name", "totalGlobalMem", "computeMajor", "computeMinor", "numSms")
    if not isinstance(props, list):
        return []
    return [
        {k: p[k] for k in keep if k in p and isinstance(p[k], (str, int, float))}
        for p in props
        if isinstance(p, dict)
    ]


def _finite(v: Num) -> float | None:
    if v is None or isinstance(v, bool):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def _step_number(name: str) -> int | None:
    tail = name[len("ProfilerStep#") :]
    return int(tail) if tail.isdigit() else None


def load_trace(path: str | Path) -> RankTrace:
    """Read, decode and reduce one rank's trace; raise :class:`TraceError` on bad input."""
    p = Path(path)
    trace = _decode(p, _read_bytes(p))
    events = trace.traceEvents
    if events is None:
        raise TraceError(
            f"{p}: JSON has no 'traceEvents' list, so it is not a Kineto/Chrome trace; "
            "pass a torch.profiler trace file"
        )
    dist = _dist_info(trace.distributedInfo)
    rank = _as_int(dist.rank) if dist else None
    rank_source = "distributedInfo"
    if rank is None:
        rank = rank_from_filename(p)
        rank_source = "file name" if rank is not None else "unknown"
    pg_sizes: dict[str, int] = {}
    if dist and dist.pg_config:
        for pg in dist.pg_config:
            size = _as_int(pg.pg_size)
            if pg.pg_name is not None and size is not None:
                pg_sizes[str(pg.pg_name)] = size

    dev_start: list[float] = []
    dev_end: list[float] = []
    dev_kind: list[int] = []
    dev_corr: list[int] = []
    dev_name: list[int] = []
    name_index: dict[str, int] = {}
    comm_args: dict[int, CommArgs] = {}
    launches: dict[int, tuple[float, str]] = {}
    steps: list[Step] = []
    dl_s: list[float] = []
    dl_e: list[float] = []
    param_comms: list[tuple[str, float, float, CommArgs]] = []
    cpu_comm_ops: list[CpuCommOp] = []
    cpu_events: list[tuple[float, float, str, str]] = []  # (start, end, tid, name)
    flops_total = 0.0
    flops_ops = 0
    skipped = 0
    complete = 0

    isfinite = math.isfinite
    kind_of_name: dict[str, int] = {}  # kernel name -> KIND_COMPUTE / KIND_COMM, regex once
    tid_str: dict[object, str] = {}
    cat_lower: dict[str, str] = {}
    for ev in events:
        if ev.ph != "X":
            continue
        raw_cat = ev.cat
        cat = cat_lower.get(raw_cat)  # type: ignore[arg-type]
        if cat is None:
            cat = cat_lower[raw_cat] = raw_cat.lower() if raw_cat else ""  # type: ignore[index]
        name = ev.name or ""
        ts = ev.ts
        dur = ev.dur
        valid = ts is not None and dur is not None and dur >= 0 and isfinite(ts) and isfinite(dur)
        kind = _DEVICE_CATS.get(cat)
        if kind is not None:
            if not valid:
                skipped += 1
                continue
            complete += 1
            start = float(ts)  # type: ignore[arg-type]
            row = len(dev_start)
            dev_start.append(start)
            dev_end.append(start + dur)  # type: ignore[operator]
            args = ev.args
            corr = args.correlation if args is not None else None
            if type(corr) is not int:
                corr = _as_int(corr)
            dev_corr.append(-1 if corr is None else corr)
            if kind == KIND_COMPUTE:
                kind = kind_of_name.get(name, -1)
                if kind < 0:
                    kind = KIND_COMM if COMM_KERNEL_RE.search(name) else KIND_COMPUTE
                    kind_of_name[name] = kind
                    name_index[name] = len(name_index)
                dev_name.append(name_index[name])
                if kind == KIND_COMM and args is not None:
                    ca = _comm_args(args)
                    if ca is not None:
                        comm_args[row] = ca
            else:
                dev_name.append(-1)
            dev_kind.append(kind)
            continue
        if not valid:
            continue
        complete += 1
        ts = float(ts)  # type: ignore[arg-type]
        end = ts + dur  # type: ignore[operator]
        raw_tid = ev.tid
        if type(raw_tid) is str:
            tid = raw_tid
        else:
            tid = tid_str.get(raw_tid)  # type: ignore[assignment]
            if tid is None:
                tid = tid_str[raw_tid] = _as_str(raw_tid) or ""
        if cat in _LAUNCH_CATS:
            corr = _as_int(ev.args.correlation) if ev.args else None
            if corr is not None:
                launches[corr] = (ts, tid)
            continue
        if cat in ("trace", "gpu_user_annotation"):
            # The profiler's own span is not activity, and GPU-side annotations (which repeat
            # ProfilerStep#N names on the device timeline) are not CPU events.
            continue
        if name.startswith("ProfilerStep#"):
            num = _step_number(name)
            if num is not None:
                steps.append(Step(num, ts, end, tid))
            continue
        if name.startswith("enumerate(DataLoader)#"):
            dl_s.append(ts)
            dl_e.append(end)
        args = ev.args
        if args is None:
            if name.startswith(_CPU_COMM_PREFIXES):
                cpu_comm_ops.append(CpuCommOp(name, ts, end, tid, None))
            cpu_events.append((ts, end, tid, name))
            continue
        if args.flops is not None:
            fl = _finite(args.flops)
            if fl is not None and fl >= 0:
                flops_total += fl
                flops_ops += 1
        if name == "record_param_comms" and ev.args is not None:
            ca = _comm_args(ev.args)
            if ca is not None:
                param_comms.append((tid, ts, end, ca))
        if name.startswith(_CPU_COMM_PREFIXES):
            cpu_comm_ops.append(CpuCommOp(name, ts, end, tid, _input_bytes(ev.args)))
        cpu_events.append((ts, end, tid, name))

    if complete == 0:
        raise TraceError(
            f"{p}: trace has no complete ('ph': 'X') events with a timestamp and duration; "
            "profile at least one active step"
        )
    n_events = len(events)
    props = _device_props(trace.deviceProperties)
    del events, trace  # the decoded events are no longer needed; keep only the arrays

    steps.sort(key=lambda s: s.start)
    main_tid = _main_thread(steps, cpu_events)
    main_s: list[float] = []
    main_e: list[float] = []
    cpu_window_all = None
    if not dev_start and cpu_events:
        # Only CPU-only traces use the main-thread compute events and the whole-trace window.
        for start, end, tid, name in cpu_events:
            if tid == main_tid and not _is_comm_name(name):
                main_s.append(start)
                main_e.append(end)
        cpu_window_all = (min(c[0] for c in cpu_events), max(c[1] for c in cpu_events))
    if steps and not dev_start:
        lo = min(s.start for s in steps)
        hi = max(s.end for s in steps)
        cpu_window_all = (
            (min(lo, cpu_window_all[0]), max(hi, cpu_window_all[1])) if cpu_window_all else (lo, hi)
        )
    del cpu_events

    corr_sorted = sorted(launches)
    return RankTrace(
        path=p,
        rank=rank,
        rank_source=rank_source,
        world_size=_as_int(dist.world_size) if dist else None,
        backend=_as_str(dist.backend) if dist else None,
        pg_sizes=pg_sizes,
        device_properties=props,
        n_events=n_events,
        skipped_device_events=skipped,
        dev_start=np.asarray(dev_start, dtype=np.float64),
        dev_end=np.asarray(dev_end, dtype=np.float64),
        dev_kind=np.asarray(dev_kind, dtype=np.int8),
        dev_corr=np.asarray(dev_corr, dtype=np.int64),
        dev_name=np.asarray(dev_name, dtype=np.int32),
        kernel_names=list(name_index),
        comm_args=comm_args,
        launch_corr=np.asarray(corr_sorted, dtype=np.int64),
        launch_ts=np.asarray([launches[c][0] for c in corr_sorted], dtype=np.float64),
        launch_tid=[launches[c][1] for c in corr_sorted],
        steps=steps,
        dataloader=(np.asarray(dl_s, dtype=np.float64), np.asarray(dl_e, dtype=np.float64)),
        param_comms=param_comms,
        cpu_comm_ops=cpu_comm_ops,
        main_tid=main_tid,
        main_thread=(np.asarray(main_s, dtype=np.float64), np.asarray(main_e, dtype=np.float64)),
        cpu_window_all=cpu_window_all,
        flops_total=flops_total if flops_ops else None,
        flops_ops=flops_ops,
    )


def _is_comm_name(name: str) -> bool:
    return name.startswith(_CPU_COMM_PREFIXES) or name.startswith(_CPU_COMM_WRAPPERS)


def _main_thread(steps: list[Step], cpu_events: list[tuple[float, float, str, str]]) -> str | None:
    """The thread of the ``ProfilerStep#N`` events; without steps, the busiest CPU thread.

    "Busiest" = largest summed duration of top-level-or-not complete events; it is a fallback for
    traces recorded without a schedule, stated in the result's definitions.
    """
    if steps:
        counts: dict[str, int] = {}
        for s in steps:
            counts[s.tid] = counts.get(s.tid, 0) + 1
        return max(counts, key=lambda t: counts[t])
    totals: dict[str, float] = {}
    for start, end, tid, _name in cpu_events:
        totals[tid] = totals.get(tid, 0.0) + (end - start)
    return max(totals, key=lambda t: totals[t]) if totals else None
