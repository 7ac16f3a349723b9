"""Transformer-XL: a segment-recurrent decoder with relative positional encoding.

Dai et al. 2019, "Transformer-XL: Attentive language models beyond a fixed-length context".
A long text is read in consecutive segments of ``T`` tokens. Each layer keeps a *memory*: its
input hidden states for the last ``mem_len`` tokens of the previous segments, with the gradient
stopped (``SG(h^{n-1}_{τ})``, eq. 2). The layer's keys and values come from ``[memory; segment]``,
its queries from the segment, so the context grows by ``mem_len`` tokens per layer while the
cost per segment stays fixed.

Absolute positions would be ambiguous across segments (position 0 of every segment would look
the same), so attention scores use *relative* positions (eq. 3-4)::

    score(i, j) = q_iᵀ k_j + q_iᵀ W_R R_{i-j} + uᵀ k_j + vᵀ W_R R_{i-j}
                = (q_i + u)ᵀ k_j + (q_i + v)ᵀ W_R R_{i-j}

with ``R`` the sinusoidal table of distances, ``W_R`` a learned projection and ``u``, ``v``
learned per-head biases ("content" and "position" bias). The first term goes through the fused
attention kernel with ``q + u``; the position term is computed once per distance
(``(q + v)·W_R R_d`` for every ``d``) and gathered into an additive bias (the paper's "relative
shift" trick in gather form). Blocks are pre-norm (norm of ``[memory; segment]``) with the
shared FFN and norms of ``models/blocks.py``.

``forward(input_ids, mems=None, mask=None)`` returns the LM logits and, in ``extra["mems"]``, the
new per-layer memories (detached) to pass with the next segment; ``backbone(input_ids, mems, mask)``
the hidden states and memories. The mask is one :class:`~lmlab.models.attention_masks.MaskSpec`
(causal, packed documents over memory + segment keys) that
:func:`~lmlab.models.attention_masks.segment_pattern` builds.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmlab.deprecation import warn_deprecated
from lmlab.errors import LmlabError
from lmlab.losses import causal_lm_loss, warn_labels_in_forward
from lmlab.models.attention_masks import MaskSpec, fold_into_bias, segment_pattern
from lmlab.models.blocks import FeedForward, SinusoidalPositions, init_weights, make_norm
from lmlab.models.checkpoint import LmlabModel
from lmlab.models.heads import LMHead, check_heads
from lmlab.models.output import ModelOutput
from lmlab.models.transformer_xl.config import TransfoXLConfig, transfo_xl_tiny  # noqa: F401

Memory = tuple[Tensor, ...]


class RelativeAttention(nn.Module):
    """Multi-head attention with Transformer-XL relative positions (see the module docstring)."""

    def __init__(self, cfg: TransfoXLConfig):
        super().__init__()
        self.n_heads, self.head_dim = cfg.n_heads, cfg.dim_head
        inner = self.n_heads * self.head_dim
        self.q_proj = nn.Linear(cfg.d_model, inner, bias=cfg.attn_bias)
        self.k_proj = nn.Linear(cfg.d_model, inner, bias=cfg.attn_bias)
        self.v_proj = nn.Linear(cfg.d_model, inner, bias=cfg.attn_bias)
        self.r_proj = nn.Linear(cfg.d_model, inner, bias=False)  # W_R
        self.o_proj = nn.Linear(inner, cfg.d_model, bias=cfg.attn_bias)
        self.u = nn.Parameter(torch.zeros(self.n_heads, self.head_dim))  # content bias
        self.v = nn.Parameter(torch.zeros(self.n_heads, self.head_dim))  # position bias
        self.scale = cfg.attn_scale if cfg.attn_scale is not None else 1.0 / math.sqrt(self.head_dim)
        self.dropout = cfg.attn_dropout

    def forward(
        self, x: Tensor, context: Tensor, distances: Tensor, table: Tensor, allowed: Tensor
    ) -> Tensor:
        """``x`` [B,T,d] queries; ``context`` [B,S,d] = [memory; x]; ``distances`` [T,S] = i - j
        (clamped to >= 0); ``table`` [L,d] sinusoids of distances 0..L-1; ``allowed`` [B,1,T,S]."""
        b, t, _ = x.shape
        s = context.shape[1]
        h, d = self.n_heads, self.head_dim
        q = self.q_proj(x).view(b, t, h, d).transpose(1, 2)
        k = self.k_proj(context).view(b, s, h, d).transpose(1, 2)
        v = self.v_proj(context).view(b, s, h, d).transpose(1, 2)
        r = self.r_proj(table).view(-1, h, d).transpose(0, 1)  # [H, L, D]
        pos = torch.matmul(q + self.v[None, :, None], r.transpose(1, 2)[None])  # [B, H, T, L]
        pos = pos.gather(-1, distances[None, None].expand(b, h, t, s))  # [B, H, T, S]
        bias = fold_into_bias(pos * self.scale, allowed)
        out = F.scaled_dot_product_attention(
            q + self.u[None, :, None],
            k,
            v,
            attn_mask=bias,
            scale=self.scale,
            dropout_p=self.dropout if self.training else 0.0,
        )
        return self.o_proj(out.transpose(1, 2).reshape(b, t, h * d))


class TransfoXLBlock(nn.Module):
    """Pre-norm layer: ``x += attn(norm([mem; x]))``, then ``x += ffn(norm(x))``."""

    def __init__(self, cfg: TransfoXLConfig):
        super().__init__()
        self.attn_norm = make_norm(cfg.norm, cfg.d_model, cfg.norm_eps, cfg.norm_bias)
        self.attn = RelativeAttention(cfg)
        self.ffn_norm = make_norm(cfg.norm, cfg.d_model, cfg.norm_eps, cfg.norm_bias)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.activation, cfg.mlp_bias)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(
        self, x: Tensor, mem: Tensor | None, distances: Tensor, table: Tensor, allowed: Tensor
    ) -> Tensor:
        t = x.shape[1]
        context = self.attn_norm(x if mem is None else torch.cat([mem, x], dim=1))
        x = x + self.drop(self.attn(context[:, -t:], context, distances, table, allowed))
        return x + self.drop(self.ffn(self.ffn_norm(x)))


class TransfoXLModel(LmlabModel):
    """Transformer-XL decoder with a tied ``lm`` head (``heads=()``: the bare network)."""

    architecture = "transfo-xl"
    config_class = TransfoXLConfig
    example_preset = "transfo-xl-tiny"

    def __init__(self, config: TransfoXLConfig, heads: tuple[str, ...] | list[str] | None = None):
        super().__init__(config)
        cfg = config
        self.head_names = check_heads(("lm",) if heads is None else heads, ("lm",), "transfo-xl")
        self.tok_embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.distance_table = SinusoidalPositions(cfg.max_positions + cfg.mem_len, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleList(TransfoXLBlock(cfg) for _ in range(cfg.n_layers))
        self.final_norm = make_norm(cfg.norm, cfg.d_model, cfg.norm_eps, cfg.norm_bias)
        self.heads = nn.ModuleDict(
            {"lm": LMHead(cfg.d_model, cfg.vocab_size)} if "lm" in self.head_names else {}
        )
        self.apply(lambda m: init_weights(m, cfg.init_std))
        for block in self.layers:
            for lin in (block.attn.o_proj, block.ffn.fc_out):
                nn.init.normal_(lin.weight, 0.0, cfg.init_std / math.sqrt(2 * cfg.n_layers))
        if "lm" in self.heads and cfg.tie_embeddings:
            self.heads["lm"].proj.weight = self.tok_embed.weight

    def backbone(self, input_ids: Tensor, mems: Memory | None = None,
                 mask: MaskSpec | None = None) -> tuple[Tensor, Memory]:
        """One segment's final hidden states ``[B, T, D]`` and the new per-layer memories.
        ``mems``: per-layer ``[B, M, d]`` from the previous segment (or None); ``mask``: one
        :class:`~lmlab.models.attention_masks.MaskSpec` over memory + segment keys (None: causal;
        ``doc_ids`` ``[B, M + T]``: attention stays inside each document; or a ``[B, T, M + T]``
        pattern), turned into the mask by :func:`~lmlab.models.attention_masks.segment_pattern`."""
        x, _, new_mems = self._run(input_ids, mems, mask)
        return x, new_mems

    def _run(self, input_ids: Tensor, mems: Memory | None, mask: MaskSpec | None,
             output_hidden_states: bool = False):
        cfg = self.config
        self.check_input_ids(input_ids)
        b, t = input_ids.shape
        if t > cfg.max_positions:
            raise LmlabError(
                f"segment of {t} tokens is longer than the model's {cfg.max_positions}",
                "use shorter segments (objective segment_len) or raise max_positions",
            )
        if mems is not None and len(mems) != cfg.n_layers:
            raise LmlabError(
                f"mems has {len(mems)} layers, the model {cfg.n_layers}", "pass the mems this model returned"
            )
        m = 0 if mems is None else mems[0].shape[1]
        _check_mask(mask, b, t, m)
        dev = input_ids.device
        allowed = segment_pattern(mask, t, m + t, b, dev)
        distances = (torch.arange(t, device=dev)[:, None] + m - torch.arange(m + t, device=dev)[None, :])
        distances = distances.clamp(min=0)
        table = self.distance_table.table[: m + t].to(self.tok_embed.weight.dtype)
        x = self.drop(self.tok_embed(input_ids))
        inputs, hidden = [], [x] if output_hidden_states else None
        for n, block in enumerate(self.layers):
            inputs.append(x)
            x = block(x, None if mems is None else mems[n], distances, table, allowed)
            if hidden is not None:
                hidden.append(x)
        x = self.final_norm(x)
        if hidden is not None:
            hidden[-1] = x
        new_mems = tuple(
            self._update_memory(None if mems is None else mems[n], h) for n, h in enumerate(inputs)
        )
        return x, tuple(hidden) if hidden else None, new_mems

    def forward(self, input_ids: Tensor, mems: Memory | None = None, mask: MaskSpec | None = None,
                labels: Tensor | None = None, output_hidden_states: bool = False,
                **deprecated) -> ModelOutput:  # other keywords are ignored, as before
        """One segment (see :meth:`backbone`): the LM logits, and the new memories in
        ``extra["mems"]``. ``attention_pattern=`` (``[B, T, M + T]``) and ``labels=`` (``[B, T]``,
        the next-token loss inside the segment) still work for one release, with a
        DeprecationWarning."""
        pattern = deprecated.pop("attention_pattern", None)
        if pattern is not None:
            warn_deprecated("TransfoXLModel(attention_pattern=...)",
                            "pass mask=MaskSpec(causal=True, doc_ids=...) or MaskSpec(pattern=...)")
            mask = MaskSpec(pattern=pattern)
        x, hidden, new_mems = self._run(input_ids, mems, mask, output_hidden_states)
        out = ModelOutput(last_hidden_state=x, hidden_states=hidden, extra={"mems": new_mems})
        if "lm" in self.heads:
            out.logits = self.heads["lm"](x)
            if labels is not None:
                warn_labels_in_forward("TransfoXLModel")
                out.loss = causal_lm_loss(out.logits, labels)
        return out

    def _update_memory(self, mem: Tensor | None, h: Tensor) -> Tensor:
        """The last ``mem_len`` layer inputs of memory + segment, with the gradient stopped."""
        cat = h if mem is None else torch.cat([mem, h], dim=1)
        return cat[:, max(0, cat.shape[1] - self.config.mem_len) :].detach()


def _check_mask(mask: MaskSpec | None, b: int, t: int, m: int) -> None:
    """A pattern covers memory + segment keys, ``[B, T, M + T]``; ``doc_ids`` one per key."""
    if mask is not None and mask.pattern is not None and mask.pattern.shape != (b, t, m + t):
        raise LmlabError(f"attention_pattern must be [batch, T, M+T] = {(b, t, m + t)}, "
                         f"got {tuple(mask.pattern.shape)}", "include one column per memory token")
    if mask is not None and mask.doc_ids is not None and mask.doc_ids.shape != (b, m + t):
        raise LmlabError(f"doc_ids must be [batch, M+T] = {(b, m + t)}, got {tuple(mask.doc_ids.shape)}",
                         "give one document id per memory and segment token")
