"""Top kernels, tensor-core vs FP32-GEMM kernel time, and achieved FLOP/s.

Each kernel launch is classified from its launching op first, then from its name. When the
kernel's ``External id`` names a GEMM/conv CPU op (``aten::mm``, ``addmm``, ``bmm``, ``baddbmm``,
``_scaled_mm``, ``_int_mm``, ``matmul``, ``linear``, convolutions) whose two matrix operands'
``Input type`` (record_shapes=True) are both half/bf16/fp8/int8, the launch is tensor-core; when
both are float32 it is FP32 GEMM unless its name matches the tensor-core list (TF32 enabled).
ATen helper kernels (``at::native::``) launched by such ops, launches without a GEMM op, and
float64 or mixed operands fall back to the name lists, which are conservative: a kernel is called
tensor-core only when its name says so, FP32 GEMM only when its name says so, and everything else
is "other" (including ROCm Tensile ``Cijk_*`` kernels, whose MFMA use depends on type codes that
mgprof does not decode).

Tensor-core name patterns (case-insensitive): ``hmma``, ``wgmma``, ``gmma``, ``mma_sync``,
``tensorop`` (CUTLASS), ``nvjet`` (cuBLASLt's Hopper/Blackwell tensor-core GEMMs, e.g.
``nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_NTN``), the cuBLAS/cuDNN instruction-shape tags
``h884``, ``h1688``, ``h16816``, ``s884``, ``s1688``, ``s16816``, ``i8816``, ``i16832``, ``f16816``,
and ``xmma``/``gemm`` names that also carry a reduced-precision type (``f16``, ``fp16``, ``bf16``,
``tf32``, ``e4m3``, ``e5m2``, ``int8``). FP32 GEMM patterns: ``sgemm`` (``ampere_sgemm_*``,
``volta_sgemm_*``, CUTLASS ``simt_sgemm``), ``gemmSN``, ``gemmk1``, ``gemv2T``/``gemv2N``,
``gemvx``, and ``gemm`` names with ``f32f32`` or ``simt``.
"""

from __future__ import annotations

import re

import msgspec
import numpy as np

from mgprof.analyze.tracefile.load import (
    KIND_COMPUTE,
    PREC_FP32,
    PREC_REDUCED,
    RankTrace,
)

__all__ = [
    "KERNELS_LIMIT",
    "FlopFacts",
    "KernelStat",
    "KernelsDropped",
    "TensorCoreFacts",
    "classify_kernel",
    "flop_facts",
    "kernel_table",
    "top_kernels",
]

KERNELS_LIMIT = 200
"""Kernel names kept in the summary's ``kernels`` list (the report's Kernels view)."""

_TC_RE = re.compile(
    r"hmma|gmma|mma_sync|tensorop|nvjet|h884|h1688|h16816|s884|s1688|s16816|i8816|i16832|f16816"
    r"|(?:xmma|gemm).*(?:f16|fp16|bf16|tf32|e4m3|e5m2|int8)"
    r"|(?:f16|fp16|bf16|tf32|e4m3|e5m2|int8).*(?:xmma|gemm)",
    re.IGNORECASE,
)
_FP32_RE = re.compile(
    r"sgemm|gemmsn|gemmk1|gemv2t|gemv2n|gemvx|gemm.*(?:f32f32|simt)|(?:f32f32|simt).*gemm",
    re.IGNORECASE,
)


_TC_TAGS = (
    "hmma", "gmma", "mma_sync", "tensorop", "nvjet", "h884", "h1688", "h16816", "s884", "s1688",
    "s16816", "i8816", "i16832", "f16816",
)  # fmt: skip
_TC_TYPES = ("f16", "fp16", "bf16", "tf32", "e4m3", "e5m2", "int8")
_FP32_TAGS = ("sgemm", "gemmsn", "gemmk1", "gemv2t", "gemv2n", "gemvx")


