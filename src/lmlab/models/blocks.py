"""The Transformer building blocks every lmlab model is assembled from.

One core, many models: BERT, GPT-2, Llama, T5 and BART differ only in which of these pieces they
use and how the attention mask is chosen (Vaswani et al. 2017, "Attention is all you need";
lecture 2, "Transformer building blocks").

* :class:`Attention` - multi-head scaled dot-product attention ``softmax(q·kᵀ·scale + bias) v``
  through ``torch.nn.functional.scaled_dot_product_attention`` (the fused kernel). Self- or
  cross-attention, grouped-query heads (several query heads share one key/value head, Ainslie et
  al. 2023), an additive bias (masks, T5 relative positions), rotary positions and a KV cache.
* masks - :mod:`lmlab.models.attention_masks` (one :class:`MaskSpec`, one ``kernel_mask``).
* :class:`LayerNorm` ``γ(x-μ)/σ+β`` and :class:`RMSNorm` ``γ x / rms(x)`` (Zhang & Sennrich 2019).
* :class:`FeedForward` ``act(x W1) W2`` or gated ``(act(x Wg) ⊙ x W1) W2`` (SwiGLU, GEGLU;
  Shazeer 2020).
* :class:`TransformerBlock` - attention (+ optional cross-attention) + FFN with residuals, in
  post-norm (BERT, BART: ``x = norm(x + f(x))``) or pre-norm (GPT-2, Llama, T5:
  ``x = x + f(norm(x))``) arrangement.
* :class:`Packing` - the real tokens of a padded batch in one row, so position-wise work skips
  the padding (attention puts them back into the padded layout).
* positions - :class:`SinusoidalPositions`, learned absolute (a plain ``nn.Embedding``),
  :class:`RelativePositionBias` (T5 buckets, Raffel et al. 2020) and :class:`RotaryEmbedding`
  (RoPE, Su et al. 2021).

Each job has its module (``attention``, ``feedforward``, ``norms``, ``positions``); this one
assembles them into :class:`TransformerBlock` and re-exports their names.

Shapes: ``B`` batch, ``T`` query length, ``S`` key length, ``H`` heads, ``D`` head size.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from lmlab.errors import LmlabError
from lmlab.models.attention import Attention, KVCache, Packing, projections
from lmlab.models.feedforward import ACTIVATIONS, FeedForward, gelu_new, get_activation
from lmlab.models.norms import LayerNorm, RMSNorm, make_norm
from lmlab.models.positions import (
    RelativePositionBias,
    RotaryEmbedding,
    SinusoidalPositions,
    apply_rotary,
    relative_position_bucket,
    rotate_half,
)

__all__ = [
    "ACTIVATIONS", "Attention", "FeedForward", "KVCache", "LayerNorm", "Packing", "RMSNorm",
    "RelativePositionBias", "RotaryEmbedding", "SinusoidalPositions", "TransformerBlock", "apply_rotary",
    "gelu_new", "get_activation", "init_weights", "make_norm", "projections", "relative_position_bucket",
    "rotate_half",
]

# ----------------------------------------------------------------------------- block


class TransformerBlock(nn.Module):
    """One Transformer layer: self-attention, optional cross-attention, FFN, each with a residual.

    ``cfg`` is a :class:`lmlab.models.config.TransformerConfig` (or anything with its fields:
    ``d_model n_heads n_kv_heads head_dim d_ff activation norm norm_eps norm_bias prenorm
    attn_bias mlp_bias attn_scale dropout attn_dropout``).

    * post-norm (``prenorm=False``; BERT, BART): ``x = norm(x + drop(f(x)))``
    * pre-norm (``prenorm=True``; GPT-2, Llama, T5): ``x = x + drop(f(norm(x)))``; the model then
      applies one final norm after the last block.

    ``forward(x, mask=None, is_causal=False, position_bias=None, rope=None, past_kv=None,
    use_cache=False, context=None, context_mask=None, context_position_bias=None, queries=None)``
    returns ``(x, present)`` where ``present`` is ``(k, v)`` or, with cross-attention,
    ``(k, v, cross_k, cross_v)`` (when ``use_cache``), and ``past_kv`` has the same layout.
    ``queries`` (a slice of positions) computes the layer's output at those positions only: the
    self-attention still reads keys and values from all of ``x``, everything after it (residual,
    norms, cross-attention, FFN) runs on the kept positions, and ``x`` comes back
    ``[B, len(queries), d_model]``. Exactly the rows the full layer would give there.
    ``packing`` (a :class:`Packing`, self-attention only): ``x`` holds the real tokens only,
    ``[1, N, d_model]``, and comes back so (``[1, B·len(queries), d_model]`` with ``queries``).
    """

    def __init__(self, cfg, cross_attention: bool = False):
        super().__init__()
        self.prenorm = cfg.prenorm
        norm_bias = getattr(cfg, "norm_bias", True)

        def attention(cross: bool) -> Attention:
            return Attention(
                cfg.d_model,
                cfg.n_heads,
                None if cross else cfg.n_kv_heads,
                cfg.head_dim,
                bias=cfg.attn_bias,
                scale=cfg.attn_scale,
                dropout=cfg.attn_dropout,
                cross=cross,
            )

        self.attn = attention(False)
        self.attn_norm = make_norm(cfg.norm, cfg.d_model, cfg.norm_eps, norm_bias)
        self.cross_attn = attention(True) if cross_attention else None
        self.cross_norm = (
            make_norm(cfg.norm, cfg.d_model, cfg.norm_eps, norm_bias) if cross_attention else None
        )
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.activation, cfg.mlp_bias)
        self.ffn_norm = make_norm(cfg.norm, cfg.d_model, cfg.norm_eps, norm_bias)
        self.drop = nn.Dropout(cfg.dropout)

    def _residual(
        self,
        x: Tensor,
        norm: nn.Module,
        fn: Callable[[Tensor], tuple[Tensor, KVCache | None]],
        queries: slice | None = None,
        packing: Packing | None = None,
    ):
        """Sub-layer ``fn`` with its residual; ``queries``: ``fn`` returns only those positions."""
        if queries is None:
            kept = x
        else:
            kept = x[:, queries] if packing is None else packing.take(x, queries)
        if self.prenorm:
            out, present = fn(norm(x))
            return kept + self.drop(out), present
        out, present = fn(x)
        return norm(kept + self.drop(out)), present

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        is_causal: bool = False,
        position_bias: Tensor | None = None,
        rope: tuple[Tensor, Tensor] | None = None,
        past_kv: KVCache | None = None,
        use_cache: bool = False,
        context: Tensor | None = None,
        context_mask: Tensor | None = None,
        context_position_bias: Tensor | None = None,
        queries: slice | None = None,
        packing: Packing | None = None,
    ) -> tuple[Tensor, KVCache | None]:
        if packing is not None and self.cross_attn is not None:
            raise LmlabError("packed inputs are for encoder blocks", "pass packing=None")
        self_past = None if past_kv is None else past_kv[:2]
        x, present = self._residual(
            x,
            self.attn_norm,
            lambda h: self.attn(
                h,
                mask=mask,
                is_causal=is_causal,
                position_bias=position_bias,
                rope=rope,
                past_kv=self_past,
                use_cache=use_cache,
                queries=queries,
                packing=packing,
            ),
            queries,
            packing,
        )
        if self.cross_attn is not None:
            cross_past = None if past_kv is None or len(past_kv) < 4 else past_kv[2:]
            x, cross_present = self._residual(
                x,
                self.cross_norm,
                lambda h: self.cross_attn(
                    h,
                    context=context,
                    mask=context_mask,
                    position_bias=context_position_bias,
                    past_kv=cross_past,
                    use_cache=use_cache,
                ),
            )
            if use_cache:
                present = present + cross_present
        x, _ = self._residual(x, self.ffn_norm, lambda h: (self.ffn(h), None))
        return x, present


# ----------------------------------------------------------------------------- init


def init_weights(module: nn.Module, std: float = 0.02) -> None:
    """BERT/GPT-2 initialisation: N(0, std) for Linear and Embedding weights, zero biases,
    unit norm gains. Apply with ``model.apply(lambda m: init_weights(m, std))``."""
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, 0.0, std)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, 0.0, std)
        if module.padding_idx is not None:
            with torch.no_grad():
                module.weight[module.padding_idx].zero_()
    elif isinstance(module, (nn.LayerNorm, RMSNorm)):
        if module.weight is not None:
            nn.init.ones_(module.weight)
        if getattr(module, "bias", None) is not None:
            nn.init.zeros_(module.bias)
