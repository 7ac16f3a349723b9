"""The machine: device, thread count and numeric precision, each chosen deliberately and logged.

* **Threads.** PyTorch's default intra-op thread count is every CPU it can see. On a small
  shared machine that is often the wrong number: when other processes keep the cores busy, threads
  that wait for each other at every parallel region make one thread several times faster
  (measured on the 2-core development machine under load: gpt2-tiny trained at 2,700 tokens/s
  with 1 thread, 650 with 2). ``threads = 0`` (auto) times a training-shaped layer with 1 thread
  and with all *physical* cores this process may use (``sched_getaffinity``, SMT siblings once,
  divided among the processes of a distributed run on this node) and keeps the faster.
* **Precision.** bfloat16/float16 autocast pays only where the hardware has fast low-precision
  matmuls (CUDA tensor cores, CPUs with AMX/AVX512-BF16); elsewhere it is much slower (float16 on
  this project's CPU: 20-70x; bf16 on CPUs without native support: up to ~100x). ``precision =
  "auto"`` times a Linear layer of the model's width (forward + backward) in float32 and under
  bf16 autocast and enables autocast only when it is at least 2x faster; the measured ratio is
  logged either way. CUDA with bf16 support always uses bf16. An explicit ``bf16``/``fp16`` is
  honoured, with a warning when the probe says it is slow. A resumed run reuses the choices the
  run started with, so ``auto`` cannot flip between the two halves of a run.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import torch

from lmlab.errors import LmlabError
from lmlab.runtime import physical_cores


@dataclass
class Machine:
    device: torch.device
    threads: int
    dtype: torch.dtype | None  # autocast dtype, None = plain float32
    notes: list[str]

    def autocast(self):
        """Context manager for the forward pass (a no-op in float32)."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    @property
    def precision(self) -> str:
        return {None: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[self.dtype]


def pick_device(name: str, local_rank: int = 0) -> torch.device:
    """``auto`` = CUDA (this process's local rank) when available, else CPU."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", local_rank % torch.cuda.device_count())
        return torch.device("cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise LmlabError(f"train.device={name} but CUDA is not available", "set train.device=cpu or auto")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise LmlabError("train.device=mps but MPS is not available", "set train.device=cpu or auto")
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", local_rank % torch.cuda.device_count())
    return dev


def step_seconds(
    device: torch.device, dtype: torch.dtype | None, width: int = 256, rows: int = 512, reps: int = 3
) -> float:
    """Best-of-``reps`` time of a Linear(width, 4*width) forward + backward, under autocast ``dtype``.

    A training step is mostly such matmuls (forward, and two per backward), plus the casts that
    autocast inserts; timing the pair measures both.
    """
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(rows, width, generator=gen).to(device).requires_grad_()
    w = torch.randn(4 * width, width, generator=gen).to(device).requires_grad_()
    ctx = torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()
    best = float("inf")
    for i in range(reps + 1):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t = time.perf_counter()
        with ctx:
            y = torch.nn.functional.linear(x, w)
        y.float().square().mean().backward()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i:
            best = min(best, time.perf_counter() - t)
    return best


def choose_threads(requested: int, local_world_size: int = 1) -> tuple[int, str]:
    """``requested`` > 0 as given; 0 = time 1 thread against all physical cores and keep the faster.

    On an idle machine all cores win; when other processes keep the cores busy, threads that
    wait for each other at every parallel region make one thread several times faster (measured
    on the 2-core development machine under load: 2,700 vs 650 tokens/s for gpt2-tiny).
    """
    if requested > 0:
        return requested, f"threads: {requested} (train.threads)"
    cores = max(1, physical_cores() // max(1, local_world_size))
    share = f", shared by {local_world_size} processes" if local_world_size > 1 else ""
    if cores == 1:
        return 1, f"threads: 1 (auto: 1 physical core available{share})"
    times = {}
    for n in (1, cores):
        torch.set_num_threads(n)
        times[n] = step_seconds(torch.device("cpu"), None)
    best = min(times, key=times.get)
    if times[cores] <= 1.1 * times[1]:
        best = cores
    probe = ", ".join(f"{n}: {t * 1e3:.1f} ms" for n, t in times.items())
    return best, (
        f"threads: {best} (auto: {cores} physical cores{share}; timed probe {probe}; "
        "set train.threads to fix it)"
    )


def choose_precision(
    requested: str, device: torch.device, width: int = 256
) -> tuple[torch.dtype | None, str]:
    """Autocast dtype for ``requested`` (auto|fp32|bf16|fp16) on ``device``, and why.

    ``auto`` on a CPU times a layer of the model's width in float32 and under bf16 autocast and
    enables autocast only when it is at least twice as fast (casts and the non-matmul work eat
    smaller gains).
    """
    if requested == "fp32":
        return None, "precision: fp32 (train.precision)"
    if device.type == "cuda":
        if requested == "fp16":
            return torch.float16, "precision: fp16 autocast with loss scaling (train.precision)"
        if torch.cuda.is_bf16_supported():
            return torch.bfloat16, "precision: bf16 autocast (CUDA device supports bfloat16)"
        if requested == "bf16":
            raise LmlabError("train.precision=bf16 but this GPU has no bfloat16 support", "use fp16 or fp32")
        return None, "precision: fp32 (this GPU has no bfloat16; set train.precision=fp16 for autocast)"
    want = torch.float16 if requested == "fp16" else torch.bfloat16
    name = "fp16" if want is torch.float16 else "bf16"
    try:
        ratio = step_seconds(device, want, width) / max(step_seconds(device, None, width), 1e-9)
    except RuntimeError:  # the dtype is not implemented on this device
        ratio = float("inf")
    if requested == "auto":
        if ratio <= 0.5:
            return want, (
                f"precision: bf16 autocast ({device.type}: a bf16 layer of width {width} ran "
                f"{1 / ratio:.1f}x faster than fp32 in a timed probe)"
            )
        return None, (
            f"precision: fp32 ({device.type}: a bf16 layer of width {width} took {ratio:.2f}x the "
            "time of fp32 in a timed probe, not enough to pay for autocast)"
        )
    warn = f"; WARNING: {name} is {ratio:.1f}x slower than fp32 here" if ratio > 1.25 else ""
    return want, f"precision: {name} autocast (train.precision){warn}"


def setup_machine(
    device: str,
    threads: int,
    precision: str,
    local_rank: int = 0,
    local_world_size: int = 1,
    width: int = 256,
) -> Machine:
    """Pick the device, set the thread count, choose the precision; return them with log lines."""
    dev = pick_device(device, local_rank)
    n, thread_note = choose_threads(threads, local_world_size)
    torch.set_num_threads(n)
    dtype, prec_note = choose_precision(precision, dev, width)
    return Machine(dev, n, dtype, [f"device: {dev}", thread_note, prec_note])


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
