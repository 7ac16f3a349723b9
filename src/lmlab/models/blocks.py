"""The Transformer building blocks every lmlab model is assembled from.

One core, many models: BERT, GPT-2, Llama, T5 and BART differ only in which of these pieces they
use and how the attention mask is chosen (Vaswani et al. 2017, "Attention is all you need";
lecture 2, "Transformer building blocks").

* :class:`Attention` - multi-head scaled dot-product attention ``softmax(q·kᵀ·scale + bias) v``
  through ``torch.nn.functional.scaled_dot_product_attention`` (the fused kernel). Self- or
  cross-attention, grouped-query heads (several query heads share one key/value head, Ainslie et
  al. 2023), an additive bias (masks, T5 relative positions), rotary positions and a KV cache.
* masks - :func:`attention_bias` turns a padding mask and a mask kind (bidirectional, causal,
  prefix) into what the kernel needs, and returns ``None`` when the kernel's own ``is_causal``
  path (or no mask at all) does the job, which is the fast case.
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

Shapes: ``B`` batch, ``T`` query length, ``S`` key length, ``H`` heads, ``D`` head size.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmlab.errors import LmlabError
from lmlab.models.attention_masks import causal_mask, flex_attention_for, is_block_mask

KVCache = tuple[Tensor, ...]

# ----------------------------------------------------------------------------- activations


def gelu_new(x: Tensor) -> Tensor:
    """GELU with the tanh approximation used by GPT-2, ALBERT and T5 v1.1 ("gelu_new")."""
    return F.gelu(x, approximate="tanh")


#: activation name -> (function, gated). Gated ones are GLU variants (Shazeer 2020).
ACTIVATIONS: dict[str, tuple[Callable[[Tensor], Tensor], bool]] = {
    "relu": (F.relu, False),
    "gelu": (F.gelu, False),
    "gelu_new": (gelu_new, False),
    "gelu_tanh": (gelu_new, False),
    "gelu_pytorch_tanh": (gelu_new, False),
    "silu": (F.silu, False),
    "swish": (F.silu, False),
    "tanh": (torch.tanh, False),
    "swiglu": (F.silu, True),
    "geglu": (F.gelu, True),
    "gated-gelu": (gelu_new, True),
    "reglu": (F.relu, True),
}


def get_activation(name: str) -> tuple[Callable[[Tensor], Tensor], bool]:
    """``(function, gated)`` for an activation name; unknown names are a one-line LmlabError."""
    if name not in ACTIVATIONS:
        raise LmlabError(f"unknown activation {name!r}", f"choose one of: {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name]


# ----------------------------------------------------------------------------- norms


class LayerNorm(nn.LayerNorm):
    """``γ (x - mean) / sqrt(var + eps) + β`` over the last dimension (Ba et al. 2016); ``bias=False``
    drops β."""

    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = True):
        super().__init__(dim, eps=eps, bias=bias)


class RMSNorm(nn.Module):
    """``γ x / sqrt(mean(x²) + eps)``: no centring, no β (Zhang & Sennrich 2019; Llama, T5).

    Computed in float32 and cast back, as Llama and T5 do, so half-precision runs stay stable.
    """

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def make_norm(kind: str, dim: int, eps: float, bias: bool = True) -> nn.Module:
    """``"layernorm"`` or ``"rmsnorm"``."""
    if kind == "layernorm":
        return LayerNorm(dim, eps, bias)
    if kind == "rmsnorm":
        return RMSNorm(dim, eps)
    raise LmlabError(f"unknown norm {kind!r}", "use 'layernorm' or 'rmsnorm'")


# ----------------------------------------------------------------------------- positions


class SinusoidalPositions(nn.Module):
    """Fixed sinusoidal positions (Vaswani et al. 2017): ``PE[p, 2i] = sin(p / 10000^(2i/d))``,
    ``PE[p, 2i+1] = cos(...)``. Not a parameter; ``forward(position_ids) -> [.., d]``."""

    def __init__(self, max_positions: int, dim: int, base: float = 10000.0):
        super().__init__()
        pos = torch.arange(max_positions, dtype=torch.float32)[:, None]
        inv = torch.exp(-math.log(base) * torch.arange(0, dim, 2, dtype=torch.float32) / dim)
        table = torch.zeros(max_positions, dim)
        table[:, 0::2] = torch.sin(pos * inv)
        table[:, 1::2] = torch.cos(pos * inv)[:, : dim // 2]
        self.register_buffer("table", table, persistent=False)

    def forward(self, position_ids: Tensor) -> Tensor:
        return self.table[position_ids]


class RotaryEmbedding(nn.Module):
    """Rotary position embedding, RoPE (Su et al. 2021), in the "rotate half" layout of Llama.

    Pairs ``(x_i, x_{i+D/2})`` of each query and key are rotated by the angle ``p·θ_i`` with
    ``θ_i = base^(-2i/D)``, so ``q_p·k_r`` depends only on ``p - r``. ``forward(position_ids)``
    returns ``(cos, sin)`` of shape ``[B|1, T, D]``; :func:`apply_rotary` applies them.
    """

    def __init__(self, head_dim: int, base: float = 10000.0):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, position_ids: Tensor) -> tuple[Tensor, Tensor]:
        if position_ids.dim() == 1:
            position_ids = position_ids[None]
        freqs = position_ids[..., None].float() * self.inv_freq  # [B, T, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()


def rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate ``x`` ``[B, H, T, D]`` by the angles in ``cos``/``sin`` ``[B|1, T, D]``."""
    cos, sin = cos[:, None].to(x.dtype), sin[:, None].to(x.dtype)
    return x * cos + rotate_half(x) * sin


