"""The few Kineto trace fields mgprof decodes (msgspec Structs) and the coercion of raw values."""

from __future__ import annotations

import math
import re

import msgspec

from mgprof.analyze.tracefile.rank_trace import CommArgs

__all__ = ["dtype_bytes"]

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
    external_id_lower: Num = msgspec.field(default=None, name="external id")
    """Older Kineto writes the device side's link to its CPU op in lower case."""


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


_INT64 = 1 << 63
_INT_TEXT = re.compile(r"\s*-?[0-9]{1,19}\s*")


def _as_int(v: object) -> int | None:
    """An integer within int64 from an int, an integral float or a decimal string; else None.

    Values beyond 64 bits are no id, rank or count a profiler writes: they are treated as
    missing, so that no array conversion or arithmetic on them can overflow.
    """
    n: int | None = None
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        n = v
    elif isinstance(v, float):
        n = int(v) if math.isfinite(v) and v.is_integer() else None
    elif isinstance(v, str):
        n = int(v) if _INT_TEXT.fullmatch(v) else None
    return n if n is not None and -_INT64 <= n < _INT64 else None


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
        if total >= _INT64:
            return None  # no tensor is this large: hostile Input Dims
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
    try:
        f = float(v)
    except OverflowError:  # an int too large for a float
        return None
    return f if math.isfinite(f) else None
