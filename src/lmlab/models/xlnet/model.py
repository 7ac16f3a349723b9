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

The masks are one :class:`~lmlab.models.attention_masks.MaskSpec`: ``pattern`` for the content
rows, ``query_stream`` for the query rows; :func:`~lmlab.models.attention_masks.kernel_mask` joins
them into the one ``[T + P, T + P]`` mask. Without ``targets`` the model is a bidirectional
encoder over the content stream (everything visible): that is how it is used after pretraining.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lmlab.deprecation import warn_deprecated
from lmlab.errors import LmlabError
from lmlab.losses import token_loss, warn_labels_in_forward
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
    config_class = XLNetConfig
    example_preset = "xlnet-tiny"

    def __init__(self, config: XLNetConfig, heads: tuple[str, ...] | list[str] | None = None):
        super().__init__(config)
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

    def _two_streams(self, h: Tensor, position_ids: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        """Content and query streams side by side: ``(x [B, T+P, D], positions [B, T+P])``."""
        b, p = targets.shape
        tpos = position_ids.gather(1, targets)
        g = self._embed_positions(self.mask_embed.expand(b, p, -1), tpos)
        return torch.cat([h, g], dim=1), torch.cat([position_ids, tpos], dim=1)

    def backbone(self, input_ids: Tensor, positions: Tensor | None = None, mask: MaskSpec | None = None,
                 targets: Tensor | None = None) -> Tensor:
        """Final hidden states: ``[B, T, D]`` (content stream), or ``[B, T + P, D]`` (content then
        query stream) with ``targets``, the ``[B, P]`` positions to predict.

        ``mask``: one :class:`~lmlab.models.attention_masks.MaskSpec`, its ``pattern`` the content
        rows' ``[B, T, T]`` (None: everything visible) and its ``query_stream`` ``[B, P, T]``
        (needed with ``targets``: which tokens' content each target's query stream may see).
        """
        return self._run(input_ids, positions, mask, targets)[0]

    def _run(self, input_ids: Tensor, position_ids: Tensor | None, mask: MaskSpec | None,
             targets: Tensor | None, output_hidden_states: bool = False):
        self.check_input_ids(input_ids)
        mask = mask or MaskSpec()
        b, t = input_ids.shape
        if position_ids is None:
            position_ids = torch.arange(t, device=input_ids.device).expand(b, t)
        _check_patterns(mask, b, t, targets)
        x = self._embed_positions(self.tok_embed(input_ids), position_ids)
        pos = position_ids
        if targets is not None:
            x, pos = self._two_streams(x, position_ids, targets)
        kernel, _ = kernel_mask(mask, x.shape[1], dtype=x.dtype, device=x.device)
        rope = self.rotary(pos) if self.rotary is not None else None
        x = self.drop(x)
        hidden = [x] if output_hidden_states else None
        for block in self.layers:
            x, _ = block(x, mask=kernel, rope=rope)
            if hidden is not None:
                hidden.append(x)
        return self.final_norm(x), tuple(hidden) if hidden else None

    def forward(self, input_ids: Tensor, position_ids: Tensor | None = None, mask: MaskSpec | None = None,
                targets: Tensor | None = None, labels: Tensor | None = None,
                output_hidden_states: bool = False, **deprecated) -> ModelOutput:  # others: ignored
        """Run the content stream, and the query stream when ``targets`` (``[B, P]``) is given;
        ``mask`` as in :meth:`backbone`. ``logits`` are ``[B, P, V]`` (query stream) or
        ``[B, T, V]`` (content stream, when no targets are given). The keywords of older releases
        (``attention_pattern``, ``query_pattern``, ``target_positions``) and ``labels`` (``[B, P]``,
        their mean cross-entropy as ``loss``) still work for one release, with a DeprecationWarning.
        """
        mask, targets = _legacy_arguments(mask, targets, deprecated)
        if labels is not None:
            warn_labels_in_forward("XLNetModel")
            if targets is None:
                raise LmlabError("XLNet labels need target_positions",
                                 "prepare batches with the xlnet objective")
        t = input_ids.shape[1]
        x, hidden = self._run(input_ids, position_ids, mask, targets, output_hidden_states)
        out = ModelOutput(last_hidden_state=x[:, :t], hidden_states=hidden)
        if targets is not None:
            out.extra["query_hidden"] = x[:, t:]
        if "lm" in self.heads:
            out.logits = self.heads["lm"](x[:, t:] if targets is not None else x)
            if labels is not None:
                if labels.shape != targets.shape:
                    raise LmlabError(f"labels must be [batch, P] = {tuple(targets.shape)}, got "
                                     f"{tuple(labels.shape)}", "give one label per target position")
                out.loss = token_loss(out.logits, labels)
        return out


def _check_patterns(mask: MaskSpec, b: int, t: int, targets: Tensor | None) -> None:
    """The content pattern is ``[B, T, T]``; targets come with a ``[B, P, T]`` query stream."""
    if mask.pattern is not None and mask.pattern.shape != (b, t, t):
        raise LmlabError(f"attention_pattern must be [batch, T, T] = {(b, t, t)}, "
                         f"got {tuple(mask.pattern.shape)}", "build it with the xlnet objective")
    if targets is None:
        if mask.query_stream is not None:
            raise LmlabError("a query stream needs its targets", "pass targets=[B, P] positions")
        return
    p = targets.shape[1]
    if mask.query_stream is None or mask.query_stream.shape != (b, p, t):
        raise LmlabError(f"query_pattern must be [batch, P, T] = {(b, p, t)}",
                         "pass the query pattern that goes with target_positions")


def _legacy_arguments(mask: MaskSpec | None, targets: Tensor | None,
                      deprecated: dict) -> tuple[MaskSpec | None, Tensor | None]:
    """The mask description and targets of a call in the old style (``attention_pattern``,
    ``query_pattern``, ``target_positions`` as keywords), with a DeprecationWarning."""
    old = {k: deprecated.pop(k, None) for k in ("attention_pattern", "query_pattern", "target_positions")}
    if all(v is None for v in old.values()):
        return mask, targets
    warn_deprecated("XLNetModel(attention_pattern=, query_pattern=, target_positions=)",
                    "pass mask=MaskSpec(pattern=..., query_stream=...) and targets=...", stacklevel=3)
    spec = MaskSpec(pattern=old["attention_pattern"], query_stream=old["query_pattern"])
    return spec, old["target_positions"] if targets is None else targets
