"""The encoder-decoder family's config and presets: T5 and BART."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from lmlab.errors import LmlabError
from lmlab.models.config import PRESET_SIZES, TransformerConfig


@dataclass
class Seq2SeqConfig(TransformerConfig):
    """Encoder-decoders: T5 and BART (built by ``models/seq2seq.py``).

    ``n_layers`` counts encoder layers; ``n_decoder_layers`` (None = same) the decoder's.

    * ``positions``: ``relative`` (T5 bucketed bias, ``relative_buckets`` / ``relative_max_distance``,
      computed once per stack and shared by its layers) or ``learned`` (BART; the table has
      ``max_positions + position_offset`` rows and position p uses row ``p + position_offset``:
      fairseq's offset of 2), ``sinusoidal`` or ``none``.
    * ``share_encoder_decoder``: T5's shared-parameter option (Raffel et al. 2020, table 2 "Enc-dec,
      shared"): the decoder reuses the encoder's self-attention, FFN, norms and position parameters;
      only its cross-attention (and its norm) are its own.
    * ``scale_embedding``: BART: multiply token embeddings by ``sqrt(d_model)``.
    * ``layernorm_embedding``: BART: LayerNorm on token + position embeddings.
    * ``scale_decoder_output``: T5 with tied embeddings: decoder output times ``d_model**-0.5``
      before the LM head.
    * ``final_logits_bias``: BART: a (non-trained) bias buffer added to the logits.
    """

    n_decoder_layers: int | None = None
    relative_buckets: int = 32
    relative_max_distance: int = 128
    share_encoder_decoder: bool = False    # T5 shared-parameter option: one stack for both sides
    decoder_start_token_id: int = 0
    scale_embedding: bool = False           # BART: multiply embeddings by sqrt(d_model)
    layernorm_embedding: bool = False       # BART: LayerNorm after token + position embeddings
    position_offset: int = 0                # BART: learned position p is row p + 2
    scale_decoder_output: bool = False      # T5 (tied): h * d_model**-0.5 before the LM head
    final_logits_bias: bool = False         # BART: logits + final_logits_bias buffer

    @property
    def decoder_layers(self) -> int:
        return self.n_decoder_layers or self.n_layers

    def validate(self) -> Seq2SeqConfig:
        super().validate()
        if self.positions == "rotary":
            raise LmlabError("encoder-decoders support relative, learned, sinusoidal or no positions, "
                             "not 'rotary'", "set positions='relative' (T5) or 'learned' (BART)")
        if self.share_encoder_decoder and self.decoder_layers != self.n_layers:
            raise LmlabError(f"share_encoder_decoder needs as many decoder layers as encoder layers "
                             f"({self.decoder_layers} != {self.n_layers})", "set n_decoder_layers=None")
        if self.relative_buckets < 2 or self.relative_max_distance < 2:
            raise LmlabError("relative_buckets and relative_max_distance must be at least 2",
                             "T5 uses 32 and 128")
        if not 0 <= self.decoder_start_token_id < self.vocab_size:
            raise LmlabError(f"decoder_start_token_id {self.decoder_start_token_id} is outside the "
                             f"vocabulary of {self.vocab_size}", "T5 uses the pad id 0, BART the eos id 2")
        return self


def _t5(size: str) -> Seq2SeqConfig:
    d, n, h, f = PRESET_SIZES[size]
    return Seq2SeqConfig(family="t5", vocab_size=32128, d_model=d, n_layers=n, n_heads=h, d_ff=f,
                         activation="relu", norm="rmsnorm", norm_eps=1e-6, prenorm=True, positions="relative",
                         attn_bias=False, mlp_bias=False, attn_scale=1.0, attn_dropout=0.0,
                         pad_token_id=0, eos_token_id=1, decoder_start_token_id=0, scale_decoder_output=True)

def _bart(size: str) -> Seq2SeqConfig:
    d, n, h, f = PRESET_SIZES[size]
    n = 6 if size == "base" else n  # facebook/bart-base: 6 encoder + 6 decoder layers
    return Seq2SeqConfig(family="bart", vocab_size=50265, d_model=d, n_layers=n, n_heads=h, d_ff=f,
                         norm_eps=1e-5, max_positions=1024, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                         decoder_start_token_id=2, attn_dropout=0.0, layernorm_embedding=True,
                         position_offset=2, final_logits_bias=True)


#: preset name -> a fresh config (t5-tiny, bart-tiny ...)
PRESETS = {f"{family}-{size}": functools.partial(make, size)
           for family, make in (("t5", _t5), ("bart", _bart))
           for size in PRESET_SIZES}
