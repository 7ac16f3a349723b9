"""Bottleneck adapters: small residual MLPs inserted into each frozen Transformer layer.

An adapter maps the width ``d`` down to a bottleneck ``m ≪ d`` and back, with a residual::

    adapter(h) = h + W_up · act(W_down · h + b_down) + b_up

``W_up`` and ``b_up`` start at zero, so each adapter starts as the identity and the adapted model
starts as the base model exactly ("near-identity initialisation", Houlsby et al. 2019 §2.1).

* ``kind="houlsby"`` (Houlsby et al. 2019, "Parameter-Efficient Transfer Learning for NLP"): two
  adapters per layer, one on the self-attention output and one on the feed-forward output, each
  before the residual sum and layer norm of that sub-layer. The paper also trains the layer
  norms (``train_norms``, on by default for this kind).
* ``kind="pfeiffer"`` (Pfeiffer et al. 2021, "AdapterFusion"): a single adapter per layer, on the
  feed-forward output; half the parameters, about the same accuracy.

The bottleneck is ``bottleneck`` if given, else ``d_model // reduction_factor`` (16 as Pfeiffer;
Houlsby's m = 64 for BERT-base is a factor of 12).

The Transformer code is not edited: each block's ``attn`` / ``ffn`` module is replaced by a thin
wrapper that calls the original module and passes its output through an adapter, so the base
weights move one level down (``layers.0.attn.inner.q_proj.weight``).
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn

from lmlab.adapt import freeze_base, transformer_blocks, unfreeze_task_heads
from lmlab.adapt.options import ADAPTER_KINDS, typed_options
from lmlab.models.blocks import get_activation

KINDS = ADAPTER_KINDS


class BottleneckAdapter(nn.Module):
    """``h + up(act(down(h)))`` with ``up`` initialised to zero (identity at the start)."""

    def __init__(self, d_model: int, bottleneck: int, activation: str = "relu", init_std: float = 1e-2):
        super().__init__()
        self.down = nn.Linear(d_model, bottleneck)
        self.act = get_activation(activation)[0]
        self.up = nn.Linear(bottleneck, d_model)
        nn.init.normal_(self.down.weight, 0.0, init_std)
        nn.init.zeros_(self.down.bias)
        nn.init.zeros_(self.up.weight)
        nn.init.zeros_(self.up.bias)

    def forward(self, h: Tensor) -> Tensor:
        return h + self.up(self.act(self.down(h)))


class AdaptedAttention(nn.Module):
    """Self-attention followed by an adapter on its output (the KV cache passes through)."""

    def __init__(self, inner: nn.Module, adapter: nn.Module):
        super().__init__()
        self.inner, self.adapter = inner, adapter

    def forward(self, x: Tensor, *args, **kwargs):
        out, present = self.inner(x, *args, **kwargs)
        return self.adapter(out), present


class AdaptedFeedForward(nn.Module):
    """The FFN followed by an adapter on its output."""

    def __init__(self, inner: nn.Module, adapter: nn.Module):
        super().__init__()
        self.inner, self.adapter = inner, adapter

    def forward(self, x: Tensor) -> Tensor:
        return self.adapter(self.inner(x))


@typed_options("adapter")
def apply_adapters(
    model: nn.Module,
    kind: str = "houlsby",
    bottleneck: int = 0,
    reduction_factor: int = 16,
    activation: str = "relu",
    train_norms: bool | None = None,
    train_head: bool = True,
) -> None:
    """Freeze ``model`` and insert adapters into every Transformer block (in place).

    ``bottleneck`` 0 means ``d_model // reduction_factor``; ``train_norms`` None means the
    kind's default (houlsby: True, pfeiffer: False).
    """
    d, bottleneck, train_norms = check_adapter_options(model, kind, bottleneck, reduction_factor, activation,
                                                       train_norms)
    insert_adapters(model, kind, lambda: BottleneckAdapter(d, bottleneck, activation), train_norms,
                    train_head)


def check_adapter_options(model: nn.Module, kind: str, bottleneck: int, reduction_factor: int,
                          activation: str, train_norms: bool | None) -> tuple[int, int, bool]:
    """The options shared by every adapter method with their defaults filled in for ``model``:
    ``(d_model, bottleneck, train_norms)``. Their kinds and ranges were checked by the methods'
    ``@typed_options`` (:mod:`lmlab.adapt.options`), before this runs."""
    blocks = transformer_blocks(model)
    d = blocks[0][1].ffn.fc_out.out_features
    if bottleneck == 0:
        bottleneck = max(1, d // reduction_factor)
    if train_norms is None:
        train_norms = kind == "houlsby"
    return d, bottleneck, train_norms


def insert_adapters(model: nn.Module, kind: str, make_adapter: Callable[[], nn.Module], train_norms: bool,
                    train_head: bool) -> None:
    """Freeze ``model`` and wrap every block's FFN (and, for ``houlsby``, its self-attention) with a
    new ``make_adapter()`` module, on the model's device and dtype; the adapters train."""
    blocks = transformer_blocks(model)
    freeze_base(model)
    w = blocks[0][1].ffn.fc_out.weight
    for _, block in blocks:

        def adapter() -> nn.Module:
            return make_adapter().to(device=w.device, dtype=w.dtype)

        if kind == "houlsby":
            block.attn = AdaptedAttention(block.attn, adapter())
        block.ffn = AdaptedFeedForward(block.ffn, adapter())
        if train_norms:
            for norm in (block.attn_norm, block.cross_norm, block.ffn_norm):
                if norm is not None:
                    for p in norm.parameters():
                        p.requires_grad_(True)
    unfreeze_task_heads(model, train_head)


def adapter_modules(model: nn.Module) -> list[BottleneckAdapter]:
    return [m for m in model.modules() if isinstance(m, BottleneckAdapter)]


def adapter_count(model: nn.Module) -> int:
    """Number of adapters in ``model`` (Houlsby: 2 per block, Pfeiffer: 1)."""
    return len(adapter_modules(model))
