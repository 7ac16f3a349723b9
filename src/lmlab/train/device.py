"""Peak throughput of known devices, the denominator of the MFU column.

Device, threads and precision are chosen by :mod:`lmlab.runtime` (the one machine policy).
"""

from __future__ import annotations

import torch

#: dense peak TFLOP/s from the vendors' data sheets: (bf16/fp16 tensor cores, tf32), by a
#: substring of ``torch.cuda.get_device_name``; the first match wins (so "H100 PCIe" before "H100")
PEAK_TFLOPS = (
    ("H200", (989.4, 494.7)),
    ("H100 PCIe", (756.0, 378.0)),
    ("H100", (989.4, 494.7)),
    ("GH200", (989.4, 494.7)),
    ("A100", (312.0, 156.0)),
    ("A10G", (70.0, 35.0)),
    ("A10", (125.0, 62.5)),
    ("L40S", (362.0, 183.0)),
    ("L4", (121.0, 60.0)),
    ("RTX 4090", (165.2, 82.6)),
    ("V100", (125.0, 15.7)),
)


def peak_tflops(device: torch.device, dtype: torch.dtype | None, given: float = 0.0) -> float | None:
    """The device's peak TFLOP/s for MFU: ``given`` when set (``train.peak_tflops``), else the
    data-sheet figure of a known GPU at this precision (``dtype`` None = float32, counted at the
    TF32 rate); None on CPUs and unknown devices, where no MFU is logged."""
    if given:
        return float(given)
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, (half, tf32) in PEAK_TFLOPS:
        if key in name:
            return half if dtype is not None else tf32
    return None
