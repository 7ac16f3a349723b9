"""Causal Transformer decoders: GPT-2 and Llama (one class, two configs).

* GPT-2 (Radford et al. 2019): token + learned absolute position embeddings, pre-norm blocks with
  LayerNorm and a ``gelu_new`` FFN, a final LayerNorm, and an LM head tied to the token embeddings.
* Llama (Touvron et al. 2023): no position embeddings but rotary positions inside attention,
  RMSNorm, a SwiGLU FFN, grouped-query attention and (usually) an untied LM head.

Both are ``n_layers`` pre-norm :class:`~lmlab.models.blocks.TransformerBlock` s with a causal mask,
which the fused kernel applies itself (``is_causal``) unless padding or a custom pattern needs an
explicit mask. ``use_cache=True`` returns per-layer ``(k, v)`` so generation feeds one new token
at a time (cached logits equal uncached ones).

Heads (plain modules, ``model.heads``): ``lm`` (next-token scores) and ``cls`` (classification
from the last real token). Objectives call ``model.backbone(input_ids, positions, mask=MaskSpec(...))``
and the heads they choose, and compute their own loss; so do tasks, from ``forward``'s scores.
``forward`` given labels still adds their losses for one release, with a DeprecationWarning.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import Tensor, nn

from lmlab.arguments import eager_checks
from lmlab.deprecation import pop_deprecated
from lmlab.errors import LmlabError
from lmlab.losses import head_loss, warn_labels_in_forward
from lmlab.models.attention_masks import MaskSpec, kernel_mask
from lmlab.models.blocks import (
    RotaryEmbedding,
    SinusoidalPositions,
    TransformerBlock,
    init_weights,
    make_norm,
)
from lmlab.models.checkpoint import LmlabModel
from lmlab.models.decoder.config import DecoderConfig
from lmlab.models.heads import DECODER_HEADS, LastTokenClassificationHead, LMHead, check_heads
from lmlab.models.output import ModelOutput


class DecoderModel(LmlabModel):
    """GPT-2 / Llama decoder with ``lm`` and/or ``cls`` heads (``heads=()``: the bare decoder)."""

    architecture = "decoder"
    config_class = DecoderConfig
    example_preset = "gpt2-tiny"

    def __init__(self, config: DecoderConfig, heads: tuple[str, ...] | list[str] | None = None):
        super().__init__(config)
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

    def compile(self, *args, **kwargs) -> None:
        """``torch.compile`` the model's call and its stack, which objectives reach through
        :meth:`backbone` (same arguments as ``nn.Module.compile``)."""
        super().compile(*args, **kwargs)
        self._run = torch.compile(self._run, *args, **kwargs)

    def backbone(self, input_ids: Tensor, positions: Tensor | None = None,
                 mask: MaskSpec | None = None) -> Tensor:
        """Final hidden states ``[B, T, D]`` (after the final norm): the objective-neutral call.

        ``positions``: position ids (default ``0..T-1``); ``mask``: one
        :class:`~lmlab.models.attention_masks.MaskSpec` (padding, packed documents, a prefix, a
        pattern); None: causal. The mask is built once, block-sparse when ``attention_backend``
        is flex.
        """
        return self._run(input_ids, positions, mask or MaskSpec(causal=True))[0]

    def _check_inputs(self, input_ids: Tensor, padding: Tensor | None, past_key_values) -> int:
        """The number of cached positions, after checking the inputs fit the model and the cache."""
        cfg = self.config
        self.check_input_ids(input_ids)
        b, t = input_ids.shape
        if past_key_values is not None and len(past_key_values) != cfg.n_layers:
            raise LmlabError(
                f"past_key_values has {len(past_key_values)} layers, the model {cfg.n_layers}",
                "pass the cache this model returned",
            )
        past = 0 if past_key_values is None else past_key_values[0][0].shape[2]
        if padding is not None and padding.shape != (b, past + t):
            raise LmlabError(
                f"attention_mask shape {tuple(padding.shape)} should be {(b, past + t)}",
                "pass one entry per token, cached tokens included",
            )
        return past

    def _embed(self, input_ids: Tensor, position_ids: Tensor, past: int) -> Tensor:
        x = self.tok_embed(input_ids)
        if self.pos_embed is not None:
            limit, t = self.config.max_positions, input_ids.shape[1]
            too_far = eager_checks() and int(position_ids.max()) >= limit
            if past + t > limit or too_far:
                raise LmlabError(
                    f"sequence of {past + t} tokens is longer than the model's {limit} positions",
                    f"truncate to {limit} tokens (or a sliding window)",
                )
            x = x + self.pos_embed(position_ids)
        return x

    def _run(self, input_ids: Tensor, position_ids: Tensor | None, mask: MaskSpec, past_key_values=None,
             use_cache: bool = False, output_hidden_states: bool = False):
        """The stack: ``(final hidden [B,T,D], hidden_states or None, new cache or None)``."""
        past = self._check_inputs(input_ids, mask.padding, past_key_values)
        t = input_ids.shape[1]
        if position_ids is None:
            position_ids = torch.arange(past, past + t, device=input_ids.device)[None]
        x = self._embed(input_ids, position_ids, past)
        rope = self.rotary(position_ids) if self.rotary is not None else None
        x = self.drop(x)
        kernel, is_causal = kernel_mask(mask, t, past + t, dtype=x.dtype, device=x.device,
                                        backend=self.backend_now())
        hidden = [x] if output_hidden_states else None
        cache = [] if use_cache else None
        for i, block in enumerate(self.layers):
            x, present = block(x, mask=kernel, is_causal=is_causal, rope=rope, use_cache=use_cache,
                               past_kv=None if past_key_values is None else past_key_values[i])
            if cache is not None:
                cache.append(present)
            if hidden is not None:
                hidden.append(x)
        x = self.final_norm(x)
        if hidden is not None:
            hidden[-1] = x
        return x, None if hidden is None else tuple(hidden), None if cache is None else tuple(cache)

    def decode(self, input_ids: Tensor, attention_mask: Tensor | None = None,
               position_ids: Tensor | None = None, past_key_values=None, use_cache: bool = False,
               output_hidden_states: bool = False, **deprecated):
        """``(final hidden [B,T,D], hidden_states or None, new cache or None)``; ``attention_mask``
        ``[B, S_past + T]`` marks real tokens (1) and padding (0). :meth:`backbone` is the call
        with one mask description; the mask keywords of older releases (``doc_ids``,
        ``prefix_mask``, ``attention_pattern``) still work, with a DeprecationWarning."""
        mask = _legacy_mask(attention_mask, deprecated, "decode")
        return self._run(input_ids, position_ids, mask, past_key_values, use_cache, output_hidden_states)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        labels: Tensor | None = None,
        past_key_values=None,
        use_cache: bool = False,
        output_hidden_states: bool = False,
        mask: MaskSpec | None = None,
        **kwargs,
    ) -> ModelOutput:
        """Decode and run every head; ``logits`` are the first head's scores. ``mask``: the
        attention's description when it is more than causal over ``attention_mask``'s padding
        (e.g. ``MaskSpec(causal=True, doc_ids=...)`` for packed examples).

        ``labels`` (deprecated, kept for one release with a DeprecationWarning: call without labels
        and compute the loss from the scores, :func:`lmlab.losses.head_loss`): aligned with
        ``input_ids`` for ``lm`` (shifted inside), classes for
        ``cls`` (``cls_labels`` when it is not the first head). Objectives call :meth:`backbone`
        and the heads they choose instead."""
        old_style = _legacy_mask(attention_mask, kwargs, "forward")
        mask = old_style if mask is None else dataclasses.replace(mask, padding=attention_mask)
        chosen = self.selected_heads(pop_deprecated(kwargs, "heads", "forward"))
        cls_labels = kwargs.pop("cls_labels", None)
        for k in ("token_type_ids", "encoder_outputs", "decoder_input_ids", "decoder_attention_mask"):
            if kwargs.pop(k, None) is not None:
                raise LmlabError(f"{k} is not used by a decoder-only model", f"drop {k}")
        if kwargs:
            raise LmlabError(
                f"unexpected arguments {sorted(kwargs)} for a decoder",
                "see DecoderModel.forward for the accepted ones",
            )
        if labels is not None or cls_labels is not None:
            warn_labels_in_forward("DecoderModel")
        x, hidden, cache = self._run(input_ids, position_ids, mask, past_key_values, use_cache,
                                     output_hidden_states)
        out = ModelOutput(hidden_states=hidden, last_hidden_state=x, past_key_values=cache)
        losses = []
        for i, name in enumerate(chosen):
            lab = labels if i == 0 and labels is not None else (cls_labels if name == "cls" else None)
            pooled = self.last_token(x, attention_mask) if name == "cls" else None
            logits = self.heads[name](x, pooled)
            if i == 0:
                out.logits = logits
            out.extra[f"{name}_logits"] = logits
            if lab is not None:
                loss = head_loss(name, logits, lab)
                out.extra[f"{name}_loss"] = loss
                losses.append(loss)
        if losses:
            out.loss = sum(losses[1:], losses[0])
        return out

    def last_token(self, x: Tensor, attention_mask: Tensor | None) -> Tensor:
        """``[B, D]``: each row's hidden state at its last real token."""
        return x[torch.arange(x.shape[0], device=x.device), self.last_token_index(attention_mask, x)]

    @staticmethod
    def last_token_index(attention_mask: Tensor | None, x: Tensor) -> Tensor:
        """Index of the last real token of each row (works with left or right padding)."""
        t = x.shape[1]
        if attention_mask is None:
            return torch.full((x.shape[0],), t - 1, device=x.device, dtype=torch.long)
        m = attention_mask[:, -t:].to(torch.long)
        return t - 1 - m.flip(-1).argmax(-1)


def _legacy_mask(attention_mask: Tensor | None, kwargs: dict, where: str) -> MaskSpec:
    """The mask description of a call in the old style (mask pieces as keywords)."""
    return MaskSpec(causal=True, padding=attention_mask,
                    doc_ids=pop_deprecated(kwargs, "doc_ids", where, stacklevel=4),
                    prefix=pop_deprecated(kwargs, "prefix_mask", where, stacklevel=4),
                    pattern=pop_deprecated(kwargs, "attention_pattern", where, stacklevel=4))
