"""LoRA: low-rank adaptation of the linear layers (Hu et al. 2021, "LoRA: Low-Rank Adaptation of
Large Language Models").

A frozen pretrained weight ``W`` (``d_out × d_in``) gets a trainable update of rank ``r``::

    h = W x + (alpha / r) · B A dropout(x)        A: r × d_in (random),  B: d_out × r (zeros)

Because ``B`` starts at zero the adapted model is exactly the base model at step 0, and only
``r·(d_in + d_out)`` numbers per layer are trained. After training the update can be folded into
the weight, ``W' = W + (alpha/r)·B·A`` (:func:`merge_lora`), so inference costs nothing extra;
:func:`unmerge_lora` subtracts it again. The paper adapts the query and value projections
(``target_modules=("q_proj", "v_proj")``, the default here); ``"all-linear"`` adapts every linear
layer inside the Transformer blocks (attention and FFN), as QLoRA does.

:class:`LoRALinear` replaces an ``nn.Linear`` in place and *shares* its weight and bias
parameters, so the base parameter names (``...q_proj.weight``) stay as they were; the new ones
are ``...q_proj.lora_A`` and ``...q_proj.lora_B``.
"""

from __future__ import annotations

import fnmatch
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmlab.adapt import freeze_base, transformer_blocks, unfreeze_task_heads
from lmlab.adapt.options import TARGET_GROUPS, is_glob, typed_options
from lmlab.arguments import model_argument
from lmlab.errors import LmlabError


