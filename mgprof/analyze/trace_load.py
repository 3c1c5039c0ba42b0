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

import gc
import gzip
import math
import re
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, cast

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


class _Args(msgspec.Struct, gc=False):
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
    concrete: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Concrete Inputs")
    external_id: Num = msgspec.field(default=None, name="External id")


class _Event(msgspec.Struct, gc=False):
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


class _TraceOutline(msgspec.Struct):
    """The document with ``traceEvents`` left undecoded: decoded later in bounded slices."""

    traceEvents: msgspec.Raw = msgspec.Raw()
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
    # Timestamps above are relative to time_base_us (the first complete event's ts in the file),
    # so that end = start + dur keeps sub-ns precision for large absolute timestamps.
    time_base_us: float = 0.0
    # External id of each device row's launching op (-1: none), and PREC_* of GEMM/conv ops.
    dev_ext: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    gemm_precision: dict[int, int] = field(default_factory=dict)
    flops_source: str | None = None
    flops_estimate_skipped: dict[str, int] = field(default_factory=dict)
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


# --- FLOP estimates from ``Input Dims`` (record_shapes=True) -----------------------------------
# Current torch does not write ``args.flops`` into the exported Chrome trace even with
# with_flops=True, so GEMM and convolution FLOPs are estimated from the op's shapes. Only the
# innermost op of a nest is counted (aten::linear -> aten::addmm counts the addmm once).
_GEMM_OPS = frozenset(
    {
        "aten::mm",
        "aten::addmm",
        "aten::bmm",
        "aten::baddbmm",
        "aten::_scaled_mm",
        "aten::_int_mm",
        "aten::matmul",
        "aten::linear",
    }
)
_CONV_OPS = frozenset(
    {
        "aten::convolution",
        "aten::_convolution",
        "aten::cudnn_convolution",
        "aten::cudnn_convolution_transpose",
        "aten::convolution_backward",
    }
)
_FLOP_OPS = _GEMM_OPS | _CONV_OPS
# Operand positions whose dtypes decide a GEMM/conv's precision (tensor-core classification).
_OPERANDS = {"aten::addmm": (1, 2), "aten::baddbmm": (1, 2), "aten::convolution_backward": (0, 2)}
_REDUCED = frozenset(
    {
        "bfloat16",
        "half",
        "float16",
        "float8_e4m3fn",
        "float8_e5m2",
        "float8_e4m3fnuz",
        "float8_e5m2fnuz",
        "signed char",
        "int8",
    }
)
PREC_REDUCED, PREC_FP32, PREC_FP64 = 1, 2, 3


def _shapes(raw: msgspec.Raw) -> list[list[int] | None] | None:
    """``Input Dims`` as a list of int shapes (None for a non-tensor argument)."""
    if not raw:
        return None
    try:
        dims = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return None
    if not isinstance(dims, list):
        return None
    out: list[list[int] | None] = []
    for d in dims:
        ok = isinstance(d, list) and all(
            isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in d
        )
        out.append(d if ok else None)
    return out


def _concrete(raw: msgspec.Raw) -> list[object] | None:
    """``Concrete Inputs`` (strings such as ``'[1, 1]'``, ``'1'``, ``'False'``) parsed."""
    if not raw:
        return None
    try:
        vals = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return None
    if not isinstance(vals, list):
        return None
    out: list[object] = []
    for v in vals:
        if not isinstance(v, str) or not v:
            out.append(None)
            continue
        try:
            out.append(msgspec.json.decode(v.replace("True", "true").replace("False", "false")))
        except msgspec.DecodeError:
            out.append(None)
    return out


def _ints(v: object, n: int) -> list[int] | None:
    if isinstance(v, int) and not isinstance(v, bool):
        return [v] * n
    if isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        if len(v) == n:
            return list(v)
        if len(v) == 1:
            return list(v) * n
    return None


