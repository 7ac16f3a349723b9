"""Device, precision and thread count: each chosen deliberately, with the reason logged.

* **Threads.** PyTorch's default intra-op thread count is every logical CPU. That is the wrong
  number on small or shared machines: two SMT siblings of one core share its FPU (no gain for
  matmuls), CPUs outside the process's affinity mask or cgroup quota are not really there, and
  with OpenMP's barrier after every op a thread that waits for a busy core stalls all the others.
  :func:`choose_threads` uses the *physical* cores this process may run on:
  ``len(os.sched_getaffinity(0))`` with SMT siblings counted once (``/sys/.../thread_siblings_list``),
  capped by the cgroup v2 CPU quota (``/sys/fs/cgroup/cpu.max``), and says when the load average
  shows the cores are already busy (then timings are noisy and fewer threads may be faster).
* **Precision.** bfloat16 autocast only pays where the hardware multiplies bf16 fast: CUDA tensor
  cores, or CPUs with AVX512-BF16/AMX that oneDNN uses. Elsewhere PyTorch emulates bf16 and a
  matmul can be ~100x slower than float32. :func:`choose_dtype` therefore *measures*:
  :func:`bf16_speedup` times square matmuls in both dtypes (a fraction of a second, cached per
  process) and ``"auto"`` picks bf16 only when it is at least :data:`BF16_MIN_SPEEDUP` times
  faster, otherwise float32, with the measured rates in the reason.

>>> choice = configure()           # doctest: +SKIP
>>> print(choice.describe())       # doctest: +SKIP
device cpu; dtype float32 (bf16 matmul 0.9x fp32 ...); threads 2 (2 physical cores ...)
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import torch

from lmlab.errors import LmlabError

log = logging.getLogger("lmlab.runtime")

#: bf16 must beat fp32 matmul by this factor to be chosen: autocast also spends time on casts.
BF16_MIN_SPEEDUP = 1.3
DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16,
          "bfloat16": torch.bfloat16}

__all__ = [
    "BF16_MIN_SPEEDUP",
    "RuntimeChoice",
    "bf16_speedup",
    "choose_device",
    "choose_dtype",
    "choose_threads",
    "configure",
    "matmul_flops",
    "physical_cores",
]


# ----------------------------------------------------------------------------- threads


def _cgroup_cpu_limit(path: Path = Path("/sys/fs/cgroup/cpu.max")) -> int | None:
    """CPUs allowed by a cgroup v2 quota (``"200000 100000"`` -> 2), None when unlimited/unknown."""
    try:
        quota, period = path.read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    return max(1, math.ceil(int(quota) / int(period)))


def physical_cores() -> int:
    """Physical cores this process may use: affinity mask, SMT siblings once, cgroup quota."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows: no affinity API
        return max(1, os.cpu_count() or 1)
    cores = set()
    for cpu in cpus:
        siblings = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
        try:
            cores.add(siblings.read_text().strip())
        except OSError:
            cores.add(str(cpu))
    n = max(1, len(cores))
    quota = _cgroup_cpu_limit()
    return min(n, quota) if quota else n


def choose_threads(requested: int | None = None) -> tuple[int, str]:
    """``(threads, reason)``: ``requested`` when given (> 0), else the physical cores available."""
    if requested is not None:
        if requested <= 0:
            raise LmlabError(f"thread count must be positive, got {requested}", "pass e.g. --threads 2")
        return requested, f"{requested} (requested)"
    cores = physical_cores()
    logical = os.cpu_count() or cores
    reason = f"{cores} (physical cores available to this process; {logical} logical CPUs on the machine)"
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = 0.0
    if load > cores:
        reason += (f"; load average {load:.1f} > {cores} cores: other processes hold them, "
                   "so timings are noisy and fewer threads may be faster")
    return cores, reason


# ----------------------------------------------------------------------------- device


def choose_device(requested: str = "auto") -> tuple[torch.device, str]:
    """``(device, reason)``: ``auto`` = CUDA when available, else CPU; a named one is checked."""
    if requested == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda"), f"cuda ({torch.cuda.get_device_name(0)})"
        return torch.device("cpu"), "cpu (no CUDA device)"
    try:
        device = torch.device(requested)
    except RuntimeError as err:
        raise LmlabError(f"unknown device {requested!r}", "use auto, cpu or cuda") from err
    if device.type == "cuda" and not torch.cuda.is_available():
        raise LmlabError(f"device {requested} asked for but CUDA is not available",
                         "use --device cpu or auto")
    return device, f"{device} (requested)"


