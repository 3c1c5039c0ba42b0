"""Short kernel names for 80-column tables: what tells kernels apart stays, the rest goes."""

from __future__ import annotations

import gzip
import json

import pytest
from _data import GPU, TRACES

from mgprof.report.kernel_names import short_kernel_name

MUL = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::AUnaryFunctor<float, float, "
    "float, at::native::binary_internal::MulFunctor<float> >, at::detail::Array<char*, 2> >(int, "
    "at::native::AUnaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float"
    "> >, at::detail::Array<char*, 2>)"
)


@pytest.mark.parametrize(
    ("name", "short"),
    [
        (MUL, "vectorized_elementwise_kernel<…MulFunctor…>"),
        (
            "void cutlass::Kernel2<cutlass_80_simt_sgemm_64x64_8x5_nn_align1>"
            "(cutlass_80_simt_sgemm_64x64_8x5_nn_align1::Params)",
            "Kernel2<…cutlass_80_simt_sgemm_64x64_8x5_nn_a…>",
        ),
        (
            "void cudnn::bn_fw_tr_1C11_singleread<float, 512, true, 1, 2, 0>"
            "(cudnn::bn_fw_tr_1C11_args<float>)",
            "bn_fw_tr_1C11_singleread<…>",
        ),
        ("ampere_sgemm_128x64_nn", "ampere_sgemm_128x64_nn"),
        ("triton_poi_fused_add_cos_sin_0", "add_cos_sin (Triton pointwise #0)"),
        (
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
        ),
    ],
)
def test_short_forms(name: str, short: str) -> None:
    assert short_kernel_name(name) == short


def test_a_long_plain_name_keeps_its_start() -> None:
    name = "sm80_xmma_gemm_f32f32_f32f32_f32_nt_n_tilesize32x32x8_stage3_warpsize1x2x1_ffma"
    short = short_kernel_name(name, width=40)
    assert len(short) == 40 and short.startswith("sm80_xmma_gemm_f32f32") and short.endswith("…")


def _kernel_names(path: object) -> set[str]:
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]  # type: ignore[attr-defined]
    return {e["name"] for e in events if str(e.get("cat", "")).lower() == "kernel"}


@pytest.mark.parametrize(
    "path",
    [
        TRACES / "gpu-nccl-a100-rank0of2" / "rank-0.json.gz",
        TRACES / "gpu-v100-single" / "rank-0.pt.trace.json.gz",
        GPU / "mgprof-run-h200" / "traces" / "rank0.pt.trace.json.gz",
    ],
    ids=["a100", "v100", "h200"],
)
def test_real_kernel_names_fit_and_stay_apart(path: object) -> None:
    """Every kernel of a real trace: at most 48 characters, never longer than the name, and
    elementwise kernels that differ in their functor stay different."""
    import re

    names = _kernel_names(path)
    shorts = {n: short_kernel_name(n) for n in names}
    assert all(len(s) <= 48 or s == n for n, s in shorts.items())
    assert all(len(s) <= len(n) for n, s in shorts.items())
    by_functor: dict[str, set[str]] = {}
    for n, s in shorts.items():
        found = re.findall(r"(\w+Functor\w*)", n.split("(")[0] if "<" not in n else n)
        if n.startswith("void at::native::vectorized_elementwise_kernel") and found:
            by_functor.setdefault(found[-1], set()).add(s)
    assert by_functor
    assert len({next(iter(v)) for v in by_functor.values()}) == len(by_functor)


@pytest.mark.parametrize(
    "name",
    ["<script>alert(1)</script>", "<img src=x onerror=alert(1)>", "[link=https://x]y[/link]"],
)
def test_what_does_not_start_as_a_cpp_name_is_shown_whole(name: str) -> None:
    """A name planted in a trace is shown (escaped by the renderer), never rewritten."""
    assert short_kernel_name(name) == name


BN = "void cudnn::bn_bw_1C11_kernel_new<float, float, float2, {}, true, 1>(float, float)"
GEMM = "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x64_16x4_{}_align4>(Params)"


def test_a_table_tells_apart_kernels_that_share_a_short_form() -> None:
    """The first template argument they differ in (its end when its start is the same); a
    name listed twice (two ranks) keeps one form."""
    from mgprof.report.kernel_names import short_kernel_names

    names = [BN.format(128), BN.format(32), GEMM.format("nn"), GEMM.format("nt"), BN.format(32)]
    assert short_kernel_name(names[0]) == short_kernel_name(names[1])
    assert short_kernel_names(names) == [
        "bn_bw_1C11_kernel_new<…128…>",
        "bn_bw_1C11_kernel_new<…32…>",
        "Kernel<…s1688gemm_256x64_16x4_nn_align4>",
        "Kernel<…s1688gemm_256x64_16x4_nt_align4>",
        "bn_bw_1C11_kernel_new<…32…>",
    ]
    assert short_kernel_names(["ampere_sgemm_128x64_nn", MUL]) == [
        "ampere_sgemm_128x64_nn",
        "vectorized_elementwise_kernel<…MulFunctor…>",
    ]


def test_inductor_kernels_are_named_by_the_operators_they_fused() -> None:
    """HTA's recorded A100 trace of a compiled function: the Triton kernel Inductor generated
    reads as the operators it fused, in the table mgprof trace prints; JSON keeps the name."""
    import io
    import json as json_module

    from rich.console import Console

    from mgprof.analyze.trace.job import analyze_job
    from mgprof.report.trace_terminal import job_to_json, render_job

    trace = TRACES / "misc" / "a100-triton.json.gz"
    job = analyze_job([trace])
    buf = io.StringIO()
    render_job(job, Console(file=buf, width=80))
    assert "add_cos_sin (Triton pointwise #0)" in buf.getvalue()
    kernels = json_module.dumps(job_to_json(job))
    assert "triton_poi_fused_add_cos_sin_0" in kernels
    # the kinds Inductor names, the index kept, a long operator list cut before the kind
    assert short_kernel_name("triton_red_fused__softmax_1") == "_softmax (Triton reduction #1)"
    assert short_kernel_name("triton_per_fused_native_layer_norm_12") == (
        "native_layer_norm (Triton persistent #12)"
    )
    assert short_kernel_name("cpp_fused_add_relu_0") == "add_relu (C++ #0)"
    assert short_kernel_name("triton_poi_fused_0") == "unnamed operators (Triton pointwise #0)"
    long = short_kernel_name("triton_tem_fused_" + "mm_" * 40 + "3")
    assert len(long) == 48 and long.endswith("… (Triton template #3)")
    assert short_kernel_name("ampere_sgemm_128x64_nn") == "ampere_sgemm_128x64_nn"