def _mm_flops(a: list[int], b: list[int]) -> float | None:
    """2·batch·M·N·K for ``a @ b`` with torch.matmul's broadcasting (1-D operands allowed)."""
    if not a or not b:
        return None
    a2 = [1, *a] if len(a) == 1 else a
    b2 = [*b, 1] if len(b) == 1 else b
    m, k = a2[-2], a2[-1]
    k2, n = b2[-2], b2[-1]
    if k != k2:
        return None
    batch_a, batch_b = a2[:-2], b2[:-2]
    width = max(len(batch_a), len(batch_b))
    batch = 1
    for x, y in zip([1] * (width - len(batch_a)) + batch_a, [1] * (width - len(batch_b)) + batch_b):
        if x != y and 1 not in (x, y):
            return None
        batch *= max(x, y)
    return 2.0 * batch * m * n * k


def _conv_fwd_flops(
    x: list[int],
    w: list[int],
    stride: object,
    padding: object,
    dilation: object,
    transposed: object,
) -> tuple[float | None, str]:
    """torch's flop-counter formula: 2·N·prod(weight)·prod(out spatial) (input spatial if
    transposed); out = ⌊(in + 2p − d(k−1) − 1)/s⌋ + 1."""
    nd = len(x) - 2
    if nd < 1 or len(w) != nd + 2:
        return None, "conv input/weight dims do not fit"
    if transposed is True:
        return 2.0 * x[0] * math.prod(w) * math.prod(x[2:]), ""
    s, p, d = _ints(stride, nd), _ints(padding, nd), _ints(dilation, nd)
    if s is None or p is None or d is None or transposed is None:
        return None, "conv stride/padding/dilation not in Concrete Inputs"
    out = [(x[2 + i] + 2 * p[i] - d[i] * (w[2 + i] - 1) - 1) // s[i] + 1 for i in range(nd)]
    if any(o <= 0 for o in out) or any(v <= 0 for v in s):
        return None, "conv output size is not positive"
    return 2.0 * x[0] * math.prod(w) * math.prod(out), ""


def estimate_flops(
    name: str, dims_raw: msgspec.Raw, concrete_raw: msgspec.Raw
) -> tuple[float | None, str]:
    """FLOPs of one GEMM/conv op from its ``Input Dims``; (None, reason) when not derivable."""
    dims = _shapes(dims_raw)
    if not dims:
        return None, "no Input Dims (profile with record_shapes=True)"

    def arg(i: int) -> list[int] | None:
        return dims[i] if i < len(dims) else None

    if name in _GEMM_OPS:
        if name == "aten::linear":
            x, w = arg(0), arg(1)
            if not x or not w or len(w) != 2 or x[-1] != w[1]:
                return None, "linear dims do not fit"
            return 2.0 * math.prod(x[:-1]) * w[0] * w[1], ""
        i = 1 if name in ("aten::addmm", "aten::baddbmm") else 0
        a, b = arg(i), arg(i + 1)
        if a is None or b is None:
            return None, f"{name} dims do not fit"
        if name != "aten::matmul" and (len(a) != len(b) or len(a) not in (2, 3)):
            return None, f"{name} dims do not fit"
        fl = _mm_flops(a, b)
        return (fl, "") if fl is not None else (None, f"{name} dims do not fit")
    conc = _concrete(concrete_raw) or []

    def c(i: int) -> object:
        return conc[i] if i < len(conc) else None

    if name in ("aten::convolution", "aten::_convolution"):
        x, w = arg(0), arg(1)
        if not x or not w:
            return None, "conv dims missing"
        return _conv_fwd_flops(x, w, c(3), c(4), c(5), c(6))
    if name == "aten::cudnn_convolution":
        x, w = arg(0), arg(1)
        if not x or not w:
            return None, "conv dims missing"
        return _conv_fwd_flops(x, w, c(3), c(2), c(4), False)
    if name == "aten::cudnn_convolution_transpose":
        x, w = arg(0), arg(1)
        if not x or not w or len(x) < 3:
            return None, "conv dims missing"
        return _conv_fwd_flops(x, w, None, None, None, True)
    if name == "aten::convolution_backward":
        # (grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
        #  output_padding, groups, output_mask): grad_output gives the output size directly.
        go, x, w, mask = arg(0), arg(1), arg(2), c(10)
        if not go or not x or not w or len(go) != len(x) or len(w) != len(x):
            return None, "conv backward dims missing"
        if not isinstance(mask, list) or len(mask) < 2:
            return None, "conv backward output_mask not in Concrete Inputs"
        spatial = x[2:] if c(7) is True else go[2:]
        fwd = 2.0 * x[0] * math.prod(w) * math.prod(spatial)
        return fwd * sum(1 for m in mask[:2] if m is True), ""
    return None, f"{name} is not a GEMM/conv op"


def _precision(name: str, types_raw: msgspec.Raw) -> int:
    """PREC_* of a GEMM/conv op from the dtypes of its two matrix operands (0: unknown/mixed)."""
    if not types_raw:
        return 0
    try:
        types = msgspec.json.decode(types_raw)
    except msgspec.DecodeError:
        return 0
    if not isinstance(types, list):
        return 0
    i, j = _OPERANDS.get(name, (0, 1))
    if j >= len(types):
        return 0
    kinds = set()
    for t in (types[i], types[j]):
        key = str(t).strip().lower().removeprefix("c10::")
        if key in _REDUCED:
            kinds.add(PREC_REDUCED)
        elif key in ("float", "float32"):
            kinds.add(PREC_FP32)
        elif key in ("double", "float64"):
            kinds.add(PREC_FP64)
        else:
            return 0
    return kinds.pop() if len(kinds) == 1 else 0


# --- Loading ---------------------------------------------------------------------------------
_CHUNK_BYTES = 1 << 20  # JSON bytes of traceEvents decoded at a time
_EVENT_GAP_RE = re.compile(rb"}\s*,\s*{")
_EVENTS_DECODER = msgspec.json.Decoder(list[_Event])


def _event_chunks(raw_events: msgspec.Raw) -> list[tuple[int, int]] | None:
    """(start, end) byte ranges of ``traceEvents`` that each hold whole events, or None.

    Ranges are cut at ``}, {`` gaps between array elements; whether a cut really fell between
    two events (and not inside a string or a nested list) is checked when the slice is decoded:
    a cut anywhere else leaves an unbalanced slice that fails to decode.
    """
    view = memoryview(raw_events)
    n = len(view)
    lo, hi = 0, n
    while lo < hi and view[lo] in b" \t\r\n":
        lo += 1
    while hi > lo and view[hi - 1] in b" \t\r\n":
        hi -= 1
    if hi - lo < 2 or view[lo] != ord("[") or view[hi - 1] != ord("]"):
        return None
    lo, hi = lo + 1, hi - 1
    ranges = []
    pos = lo
    while pos < hi:
        target = pos + _CHUNK_BYTES
        m = _EVENT_GAP_RE.search(view, target, hi) if target < hi else None
        if m is None:
            ranges.append((pos, hi))
            break
        ranges.append((pos, m.start() + 1))
        pos = m.end() - 1
    return ranges


_READ_BYTES = 1 << 20  # file bytes (decompressed) read at a time by the streaming path
_EVENTS_KEY_RE = re.compile(rb'"traceEvents"\s*:\s*\[')


def _stream_events(stream: IO[bytes]) -> tuple[_Reducer, msgspec.Raw, msgspec.Raw] | None:
    """Reduce ``traceEvents`` while reading ``stream``; None when the layout is not recognised.

    The head (up to ``"traceEvents": [``) is checked to be the start of a top-level object by
    decoding it closed as ``...[]}``; events are then decoded in slices of about 1 MB cut at
    ``}, {`` gaps (a cut inside a string or nested value makes the slice fail to decode), and the
    rest of the file, which holds the last events and the keys after the list, is decoded as a
    document of its own. Neither the whole file nor all decoded events are held at once.
    """
    buf = b""
    while True:
        block = stream.read(_READ_BYTES)
        if not block:
            return None
        searched = max(0, len(buf) - 32)
        buf += block
        m = _EVENTS_KEY_RE.search(buf, searched)
        if m is not None:
            break
    head = msgspec.json.decode(buf[: m.end()] + b"]}", type=_TraceOutline)
    rest = buf[m.end() :]
    del buf
    red = _Reducer()
    while True:
        block = stream.read(_READ_BYTES)
        if block:
            rest = b"".join((rest, block)) if rest else block
        pos = 0
        with memoryview(rest) as view:
            while len(rest) - pos > _CHUNK_BYTES:
                gap = _EVENT_GAP_RE.search(rest, pos + _CHUNK_BYTES)
                if gap is None:
                    break
                # One copy per slice: the join reads the bytes through the view (slicing a
                # bytearray and joining copied each slice twice, in fresh pages each time).
                red.feed(
                    _EVENTS_DECODER.decode(b"".join((b"[", view[pos : gap.start() + 1], b"]")))
                )
                pos = gap.end() - 1
        if pos:
            rest = rest[pos:]
        if not block:
            break
    tail = msgspec.json.decode(b"".join((b'{"traceEvents": [', rest)), type=_Trace)
    del rest
    red.feed(tail.traceEvents or [])
    dist = tail.distributedInfo if len(tail.distributedInfo) else head.distributedInfo
    props = tail.deviceProperties if len(tail.deviceProperties) else head.deviceProperties
    return red, dist, props


def _load_streaming(p: Path) -> RankTrace | None:
    """``load_trace`` reading the file in pieces; None where the in-memory path must decide."""
    try:
        f = open(p, "rb")  # noqa: SIM115 - closed below, the gzip reader wraps it
    except OSError:
        return None
    with f:
        try:
            gzipped = f.read(2) == b"\x1f\x8b"
            stream = cast(IO[bytes], gzip.GzipFile(fileobj=f) if gzipped else f)
            f.seek(0)
            got = _stream_events(stream)
        except (OSError, EOFError, zlib.error, msgspec.ValidationError, msgspec.DecodeError):
            return None
    if got is None:
        return None
    red, dist_raw, props_raw = got
    return red.finish(p, _dist_info(dist_raw), _device_props(props_raw))


def load_trace(path: str | Path) -> RankTrace:
    """Read, decode and reduce one rank's trace; raise :class:`TraceError` on bad input.

    The file is read and decoded in pieces (``_stream_events``), so neither the whole file nor
    all its decoded events are in memory at once. Where that does not apply (a layout it does
    not recognise, or bad input, whose precise error the whole-document decode gives), the file
    is decompressed into memory once; ``traceEvents`` is then decoded about 1 MB of JSON at a
    time, and each slice is reduced and dropped before the next is decoded.
    """
    p = Path(path)
    with _gc_paused():
        return _load(p)


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a trace is reduced.

    Reducing allocates ~10^5 container objects (event tuples, launch records) that all stay
    alive until the end, so the collector's passes over them would find nothing to free; they
    cost ~5-10 % of the load time. Nothing reduced here forms a cycle that needs the collector.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _load(p: Path) -> RankTrace:
    streamed = _load_streaming(p)
    if streamed is not None:
        return streamed
    raw = _read_bytes(p)
    outline: _TraceOutline | None
    try:
        outline = msgspec.json.decode(raw, type=_TraceOutline)
    except (msgspec.ValidationError, msgspec.DecodeError):
        outline = None  # the full decode below gives the precise error
    ranges = _event_chunks(outline.traceEvents) if outline is not None else None
    red: _Reducer | None = None
    if outline is not None and ranges is not None:
        red = _Reducer()
        view = memoryview(outline.traceEvents)
        try:
            for a, b in ranges:
                red.feed(_EVENTS_DECODER.decode(b"".join((b"[", view[a:b], b"]"))))
        except (msgspec.ValidationError, msgspec.DecodeError):
            red = None  # a cut fell inside an event or an event is malformed: decode it whole
        del view
    if red is None:
        trace = _decode(p, raw)
        if trace.traceEvents is None:
            raise TraceError(
                f"{p}: JSON has no 'traceEvents' list, so it is not a Kineto/Chrome trace; "
                "pass a torch.profiler trace file"
            )
        red = _Reducer()
        red.feed(trace.traceEvents)
        dist_raw, props_raw = trace.distributedInfo, trace.deviceProperties
        del trace
    else:
        assert outline is not None
        dist_raw, props_raw = outline.distributedInfo, outline.deviceProperties
    dist = _dist_info(dist_raw)
    props = _device_props(props_raw)
    del outline, dist_raw, props_raw, raw
    return red.finish(p, dist, props)


# What :meth:`_Reducer.feed` does with an event, decided once per distinct ``cat`` (a device
# category maps to its KIND_*, 0..3) and, for CPU events, once per distinct name (_N_* bits).
_CAT_LAUNCH, _CAT_SKIP, _CAT_CPU = 4, 5, 6
_N_STEP, _N_DATALOADER, _N_CPU_COMM, _N_FLOP_OP, _N_PARAM_COMMS = 1, 2, 4, 8, 16


def _cat_code(raw_cat: str | None) -> int:
    cat = raw_cat.lower() if raw_cat else ""
    kind = _DEVICE_CATS.get(cat)
    if kind is not None:
        return kind
    if cat in _LAUNCH_CATS:
        return _CAT_LAUNCH
    if cat in ("trace", "gpu_user_annotation"):
        return _CAT_SKIP
    return _CAT_CPU


def _name_flags(name: str) -> int:
    if name.startswith("ProfilerStep#"):
        return _N_STEP
    flags = 0
    if name.startswith("enumerate(DataLoader)#"):
        flags |= _N_DATALOADER
    if name.startswith(_CPU_COMM_PREFIXES):
        flags |= _N_CPU_COMM
    if name in _FLOP_OPS:
        flags |= _N_FLOP_OP
    elif name == "record_param_comms":
        flags |= _N_PARAM_COMMS
    return flags


class _Reducer:
    """Reduces decoded events, one slice at a time, to the columns :class:`RankTrace` holds."""

    def __init__(self) -> None:
        self.base: float | None = None
        self.dev_start: list[float] = []
        self.dev_end: list[float] = []
        self.dev_kind: list[int] = []
        self.dev_corr: list[int] = []
        self.dev_name: list[int] = []
        self.dev_ext: list[int] = []
        self.name_index: dict[str, int] = {}
        self.kind_of_name: dict[str, int] = {}  # kernel name -> KIND_COMPUTE / KIND_COMM
        self.comm_args: dict[int, CommArgs] = {}
        # Runtime/driver calls by correlation id: launch timestamp and thread (two dicts of
        # untracked values rather than one of tuples: no garbage-collector work per launch).
        self.launch_ts: dict[int, float] = {}
        self.launch_tid: dict[int, str] = {}
        self.steps: list[Step] = []
        self.dl_s: list[float] = []
        self.dl_e: list[float] = []
        self.param_comms: list[tuple[str, float, float, CommArgs]] = []
        self.cpu_comm_ops: list[CpuCommOp] = []
        self.cpu_events: list[tuple[float, float, str, str]] = []  # (start, end, tid, name)
        # GEMM/conv ops: (tid, start, end, flops or None, reason)
        self.flop_ops: list[tuple[str, float, float, float | None, str]] = []
        self.gemm_prec: dict[int, int] = {}  # External id -> PREC_* of GEMM/conv ops
        self.flops_total = 0.0
        self.flops_ops = 0
        self.skipped = 0
        self.complete = 0
        self.n_events = 0
        self.tid_str: dict[object, str] = {}
        self.cat_code: dict[str | None, int] = {}  # raw ``cat`` -> KIND_* or _CAT_*
        self.name_flags: dict[str, int] = {}  # CPU event name -> _N_* bits

    def feed(self, events: list[_Event]) -> None:
        self.n_events += len(events)
        if self.base is None:
            for ev in events:
                if ev.ph == "X" and ev.ts is not None and math.isfinite(ev.ts):
                    self.base = float(ev.ts)
                    break
        base = self.base if self.base is not None else 0.0
        cat_code = self.cat_code
        name_flags = self.name_flags
        kind_of_name = self.kind_of_name
        name_index = self.name_index
        tid_str = self.tid_str
        launch_ts, launch_tid = self.launch_ts, self.launch_tid
        dev_start, dev_end, dev_kind = self.dev_start, self.dev_end, self.dev_kind
        dev_corr, dev_name, dev_ext = self.dev_corr, self.dev_name, self.dev_ext
        cpu_events = self.cpu_events
        isfinite = math.isfinite
        complete = skipped = 0  # written back to self after the loop
        for ev in events:
            if ev.ph != "X":
                continue
            raw_cat = ev.cat
            code = cat_code.get(raw_cat)
            if code is None:
                code = cat_code[raw_cat] = _cat_code(raw_cat)
            ts = ev.ts
            dur = ev.dur
            valid = (
                ts is not None
                and dur is not None
                and dur >= 0.0  # a float literal: int-vs-float comparison is the slow path
                and isfinite(ts)
                and isfinite(dur)
            )
            if code < _CAT_LAUNCH:  # a device event: code is its KIND_*
                if not valid:
                    skipped += 1
                    continue
                complete += 1
                name = ev.name or ""
                start = ts - base  # type: ignore[operator]
                row = len(dev_start)
                dev_start.append(start)
                dev_end.append(start + dur)  # type: ignore[operator]
                args = ev.args
                corr = args.correlation if args is not None else None
                if type(corr) is not int:
                    corr = _as_int(corr)
                dev_corr.append(-1 if corr is None else corr)
                if code == KIND_COMPUTE:
                    kind = kind_of_name.get(name, -1)
                    if kind < 0:
                        kind = KIND_COMM if COMM_KERNEL_RE.search(name) else KIND_COMPUTE
                        kind_of_name[name] = kind
                        name_index[name] = len(name_index)
                    dev_name.append(name_index[name])
                    ext = args.external_id if args is not None else None
                    if type(ext) is not int:
                        ext = _as_int(ext)
                    dev_ext.append(-1 if ext is None else ext)
                    if kind == KIND_COMM and args is not None:
                        ca = _comm_args(args)
                        if ca is not None:
                            self.comm_args[row] = ca
                    dev_kind.append(kind)
                else:
                    dev_name.append(-1)
                    dev_ext.append(-1)
                    dev_kind.append(code)
                continue
            if not valid:
                continue
            complete += 1
            if code == _CAT_SKIP:
                # The profiler's own span is not activity, and GPU-side annotations (which repeat
                # ProfilerStep#N names on the device timeline) are not CPU events.
                continue
            ts = ts - base  # type: ignore[operator]
            raw_tid = ev.tid
            if type(raw_tid) is str:
                tid = raw_tid
            else:
                tid = tid_str.get(raw_tid)  # type: ignore[assignment]
                if tid is None:
                    tid = tid_str[raw_tid] = _as_str(raw_tid) or ""
            if code == _CAT_LAUNCH:
                args = ev.args
                if args is not None:
                    corr = args.correlation
                    if type(corr) is not int:
                        corr = _as_int(corr)
                    if corr is not None:
                        launch_ts[corr] = ts
                        launch_tid[corr] = tid
                continue
            end = ts + dur  # type: ignore[operator]
            name = ev.name or ""
            flags = name_flags.get(name)
            if flags is None:
                flags = name_flags[name] = _name_flags(name)
            args = ev.args
            if not flags:  # the common case: an op with no special meaning
                if args is not None and args.flops is not None:
                    self._add_flops(args.flops)
                cpu_events.append((ts, end, tid, name))
                continue
            if flags & _N_STEP:
                num = _step_number(name)
                if num is not None:
                    self.steps.append(Step(num, ts, end, tid))
                continue
            if flags & _N_DATALOADER:
                self.dl_s.append(ts)
                self.dl_e.append(end)
            if args is None:
                if flags & _N_CPU_COMM:
                    self.cpu_comm_ops.append(CpuCommOp(name, ts, end, tid, None))
                cpu_events.append((ts, end, tid, name))
                continue
            if args.flops is not None:
                self._add_flops(args.flops)
            if flags & _N_FLOP_OP:
                est, why = estimate_flops(name, args.input_dims, args.concrete)
                self.flop_ops.append((tid, ts, end, est, why))
                ext = _as_int(args.external_id)
                if ext is not None:
                    prec = _precision(name, args.input_type)
                    if prec:
                        self.gemm_prec[ext] = prec
            elif flags & _N_PARAM_COMMS:
                ca = _comm_args(args)
                if ca is not None:
                    self.param_comms.append((tid, ts, end, ca))
            if flags & _N_CPU_COMM:
                self.cpu_comm_ops.append(CpuCommOp(name, ts, end, tid, _input_bytes(args)))
            cpu_events.append((ts, end, tid, name))
        self.complete += complete
        self.skipped += skipped

    def _add_flops(self, flops: Num) -> None:
        fl = _finite(flops)
        if fl is not None and fl >= 0:
            self.flops_total += fl
            self.flops_ops += 1

    def finish(self, p: Path, dist: _DistInfo | None, props: list[dict[str, object]]) -> RankTrace:
        if self.complete == 0:
            raise TraceError(
                f"{p}: trace has no complete ('ph': 'X') events with a timestamp and duration; "
                "profile at least one active step"
            )
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

        steps = sorted(self.steps, key=lambda s: s.start)
        cpu_events = self.cpu_events
        main_tid = _main_thread(steps, cpu_events)
        main_s: list[float] = []
        main_e: list[float] = []
        cpu_window_all = None
        if not self.dev_start and cpu_events:
            # Only CPU-only traces use the main-thread compute events and the whole-trace window.
            for start, end, tid, name in cpu_events:
                if tid == main_tid and not _is_comm_name(name):
                    main_s.append(start)
                    main_e.append(end)
            cpu_window_all = (min(c[0] for c in cpu_events), max(c[1] for c in cpu_events))
        if steps and not self.dev_start:
            lo = min(s.start for s in steps)
            hi = max(s.end for s in steps)
            cpu_window_all = (
                (min(lo, cpu_window_all[0]), max(hi, cpu_window_all[1]))
                if cpu_window_all
                else (lo, hi)
            )
        self.cpu_events = []

        est_total, est_ops, est_skipped = _leaf_flops(self.flop_ops)
        if self.flops_ops:
            flops_total: float | None = self.flops_total
            flops_ops, flops_source = self.flops_ops, "trace args.flops"
        elif est_ops:
            flops_total, flops_ops, flops_source = est_total, est_ops, FLOPS_ESTIMATED
        else:
            flops_total, flops_ops, flops_source = None, 0, None

        corr_sorted = sorted(self.launch_ts)
        return RankTrace(
            path=p,
            rank=rank,
            rank_source=rank_source,
            world_size=_as_int(dist.world_size) if dist else None,
            backend=_as_str(dist.backend) if dist else None,
            pg_sizes=pg_sizes,
            device_properties=props,
            n_events=self.n_events,
            skipped_device_events=self.skipped,
            dev_start=np.asarray(self.dev_start, dtype=np.float64),
            dev_end=np.asarray(self.dev_end, dtype=np.float64),
            dev_kind=np.asarray(self.dev_kind, dtype=np.int8),
            dev_corr=np.asarray(self.dev_corr, dtype=np.int64),
            dev_name=np.asarray(self.dev_name, dtype=np.int32),
            kernel_names=list(self.name_index),
            comm_args=self.comm_args,
            launch_corr=np.asarray(corr_sorted, dtype=np.int64),
            launch_ts=np.fromiter(
                map(self.launch_ts.__getitem__, corr_sorted),
                dtype=np.float64,
                count=len(corr_sorted),
            ),
            launch_tid=list(map(self.launch_tid.__getitem__, corr_sorted)),
            steps=steps,
            dataloader=(
                np.asarray(self.dl_s, dtype=np.float64),
                np.asarray(self.dl_e, dtype=np.float64),
            ),
            param_comms=self.param_comms,
            cpu_comm_ops=self.cpu_comm_ops,
            main_tid=main_tid,
            main_thread=(
                np.asarray(main_s, dtype=np.float64),
                np.asarray(main_e, dtype=np.float64),
            ),
            cpu_window_all=cpu_window_all,
            flops_total=flops_total,
            flops_ops=flops_ops,
            time_base_us=self.base if self.base is not None else 0.0,
            dev_ext=np.asarray(self.dev_ext, dtype=np.int64),
            gemm_precision=self.gemm_prec,
            flops_source=flops_source,
            flops_estimate_skipped=est_skipped,
        )


FLOPS_ESTIMATED = "estimated from Input Dims (GEMM/conv only)"


def _leaf_flops(
    ops: list[tuple[str, float, float, float | None, str]],
) -> tuple[float, int, dict[str, int]]:
    """Σ FLOPs of the innermost GEMM/conv ops whose FLOPs are known, and skipped-op reasons.

    Ops of one thread nest (aten::linear > aten::addmm, aten::convolution > aten::_convolution >
    aten::cudnn_convolution); an op counts when it has a FLOP estimate and no op inside it has
    one, so every GEMM/conv is counted once, at the deepest level its shapes allow.
    """
    acc = [0.0, 0.0]  # total FLOPs, ops counted
    skipped: dict[str, int] = {}
    by_tid: dict[str, list[tuple[float, float, float | None, str]]] = {}
    for tid, s, e, fl, why in ops:
        by_tid.setdefault(tid, []).append((s, e, fl, why))
    for items in by_tid.values():
        items.sort(key=lambda t: (t[0], -t[1]))
        stack: list[_OpNode] = []
        for s, e, fl, why in items:
            while stack and s >= stack[-1].end:
                _close(stack, acc, skipped)
            stack.append(_OpNode(e, fl, why))
        while stack:
            _close(stack, acc, skipped)
    return acc[0], int(acc[1]), skipped


@dataclass
class _OpNode:
    end: float
    flops: float | None
    reason: str
    inner_known: bool = False  # some op nested inside has a FLOP estimate
    has_inner: bool = False  # some GEMM/conv op is nested inside


def _close(stack: list[_OpNode], acc: list[float], skipped: dict[str, int]) -> None:
    node = stack.pop()
    if not node.inner_known:
        if node.flops is not None:
            acc[0] += node.flops
            acc[1] += 1
        elif not node.has_inner:
            skipped[node.reason] = skipped.get(node.reason, 0) + 1
    if stack:
        stack[-1].has_inner = True
        if node.inner_known or node.flops is not None:
            stack[-1].inner_known = True


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
