"""Causal Transformer decoders: GPT-2 and Llama (one class, two configs).

* GPT-2 (Radford et al. 2019): token + learned absolute position embeddings, pre-norm blocks with
  LayerNorm and a ``gelu_new`` FFN, a final LayerNorm, and an LM head tied to the token embeddings.
* Llama (Touvron et al. 2023): no position embeddings but rotary positions inside attention,
  RMSNorm, a SwiGLU FFN, grouped-query attention and (usually) an untied LM head.

Both are ``n_layers`` pre-norm :class:`~lmlab.models.blocks.TransformerBlock` s with a causal mask,
which the fused kernel applies itself (``is_causal``) unless padding or a custom pattern needs an
explicit mask. ``use_cache=True`` returns per-layer ``(k, v)`` so generation feeds one new token
at a time (cached logits equal uncached ones).

Heads: ``lm`` (next-token softmax; ``labels`` aligned with ``input_ids`` and shifted inside) and
``cls`` (classification from the last real token, ``cls_labels`` or ``labels`` when first).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from lmlab.errors import LmlabError
from lmlab.models.attention_masks import self_attention_mask
from lmlab.models.blocks import (
    RotaryEmbedding,
    SinusoidalPositions,
    TransformerBlock,
    init_weights,
    make_norm,
)
from lmlab.models.checkpoint import LmlabModel, eager_checks
from lmlab.models.config import DecoderConfig
from lmlab.models.heads import DECODER_HEADS, LastTokenClassificationHead, LMHead, check_heads
from lmlab.models.output import ModelOutput


class DecoderModel(LmlabModel):
    """GPT-2 / Llama decoder with ``lm`` and/or ``cls`` heads (``heads=()``: the bare decoder)."""

    architecture = "decoder"

    def __init__(self, config: DecoderConfig, heads: tuple[str, ...] | list[str] | None = None):
        if not isinstance(config, DecoderConfig):
            raise LmlabError(
                f"DecoderModel needs a DecoderConfig, got {type(config).__name__}",
                "use get_preset('gpt2-tiny') or DecoderConfig(...)",
            )
        super().__init__(config.validate())
        cfg = config
        self.head_names = check_heads(("lm",) if heads is None else heads, DECODER_HEADS, "decoder")
        self.tok_embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_embed = None
        self.rotary = None
        if cfg.positions == "learned":
            self.pos_embed = nn.Embedding(cfg.max_positions, cfg.d_model)
        elif cfg.positions == "sinusoidal":
            self.pos_embed = SinusoidalPositions(cfg.max_positions, cfg.d_model)
        elif cfg.positions == "rotary":
            self.rotary = RotaryEmbedding(cfg.dim_head, cfg.rope_theta)
        self.drop = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleList(TransformerBlock(cfg) for _ in range(cfg.n_layers))
        self.final_norm = make_norm(cfg.norm, cfg.d_model, cfg.norm_eps, cfg.norm_bias)
        heads_ = {}
        if "lm" in self.head_names:
            heads_["lm"] = LMHead(cfg.d_model, cfg.vocab_size)
        if "cls" in self.head_names:
            heads_["cls"] = LastTokenClassificationHead(cfg.d_model, cfg.num_labels)
        self.heads = nn.ModuleDict(heads_)
        self.apply(lambda m: init_weights(m, cfg.init_std))
        # GPT-2: residual output projections scaled by 1/sqrt(2·n_layers) at init
        for block in self.layers:
            for lin in (block.attn.o_proj, block.ffn.fc_out):
                nn.init.normal_(lin.weight, 0.0, cfg.init_std / math.sqrt(2 * cfg.n_layers))
        self.tie_weights()

    def tie_weights(self) -> None:
        if "lm" in self.heads and self.config.tie_embeddings:
            self.heads["lm"].proj.weight = self.tok_embed.weight

    def decode(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        past_key_values=None,
        use_cache: bool = False,
        output_hidden_states: bool = False,
        attention_pattern: Tensor | None = None,
        doc_ids: Tensor | None = None,
        prefix_mask: Tensor | None = None,
    ):
        """Run the stack: ``(final hidden [B,T,D], hidden_states or None, new cache or None)``.

        ``attention_mask`` ``[B, S_past + T]`` marks real tokens (1) and padding (0).
        ``doc_ids`` ``[B, T]`` keeps packed documents apart; ``prefix_mask`` ``[B, T]`` marks the
        keys every query of its document sees (a prefix LM); ``attention_pattern`` (boolean,
        True = may attend) replaces the causal mask. The model builds one mask from them
        (:mod:`lmlab.models.attention_masks`), block-sparse when ``attention_backend`` is flex.
        """
        cfg = self.config
        self.check_input_ids(input_ids)
        b, t = input_ids.shape
        if past_key_values is not None and len(past_key_values) != cfg.n_layers:
            raise LmlabError(
                f"past_key_values has {len(past_key_values)} layers, the model {cfg.n_layers}",
                "pass the cache this model returned",
            )
        past = 0 if past_key_values is None else past_key_values[0][0].shape[2]
        if position_ids is None:
            position_ids = torch.arange(past, past + t, device=input_ids.device)[None]
        if attention_mask is not None and attention_mask.shape != (b, past + t):
            raise LmlabError(
                f"attention_mask shape {tuple(attention_mask.shape)} should be {(b, past + t)}",
                "pass one entry per token, cached tokens included",
            )
        x = self.tok_embed(input_ids)
        if self.pos_embed is not None:
            too_far = eager_checks() and int(position_ids.max()) >= cfg.max_positions
            if past + t > cfg.max_positions or too_far:
                raise LmlabError(
                    f"sequence of {past + t} tokens is longer than the model's {cfg.max_positions} positions",
                    f"truncate to {cfg.max_positions} tokens (or a sliding window)",
                )
            x = x + self.pos_embed(position_ids)
        rope = self.rotary(position_ids) if self.rotary is not None else None
        x = self.drop(x)
        mask, is_causal = self_attention_mask(
            causal=True, q_len=t, k_len=past + t, doc_ids=doc_ids, prefix_mask=prefix_mask,
            pattern=attention_pattern, attention_mask=attention_mask, dtype=x.dtype, device=x.device,
            backend=self.backend_now(),
        )
        hidden = [x] if output_hidden_states else None
        cache = [] if use_cache else None
        for i, block in enumerate(self.layers):
            x, present = block(
                x,
                mask=mask,
                is_causal=is_causal,
                rope=rope,
                past_kv=None if past_key_values is None else past_key_values[i],
                use_cache=use_cache,
            )
            if cache is not None:
                cache.append(present)
            if hidden is not None:
                hidden.append(x)
        x = self.final_norm(x)
        if hidden is not None:
            hidden[-1] = x
        return (
            x,
            (tuple(hidden) if hidden is not None else None),
            (tuple(cache) if cache is not None else None),
        )

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        labels: Tensor | None = None,
        past_key_values=None,
        use_cache: bool = False,
        output_hidden_states: bool = False,
        attention_pattern: Tensor | None = None,
        cls_labels: Tensor | None = None,
        heads: tuple[str, ...] | None = None,
        doc_ids: Tensor | None = None,
        prefix_mask: Tensor | None = None,
        **kwargs,
    ) -> ModelOutput:
        """Decode and run the heads (``heads`` picks a subset; default all)."""
        for k in ("token_type_ids", "encoder_outputs", "decoder_input_ids", "decoder_attention_mask"):
            if kwargs.pop(k, None) is not None:
                raise LmlabError(f"{k} is not used by a decoder-only model", f"drop {k}")
        if kwargs:
            raise LmlabError(
                f"unexpected arguments {sorted(kwargs)} for a decoder",
                "see DecoderModel.forward for the accepted ones",
            )
        x, hidden, cache = self.decode(
            input_ids,
            attention_mask,
            position_ids,
            past_key_values,
            use_cache,
            output_hidden_states,
            attention_pattern,
            doc_ids,
            prefix_mask,
        )
        out = ModelOutput(hidden_states=hidden, last_hidden_state=x, past_key_values=cache)
        losses = []
        for i, name in enumerate(self.selected_heads(heads)):
            lab = labels if i == 0 and labels is not None else (cls_labels if name == "cls" else None)
            pooled = None
            if name == "cls":
                pooled = x[
                    torch.arange(x.shape[0], device=x.device), self.last_token_index(attention_mask, x)
                ]
            logits, loss = self.heads[name](x, pooled, lab)
            if i == 0:
                out.logits = logits
            out.extra[f"{name}_logits"] = logits
            if loss is not None:
                out.extra[f"{name}_loss"] = loss
                losses.append(loss)
        if losses:
            out.loss = sum(losses[1:], losses[0])
        return out

    @staticmethod
    def last_token_index(attention_mask: Tensor | None, x: Tensor) -> Tensor:
        """Index of the last real token of each row (works with left or right padding)."""
        t = x.shape[1]
        if attention_mask is None:
            return torch.full((x.shape[0],), t - 1, device=x.device, dtype=torch.long)
        m = attention_mask[:, -t:].to(torch.long)
        return t - 1 - m.flip(-1).argmax(-1)