def classify_kernel(name: str) -> str:
    """``tensor_core``, ``fp32_gemm`` or ``other`` (see the module docstring for the lists).

    An ASCII name is matched by substrings of its lower case, which is what the regular
    expressions say (their ``gemm.*f16 | f16.*gemm`` halves ask for both words in either order,
    and no two of the words can overlap) at a fraction of their cost on long C++ names; other
    names go through the expressions, whose case-insensitive matching folds non-ASCII letters.
    """
    if not name.isascii():
        if _TC_RE.search(name):
            return "tensor_core"
        return "fp32_gemm" if _FP32_RE.search(name) else "other"
    low = name.lower()
    gemm = "gemm" in low
    if any(t in low for t in _TC_TAGS) or (
        (gemm or "xmma" in low) and any(t in low for t in _TC_TYPES)
    ):
        return "tensor_core"
    if any(t in low for t in _FP32_TAGS) or (gemm and ("f32f32" in low or "simt" in low)):
        return "fp32_gemm"
    return "other"


class KernelStat(msgspec.Struct):
    """One compute kernel name: calls, summed time, share of summed compute-kernel time, and
    mean/min/max duration per launch (the TensorBoard plugin's kernel view)."""

    name: str
    count: int
    total_us: float
    pct_of_compute: float
    kind: str
    """The class holding most of the name's time: tensor_core, fp32_gemm or other."""
    mean_us: float | None = None
    min_us: float | None = None
    max_us: float | None = None
    calls: int = 0
    """Launches (the same number as ``count``, under the name the Kernels view uses)."""
    tensor_core: bool = False
    """``kind == "tensor_core"``."""


class KernelsDropped(msgspec.Struct):
    """The compute kernels a bounded list left out."""

    names: int
    calls: int
    total_us: float


class TensorCoreFacts(msgspec.Struct):
    """Summed kernel time by class; percentages are of summed compute-kernel time."""

    tensor_core_us: float
    fp32_gemm_us: float
    tensor_core_kernels: int
    """Launches classified tensor-core (each launch counts, not each distinct name)."""
    fp32_gemm_kernels: int
    """Launches classified FP32 GEMM."""
    tensor_core_pct: float | None
    fp32_gemm_pct: float | None
    launches_by_op_dtype: int = 0  # launches classified from their GEMM op's Input type


class FlopFacts(msgspec.Struct):
    """FLOPs of the rank's CPU ops over the trace window (see ``flops_source``)."""

    total_flops: float | None
    ops_with_flops: int
    achieved_tflops: float | None
    flops_source: str | None = None
    estimate_skipped: dict[str, int] = msgspec.field(default_factory=dict)


_OTHER, _TC, _FP32 = 0, 1, 2
_CODES = {"other": _OTHER, "tensor_core": _TC, "fp32_gemm": _FP32}
_KINDS = ["other", "tensor_core", "fp32_gemm"]


def _launch_classes(rt: RankTrace, rows: np.ndarray) -> tuple[np.ndarray, int]:
    """Class code of each compute-kernel launch ``rows`` (see the module docstring)."""
    names = rt.dev_name[rows]
    by_name = np.asarray([_CODES[classify_kernel(n)] for n in rt.kernel_names], dtype=np.int8)
    cls = by_name[names]
    if not rt.gemm_precision or rt.dev_ext.size != rt.dev_start.size:
        return cls, 0
    ids = np.fromiter(rt.gemm_precision, dtype=np.int64, count=len(rt.gemm_precision))
    precs = np.fromiter(rt.gemm_precision.values(), dtype=np.int8, count=len(ids))
    order = np.argsort(ids)
    ids, precs = ids[order], precs[order]
    ext = rt.dev_ext[rows]
    pos = np.clip(np.searchsorted(ids, ext), 0, ids.size - 1)
    prec = np.where(ids[pos] == ext, precs[pos], 0)
    helper = np.asarray(["at::native::" in n for n in rt.kernel_names], dtype=bool)[names]
    reduced = (prec == PREC_REDUCED) & ~helper
    fp32 = (prec == PREC_FP32) & ~helper & (cls != _TC)
    cls = np.where(reduced, _TC, np.where(fp32, _FP32, cls)).astype(np.int8)
    return cls, int(reduced.sum() + ((prec == PREC_FP32) & ~helper).sum())


