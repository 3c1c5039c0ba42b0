"""Top kernels, tensor-core vs FP32-GEMM kernel time, and achieved FLOP/s.

Kernel classes come from kernel *names* only, so the lists are conservative: a kernel is called
tensor-core only when its name says so, FP32 GEMM only when its name says so, and everything else
is "other" (including ROCm Tensile ``Cijk_*`` kernels, whose MFMA use depends on type codes that
mgprof does not decode).

Tensor-core name patterns (case-insensitive): ``hmma``, ``wgmma``, ``mma_sync``, ``tensorop``
(CUTLASS), the cuBLAS/cuDNN instruction-shape tags ``h884``, ``h1688``, ``h16816``, ``s884``,
``s1688``, ``s16816``, ``i8816``, ``i16832``, ``f16816``, and ``xmma``/``gemm`` names that also
carry a reduced-precision type (``f16``, ``fp16``, ``bf16``, ``tf32``, ``e4m3``, ``e5m2``,
``int8``).
FP32 GEMM patterns: ``sgemm`` (``ampere_sgemm_*``, ``volta_sgemm_*``, CUTLASS ``simt_sgemm``),
``gemmSN``, ``gemmk1``, ``gemv2T``/``gemv2N``, ``gemvx``, and ``gemm`` names with ``f32f32`` or
``simt``.
"""

from __future__ import annotations

import re

import msgspec
import numpy as np

from mgprof.analyze.trace_load import KIND_COMPUTE, RankTrace

__all__ = [
    "FlopFacts",
    "KernelStat",
    "TensorCoreFacts",
    "classify_kernel",
    "flop_facts",
    "top_kernels",
]

_TC_RE = re.compile(
    r"hmma|wgmma|mma_sync|tensorop|h884|h1688|h16816|s884|s1688|s16816|i8816|i16832|f16816"
    r"|(?:xmma|gemm).*(?:f16|fp16|bf16|tf32|e4m3|e5m2|int8)"
    r"|(?:f16|fp16|bf16|tf32|e4m3|e5m2|int8).*(?:xmma|gemm)",
    re.IGNORECASE,
)
_FP32_RE = re.compile(
    r"sgemm|gemmsn|gemmk1|gemv2t|gemv2n|gemvx|gemm.*(?:f32f32|simt)|(?:f32f32|simt).*gemm",
    re.IGNORECASE,
)


def classify_kernel(name: str) -> str:
    """``tensor_core``, ``fp32_gemm`` or ``other`` (see the module docstring for the lists)."""
    if _TC_RE.search(name):
        return "tensor_core"
    if _FP32_RE.search(name):
        return "fp32_gemm"
    return "other"


class KernelStat(msgspec.Struct):
    """One compute kernel name: calls, summed time, and share of summed compute-kernel time."""

    name: str
    count: int
    total_us: float
    pct_of_compute: float
    kind: str


class TensorCoreFacts(msgspec.Struct):
    """Summed kernel time by class; percentages are of summed compute-kernel time."""

    tensor_core_us: float
    fp32_gemm_us: float
    tensor_core_kernels: int
    fp32_gemm_kernels: int
    tensor_core_pct: float | None
    fp32_gemm_pct: float | None


class FlopFacts(msgspec.Struct):
    """FLOPs that torch.profiler(with_flops=True) put on CPU ops, over the trace window."""

    total_flops: float | None
    ops_with_flops: int
    achieved_tflops: float | None


def _per_name(rt: RankTrace) -> tuple[np.ndarray, np.ndarray]:
    rows = rt.dev_kind == KIND_COMPUTE
    names = rt.dev_name[rows]
    durs = rt.dev_end[rows] - rt.dev_start[rows]
    n = len(rt.kernel_names)
    counts = np.bincount(names, minlength=n)
    totals = np.bincount(names, weights=durs, minlength=n)
    return counts, totals


def top_kernels(rt: RankTrace, top: int) -> tuple[list[KernelStat], TensorCoreFacts]:
    """The ``top`` compute kernels by summed duration, and the tensor-core facts."""
    if not rt.kernel_names:
        return [], TensorCoreFacts(0.0, 0.0, 0, 0, None, None)
    counts, totals = _per_name(rt)
    all_us = float(totals.sum())
    tc_us = fp_us = 0.0
    tc_n = fp_n = 0
    kinds = []
    for i, name in enumerate(rt.kernel_names):
        kind = classify_kernel(name)
        kinds.append(kind)
        if counts[i] == 0:
            continue
        if kind == "tensor_core":
            tc_us += float(totals[i])
            tc_n += 1
        elif kind == "fp32_gemm":
            fp_us += float(totals[i])
            fp_n += 1
    order = [int(i) for i in np.argsort(-totals, kind="stable") if counts[i] > 0][: max(top, 0)]
    stats = [
        KernelStat(
            name=rt.kernel_names[i],
            count=int(counts[i]),
            total_us=float(totals[i]),
            pct_of_compute=100.0 * float(totals[i]) / all_us if all_us > 0 else 0.0,
            kind=kinds[i],
        )
        for i in order
    ]
    facts = TensorCoreFacts(
        tensor_core_us=tc_us,
        fp32_gemm_us=fp_us,
        tensor_core_kernels=tc_n,
        fp32_gemm_kernels=fp_n,
        tensor_core_pct=100.0 * tc_us / all_us if all_us > 0 else None,
        fp32_gemm_pct=100.0 * fp_us / all_us if all_us > 0 else None,
    )
    return stats, facts


def flop_facts(rt: RankTrace, window_us: float | None) -> FlopFacts:
    """Achieved TFLOP/s = Σ args.flops of CPU ops / window; None when no op carries flops."""
    if rt.flops_total is None:
        return FlopFacts(None, 0, None)
    tflops = None
    if window_us and window_us > 0:
        tflops = rt.flops_total / (window_us * 1e-6) / 1e12
    return FlopFacts(rt.flops_total, rt.flops_ops, tflops)