class LoRALinear(nn.Linear):
    """``y = x Wᵀ + b + scaling · dropout(x) Aᵀ Bᵀ`` with ``W``, ``b`` frozen and shared with the
    linear layer it replaces. ``merged``: the update currently lives inside ``W``."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float = 0.0):
        nn.Module.__init__(self)  # no new weight: reuse the base layer's parameters
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight, self.bias = base.weight, base.bias
        self.rank, self.alpha, self.scaling = rank, alpha, alpha / rank
        w = base.weight
        self.lora_A = nn.Parameter(torch.empty(rank, self.in_features, device=w.device, dtype=w.dtype))
        self.lora_B = nn.Parameter(torch.zeros(self.out_features, rank, device=w.device, dtype=w.dtype))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))  # as nn.Linear, as the reference code
        self.lora_dropout = nn.Dropout(dropout) if dropout else nn.Identity()
        self.merged = False

    def forward(self, x: Tensor) -> Tensor:
        out = F.linear(x, self.weight, self.bias)
        if self.merged:
            return out
        update = F.linear(F.linear(self.lora_dropout(x), self.lora_A), self.lora_B)
        return out + self.scaling * update

    def delta_weight(self) -> Tensor:
        """``(alpha/r) · B A``, the update in the shape of ``W``."""
        return (self.lora_B @ self.lora_A) * self.scaling

    @torch.no_grad()
    def merge(self) -> None:
        if not self.merged:
            self.weight += self.delta_weight().to(self.weight.dtype)
            self.merged = True

    @torch.no_grad()
    def unmerge(self) -> None:
        if self.merged:
            self.weight -= self.delta_weight().to(self.weight.dtype)
            self.merged = False

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, rank={self.rank}, alpha={self.alpha}"


def _matches(name: str, patterns: list[str]) -> bool:
    """A plain pattern matches the last name component (``q_proj``); one with ``* ? [`` is a glob
    over the full qualified name (``layers.1*.attn.*``)."""
    last = name.rsplit(".", 1)[-1]
    for p in patterns:
        if is_glob(p) and fnmatch.fnmatchcase(name, p):
            return True
        if p == last or p == name:
            return True
    return False


def find_targets(model: nn.Module, target_modules) -> list[tuple[nn.Module, str, nn.Linear]]:
    """``(parent, attribute, linear)`` for every linear layer inside a Transformer block that the
    patterns select (``"all-linear"``, a group from :data:`TARGET_GROUPS`, names or globs). Every
    pattern must select a layer of this model: one that selects none is refused, naming the closest
    of the model's layer names (a name lmlab's blocks never have is refused earlier, by the option's
    type, :mod:`lmlab.adapt.options`)."""
    patterns = [target_modules] if isinstance(target_modules, str) else list(target_modules)
    linears = []  # (parent, attr, linear, qualified name), each layer once
    seen = set()
    for block_name, block in transformer_blocks(model):
        for name, parent in block.named_modules():
            for attr, child in parent.named_children():
                if isinstance(child, nn.Linear) and id(child) not in seen:
                    seen.add(id(child))
                    linears.append((parent, attr, child, ".".join(x for x in (block_name, name, attr) if x)))
    available = sorted({full.rsplit(".", 1)[-1] for *_, full in linears})
    chosen = set()
    for p in patterns:
        expanded = [full for *_, full in linears] if p == "all-linear" else list(TARGET_GROUPS.get(p, (p,)))
        hits = {i for i, (*_, full) in enumerate(linears) if _matches(full, expanded)}
        if not hits:
            from lmlab.config.overrides import suggest

            names = ["all-linear", *TARGET_GROUPS, *available]
            fix = (f"use a glob that matches, or one of: {', '.join(names)}" if is_glob(p)
                   else suggest(p.rsplit(".", 1)[-1], names))
            raise LmlabError(f"LoRA target_modules {p!r} matches no linear layer of this model", fix)
        chosen |= hits
    return [(parent, attr, linear) for i, (parent, attr, linear, _) in enumerate(linears) if i in chosen]


@typed_options("lora")
def apply_lora(
    model: nn.Module,
    rank: int = 8,
    alpha: float = 16.0,
    dropout: float = 0.0,
    target_modules: tuple[str, ...] = ("q_proj", "v_proj"),
    train_head: bool = True,
) -> None:
    """Freeze ``model`` and replace the targeted linear layers by :class:`LoRALinear` (in place).

    ``rank`` r and ``alpha`` give the update scale ``alpha / r``; ``dropout`` applies to the LoRA
    branch's input; ``target_modules``: see :func:`find_targets`; ``train_head`` also trains the
    task head (see :func:`lmlab.adapt.unfreeze_task_heads`).
    """
    # the arguments' kinds and ranges: @typed_options (lmlab.adapt.options), as apply_method's
    targets = find_targets(model, target_modules)
    freeze_base(model)
    for parent, attr, linear in targets:
        if min(linear.in_features, linear.out_features) < rank:
            raise LmlabError(
                f"LoRA rank {rank} exceeds the size of {attr} ({linear.out_features}×{linear.in_features})",
                "choose a smaller rank",
            )
        setattr(parent, attr, LoRALinear(linear, rank, float(alpha), dropout))
    unfreeze_task_heads(model, train_head)


def lora_layers(model: nn.Module) -> list[LoRALinear]:
    return [m for m in model.modules() if isinstance(m, LoRALinear)]


def merge_lora(model: nn.Module, unload: bool = False) -> nn.Module:
    """Fold every LoRA update into its base weight (outputs unchanged up to rounding).

    ``unload=True`` also puts plain ``nn.Linear`` layers back (sharing the merged weights) and drops
    ``model.peft``, leaving an ordinary model that ``model.save()`` writes as a normal checkpoint.
    """
    model = model_argument(model, "merge_lora's model")
    layers = lora_layers(model)
    if not layers:
        raise LmlabError(
            "the model has no LoRA layers to merge", "apply LoRA first (apply_method(model, 'lora'))"
        )
    for layer in layers:
        layer.merge()
    if unload:
        for parent in list(model.modules()):
            for attr, child in list(parent.named_children()):
                if isinstance(child, LoRALinear):
                    plain = nn.Linear(
                        child.in_features, child.out_features, bias=child.bias is not None, device="meta"
                    )
                    plain.weight, plain.bias = child.weight, child.bias
                    setattr(parent, attr, plain)
        if hasattr(model, "peft"):
            del model.peft
    return model


def unmerge_lora(model: nn.Module) -> nn.Module:
    """Subtract the LoRA updates from the base weights again (undoes :func:`merge_lora`)."""
    for layer in lora_layers(model):
        layer.unmerge()
    return model
