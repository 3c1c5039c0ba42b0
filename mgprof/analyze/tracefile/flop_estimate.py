"""FLOPs and operand precision of GEMM/conv ops, estimated from the op shapes a trace records."""

from __future__ import annotations

import math
from dataclasses import dataclass

import msgspec

__all__ = [
    "FLOPS_ESTIMATED",
    "PREC_FP32",
    "PREC_FP64",
    "PREC_REDUCED",
    "GemmPrecisionFacts",
    "estimate_flops",
    "gemm_precision_facts",
    "leaf_gemm_time",
]

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


_PREC_KEYS = {PREC_REDUCED: "reduced", PREC_FP32: "fp32", PREC_FP64: "fp64"}


def leaf_gemm_time(ops: list[tuple[str, float, float, int]]) -> dict[str, float]:
    """Host µs of the innermost GEMM/conv ops by operand precision: ``reduced`` (bf16, fp16,
    fp8, int8), ``fp32``, ``fp64``, ``unknown`` (mixed or unrecorded types).

    The innermost op is the one that computes (``aten::linear`` > ``aten::addmm``: autocast
    casts the operands on the way in, so the outer op still shows float32 inputs). On a CPU
    trace its host time is the compute; on a GPU trace it is the launch cost, and
    ``tensor_cores`` says where the kernels ran.
    """
    out: dict[str, float] = {}
    by_tid: dict[str, list[tuple[float, float, int]]] = {}
    for tid, s, e, prec in ops:
        by_tid.setdefault(tid, []).append((s, e, prec))
    for items in by_tid.values():
        items.sort(key=lambda t: (t[0], -t[1]))
        for k, (s, e, prec) in enumerate(items):
            nxt = items[k + 1] if k + 1 < len(items) else None
            if nxt is not None and nxt[0] < e:
                continue  # a GEMM op starts inside this one: this one is not the innermost
            key = _PREC_KEYS.get(prec, "unknown")
            out[key] = out.get(key, 0.0) + max(e - s, 0.0)
    return out


class GemmPrecisionFacts(msgspec.Struct):
    """Where the innermost GEMM/conv ops' host time went by operand precision (µs, and % of
    their time): the evidence that a precision setting reached the matrix multiplies."""

    reduced_us: float
    fp32_us: float
    fp64_us: float
    unknown_us: float
    reduced_pct: float | None
    fp32_pct: float | None


def gemm_precision_facts(us: dict[str, float]) -> GemmPrecisionFacts | None:
    """None when the trace has no GEMM/conv op."""
    total = sum(us.values())
    if total <= 0:
        return None

    def pct(key: str) -> float:
        return 100.0 * us.get(key, 0.0) / total

    return GemmPrecisionFacts(
        reduced_us=us.get("reduced", 0.0),
        fp32_us=us.get("fp32", 0.0),
        fp64_us=us.get("fp64", 0.0),
        unknown_us=us.get("unknown", 0.0),
        reduced_pct=pct("reduced"),
        fp32_pct=pct("fp32"),
    )
