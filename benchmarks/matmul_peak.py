"""The machine's float32 matmul rate: the denominator of model FLOPs utilisation (MFU).

Large square matmuls (``2 n^3`` FLOPs each) are the best case for the BLAS library, so their rate
is what a Transformer's matmuls could reach at most on this device, this thread count and this
load. ``model_throughput.py`` measures it in the same process, at the same thread count, before
and after the model runs, and keeps the higher figure (load only slows a measurement down).

    python benchmarks/matmul_peak.py                  # fp32 and bf16, sizes 1024 and 2048
    python benchmarks/matmul_peak.py --threads 1 --sizes 512,1024
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

SIZES = (1024, 2048)
QUICK_SIZES = (256,)


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


def matmul_peak(sizes=SIZES, dtype: torch.dtype = torch.float32, seconds: float = 0.4,
                repeats: int = 3, device: str = "cpu") -> dict[str, float]:
    """Best FLOP/s over the given square sizes: ``{"flops": best, "size": n_best, "<n>": rate...}``."""
    rates = {n: matmul_flops(dtype, n, device, min_seconds=seconds, repeats=repeats, max_seconds=20 * seconds)
             for n in sizes}
    best = max(rates, key=rates.get)
    return {"flops": rates[best], "size": best, **{str(n): r for n, r in rates.items()}}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=None, help="intra-op threads (default: auto)")
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)), help="square sizes, comma separated")
    args = ap.parse_args(argv)
    from lmlab.runtime import choose_threads, set_threads

    threads, reason = choose_threads(args.threads)
    set_threads(threads)
    print(f"threads: {reason}")
    sizes = tuple(int(s) for s in args.sizes.split(","))
    for dtype in (torch.float32, torch.bfloat16):
        r = matmul_peak(sizes, dtype)
        per_size = ", ".join(f"{n}: {r[str(n)] / 1e9:.1f}" for n in sizes)
        print(f"{str(dtype).removeprefix('torch.'):9s} best {r['flops'] / 1e9:.1f} GFLOP/s  ({per_size})")


if __name__ == "__main__":
    main()
