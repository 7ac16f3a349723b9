"""Multi-head attention on the fused SDPA kernel (or FlexAttention's block-sparse one), and
:class:`Packing`, the real tokens of a padded batch in one row.

Masks come from :mod:`lmlab.models.attention_masks` (``kernel_mask`` once per forward,
``layer_mask`` per call); this module builds none of its own.
Shapes: ``B`` batch, ``T`` query length, ``S`` key length, ``H`` heads, ``D`` head size.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmlab.errors import LmlabError
from lmlab.models.attention_masks import flex_attention_for, is_block_mask, layer_mask
from lmlab.models.positions import apply_rotary

KVCache = tuple[Tensor, ...]



class Packing:
    """The real tokens of a padded ``[B, T]`` batch laid out as one row ``[1, N, D]`` (N = real tokens).

    Position-wise work (projections, FFN, norms, residuals, dropout) then runs on the N real
    tokens only; :class:`Attention` puts its queries, keys and values back into the padded
    ``[B, H, T, D]`` layout for the kernel (zeros at padding, which the mask hides) and takes its
    output out again. ``queries`` slices elsewhere stay in padded coordinates (``slice(0, 1)`` =
    every sequence's first token); :meth:`take` finds those rows in the packed layout.
    """

    def __init__(self, attention_mask: Tensor):
        self.batch, self.length = attention_mask.shape
        real = attention_mask.reshape(-1).bool()
        self.index = real.nonzero().squeeze(1)  # [N] flat positions b*T + t of the real tokens
        self.where = torch.cumsum(real, 0).sub_(1).masked_fill_(~real, -1).view(self.batch, self.length)

    @staticmethod
    def worth_it(attention_mask: Tensor | None) -> bool:
        """Packing pays when there is padding (and the first tokens are real, for ``take``)."""
        return (
            attention_mask is not None
            and attention_mask.dim() == 2
            and not bool(attention_mask.all())
            and bool(attention_mask[:, 0].all())
        )

    def unpad(self, y: Tensor) -> Tensor:
        """``[B, T, C]`` -> ``[1, N, C]``."""
        return y.reshape(self.batch * self.length, -1)[self.index][None]

    def pad(self, y: Tensor) -> Tensor:
        """``[1, N, C]`` -> ``[B, T, C]`` with zeros at the padded positions."""
        out = y.new_zeros(self.batch * self.length, y.shape[-1]).index_copy(0, self.index, y[0])
        return out.view(self.batch, self.length, -1)

    def take(self, y: Tensor, positions: slice) -> Tensor:
        """The rows of packed ``y`` at padded ``positions`` of every sequence, ``[1, B·k, C]``."""
        rows = self.where[:, positions].reshape(-1)
        if bool((rows < 0).any()):
            raise LmlabError("packed queries must be real tokens", "keep those positions unpadded")
        return y[:, rows]




def projections(
    layers: tuple[nn.Module, ...], x: Tensor, after: Callable[[Tensor], Tensor]
) -> tuple[Tensor, ...]:
    """``after(layer(x))`` for each layer; plain ``nn.Linear`` layers (no hooks, the same bias
    setting) run as ONE matmul over their concatenated weights, then split: one pass over ``x``
    and one larger, more efficient GEMM instead of several, and one gradient for ``x`` instead of
    a sum of several. The parameters (and so the state dict, the optimizer, LoRA's replacement of
    a projection, which then takes the separate path) stay the separate layers'. Only where
    gradients are recorded (training): without them (generation, evaluation) concatenating the
    weights at every call, token by token in decoding, would cost more than it saves."""
    plain = torch.is_grad_enabled() and all(
        type(m) is nn.Linear and not m._forward_hooks and not m._forward_pre_hooks
        and (m.bias is None) == (layers[0].bias is None) for m in layers)
    if not plain:
        return tuple(after(m(x)) for m in layers)
    weight = torch.cat([m.weight for m in layers])
    bias = None if layers[0].bias is None else torch.cat([m.bias for m in layers])
    return after(F.linear(x, weight, bias)).split([m.out_features for m in layers], dim=-1)


class Attention(nn.Module):
    """Multi-head attention ``softmax(q kᵀ · scale + bias) v`` on the fused SDPA kernel.

    Args:
        d_model: width of the residual stream (and of ``context`` for cross-attention unless
            ``d_context`` is given).
        n_heads: query heads. ``n_kv_heads`` (default ``n_heads``) key/value heads; fewer gives
            grouped-query attention (1 = multi-query). ``head_dim`` defaults to ``d_model // n_heads``.
        bias: bias on the q/k/v projections; ``out_bias`` (default ``bias``) on the output one.
        scale: logit scale; None means ``1/sqrt(head_dim)``; T5 uses 1.0.
        dropout: attention-probability dropout (training only).
        cross: keys/values come from ``context`` (the encoder output) instead of ``x``.

    ``forward(x, context=None, mask=None, is_causal=False, position_bias=None, rope=None,
    past_kv=None, use_cache=False) -> (out [B,T,d_model], present_kv or None)``:

    * ``mask``: additive float or boolean (True = attend) tensor broadcastable to ``[B,H,T,S]``.
      Build it with :func:`~lmlab.models.attention_masks.kernel_mask` from a ``MaskSpec``, which
      also tells you when ``is_causal`` suffices (or pass a FlexAttention BlockMask from it).
    * ``position_bias``: additive ``[1|B, H, T, S]`` (T5), summed with ``mask``.
    * ``rope``: ``(cos, sin)`` from :class:`RotaryEmbedding` for the T new positions.
    * ``past_kv``: self-attention: ``(k, v)`` ``[B, n_kv_heads, S_past, D]`` to prepend; the new
      keys/values are appended and returned as ``present_kv`` when ``use_cache``.
      Cross-attention: the precomputed ``(k, v)`` of the context, reused as is (context may be None).
    * ``queries``: a slice of the positions of ``x`` that need an output (default all): keys and
      values still come from every position, but only those queries are projected and attended,
      so the output is ``[B, len(queries), d_model]`` (the last encoder layer under a ``[CLS]``
      classifier needs position 0 only).
    * ``packing``: a :class:`Packing`; ``x`` is then ``[1, N, d_model]``, the real tokens only
      (self-attention), and so is the output (``[1, B·len(queries), d_model]`` with ``queries``).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        head_dim: int | None = None,
        bias: bool = True,
        out_bias: bool | None = None,
        scale: float | None = None,
        dropout: float = 0.0,
        cross: bool = False,
        d_context: int | None = None,
    ):
        super().__init__()
        n_kv_heads = n_kv_heads or n_heads
        if head_dim is None:
            if d_model % n_heads:
                raise LmlabError(
                    f"{n_heads} attention heads do not divide d_model {d_model}",
                    "choose n_heads that divides d_model (or give head_dim)",
                )
            head_dim = d_model // n_heads
        if n_heads % n_kv_heads:
            raise LmlabError(
                f"{n_kv_heads} key/value heads do not divide {n_heads} query heads",
                "choose n_kv_heads that divides n_heads",
            )
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.scale, self.dropout, self.cross = scale, dropout, cross
        d_kv_in = d_context or d_model
        self.q_proj = nn.Linear(d_model, n_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(d_kv_in, n_kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(d_kv_in, n_kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(n_heads * head_dim, d_model, bias=bias if out_bias is None else out_bias)

    def _heads(self, x: Tensor, n: int) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, n, self.head_dim).transpose(1, 2)

    def _project(self, x: Tensor, src: Tensor | None, queries: slice | None, packing: Packing | None,
                 cross_past: KVCache | None) -> tuple[Tensor, Tensor, Tensor]:
        """Queries from ``x`` (only the ``queries`` rows when given), keys and values from ``src``
        (or a cross-attention cache), each ``[B, heads, len, D]`` in the padded layout."""
        unpacked = (lambda y: y) if packing is None else packing.pad
        b = x.shape[0] if packing is None else packing.batch
        if queries is None and not self.cross:  # q, k and v from x: one matmul
            q, k, v = (self._heads(y, n) for y, n in zip(
                projections((self.q_proj, self.k_proj, self.v_proj), x, unpacked),
                (self.n_heads, self.n_kv_heads, self.n_kv_heads)))
            return q, k, v
        if queries is None:
            q = self._heads(self.q_proj(x), self.n_heads)
        else:
            rows = x[:, queries] if packing is None else packing.take(x, queries)
            q = self.q_proj(rows).view(b, -1, self.n_heads, self.head_dim).transpose(1, 2)
        if cross_past is not None:
            return q, cross_past[0], cross_past[1]
        k, v = projections((self.k_proj, self.v_proj), src, unpacked)  # one matmul
        return q, self._heads(k, self.n_kv_heads), self._heads(v, self.n_kv_heads)

    def _output(self, out: Tensor, b: int, queries: slice | None, packing: Packing | None) -> Tensor:
        """``[B, H, T, D]`` kernel output -> ``o_proj`` of ``[B, T, H·D]`` (packed rows with packing)."""
        out = out.transpose(1, 2).reshape(b, out.shape[2], self.n_heads * self.head_dim)
        if packing is not None:
            out = packing.unpad(out) if queries is None else out.reshape(1, -1, out.shape[-1])
        return self.o_proj(out)

    def forward(
        self,
        x: Tensor,
        context: Tensor | None = None,
        mask: Tensor | None = None,
        is_causal: bool = False,
        position_bias: Tensor | None = None,
        rope: tuple[Tensor, Tensor] | None = None,
        past_kv: KVCache | None = None,
        use_cache: bool = False,
        queries: slice | None = None,
        packing: Packing | None = None,
    ) -> tuple[Tensor, KVCache | None]:
        b, t, _ = x.shape
        if packing is not None:
            if self.cross:
                raise LmlabError("packed inputs are for self-attention", "pass packing=None")
            b, t = packing.batch, packing.length
        src = x if not self.cross else context
        if src is None and past_kv is None:
            raise LmlabError("cross-attention needs the encoder output", "pass encoder_outputs or input_ids")
        q, k, v = self._project(x, src, queries, packing, past_kv if self.cross else None)
        if rope is not None:
            q = apply_rotary(q, *(rope if queries is None else (r[:, queries] for r in rope)))
            if not self.cross:
                k = apply_rotary(k, *rope)
        if past_kv is not None and not self.cross:
            k = torch.cat((past_kv[0], k), dim=2)
            v = torch.cat((past_kv[1], v), dim=2)
        present = (k, v) if use_cache else None
        gqa = self.n_kv_heads != self.n_heads
        if is_block_mask(mask):  # packed documents on the block-sparse kernel (attention_masks.py)
            if position_bias is not None or queries is not None or past_kv is not None:
                raise LmlabError("a block-sparse mask serves whole sequences without position bias",
                                 "use the dense mask (attention backend sdpa) here")
            out = flex_attention_for(q.device)(q, k, v, block_mask=mask, scale=self.scale, enable_gqa=gqa)
            return self._output(out, b, None, packing), present
        mask, is_causal = layer_mask(mask, is_causal, t, k.shape[2], queries=queries,
                                     position_bias=position_bias, dtype=q.dtype, device=x.device)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=self.scale,
                                             dropout_p=self.dropout if self.training else 0.0, enable_gqa=gqa)
        return self._output(out, b, queries, packing), present
