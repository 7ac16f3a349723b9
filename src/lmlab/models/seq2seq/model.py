"""Encoder-decoder Transformers: the T5 and BART families, assembled from ``models/blocks.py``.

The picture (Vaswani et al. 2017; lecture 3, "encoder-decoders")::

    input_ids ─embed─▶ encoder: N × [bidirectional self-attn, FFN] ─────────────┐ (keys/values)
    decoder_input_ids ─embed─▶ decoder: M × [causal self-attn, cross-attn ◀──────┘, FFN] ─▶ LM head

Queries of the cross-attention come from the decoder, keys and values from the encoder output,
so every target position can look at the whole source. Everything else is a wiring choice made
by :class:`lmlab.models.config.Seq2SeqConfig`:

* **T5** (Raffel et al. 2020): pre-norm residuals with an RMS-style LayerNorm (no mean, no bias),
  no biases anywhere, no ``1/sqrt(d)`` logit scaling, no absolute positions: a learned scalar per
  (relative-distance bucket, head) is added to the attention logits. Each stack computes that
  bias once (HF keeps the table in its first layer) and every layer reuses it; the encoder's
  buckets are bidirectional, the decoder's look only back. The LM head is tied to the
  embeddings and the decoder output is multiplied by ``d_model**-0.5`` before it. T5 v1.1 uses
  the gated-GELU FFN and an untied head without that rescale. The shared-parameter option
  (``share_encoder_decoder``, the paper's "Enc-dec, shared" row: P parameters instead of 2P)
  makes the decoder reuse the encoder's layers; only its cross-attention is its own.
* **BART** (Lewis et al. 2020): post-norm residuals with LayerNorm, GELU, biases, learned
  absolute positions stored with fairseq's offset of 2, a LayerNorm on the embeddings, optional
  ``sqrt(d)`` embedding scale, a tied LM head plus a ``final_logits_bias`` buffer.

Caching (for generation): ``past_key_values`` holds per decoder layer ``(k, v, cross_k, cross_v)``;
the self-attention part grows by one step per call, the cross part is computed once from the
encoder output and reused, so the encoder runs once per generated sequence.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from lmlab.arguments import eager_checks
from lmlab.errors import LmlabError
from lmlab.losses import IGNORE, token_loss, warn_labels_in_forward
from lmlab.models.attention_masks import MaskSpec, kernel_mask
from lmlab.models.blocks import (
    LayerNorm,
    RelativePositionBias,
    RMSNorm,
    SinusoidalPositions,
    TransformerBlock,
    init_weights,
    make_norm,
)
from lmlab.models.checkpoint import LmlabModel
from lmlab.models.output import ModelOutput
from lmlab.models.seq2seq.config import Seq2SeqConfig

#: per decoder layer (self_k, self_v, cross_k, cross_v), each [B, H, S, D]
Seq2SeqCache = tuple[tuple[Tensor, Tensor, Tensor, Tensor], ...]

#: the parts of a layer the decoder borrows from the encoder under ``share_encoder_decoder``
_SHARED_LAYER_PARTS = ("attn", "attn_norm", "ffn", "ffn_norm")


def shift_right(labels: Tensor, start_token_id: int, pad_token_id: int | None) -> Tensor:
    """Teacher forcing inputs: ``[start, y_0, ..., y_{T-2}]`` from labels ``[y_0, ..., y_{T-1}]``.

    Ignored label positions (-100) become the pad id, as in transformers.
    """
    shifted = labels.new_empty(labels.shape)
    shifted[:, 0] = start_token_id
    shifted[:, 1:] = labels[:, :-1]
    return shifted.masked_fill(shifted == IGNORE, 0 if pad_token_id is None else pad_token_id)


class Seq2SeqStack(nn.Module):
    """One half of the model (encoder or decoder): positions, embedding norm, layers, final norm.

    Token embeddings live in :class:`Seq2SeqModel` (one table shared by both halves); the stack
    receives them already looked up and scaled.
    """

    def __init__(self, cfg: Seq2SeqConfig, decoder: bool, share_with: Seq2SeqStack | None = None):
        super().__init__()
        self.is_decoder, self.cfg = decoder, cfg
        n_layers = cfg.decoder_layers if decoder else cfg.n_layers
        d, n_rows = cfg.d_model, cfg.max_positions + cfg.position_offset
        self.embed_positions: nn.Module | None = None
        self.relative_bias: RelativePositionBias | None = None
        if cfg.positions == "learned":
            self.embed_positions = nn.Embedding(n_rows, d)
        elif cfg.positions == "sinusoidal":
            self.embed_positions = SinusoidalPositions(n_rows, d)
        elif cfg.positions == "relative":
            self.relative_bias = RelativePositionBias(cfg.n_heads, cfg.relative_buckets,
                                                      cfg.relative_max_distance, bidirectional=not decoder)
        self.embed_norm = LayerNorm(d, cfg.norm_eps, cfg.norm_bias) if cfg.layernorm_embedding else None
        self.layers = nn.ModuleList(TransformerBlock(cfg, cross_attention=decoder) for _ in range(n_layers))
        if cfg.family == "t5" and cfg.dropout:  # T5 also drops out the FFN's hidden activations
            for layer in self.layers:
                layer.ffn.drop = nn.Dropout(cfg.dropout)
        self.final_norm = make_norm(cfg.norm, d, cfg.norm_eps, cfg.norm_bias) if cfg.prenorm else None
        self.drop = nn.Dropout(cfg.dropout)
        if share_with is not None:
            self._share(share_with)

    def _share(self, other: Seq2SeqStack) -> None:
        """Reuse ``other``'s parameters (T5 shared encoder/decoder); cross-attention stays our own."""
        if isinstance(self.embed_positions, nn.Embedding):
            self.embed_positions = other.embed_positions
        if self.relative_bias is not None:
            self.relative_bias.embedding = other.relative_bias.embedding  # own bucketing, shared table
        if self.embed_norm is not None:
            self.embed_norm = other.embed_norm
        if self.final_norm is not None:
            self.final_norm = other.final_norm
        for mine, theirs in zip(self.layers, other.layers):
            for part in _SHARED_LAYER_PARTS:
                setattr(mine, part, getattr(theirs, part))

    def forward(self, x: Tensor, attention_mask: Tensor | None = None, position_ids: Tensor | None = None,
                context: Tensor | None = None, context_mask: Tensor | None = None,
                past_key_values: Seq2SeqCache | None = None, use_cache: bool = False,
                output_hidden_states: bool = False) -> tuple[Tensor, tuple | None, tuple | None]:
        """``x``: token embeddings ``[B, T, D]``. Returns ``(hidden, hidden_states, present)``."""
        t = x.shape[1]
        past_len = past_key_values[0][0].shape[2] if past_key_values else 0
        k_len = past_len + t
        if self.embed_positions is not None:
            if position_ids is None:
                position_ids = torch.arange(past_len, k_len, device=x.device)[None]
            if eager_checks() and int(position_ids.max()) >= self.cfg.max_positions:
                raise LmlabError(f"sequence of {int(position_ids.max()) + 1} positions is longer than "
                                 f"max_positions={self.cfg.max_positions}", "truncate the input")
            x = x + self.embed_positions(position_ids + self.cfg.position_offset).to(x.dtype)
        if self.embed_norm is not None:
            x = self.embed_norm(x)
        x = self.drop(x)

        mask, is_causal = kernel_mask(MaskSpec(causal=self.is_decoder, padding=attention_mask), t, k_len,
                                      dtype=x.dtype, device=x.device)
        position_bias = None
        if self.relative_bias is not None:
            position_bias = self.relative_bias(t, k_len, q_offset=past_len, device=x.device).to(x.dtype)
        cross_mask = None
        if self.is_decoder and context_mask is not None:
            cross_mask, _ = kernel_mask(MaskSpec(padding=context_mask), t, context_mask.shape[-1],
                                        dtype=x.dtype, device=x.device)

        hidden_states = (x,) if output_hidden_states else None
        present = () if use_cache else None
        for i, layer in enumerate(self.layers):
            past = past_key_values[i] if past_key_values else None
            x, layer_present = layer(x, mask=mask, is_causal=is_causal, position_bias=position_bias,
                                     past_kv=past, use_cache=use_cache, context=context,
                                     context_mask=cross_mask)
            if use_cache:
                present += (layer_present,)
            if output_hidden_states and i < len(self.layers) - 1:
                hidden_states += (x,)
        if self.final_norm is not None:  # pre-norm (T5): final norm, then dropout
            x = self.drop(self.final_norm(x))
        if output_hidden_states:
            hidden_states += (x,)  # the last entry is after the final norm, as transformers does
        return x, hidden_states, present