def relative_position_bucket(
    relative_position: Tensor, bidirectional: bool = True, num_buckets: int = 32, max_distance: int = 128
) -> Tensor:
    """T5's bucketing of ``key_pos - query_pos`` (Raffel et al. 2020, appendix / mesh-tensorflow).

    Half the buckets (per direction when bidirectional) hold exact small distances; the rest
    cover distances up to ``max_distance`` logarithmically; longer distances share the last bucket.
    Decoders (``bidirectional=False``) only look back, so future offsets all map to bucket 0.
    """
    buckets = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative_position > 0).long() * num_buckets
        distance = relative_position.abs()
    else:
        distance = -torch.clamp(relative_position, max=0)
    max_exact = num_buckets // 2
    is_small = distance < max_exact
    log_ratio = torch.log(distance.float().clamp(min=1) / max_exact) / math.log(max_distance / max_exact)
    large = max_exact + (log_ratio * (num_buckets - max_exact)).long()
    large = torch.clamp(large, max=num_buckets - 1)
    return buckets + torch.where(is_small, distance, large)


class RelativePositionBias(nn.Module):
    """T5 relative attention bias: one learned scalar per (bucket, head), added to the logits.

    ``forward(q_len, k_len)`` returns ``[1, H, T, S]``; with a KV cache pass ``q_offset`` = number
    of past positions so the new queries get their true positions.
    """

    def __init__(
        self, n_heads: int, num_buckets: int = 32, max_distance: int = 128, bidirectional: bool = True
    ):
        super().__init__()
        self.num_buckets, self.max_distance, self.bidirectional = num_buckets, max_distance, bidirectional
        self.embedding = nn.Embedding(num_buckets, n_heads)

    def forward(self, q_len: int, k_len: int, q_offset: int = 0, device=None) -> Tensor:
        device = device or self.embedding.weight.device
        q = torch.arange(q_offset, q_offset + q_len, device=device)[:, None]
        k = torch.arange(k_len, device=device)[None, :]
        buckets = relative_position_bucket(k - q, self.bidirectional, self.num_buckets, self.max_distance)
        # contiguous: every layer adds it to its scores, and a broadcast add reading the strided
        # permuted view was three times slower than this one copy
        return self.embedding(buckets).permute(2, 0, 1).contiguous()[None]


# ----------------------------------------------------------------------------- packing


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


