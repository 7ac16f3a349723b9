"""XLNet: a Transformer with two-stream self-attention for permutation language modelling.

Yang et al. 2019, "XLNet: Generalized autoregressive pretraining for language understanding".
A permutation LM predicts token ``x_{z_t}`` from the tokens earlier in a sampled factorization
order ``z``. A plain Transformer cannot do that: the hidden state at position ``z_t`` would have
to both *hide* its own token (to predict it) and *show* it (as context for later tokens). XLNet
keeps two streams with the same weights:

* the **content stream** ``h_i``: starts from the token embedding and may attend to the content
  of every token at or before ``i`` in the order (itself included), exactly like an ordinary
  Transformer under a permuted causal mask;
* the **query stream** ``g_i``: starts from a learned vector ``w`` (no token content) and at
  every layer attends to the *content* stream of the tokens strictly before ``i`` in the order;
  it knows the position of ``i`` (through the positional encoding) but never its token. The LM
  head reads ``g`` to predict the targets.

How it is built from the shared blocks (``models/blocks.py``): one :class:`TransformerBlock` per
layer runs over the concatenation ``[h; g]`` (``T + P`` rows for ``P`` targets) with one boolean
mask: content rows see content keys through the content pattern, query rows see content keys
through the query pattern, and no row ever sees a query-stream key. Norms and the FFN are
position-wise, so the two streams share every parameter as in the paper. Positions are rotary
by default (a relative encoding, like XLNet's Transformer-XL positions: ``q_i·k_j`` depends on
``i - j`` only), so the query stream learns "where" from the rotation of its queries; learned
or sinusoidal absolute positions are the alternative (added to both streams' inputs).

Without ``target_positions`` the model is a bidirectional encoder over the content stream
(``attention_pattern`` defaults to all-visible): that is how it is used after pretraining.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lmlab.errors import LmlabError
from lmlab.losses import token_loss
from lmlab.models.attention_masks import MaskSpec, kernel_mask
from lmlab.models.blocks import (
    RotaryEmbedding,
    SinusoidalPositions,
    TransformerBlock,
    init_weights,
    make_norm,
)
from lmlab.models.checkpoint import LmlabModel
from lmlab.models.heads import LMHead, check_heads
from lmlab.models.output import ModelOutput
from lmlab.models.xlnet.config import XLNetConfig, xlnet_tiny  # noqa: F401


class XLNetModel(LmlabModel):
    """Two-stream XLNet with an ``lm`` head (``heads=()``: the bare network)."""

    architecture = "xlnet"

    def __init__(self, config: XLNetConfig, heads: tuple[str, ...] | list[str] | None = None):
        if not isinstance(config, XLNetConfig):
            raise LmlabError(
                f"XLNetModel needs an XLNetConfig, got {type(config).__name__}",
                "use get_preset('xlnet-tiny') or XLNetConfig(...)",
            )
        super().__init__(config.validate())
        cfg = config
        self.head_names = check_heads(("lm",) if heads is None else heads, ("lm",), "xlnet")
        self.tok_embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.mask_embed = nn.Parameter(torch.zeros(cfg.d_model))  # w: the query stream's start
        self.pos_embed = None
        self.rotary = None
        if cfg.positions == "learned":
            self.pos_embed = nn.Embedding(cfg.max_positions, cfg.d_model)
        elif cfg.positions == "sinusoidal":
            self.pos_embed = SinusoidalPositions(cfg.max_positions, cfg.d_model)
        else:
            self.rotary = RotaryEmbedding(cfg.dim_head, cfg.rope_theta)
        self.drop = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleList(TransformerBlock(cfg) for _ in range(cfg.n_layers))
        self.final_norm = make_norm(cfg.norm, cfg.d_model, cfg.norm_eps, cfg.norm_bias)
        self.heads = nn.ModuleDict(
            {"lm": LMHead(cfg.d_model, cfg.vocab_size)} if "lm" in self.head_names else {}
        )
        self.apply(lambda m: init_weights(m, cfg.init_std))
        nn.init.normal_(self.mask_embed, 0.0, cfg.init_std)
        if "lm" in self.heads and cfg.tie_embeddings:
            self.heads["lm"].proj.weight = self.tok_embed.weight

    def _embed_positions(self, x: Tensor, position_ids: Tensor) -> Tensor:
        if self.pos_embed is None:
            return x
        if int(position_ids.max()) >= self.config.max_positions:
            raise LmlabError(
                f"position {int(position_ids.max())} is beyond the model's "
                f"{self.config.max_positions} positions",
                "use shorter sequences",
            )
        return x + self.pos_embed(position_ids)

    def _two_streams(self, h: Tensor, position_ids: Tensor, attention_pattern: Tensor,
                     target_positions: Tensor, query_pattern: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        """Content and query streams side by side: ``(x [B, T+P, D], positions, pattern [B, T+P, T+P])``."""
        (b, t), p, dev = position_ids.shape, target_positions.shape[1], h.device
        if query_pattern is None or query_pattern.shape != (b, p, t):
            raise LmlabError(
                f"query_pattern must be [batch, P, T] = {(b, p, t)}",
                "pass the query pattern that goes with target_positions",
            )
        tpos = position_ids.gather(1, target_positions)
        g = self._embed_positions(self.mask_embed.expand(b, p, -1), tpos)
        x, pos = torch.cat([h, g], dim=1), torch.cat([position_ids, tpos], dim=1)
        allowed = torch.zeros(b, t + p, t + p, dtype=torch.bool, device=dev)
        allowed[:, :t, :t] = attention_pattern
        allowed[:, t:, :t] = query_pattern
        # a target with nothing to look at sees its own query vector (no token content), so
        # the softmax never spreads over forbidden keys
        empty = ~query_pattern.any(-1)
        idx = torch.arange(p, device=dev)
        allowed[:, t + idx, t + idx] = empty
        return x, pos, allowed

    def forward(
        self,
        input_ids: Tensor,
        position_ids: Tensor | None = None,
        attention_pattern: Tensor | None = None,
        query_pattern: Tensor | None = None,
        target_positions: Tensor | None = None,
        labels: Tensor | None = None,
        output_hidden_states: bool = False,
        **unused,
    ) -> ModelOutput:
        """Run the content stream, and the query stream when ``target_positions`` is given.

        * ``attention_pattern``: boolean ``[B, T, T]``, True where content row i may see token j
          (None: everything).
        * ``target_positions``: ``[B, P]`` long, the positions to predict; ``query_pattern``
          boolean ``[B, P, T]``: which tokens' content each target's query stream may see.
        * ``labels``: ``[B, P]`` token ids of the targets (``-100`` = ignore); the loss is their
          mean cross-entropy. ``logits`` are ``[B, P, V]`` (query stream) or ``[B, T, V]``
          (content stream, when no targets are given).
        """
        self.check_input_ids(input_ids)
        b, t = input_ids.shape
        dev = input_ids.device
        if position_ids is None:
            position_ids = torch.arange(t, device=dev).expand(b, t)
        if attention_pattern is None:
            attention_pattern = torch.ones(b, t, t, dtype=torch.bool, device=dev)
        if attention_pattern.shape != (b, t, t):
            raise LmlabError(
                f"attention_pattern must be [batch, T, T] = {(b, t, t)}, "
                f"got {tuple(attention_pattern.shape)}",
                "build it with the xlnet objective",
            )
        h = self._embed_positions(self.tok_embed(input_ids), position_ids)
        if target_positions is None:
            if labels is not None:
                raise LmlabError(
                    "XLNet labels need target_positions", "prepare batches with the xlnet objective"
                )
            x, pos, allowed, p = h, position_ids, attention_pattern, 0
        else:
            x, pos, allowed = self._two_streams(h, position_ids, attention_pattern, target_positions,
                                                query_pattern)
            p = target_positions.shape[1]
        mask, _ = kernel_mask(MaskSpec(pattern=allowed), t + p, dtype=x.dtype, device=dev)
        rope = self.rotary(pos) if self.rotary is not None else None
        x = self.drop(x)
        hidden = [x] if output_hidden_states else None
        for block in self.layers:
            x, _ = block(x, mask=mask, rope=rope)
            if hidden is not None:
                hidden.append(x)
        x = self.final_norm(x)
        out = ModelOutput(last_hidden_state=x[:, :t], hidden_states=tuple(hidden) if hidden else None)
        if p:
            out.extra["query_hidden"] = x[:, t:]
        if "lm" in self.heads:
            logits = self.heads["lm"].proj(x[:, t:] if p else x)
            out.logits = logits
            if labels is not None:
                if labels.shape != (b, p):
                    raise LmlabError(
                        f"labels must be [batch, P] = {(b, p)}, got {tuple(labels.shape)}",
                        "give one label per target position",
                    )
                out.loss = token_loss(logits, labels)
        return out
