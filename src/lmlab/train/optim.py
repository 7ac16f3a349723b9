"""AdamW with the usual parameter groups, and the learning-rate schedule.

* **Weight decay** (Loshchilov & Hutter 2019, decoupled) applies to the matrices of linear
  layers only: biases, norm gains and embedding tables (and so a tied LM head) are not decayed,
  as in GPT-2/nanoGPT and BERT.
* **Schedule**: linear warmup from ``lr/warmup`` to ``lr`` over ``warmup_steps``, then cosine
  (Loshchilov & Hutter 2017, SGDR without restarts) or linear decay to ``min_lr`` at
  ``decay_steps``, and ``min_lr`` afterwards (nanoGPT's ``get_lr``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn

from lmlab.train.config import TrainConfig


def param_groups(modules: Iterable[nn.Module], weight_decay: float) -> list[dict]:
    """Two AdamW groups over the distinct trainable parameters of ``modules``: decayed and not."""
    no_decay: set[int] = set()
    for module in modules:
        for m in module.modules():
            if isinstance(m, nn.Embedding):
                no_decay.add(id(m.weight))
    decay, plain, seen = [], [], set()
    for module in modules:
        for p in module.parameters():
            if not p.requires_grad or id(p) in seen:
                continue
            seen.add(id(p))
            (plain if p.dim() < 2 or id(p) in no_decay else decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": plain, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def adamw(modules: Iterable[nn.Module], *, lr: float, betas, weight_decay: float, eps: float = 1e-8
          ) -> torch.optim.AdamW:
    """AdamW over the trainable parameters of ``modules`` (the two :func:`param_groups`), with
    PyTorch's fused kernel where it exists (CPU/CUDA, floating point): the same update in one pass
    over the parameters, about 6x faster on a 2-core CPU (0.03 s vs 0.19 s per step for 12M
    parameters; a MiniLM fine-tuning step 0.04 s vs 0.43 s). Pretraining, fine-tuning and
    distillation all build their optimizer here."""
    groups = param_groups(list(modules), weight_decay)
    params = [p for g in groups for p in g["params"]]
    fused = bool(params) and all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params)
    return torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), eps=eps, fused=fused)


def build_optimizer(modules: Iterable[nn.Module], cfg: TrainConfig) -> torch.optim.AdamW:
    """The pretraining optimizer: :func:`adamw` with ``cfg``'s settings."""
    return adamw(modules, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay, eps=cfg.eps)


def warmup_decay_lr(step: int, *, lr: float, warmup: int, end: int, min_lr: float = 0.0,
                    shape: str = "linear") -> float:
    """The learning rate of optimizer step ``step`` (0-based): linear warmup over ``warmup`` steps
    to ``lr``, then ``shape`` ("linear", "cosine" or "constant") down to ``min_lr`` at ``end``.

    Pretraining (:func:`lr_at`), fine-tuning and distillation all schedule through this one
    function; fine-tuning uses BERT's linear decay to 0 at the last step.
    """
    if shape == "constant":
        return lr * min(1.0, (step + 1) / warmup) if warmup else lr
    if step < warmup:
        return lr * (step + 1) / warmup
    if step >= end:
        return min_lr
    frac = (step - warmup) / max(1, end - warmup)
    if shape == "cosine":
        frac = 0.5 * (1.0 - math.cos(math.pi * frac))
    return lr - frac * (lr - min_lr)


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate for pretraining step ``step`` under ``cfg``'s schedule (0-based: the first
    update uses ``lr_at(0)``)."""
    return warmup_decay_lr(step, lr=cfg.lr, warmup=cfg.warmup_steps, end=cfg.decay_steps or cfg.max_steps,
                           min_lr=cfg.min_lr, shape=cfg.schedule)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for g in optimizer.param_groups:
        g["lr"] = lr


# --------------------------------------------------------------------------- state <-> safetensors
def optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    """Optimizer state as flat tensors ``state.{param_index}.{name}`` + JSON-able param groups."""
    sd = optimizer.state_dict()
    tensors = {}
    for idx, st in sd["state"].items():
        for name, value in st.items():
            t = value if torch.is_tensor(value) else torch.tensor(value)
            tensors[f"state.{idx}.{name}"] = t.detach().cpu().contiguous()
    groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()} for g in sd["param_groups"]]
    return tensors, {"param_groups": groups}


def load_optimizer_tensors(
    optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], meta: dict
) -> None:
    """Inverse of :func:`optimizer_tensors` (tensors moved to each parameter's device)."""
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, t in tensors.items():
        _, idx, name = key.split(".", 2)
        state.setdefault(int(idx), {})[name] = t
    groups = []
    for g in meta["param_groups"]:
        g = dict(g)
        if "betas" in g:
            g["betas"] = tuple(g["betas"])
        groups.append(g)
    optimizer.load_state_dict({"state": state, "param_groups": groups})