def top_kernels(rt: RankTrace, top: int) -> tuple[list[KernelStat], TensorCoreFacts]:
    """The ``top`` compute kernels by summed duration, and the tensor-core facts."""
    stats, facts, _ = kernel_table(rt, top)
    return stats, facts


def kernel_table(
    rt: RankTrace, limit: int
) -> tuple[list[KernelStat], TensorCoreFacts, KernelsDropped]:
    """The ``limit`` compute kernels with the most summed time, the tensor-core facts, and what
    the list left out."""
    if not rt.kernel_names:
        return [], TensorCoreFacts(0.0, 0.0, 0, 0, None, None), KernelsDropped(0, 0, 0.0)
    rows = np.flatnonzero(rt.dev_kind == KIND_COMPUTE)
    names = rt.dev_name[rows]
    durs = rt.dev_end[rows] - rt.dev_start[rows]
    n = len(rt.kernel_names)
    cls, by_op = _launch_classes(rt, rows)
    counts = np.bincount(names, minlength=n)
    totals = np.bincount(names, weights=durs, minlength=n)
    per_cls = np.bincount(names * 3 + cls, weights=durs, minlength=3 * n).reshape(n, 3)
    hits = np.bincount(names * 3 + cls, minlength=3 * n).reshape(n, 3)
    lows = np.full(n, np.inf)
    highs = np.full(n, -np.inf)
    np.minimum.at(lows, names, durs)
    np.maximum.at(highs, names, durs)
    all_us = float(totals.sum())
    tc_us = float(per_cls[:, _TC].sum())
    fp_us = float(per_cls[:, _FP32].sum())
    # A name's kind: the class holding most of its time (launches, when all are zero long).
    kind_of = np.where(totals > 0, np.argmax(per_cls, axis=1), np.argmax(hits, axis=1))
    present = [int(i) for i in np.argsort(-totals, kind="stable") if counts[i] > 0]
    order, rest = present[: max(limit, 0)], present[max(limit, 0) :]
    stats = [
        KernelStat(
            name=rt.kernel_names[i],
            count=int(counts[i]),
            total_us=float(totals[i]),
            pct_of_compute=100.0 * float(totals[i]) / all_us if all_us > 0 else 0.0,
            kind=_KINDS[int(kind_of[i])],
            mean_us=float(totals[i]) / int(counts[i]),
            min_us=float(lows[i]),
            max_us=float(highs[i]),
            calls=int(counts[i]),
            tensor_core=int(kind_of[i]) == _TC,
        )
        for i in order
    ]
    dropped = KernelsDropped(
        names=len(rest),
        calls=int(counts[rest].sum()) if rest else 0,
        total_us=float(totals[rest].sum()) if rest else 0.0,
    )
    facts = TensorCoreFacts(
        tensor_core_us=tc_us,
        fp32_gemm_us=fp_us,
        tensor_core_kernels=int(hits[:, _TC].sum()),
        fp32_gemm_kernels=int(hits[:, _FP32].sum()),
        tensor_core_pct=100.0 * tc_us / all_us if all_us > 0 else None,
        fp32_gemm_pct=100.0 * fp_us / all_us if all_us > 0 else None,
        launches_by_op_dtype=by_op,
    )
    return stats, facts, dropped


def flop_facts(rt: RankTrace, window_us: float | None) -> FlopFacts:
    """Achieved TFLOP/s = FLOPs / window; None when the trace gives no FLOPs.

    FLOPs are Σ ``args.flops`` of CPU ops when the trace carries them (older torch), else the
    estimate from ``Input Dims`` of the innermost GEMM/conv ops (``flops_source`` says which).
    """
    skipped = dict(rt.flops_estimate_skipped)
    if rt.flops_total is None:
        return FlopFacts(None, 0, None, None, skipped)
    tflops = None
    if window_us and window_us > 0:
        tflops = rt.flops_total / (window_us * 1e-6) / 1e12
    return FlopFacts(rt.flops_total, rt.flops_ops, tflops, rt.flops_source, skipped)