# ----------------------------------------------------------------------------- attention


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
      Build it with :func:`attention_bias`, which also tells you when ``is_causal`` suffices.
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
        unpacked = (lambda y: y) if packing is None else packing.pad
        if packing is not None:
            if self.cross:
                raise LmlabError("packed inputs are for self-attention", "pass packing=None")
            b, t = packing.batch, packing.length
        src = x if not self.cross else context
        if src is None and past_kv is None:
            raise LmlabError("cross-attention needs the encoder output", "pass encoder_outputs or input_ids")
        if queries is None and not self.cross:  # q, k and v from x: one matmul
            q, k, v = (self._heads(y, n) for y, n in zip(
                projections((self.q_proj, self.k_proj, self.v_proj), x, unpacked),
                (self.n_heads, self.n_kv_heads, self.n_kv_heads)))
        else:
            if queries is None:
                q = self._heads(self.q_proj(x), self.n_heads)
            else:
                rows = x[:, queries] if packing is None else packing.take(x, queries)
                q = self.q_proj(rows).view(b, -1, self.n_heads, self.head_dim).transpose(1, 2)
            if self.cross and past_kv is not None:
                k, v = past_kv[0], past_kv[1]
            else:  # k and v from src: one matmul
                k, v = (self._heads(y, self.n_kv_heads)
                        for y in projections((self.k_proj, self.v_proj), src, unpacked))
        if rope is not None:
            q = apply_rotary(q, *(rope if queries is None else (r[:, queries] for r in rope)))
            if not self.cross:
                k = apply_rotary(k, *rope)
        if past_kv is not None and not self.cross:
            k = torch.cat((past_kv[0], k), dim=2)
            v = torch.cat((past_kv[1], v), dim=2)
        present = (k, v) if use_cache else None

        if is_block_mask(mask):  # packed documents on the block-sparse kernel (attention_masks.py)
            if position_bias is not None or queries is not None or past_kv is not None:
                raise LmlabError("a block-sparse mask serves whole sequences without position bias",
                                 "use the dense mask (attention backend sdpa) here")
            out = flex_attention_for(q.device)(q, k, v, block_mask=mask, scale=self.scale,
                                               enable_gqa=self.n_kv_heads != self.n_heads)
            out = out.transpose(1, 2).reshape(b, q.shape[2], self.n_heads * self.head_dim)
            if packing is not None:
                out = packing.unpad(out)
            return self.o_proj(out), present
        s = k.shape[2]
        if is_causal and (s != t or queries is not None):
            # Cached decoding: new queries see all the past; SDPA's is_causal aligns top-left.
            # A subset of the queries: an explicit mask, cut to their rows below.
            mask = None if t == 1 else causal_mask(t, s, x.device)
            is_causal = False
        if position_bias is not None:
            if mask is not None and mask.dtype == torch.bool:
                mask = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill_(
                    ~mask, torch.finfo(q.dtype).min
                )
            mask = position_bias if mask is None else position_bias + mask
            if is_causal:  # fold causality into the bias: the kernel takes one or the other
                mask = mask.masked_fill(~causal_mask(t, s, x.device), torch.finfo(q.dtype).min)
                is_causal = False
        if mask is not None and mask.dtype != torch.bool:
            mask = mask.to(q.dtype)
        if queries is not None and mask is not None and mask.shape[-2] != 1:
            mask = mask[..., queries, :]  # the rows of the queries kept
        out = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            is_causal=is_causal,
            scale=self.scale,
            dropout_p=self.dropout if self.training else 0.0,
            enable_gqa=self.n_kv_heads != self.n_heads,
        )
        out = out.transpose(1, 2).reshape(b, q.shape[2], self.n_heads * self.head_dim)
        if packing is not None:
            out = packing.unpad(out) if queries is None else out.reshape(1, -1, out.shape[-1])
        return self.o_proj(out), present


# ----------------------------------------------------------------------------- feed-forward


class FeedForward(nn.Module):
    """Position-wise FFN: ``fc_out(act(fc_in(x)))``, or gated ``fc_out(act(fc_gate(x)) * fc_in(x))``.

    ``activation`` is a name from :data:`ACTIVATIONS`; ``swiglu`` (Llama), ``geglu`` and
    ``gated-gelu`` (T5 v1.1) are the gated ones. ``dropout`` (default 0) applies after the
    activation, as T5 does; the residual dropout belongs to :class:`TransformerBlock`.
    """

    def __init__(
        self, d_model: int, d_ff: int, activation: str = "gelu", bias: bool = True, dropout: float = 0.0
    ):
        super().__init__()
        self.act, gated = get_activation(activation)
        self.fc_gate = nn.Linear(d_model, d_ff, bias=bias) if gated else None
        self.fc_in = nn.Linear(d_model, d_ff, bias=bias)
        self.fc_out = nn.Linear(d_ff, d_model, bias=bias)
        self.drop = nn.Dropout(dropout) if dropout else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        if self.fc_gate is not None:
            h = self.act(self.fc_gate(x)) * self.fc_in(x)
        else:
            h = self.act(self.fc_in(x))
        return self.fc_out(self.drop(h))


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