# ----------------------------------------------------------------------------- precision


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_flops(dtype: torch.dtype = torch.float32, n: int = 512, device: str | torch.device = "cpu",
                 min_seconds: float = 0.05, repeats: int = 3, max_seconds: float = 2.0) -> float:
    """Best measured FLOP/s of ``n x n`` matmuls in ``dtype`` (``2 n^3`` FLOPs each).

    Each of ``repeats`` rounds multiplies until ``min_seconds`` have passed; the best round wins
    (other processes only ever slow a round down). ``max_seconds`` bounds the total, so a dtype
    that is emulated (very slow) costs one call, not a minute.
    """
    device = torch.device(device)
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    torch.mm(a, b)  # warm-up: kernel selection, page faults
    _sync(device)
    best, start = 0.0, time.perf_counter()
    for _ in range(max(1, repeats)):
        t0, calls = time.perf_counter(), 0
        while True:
            torch.mm(a, b)
            calls += 1
            _sync(device)
            elapsed = time.perf_counter() - t0
            if elapsed >= min_seconds or time.perf_counter() - start > max_seconds:
                break
        best = max(best, 2 * n**3 * calls / elapsed)
        if time.perf_counter() - start > max_seconds:
            break
    return best


@lru_cache(maxsize=8)
def _bf16_probe(device: str, n: int, threads: int) -> tuple[float, float]:
    fp32 = matmul_flops(torch.float32, n, device)
    bf16 = matmul_flops(torch.bfloat16, n, device)
    fp32 = max(fp32, matmul_flops(torch.float32, n, device))  # interleaved: load drift hits both
    return fp32, bf16


def bf16_speedup(device: str | torch.device = "cpu", n: int = 512) -> tuple[float, float, float]:
    """``(bf16 / fp32 speed ratio, fp32 FLOP/s, bf16 FLOP/s)`` from a timed matmul probe (cached)."""
    fp32, bf16 = _bf16_probe(str(torch.device(device)), n, torch.get_num_threads())
    return bf16 / fp32, fp32, bf16


def choose_dtype(requested: str = "auto", device: str | torch.device = "cpu") -> tuple[torch.dtype, str]:
    """``(compute dtype, reason)`` for ``requested`` in auto | fp32 | bf16.

    bf16 means autocast: parameters and optimizer state stay float32, matmuls run in bf16.
    ``auto`` measures (:func:`bf16_speedup`) and picks bf16 only when it is at least
    :data:`BF16_MIN_SPEEDUP` x faster; an explicit ``bf16`` is honoured with a warning when slow.
    """
    if requested not in ("auto", *DTYPES):
        raise LmlabError(f"unknown precision {requested!r}", "use auto, fp32 or bf16")
    device = torch.device(device)
    if requested in DTYPES and DTYPES[requested] is torch.float32:
        return torch.float32, "float32 (requested)"
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        if requested != "auto":
            raise LmlabError("bfloat16 requested but this GPU does not support it", "use fp32")
        return torch.float32, "float32 (this GPU has no bfloat16 support)"
    ratio, fp32, bf16 = bf16_speedup(device)
    rates = f"bf16 matmul {bf16 / 1e9:.1f} GFLOP/s vs fp32 {fp32 / 1e9:.1f} GFLOP/s ({ratio:.2f}x)"
    if requested != "auto":
        if ratio < 1.0:
            log.warning("bfloat16 requested but slower than float32 here: %s", rates)
            return torch.bfloat16, f"bfloat16 autocast (requested; WARNING slower than fp32 here: {rates})"
        return torch.bfloat16, f"bfloat16 autocast (requested; {rates})"
    if ratio >= BF16_MIN_SPEEDUP:
        return torch.bfloat16, f"bfloat16 autocast ({rates}, measured on {device.type})"
    return torch.float32, (f"float32 ({rates}, measured on {device.type}: below the "
                           f"{BF16_MIN_SPEEDUP}x that would pay for autocast)")


# ----------------------------------------------------------------------------- all together


@dataclass
class RuntimeChoice:
    """What :func:`configure` decided, and why (one reason per decision)."""

    device: torch.device
    dtype: torch.dtype
    threads: int
    reasons: dict[str, str] = field(default_factory=dict)

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """Autocast dtype for the forward pass, None for plain float32."""
        return None if self.dtype is torch.float32 else self.dtype

    def describe(self) -> str:
        return "; ".join(f"{k} {v}" for k, v in self.reasons.items())


def configure(device: str = "auto", dtype: str = "auto", threads: int | None = None) -> RuntimeChoice:
    """Choose device, threads and dtype (in that order: the dtype probe runs at the chosen thread
    count), apply the thread count with ``torch.set_num_threads``, log and return the choices."""
    dev, dev_reason = choose_device(device)
    n, thread_reason = choose_threads(threads)
    torch.set_num_threads(n)
    dt, dtype_reason = choose_dtype(dtype, dev)
    reasons = {"device": dev_reason, "dtype": dtype_reason, "threads": thread_reason}
    choice = RuntimeChoice(dev, dt, n, reasons)
    log.info("runtime: %s", choice.describe())
    return choice
