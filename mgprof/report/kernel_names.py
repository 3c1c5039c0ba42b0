"""Kernel names short enough for a table: template arguments and parameter lists elided.

A C++ kernel name as the trace records it (``void at::native::vectorized_elementwise_kernel<4,
at::native::AUnaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float>>,
at::detail::Array<char*, 2>>(int, ...)``) wraps over 10-14 lines of an 80-column table. The short
form keeps what tells such kernels apart: the function's own name and, in ``<…>``, the most
specific name inside its template arguments (``vectorized_elementwise_kernel<…MulFunctor…>``,
``Kernel2<…cutlass_80_simt_sgemm_64x64_8x5_nn_align1…>``), or ``<…>`` alone when they hold only
types and numbers. The parameter list goes. C-style names (``ampere_sgemm_128x64_nn``) pass
unchanged, and so does anything that does not start as a C++ name does (a ``<script>`` or
``[link=…]`` planted in a trace is shown whole, escaped by the renderer, never rewritten). The
full name stays in JSON and in report.html (on hover).

A kernel ``torch.compile`` (Inductor) generated is named by the operators it fused, as its name
says them: Inductor names a kernel ``triton_<kind>_fused_<ops>_<n>`` (``cpp_fused_<ops>_<n>`` on
the CPU), ``<ops>`` being the ATen operators it fused, sorted and joined by ``_``; the short form
puts them first, then the backend, the kind and the index that tells two kernels of the same
operators apart (``add_cos_sin (Triton pointwise #0)``). ATen names hold ``_`` themselves
(``native_layer_norm``), so the operators are shown as Inductor joined them, never split.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["inductor_label", "short_kernel_name", "short_kernel_names"]

ELLIPSIS = "…"
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CPP_START = re.compile(r"(?:\(anonymous namespace\)::)*[A-Za-z_]")
"""How a demangled C++ (or C) name starts: an identifier, maybe in an anonymous namespace."""
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


SCAN_CHARS = 4096
"""Characters of a name the short form is built from. A short form is at most a table column
wide and is made from the name's start (the function) and the first template argument, so a
longer name (a C++ instantiation runs to a few KiB; a broken trace once held one of 200 MB,
and the character scans made its rendering take minutes) is cut here, before any work."""


def _strip(name: str) -> str:
    text = name[:SCAN_CHARS].strip()
    for prefix in ("void ", "static ", "__global__ "):
        if text.startswith(prefix):
            text = text[len(prefix) :]
    return text


def _fit(short: str, name: str, width: int) -> str:
    if len(short) > width:
        short = short[: width - 1] + ELLIPSIS
    return short if len(short) < len(name) else name


_INDUCTOR = re.compile(r"(triton|cpp)_(?:(poi|red|per|tem|for)_)?fused_?([A-Za-z0-9_]*?)_(\d+)")
_INDUCTOR_KINDS = {
    "poi": "pointwise",
    "red": "reduction",
    "per": "persistent",
    "tem": "template",
    "for": "foreach",
}


def inductor_label(name: str, width: int = 48) -> str | None:
    """``add_cos_sin (Triton pointwise #0)`` for an Inductor kernel's name, else None; at most
    ``width`` characters, the operators cut (``…``) before the backend, kind and index are."""
    m = _INDUCTOR.fullmatch(name[:SCAN_CHARS].strip())
    if m is None:
        return None
    backend, kind, ops, index = m.groups()
    words = ["Triton" if backend == "triton" else "C++", _INDUCTOR_KINDS.get(kind or "", "")]
    tail = f"({' '.join(w for w in words if w)} #{index})"
    ops = ops or "unnamed operators"
    room = max(2, width - len(tail) - 1)
    if len(ops) > room:
        ops = ops[: room - 1] + ELLIPSIS
    return f"{ops} {tail}"


def short_kernel_name(name: str, width: int = 48) -> str:
    """The table form of ``name`` (module docstring), at most ``width`` characters: past it the
    inner name, then the function's own, is cut at its end and marked ``…`` (a name's start is
    what tells it apart: ``sm80_xmma_gemm_f32f32…``). Never longer than ``name`` itself, but
    for an Inductor kernel, named by the operators it fused."""
    fused = inductor_label(name, width)
    if fused is not None:
        return fused
    text = _strip(name)
    if not _CPP_START.match(text):
        return name
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
    return _fit(short, name, width)


def _split_args(args: str) -> list[str]:
    """Template arguments split at their top-level commas."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(args):
        if ch in "<(":
            depth += 1
        elif ch in ">)" and depth:
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(args[start:i].strip())
            start = i + 1
    out.append(args[start:].strip())
    return out


_QUALIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*::|\(anonymous namespace\)::")
"""A namespace or class qualifier (``at::native::``), dropped from a template argument shown."""


def _arg_forms(func: str, arg: str, width: int) -> tuple[str, str]:
    """(head, tail) forms of ``func`` with one template argument, at most ``width`` long: its
    start (``Kernel<…cutlass_80_tensorop_s1688gemm_25…>``) and its end from a word boundary
    (``Kernel<…s1688gemm_256x64_16x4_nn_align4>``), for names that differ late."""
    room = max(8, width - len(func) - 4)
    if len(arg) <= room:
        whole = f"{func}<{ELLIPSIS}{arg}{ELLIPSIS}>"
        return whole, whole
    head = f"{func}<{ELLIPSIS}{arg[: room - 1]}{ELLIPSIS}>"
    end = arg[-room:]
    cut = end.find("_")
    if 0 <= cut < len(end) - 1:
        end = end[cut + 1 :]
    return head, f"{func}<{ELLIPSIS}{end}>"


def _told_apart(names: Sequence[str], width: int) -> list[str] | None:
    """Short forms of ``names`` (one short form, different names) that show the first template
    argument in which they differ, namespaces dropped (``bn_bw_1C11_kernel_new<…128…>`` and
    ``<…32…>``), its end when its start does not tell them apart; None when neither does."""
    parts = [_function_and_args(_strip(n).replace("(anonymous namespace)::", "")) for n in names]
    arg_lists = [_split_args(args) for _, args in parts]
    for i in range(max(len(a) for a in arg_lists)):
        column = [a[i] if i < len(a) else "" for a in arg_lists]
        if len(set(column)) < 2:
            continue
        forms = []
        for (qualified, _), arg, name in zip(parts, column, names, strict=True):
            func = qualified.rsplit("::", 1)[-1].strip() or qualified.strip()
            head, tail = _arg_forms(func, _QUALIFIER.sub("", arg), width)
            forms.append((_fit(head, name, width), _fit(tail, name, width)))
        for k in (0, 1):
            out = [f[k] for f in forms]
            if len(set(out)) == len(names):
                return out
        return None
    return None


def short_kernel_names(names: Sequence[str], width: int = 48) -> list[str]:
    """``short_kernel_name`` of each name in a table, where different names that share a short
    form are told apart by the first template argument in which they differ (two cuDNN batch
    norms, ``<…128…>`` and ``<…32…>``); a name listed twice keeps one short form."""
    shorts = [short_kernel_name(n, width) for n in names]
    groups: dict[str, list[str]] = {}
    for name, short in zip(names, shorts, strict=True):
        if name not in groups.setdefault(short, []):
            groups[short].append(name)
    better: dict[str, str] = {}
    for group in groups.values():
        if len(group) > 1:
            told = _told_apart(group, width)
            if told is not None:
                better.update(zip(group, told, strict=True))
    return [better.get(n, s) for n, s in zip(names, shorts, strict=True)]