class Seq2SeqModel(LmlabModel):
    """T5 / BART encoder-decoder with an LM head (``T5ForConditionalGeneration`` and
    ``BartForConditionalGeneration`` in Hugging Face terms; weights convert both ways, see
    ``lmlab.interop.hf_seq2seq``).

    ``forward(input_ids, attention_mask, decoder_input_ids, decoder_attention_mask, labels,
    past_key_values, use_cache, output_hidden_states, encoder_outputs)`` -> :class:`ModelOutput`
    with ``logits [B, T, V]``, ``loss`` (mean cross-entropy over labels != -100; ``labels=`` is
    deprecated, kept for one release with a DeprecationWarning: objectives and tasks compute the
    loss from the scores; :meth:`encode`, :meth:`decode` and :meth:`lm_scores` are the pieces),
    ``hidden_states`` (decoder; the encoder's go to ``extra["encoder_hidden_states"]``),
    ``past_key_values`` and ``encoder_last_hidden_state``.
    """

    architecture = "seq2seq"
    config_class = Seq2SeqConfig
    example_preset = "t5-tiny"

    def __init__(self, config: Seq2SeqConfig, heads: tuple[str, ...] | list[str] | None = None):
        super().__init__(config)  # checked to be a Seq2SeqConfig and validated there
        cfg = self.config
        heads = ("lm",) if not heads else tuple(heads)  # None / () : the LM head is the model
        if heads != ("lm",):
            raise LmlabError(f"encoder-decoders have only the 'lm' head, not {list(heads)}",
                             "cast classification as text-to-text (T5) or use an encoder")
        self.head_names = heads
        pad = cfg.pad_token_id if cfg.family == "bart" else None
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=pad)
        self.embed_scale = math.sqrt(cfg.d_model) if cfg.scale_embedding else 1.0
        self.encoder = Seq2SeqStack(cfg, decoder=False)
        self.decoder = Seq2SeqStack(cfg, decoder=True,
                                    share_with=self.encoder if cfg.share_encoder_decoder else None)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.final_logits_bias:
            self.register_buffer("final_logits_bias", torch.zeros(cfg.vocab_size))
        else:
            self.final_logits_bias = None
        self.reset_parameters()
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    # ------------------------------------------------------------------ init
    @torch.no_grad()
    def reset_parameters(self) -> None:
        """T5: the mesh-tensorflow scheme (unit-variance embeddings, fan-in scaled projections);
        BART: N(0, init_std) everywhere, zero biases."""
        cfg = self.config
        if cfg.family != "t5":
            self.apply(lambda m: init_weights(m, cfg.init_std))
            return
        d, hd = cfg.d_model, cfg.dim_head
        for m in self.modules():
            if isinstance(m, (RMSNorm, nn.LayerNorm)):
                init_weights(m)
            elif isinstance(m, RelativePositionBias):
                nn.init.normal_(m.embedding.weight, 0.0, d ** -0.5)
            elif isinstance(m, nn.Embedding):
                nn.init.normal_(m.weight, 0.0, 1.0)
        nn.init.normal_(self.lm_head.weight, 0.0, 1.0)
        params = dict(self.named_parameters())
        for name, p in params.items():
            if p.dim() != 2 or not name.startswith(("encoder.layers.", "decoder.layers.")):
                continue
            if name.endswith("q_proj.weight"):
                std = (d * hd) ** -0.5  # folds the 1/sqrt(d_head) that T5 leaves out of the logits
            elif name.endswith(("o_proj.weight", "fc_out.weight")):
                std = p.shape[1] ** -0.5  # fan-in
            else:
                std = d ** -0.5
            nn.init.normal_(p, 0.0, std)
            bias = params.get(name[: -len("weight")] + "bias")
            if bias is not None:
                nn.init.zeros_(bias)

    # ------------------------------------------------------------------ pieces
    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed_tokens

    def _embed(self, ids: Tensor) -> Tensor:
        self.check_input_ids(ids)
        h = self.embed_tokens(ids)
        return h if self.embed_scale == 1.0 else h * self.embed_scale

    def encode(self, input_ids: Tensor, attention_mask: Tensor | None = None,
               position_ids: Tensor | None = None, output_hidden_states: bool = False) -> ModelOutput:
        """Run the encoder once; pass the result as ``encoder_outputs`` to later forward calls."""
        h, states, _ = self.encoder(self._embed(input_ids), attention_mask, position_ids,
                                    output_hidden_states=output_hidden_states)
        return ModelOutput(last_hidden_state=h, encoder_last_hidden_state=h, hidden_states=states)

    def decode(self, decoder_input_ids: Tensor, encoder_hidden: Tensor, encoder_padding: Tensor | None = None,
               decoder_padding: Tensor | None = None, positions: Tensor | None = None) -> Tensor:
        """The decoder's final hidden states ``[B, T, D]`` over ``encoder_hidden`` (from
        :meth:`encode`): the decoder-side backbone call, no cache. ``encoder_padding`` ``[B, S]``
        and ``decoder_padding`` ``[B, T]``: 1 at real tokens (the masks come from
        :func:`~lmlab.models.attention_masks.kernel_mask`). Objectives score it with
        :meth:`lm_scores` and compute their own loss."""
        h, _, _ = self.decoder(self._embed(decoder_input_ids), decoder_padding, positions,
                               context=encoder_hidden, context_mask=encoder_padding)
        return h

    def lm_scores(self, hidden: Tensor) -> Tensor:
        """The LM head: next-token scores ``[B, T, V]`` of decoder hidden states (T5 rescales them
        by ``d_model**-0.5`` first; BART adds ``final_logits_bias``)."""
        out = hidden * self.config.d_model ** -0.5 if self.config.scale_decoder_output else hidden
        logits = self.lm_head(out)
        return logits if self.final_logits_bias is None else logits + self.final_logits_bias

    def compile(self, *args, **kwargs) -> None:
        """``torch.compile`` the model's call and its two stacks, which objectives reach through
        :meth:`encode` and :meth:`decode` (same arguments as ``nn.Module.compile``)."""
        super().compile(*args, **kwargs)
        self.encoder.compile(*args, **kwargs)
        self.decoder.compile(*args, **kwargs)

    def forward(self, input_ids: Tensor | None = None, attention_mask: Tensor | None = None,
                token_type_ids: Tensor | None = None, position_ids: Tensor | None = None,
                decoder_input_ids: Tensor | None = None, decoder_attention_mask: Tensor | None = None,
                labels: Tensor | None = None, past_key_values: Seq2SeqCache | None = None,
                use_cache: bool = False, output_hidden_states: bool = False,
                encoder_outputs: ModelOutput | Tensor | tuple | None = None,
                decoder_position_ids: Tensor | None = None) -> ModelOutput:
        """See the class docstring. ``encoder_outputs`` skips the encoder; so does a
        ``past_key_values`` cache (it already holds the cross-attention keys/values), in which case
        ``encoder_last_hidden_state`` is None. ``attention_mask`` (source padding) is needed on
        every call; ``decoder_attention_mask`` covers past + new positions."""
        cfg = self.config
        if token_type_ids is not None:
            raise LmlabError("encoder-decoders take no token_type_ids", "drop token_type_ids")
        if past_key_values is not None and len(past_key_values) != len(self.decoder.layers):
            raise LmlabError(f"past_key_values has {len(past_key_values)} layers, the decoder has "
                             f"{len(self.decoder.layers)}", "pass the cache this model returned")

        # 1. encoder (skipped when its output is given, or when the cache already holds cross k/v)
        encoder_hidden, encoder_states = None, None
        if encoder_outputs is not None:
            encoder_hidden = _encoder_tensor(encoder_outputs)
        elif past_key_values is None:
            if input_ids is None:
                raise LmlabError("no encoder input", "pass input_ids or encoder_outputs")
            enc = self.encode(input_ids, attention_mask, position_ids, output_hidden_states)
            encoder_hidden, encoder_states = enc.last_hidden_state, enc.hidden_states

        # 2. decoder inputs: teacher forcing from labels, as transformers does
        if decoder_input_ids is None:
            if labels is not None:
                decoder_input_ids = shift_right(labels, cfg.decoder_start_token_id, cfg.pad_token_id)
            elif cfg.family == "bart" and input_ids is not None:  # BART's denoising default
                decoder_input_ids = shift_right(input_ids, cfg.decoder_start_token_id, cfg.pad_token_id)
            else:
                raise LmlabError("no decoder input", "pass decoder_input_ids or labels")

        # 3. decoder
        h, states, present = self.decoder(
            self._embed(decoder_input_ids), decoder_attention_mask, decoder_position_ids,
            context=encoder_hidden, context_mask=attention_mask, past_key_values=past_key_values,
            use_cache=use_cache, output_hidden_states=output_hidden_states)

        # 4. LM head
        logits = self.lm_scores(h)
        loss = None
        if labels is not None:
            warn_labels_in_forward("Seq2SeqModel")
            if labels.shape != decoder_input_ids.shape:
                raise LmlabError(f"labels have shape {tuple(labels.shape)} but the decoder input "
                                 f"{tuple(decoder_input_ids.shape)}", "give one label per decoder position")
            loss = token_loss(logits, labels)
        extra = {"encoder_hidden_states": encoder_states} if output_hidden_states else {}
        return ModelOutput(logits=logits, loss=loss, hidden_states=states, last_hidden_state=h,
                           past_key_values=present, encoder_last_hidden_state=encoder_hidden, extra=extra)


def _encoder_tensor(encoder_outputs) -> Tensor:
    """Accept a ModelOutput (from :meth:`Seq2SeqModel.encode` or a previous forward), a tensor,
    or a tuple whose first item is the tensor (transformers style)."""
    if isinstance(encoder_outputs, ModelOutput):
        t = encoder_outputs.encoder_last_hidden_state
        return t if t is not None else encoder_outputs.last_hidden_state
    if isinstance(encoder_outputs, (tuple, list)):
        encoder_outputs = encoder_outputs[0]
    if not isinstance(encoder_outputs, Tensor) or encoder_outputs.dim() != 3:
        raise LmlabError("encoder_outputs must be the encoder's [batch, length, d_model] output",
                         "pass model.encode(input_ids)")
    return encoder_outputs
