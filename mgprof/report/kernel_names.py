"""Kernel names short enough for a table: template arguments and parameter lists elided.

A C++ kernel name as the trace records it (``void at::native::vectorized_elementwise_kernel<4,
at::native::AUnaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float>>,
at::detail::Array<char*, 2>>(int, ...)``) wraps over 10-14 lines of an 80-column table. The short
form keeps what tells such kernels apart: the function's own name and, in ``<…>``, the most
specific name inside its template arguments (``vectorized_elementwise_kernel<…MulFunctor…>``,
``Kernel2<…cutlass_80_simt_sgemm_64x64_8x5_nn_align1…>``), or ``<…>`` alone when they hold only
types and numbers. The parameter list goes. C-style names (``ampere_sgemm_128x64_nn``) pass
unchanged. The full name stays in JSON and in report.html (on hover).
"""

from __future__ import annotations

import re

__all__ = ["short_kernel_name"]

ELLIPSIS = "…"
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_STOP = frozenset(
    [
        "float",
        "double",
        "int",
        "long",
        "char",
        "bool",
        "unsigned",
        "short",
        "signed",
        "half",
        "Half",
        "BFloat16",
        "float2",
        "float4",
        "int2",
        "int4",
        "c10",
        "at",
        "native",
        "detail",
        "std",
        "array",
        "Array",
        "true",
        "false",
        "void",
        "const",
        "operator",
        "lambda",
        "anonymous",
        "namespace",
        "internal",
        "binary_internal",
        "cuda",
        "ul",
        "TensorIteratorBase",
        "TensorIterator",
        "Scalar",
        "ClampLimits",
        "OpaqueType",
    ]
)


def _function_and_args(text: str) -> tuple[str, str]:
    """(qualified function name, its outermost template arguments) of a demangled name."""
    depth = 0
    start = None
    for i, ch in enumerate(text):
        if ch == "<":
            if depth == 0 and start is None:
                start = i
            depth += 1
        elif ch == ">" and depth:
            depth -= 1
            if depth == 0 and start is not None:
                return text[:start], text[start + 1 : i]
        elif ch == "(" and depth == 0:
            return text[:i], ""
    return (text[:start], text[start + 1 :]) if start is not None else (text, "")


def _most_specific(args: str) -> str | None:
    """The last name inside the template arguments that is not a type, a number or a library
    namespace: the functor or operation that makes this instance what it is."""
    best = None
    for m in _IDENT.finditer(args):
        word = m.group()
        after = args[m.end() : m.end() + 2]
        if word in _STOP or word.endswith("_t") or after == "::":
            continue
        best = word
    return best


def short_kernel_name(name: str, width: int = 48) -> str:
    """The table form of ``name`` (module docstring), at most ``width`` characters: past it the
    inner name, then the function's own, is cut at its end and marked ``…`` (a name's start is
    what tells it apart: ``sm80_xmma_gemm_f32f32…``). Never longer than ``name`` itself."""
    text = name.strip()
    for prefix in ("void ", "static ", "__global__ "):
        if text.startswith(prefix):
            text = text[len(prefix) :]
    if "<" not in text and "(" not in text and "::" not in text:
        short = text
    else:
        qualified, args = _function_and_args(text.replace("(anonymous namespace)::", ""))
        func = qualified.rsplit("::", 1)[-1].strip() or qualified.strip()
        inner = _most_specific(args) if args else None
        if inner is not None:
            room = max(8, width - len(func) - 4)
            tail = ELLIPSIS
            if len(inner) > room:
                inner, tail = inner[: room - 1], ELLIPSIS  # one mark for both elisions
            short = f"{func}<{ELLIPSIS}{inner}{tail}>"
        else:
            short = f"{func}<{ELLIPSIS}>" if args else func
    if len(short) > width:
        short = short[: width - 1] + ELLIPSIS
    return short if len(short) < len(name) else name
