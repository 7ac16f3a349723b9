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
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from lmlab.runtime import matmul_flops  # noqa: E402

SIZES = (1024, 2048)
QUICK_SIZES = (256,)


def matmul_peak(sizes=SIZES, dtype: torch.dtype = torch.float32, seconds: float = 0.4,
                repeats: int = 3, device: str = "cpu") -> dict[str, float]:
    """Best FLOP/s over the given square sizes: ``{"flops": best, "size": n_best, "<n>": rate...}``."""
    rates = {n: matmul_flops(dtype, n, device, min_seconds=seconds, repeats=repeats, max_seconds=20 * seconds)
             for n in sizes}
    best = max(rates, key=rates.get)
    return {"flops": rates[best], "size": best, **{str(n): r for n, r in rates.items()}}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=None, help="intra-op threads (default: physical cores)")
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)), help="square sizes, comma separated")
    args = ap.parse_args(argv)
    from lmlab.runtime import choose_threads

    threads, reason = choose_threads(args.threads)
    torch.set_num_threads(threads)
    print(f"threads: {reason}")
    sizes = tuple(int(s) for s in args.sizes.split(","))
    for dtype in (torch.float32, torch.bfloat16):
        r = matmul_peak(sizes, dtype)
        per_size = ", ".join(f"{n}: {r[str(n)] / 1e9:.1f}" for n in sizes)
        print(f"{str(dtype).removeprefix('torch.'):9s} best {r['flops'] / 1e9:.1f} GFLOP/s  ({per_size})")


if __name__ == "__main__":
    main()
