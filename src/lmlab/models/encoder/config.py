"""The encoder family's config and presets: BERT, RoBERTa, ALBERT, ELECTRA."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from lmlab.errors import LmlabError
from lmlab.models.config import PRESET_SIZES, TransformerConfig


@dataclass
class EncoderConfig(TransformerConfig):
    """Bidirectional encoders: BERT, RoBERTa, ALBERT, ELECTRA.

    * ``type_vocab_size``: segment (token type) embeddings, 0 for none.
    * ``embedding_size``: ALBERT/ELECTRA factorized embeddings: tokens are embedded in E dims and
      projected to ``d_model`` (None: E = d_model).
    * ``layer_groups``: ALBERT cross-layer sharing: 0 = every layer its own parameters; k >= 1 =
      only k distinct layers, each reused for n_layers/k consecutive layers.
    * ``positions_from_padding``: RoBERTa numbers positions from ``pad_token_id + 1`` and gives
      padding the position ``pad_token_id``.
    * ``embedding_norm``: LayerNorm (+ dropout) on the summed embeddings, as BERT does.
    * ``pooler``: BERT's ``tanh(W h_[CLS])`` pooler. None (default) = only when a head uses it
      (``nsp``; ``seq_cls`` of bert/albert, as in transformers).
    * ``head_activation``: activation inside the MLM head transform (None = ``activation``).
    """

    type_vocab_size: int = 2
    embedding_size: int | None = None
    layer_groups: int = 0
    positions_from_padding: bool = False
    embedding_norm: bool = True
    pooler: bool | None = None
    head_activation: str | None = None
    classifier_dropout: float | None = None

    def validate(self) -> EncoderConfig:
        super().validate()
        if self.layer_groups < 0 or (self.layer_groups and self.n_layers % self.layer_groups):
            raise LmlabError(f"layer_groups {self.layer_groups} must divide n_layers {self.n_layers}",
                             "use 1 (ALBERT: one shared layer) or 0 (no sharing)")
        if self.positions not in ("learned", "sinusoidal", "rotary", "none"):
            raise LmlabError(f"encoders support learned, sinusoidal, rotary or no positions, not "
                             f"{self.positions!r}", "set positions='learned'")
        if self.positions_from_padding and self.pad_token_id is None:
            raise LmlabError("positions_from_padding needs pad_token_id", "set pad_token_id (RoBERTa: 1)")
        if self.head_activation is not None:
            from lmlab.models.blocks import get_activation

            get_activation(self.head_activation)
        return self

    @property
    def embed_dim(self) -> int:
        return self.embedding_size or self.d_model


def _bert(size: str) -> EncoderConfig:
    d, n, h, f = PRESET_SIZES[size]
    return EncoderConfig(family="bert", d_model=d, n_layers=n, n_heads=h, d_ff=f)

def _roberta(size: str) -> EncoderConfig:
    d, n, h, f = PRESET_SIZES[size]
    return EncoderConfig(family="roberta", vocab_size=50265, d_model=d, n_layers=n, n_heads=h, d_ff=f,
                         max_positions=514, type_vocab_size=1, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                         positions_from_padding=True, norm_eps=1e-5)

def _albert(size: str) -> EncoderConfig:
    d, n, h, f = PRESET_SIZES[size]
    return EncoderConfig(family="albert", vocab_size=30000, d_model=d, n_layers=n, n_heads=h, d_ff=f,
                         embedding_size=min(128, d), layer_groups=1, activation="gelu_new", dropout=0.0,
                         attn_dropout=0.0)

def _electra(size: str) -> EncoderConfig:
    d, n, h, f = PRESET_SIZES[size]
    # ELECTRA-small factorizes (E=128 < H=256); ELECTRA-base does not (E = H = 768)
    return EncoderConfig(family="electra", d_model=d, n_layers=n, n_heads=h, d_ff=f,
                         embedding_size=d if size == "base" else min(128, d))


#: preset name -> a fresh config (bert-tiny, roberta-tiny, albert-tiny, electra-tiny ...)
PRESETS = {f"{family}-{size}": functools.partial(make, size)
           for family, make in (("bert", _bert), ("roberta", _roberta), ("albert", _albert),
                                ("electra", _electra))
           for size in PRESET_SIZES}
