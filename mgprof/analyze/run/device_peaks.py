"""Peak dense FLOP/s of known devices, the denominator of MFU; vendor datasheet figures."""

from __future__ import annotations

import re

# Peak dense (no structured sparsity) tensor FLOP/s in TFLOP/s from vendor datasheets; fp32 is
# plain FP32 (PyTorch does not use TF32 for matmuls by default). First matching pattern wins, so
# specific variants come before the family name. None: the device lacks that dtype.
_PEAKS_TFLOPS: tuple[tuple[str, dict[str, float | None]], ...] = (
    (r"\bH200 NVL\b", {"bf16": 835.0, "fp16": 835.0, "fp32": 60.0}),
    (r"\bH200\b", {"bf16": 989.0, "fp16": 989.0, "fp32": 67.0}),
    (r"\bH100 PCIe\b", {"bf16": 756.0, "fp16": 756.0, "fp32": 51.0}),
    (r"\bH100 NVL\b", {"bf16": 835.0, "fp16": 835.0, "fp32": 60.0}),
    (r"\bH100\b", {"bf16": 989.0, "fp16": 989.0, "fp32": 67.0}),  # SXM ("H100 80GB HBM3")
    (r"\bA100\b", {"bf16": 312.0, "fp16": 312.0, "fp32": 19.5}),
    (r"\bL40S\b", {"bf16": 362.0, "fp16": 362.0, "fp32": 91.6}),
    (r"\bL4\b", {"bf16": 121.0, "fp16": 121.0, "fp32": 30.3}),
    (r"\bA10\b", {"bf16": 125.0, "fp16": 125.0, "fp32": 31.2}),
    (r"\bV100S\b", {"bf16": None, "fp16": 130.0, "fp32": 16.4}),
    (r"\bV100-PCIE\b", {"bf16": None, "fp16": 112.0, "fp32": 14.0}),
    (r"\bV100\b", {"bf16": None, "fp16": 125.0, "fp32": 15.7}),
    (r"\bT4\b", {"bf16": None, "fp16": 65.0, "fp32": 8.1}),
    (r"\bRTX 4090\b", {"bf16": 165.2, "fp16": 165.2, "fp32": 82.6}),
    (r"\bRTX 3090\b", {"bf16": 71.0, "fp16": 71.0, "fp32": 35.6}),
)


def device_peak_tflops(device_name: str | None, dtype: str) -> float | None:
    """Peak dense TFLOP/s of a device for ``dtype`` (bf16, fp16, fp32), None when not known."""
    if not device_name:
        return None
    for pattern, peaks in _PEAKS_TFLOPS:
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            return peaks.get(dtype)
    return None
