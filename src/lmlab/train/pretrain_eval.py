"""A pretraining run's evaluation: the validation loss and the objective's signals, and the words
that show them (the hook the fit loop's evaluator calls)."""

from __future__ import annotations

from typing import Any

import torch

from lmlab.data.packing import read_windows
from lmlab.train import distributed as dist_
from lmlab.train.metrics import perplexity


def micro_seed(seed: int, step: int, index: int) -> int:
    """Seed of micro-batch ``index`` (in the global batch) of optimizer step ``step``."""
    return (seed * 1_000_003 + step * 7919 + index * 104_729 + 12_345) % (2**63 - 1)


@torch.no_grad()
def evaluate(trainer) -> dict[str, float]:
    """Mean validation loss (weighted by predicted tokens when the objective reports ``targets``)."""
    t = trainer.cfg.train
    trainer.model.eval()
    trainer.objective.eval()
    total, weight = 0.0, 0.0
    sums: dict[str, float] = {}  # the objective's metrics, weighted like the loss
    for i in range(0, trainer.val_batches * t.batch_size, t.batch_size):
        chunk = trainer.val_starts[i : i + t.batch_size]
        batch = read_windows(trainer.data.val, chunk or [0], t.seq_len)  # none left: a stand-in, unscored
        seed = micro_seed(t.seed, -1, i)
        inputs = trainer.device_inputs(trainer.host_inputs(batch, seed), seed)
        with trainer.machine.autocast():  # through the DDP/FSDP wrapper, which gathers sharded weights
            loss, extra = trainer.step_module(inputs)
        if not chunk:
            continue
        w = float(extra.get("targets", 1.0))
        total += float(loss) * w
        weight += w
        for k, v in extra.items():
            if k != "targets" and isinstance(v, (int, float, torch.Tensor)):
                sums[k] = sums.get(k, 0.0) + float(v) * w
    names = sorted(sums)
    total, weight, *values = dist_.mean_across([total, weight, *(sums[k] for k in names)], trainer.info,
                                               trainer.machine.device)
    trainer.model.train()
    trainer.objective.train()
    mean = total / max(weight, 1e-12)
    row = {"val_loss": mean, **{f"val_{k}": v / max(weight, 1e-12) for k, v in zip(names, values)}}
    kind = getattr(trainer.objective, "loss_kind", "other")
    if kind in ("nll", "masked_nll"):
        row["val_ppl"] = perplexity(mean)
    if kind == "nll":
        row["val_bpb"] = trainer.data.val.bits_per_byte(mean)
    return row

def describe(objective, row: dict[str, Any]) -> str:
    """The validation numbers that mean something for this objective: loss, perplexity and bits
    per byte only for a per-token NLL, and each learning signal beside its trivial baseline."""
    parts = [f"val loss {row['val_loss']:.4f}"]
    if "val_ppl" in row:
        parts.append(f"ppl {row['val_ppl']:.1f}")
    if "val_bpb" in row:
        parts.append(f"{row['val_bpb']:.3f} bits/byte")
    for metric, guess, what in getattr(objective, "signals", ()):
        if f"val_{metric}" in row and f"val_{guess}" in row:
            parts.append(f"{metric} {row[f'val_{metric}']:.4f} ({what}: {row[f'val_{guess}']:.4f})")
    return ", ".join(parts)

