"""Model configurations: one dataclass per architecture, all built on :class:`TransformerConfig`.

A config is plain data (it round-trips through ``config.json``); :meth:`TransformerConfig.validate`
checks it and raises a one-line :class:`LmlabError` naming the bad field and the fix, so an
impossible model fails when it is built, never later with a silently wrong answer.

* :class:`TransformerConfig` - the shared block settings (width, depth, heads, FFN, norm, positions).
* :class:`EncoderConfig` - BERT, RoBERTa, ALBERT, ELECTRA (segment embeddings, factorized
  embeddings, cross-layer sharing, pooler).
* :class:`DecoderConfig` - GPT-2 and Llama.
* :class:`Seq2SeqConfig` - T5 and BART (its fields belong to ``models/seq2seq.py``).
* :class:`RNNConfig` - ELMo and the LSTM LM (its fields belong to ``models/rnn.py``).

Presets: ``get_preset("bert-tiny")`` etc., ``PRESETS`` lists them all; keyword overrides apply on top
(``get_preset("gpt2-small", vocab_size=8000)``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lmlab.errors import LmlabError
from lmlab.file_schemas import NORMS, POSITIONS  # the choices live with the file schemas


@dataclass
class TransformerConfig:
    """Settings shared by every Transformer (see ``models/blocks.py`` for what each one does)."""

    family: str = ""                 # bert | roberta | albert | electra | gpt2 | llama | t5 | bart
    vocab_size: int = 30522
    d_model: int = 768
    n_layers: int = 12
    n_heads: int = 12
    n_kv_heads: int | None = None    # grouped-query attention; None = n_heads
    head_dim: int | None = None      # None = d_model // n_heads
    d_ff: int = 3072
    activation: str = "gelu"         # relu gelu gelu_new silu | gated: swiglu geglu gated-gelu
    norm: str = "layernorm"          # layernorm | rmsnorm
    norm_eps: float = 1e-12
    norm_bias: bool = True
    prenorm: bool = False            # False: BERT post-norm; True: GPT-2/Llama/T5 pre-norm + final norm
    positions: str = "learned"       # learned | sinusoidal | rotary | relative | none
    max_positions: int = 512
    rope_theta: float = 10000.0
    attn_bias: bool = True
    mlp_bias: bool = True
    attn_scale: float | None = None  # None = 1/sqrt(head_dim)
    dropout: float = 0.1
    attn_dropout: float = 0.1
    tie_embeddings: bool = True
    init_std: float = 0.02
    pad_token_id: int | None = 0
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    num_labels: int = 2              # for classification heads

    # ------------------------------------------------------------------ checks
    def validate(self) -> TransformerConfig:
        """Raise a one-line LmlabError on an impossible setting; return self."""
        def positive(name):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise LmlabError(f"{name} must be a positive integer, got {v!r}", f"set {name} to e.g. 64")

        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_positions", "num_labels"):
            positive(name)
        check_fields(self, ("norm_eps", "rope_theta", "attn_scale", "init_std"))
        if self.head_dim is None and self.d_model % self.n_heads:
            raise LmlabError(f"n_heads {self.n_heads} does not divide d_model {self.d_model}",
                             f"choose n_heads among the divisors of {self.d_model} (e.g. "
                             f"{_divisor_near(self.d_model, self.n_heads)})")
        if self.head_dim is not None:
            positive("head_dim")
        kv = self.n_kv_heads or self.n_heads
        if self.n_kv_heads is not None:
            positive("n_kv_heads")
        if self.n_heads % kv:
            raise LmlabError(f"n_kv_heads {kv} does not divide n_heads {self.n_heads}",
                             "choose n_kv_heads that divides n_heads (1 = multi-query)")
        if self.positions == "rotary" and self.dim_head % 2:
            raise LmlabError(f"rotary positions need an even head size, got {self.dim_head}",
                             "change d_model or n_heads")
        if self.norm not in NORMS:
            raise LmlabError(f"unknown norm {self.norm!r}", f"choose one of: {', '.join(NORMS)}")
        if self.positions not in POSITIONS:
            raise LmlabError(f"unknown positions {self.positions!r}",
                             f"choose one of: {', '.join(POSITIONS)}")
        from lmlab.models.blocks import get_activation

        get_activation(self.activation)
        for name in ("dropout", "attn_dropout"):
            v = getattr(self, name)
            if not 0.0 <= v < 1.0:
                raise LmlabError(f"{name} must be in [0, 1), got {v}", f"set {name} to e.g. 0.1")
        for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
            v = getattr(self, name)
            if v is not None and not 0 <= v < self.vocab_size:
                raise LmlabError(f"{name} {v} is outside the vocabulary of {self.vocab_size}",
                                 f"set {name} below vocab_size or to None")
        return self

    @property
    def dim_head(self) -> int:
        return self.head_dim or self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "model config") -> TransformerConfig:
        """Build from ``to_dict()`` output (a file's: ``where`` names it in errors); unknown keys are
        an error (a config from a newer lmlab?), and so is a value of the wrong type or range."""
        from lmlab import values
        from lmlab.file_schemas import model_config_fields

        check_known_fields(cls, data, where)
        values.check(model_config_fields(cls), data, where=where, fix=FILE_FIX)
        return cls(**data).validate()

    def replace(self, **changes) -> TransformerConfig:
        """A validated copy with some fields changed."""
        return dataclasses.replace(self, **changes).validate()


#: what to do about a model config file with a bad value
FILE_FIX = "the model's config.json is damaged: restore it, or save (or import) the model again"


def check_known_fields(config_class: type, data: dict[str, Any], where: str, key: str = "") -> None:
    """``data`` (a ``config_class``'s dict read from the file ``where``, at ``key`` in it) names
    only fields of that class (another field: a config from a newer lmlab)."""
    unknown = sorted(set(data) - {f.name for f in dataclasses.fields(config_class)})
    if unknown:
        raise LmlabError(f"{where}: {key}{config_class.__name__} has no fields {unknown}",
                         "the checkpoint was written by a different lmlab version; upgrade lmlab")


def check_fields(config, names: tuple[str, ...]) -> None:
    """``config``'s fields ``names`` checked against its file schema (lmlab.file_schemas): the
    values that the constructor's own checks do not look at (a norm epsilon of -1 or NaN)."""
    from lmlab import values
    from lmlab.file_schemas import model_config_fields

    values.check(model_config_fields(type(config)), {n: getattr(config, n) for n in names},
                 where="model config", fix=f"set {' / '.join(names)} to finite positive numbers "
                 f"(e.g. norm_eps=1e-5)")


def _divisor_near(n: int, k: int) -> int:
    return min((d for d in range(1, n + 1) if n % d == 0), key=lambda d: abs(d - k))


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
        if self.embedding_size is not None and self.embedding_size <= 0:
            raise LmlabError(f"embedding_size must be positive, got {self.embedding_size}",
                             "e.g. 128 (ALBERT)")
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


@dataclass
class DecoderConfig(TransformerConfig):
    """Causal decoders: GPT-2 (learned positions, LayerNorm, gelu_new, tied head) and Llama
    (RMSNorm, rotary, SwiGLU, grouped-query attention, untied head)."""

    prenorm: bool = True
    activation: str = "gelu_new"
    norm_eps: float = 1e-5
    max_positions: int = 1024
    pad_token_id: int | None = None

    def validate(self) -> DecoderConfig:
        super().validate()
        if not self.prenorm:
            raise LmlabError("decoders are pre-norm in lmlab", "set prenorm=True")
        if self.positions == "relative":
            raise LmlabError("decoders support learned, sinusoidal, rotary or no positions, not 'relative'",
                             "use an encoder-decoder (t5) for relative position bias")
        return self


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
        if self.n_decoder_layers is not None and self.n_decoder_layers <= 0:
            raise LmlabError(f"n_decoder_layers must be positive, got {self.n_decoder_layers}", "e.g. 6")
        if self.positions == "rotary":
            raise LmlabError("encoder-decoders support relative, learned, sinusoidal or no positions, "
                             "not 'rotary'", "set positions='relative' (T5) or 'learned' (BART)")
        if self.share_encoder_decoder and self.decoder_layers != self.n_layers:
            raise LmlabError(f"share_encoder_decoder needs as many decoder layers as encoder layers "
                             f"({self.decoder_layers} != {self.n_layers})", "set n_decoder_layers=None")
        if self.position_offset < 0:
            raise LmlabError(f"position_offset must be >= 0, got {self.position_offset}",
                             "BART uses 2, others 0")
        if self.relative_buckets < 2 or self.relative_max_distance < 2:
            raise LmlabError("relative_buckets and relative_max_distance must be at least 2",
                             "T5 uses 32 and 128")
        if not 0 <= self.decoder_start_token_id < self.vocab_size:
            raise LmlabError(f"decoder_start_token_id {self.decoder_start_token_id} is outside the "
                             f"vocabulary of {self.vocab_size}", "T5 uses the pad id 0, BART the eos id 2")
        return self


@dataclass
class RNNConfig:
    """Recurrent language models: ELMo bi-LM and the LSTM LM. Owned by ``models/rnn.py`` (helper C).

    * ``d_model``: token representation width and LSTM output width (ELMo: 512).
    * ``d_hidden``: LSTM cells per layer (ELMo: 4096); when larger than ``d_model`` each layer's
      output is projected back to ``d_model`` (LSTMP).
    * ``residual``: add each LSTM layer's input to its output (layers above the first; ELMo).
    * ``tie_embeddings``: LSTM LM only, output matrix = input embedding matrix.
    * ``max_chars``, ``char_dim``, ``char_filters`` ([width, n_filters] pairs), ``n_highway``: ELMo's
      character CNN (ELMo: 50, 16, 2048 filters of widths 1-7, 2 highway layers).
    """

    family: str = "lstm"           # lstm | elmo
    vocab_size: int = 10000
    d_model: int = 256
    d_hidden: int = 512
    n_layers: int = 2
    dropout: float = 0.1
    residual: bool = False
    tie_embeddings: bool = True
    max_chars: int = 50
    char_dim: int = 16
    char_filters: list[list[int]] = field(
        default_factory=lambda: [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]])
    n_highway: int = 2
    pad_token_id: int | None = 0
    bos_token_id: int | None = None
    eos_token_id: int | None = None

    def validate(self) -> RNNConfig:
        if self.family not in ("lstm", "elmo"):
            raise LmlabError(f"unknown recurrent family {self.family!r}", "use 'lstm' or 'elmo'")
        for name in ("vocab_size", "d_model", "d_hidden", "n_layers", "char_dim", "max_chars"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise LmlabError(f"{name} must be a positive integer, got {v!r}", f"set {name} to e.g. 128")
        if self.d_hidden < self.d_model:
            raise LmlabError(f"d_hidden {self.d_hidden} is smaller than d_model {self.d_model}",
                             "set d_hidden >= d_model (larger cells are projected down to d_model)")
        if not 0.0 <= self.dropout < 1.0:
            raise LmlabError(f"dropout must be in [0, 1), got {self.dropout}", "set dropout to e.g. 0.1")
        if self.n_highway < 0:
            raise LmlabError(f"n_highway must be >= 0, got {self.n_highway}", "ELMo uses 2")
        if self.max_chars < 3:
            raise LmlabError(f"max_chars {self.max_chars} leaves no room for a character",
                             "use max_chars >= 3")
        ok = isinstance(self.char_filters, (list, tuple)) and len(self.char_filters) > 0 and all(
            isinstance(f, (list, tuple)) and len(f) == 2 and all(isinstance(v, int) and v > 0 for v in f)
            for f in self.char_filters)
        if not ok:
            raise LmlabError(f"char_filters must be a non-empty list of [width, n_filters], "
                             f"got {self.char_filters!r}", "e.g. [[1, 32], [2, 32], [3, 64]]")
        self.char_filters = [list(f) for f in self.char_filters]
        if max(w for w, _ in self.char_filters) > self.max_chars:
            raise LmlabError(f"a char filter is wider than max_chars {self.max_chars}",
                             "narrow it or raise max_chars")
        for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
            v = getattr(self, name)
            if v is not None and not 0 <= v < self.vocab_size:
                raise LmlabError(f"{name} {v} is outside the vocabulary of {self.vocab_size}",
                                 f"set {name} below vocab_size or to None")
        return self

    to_dict = TransformerConfig.to_dict
    from_dict = TransformerConfig.__dict__["from_dict"]
    replace = TransformerConfig.replace


#: family name -> config class
FAMILY_CONFIGS: dict[str, type] = {
    "bert": EncoderConfig, "roberta": EncoderConfig, "albert": EncoderConfig, "electra": EncoderConfig,
    "gpt2": DecoderConfig, "llama": DecoderConfig,
    "t5": Seq2SeqConfig, "bart": Seq2SeqConfig,
    "lstm": RNNConfig, "elmo": RNNConfig,
}

# ----------------------------------------------------------------------------- presets

_SIZES = {  # d_model, n_layers, n_heads, d_ff
    "tiny": (64, 2, 4, 256),
    "small": (256, 4, 4, 1024),
    "base": (768, 12, 12, 3072),
}


def _bert(size: str) -> EncoderConfig:
    d, n, h, f = _SIZES[size]
    return EncoderConfig(family="bert", d_model=d, n_layers=n, n_heads=h, d_ff=f)


def _roberta(size: str) -> EncoderConfig:
    d, n, h, f = _SIZES[size]
    return EncoderConfig(family="roberta", vocab_size=50265, d_model=d, n_layers=n, n_heads=h, d_ff=f,
                         max_positions=514, type_vocab_size=1, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                         positions_from_padding=True, norm_eps=1e-5)


def _albert(size: str) -> EncoderConfig:
    d, n, h, f = _SIZES[size]
    return EncoderConfig(family="albert", vocab_size=30000, d_model=d, n_layers=n, n_heads=h, d_ff=f,
                         embedding_size=min(128, d), layer_groups=1, activation="gelu_new", dropout=0.0,
                         attn_dropout=0.0)


def _electra(size: str) -> EncoderConfig:
    d, n, h, f = _SIZES[size]
    # ELECTRA-small factorizes (E=128 < H=256); ELECTRA-base does not (E = H = 768)
    return EncoderConfig(family="electra", d_model=d, n_layers=n, n_heads=h, d_ff=f,
                         embedding_size=d if size == "base" else min(128, d))


def _gpt2(size: str) -> DecoderConfig:
    d, n, h, f = _SIZES[size]
    return DecoderConfig(family="gpt2", vocab_size=50257, d_model=d, n_layers=n, n_heads=h, d_ff=f,
                         bos_token_id=50256, eos_token_id=50256)


def _llama(size: str) -> DecoderConfig:
    d, n, h, _ = _SIZES[size]
    # SwiGLU's three matrices: d_ff ≈ 8/3 d keeps the FFN parameter count of a 4d GELU FFN.
    return DecoderConfig(family="llama", vocab_size=32000, d_model=d, n_layers=n, n_heads=h,
                         n_kv_heads=max(1, h // 2), d_ff=int(8 * d / 3 + 63) // 64 * 64, activation="swiglu",
                         norm="rmsnorm", norm_eps=1e-6, positions="rotary", max_positions=2048,
                         attn_bias=False, mlp_bias=False, tie_embeddings=False, dropout=0.0, attn_dropout=0.0,
                         bos_token_id=1, eos_token_id=2)


def _t5(size: str) -> Seq2SeqConfig:
    d, n, h, f = _SIZES[size]
    return Seq2SeqConfig(family="t5", vocab_size=32128, d_model=d, n_layers=n, n_heads=h, d_ff=f,
                         activation="relu", norm="rmsnorm", norm_eps=1e-6, prenorm=True, positions="relative",
                         attn_bias=False, mlp_bias=False, attn_scale=1.0, attn_dropout=0.0,
                         pad_token_id=0, eos_token_id=1, decoder_start_token_id=0, scale_decoder_output=True)


def _bart(size: str) -> Seq2SeqConfig:
    d, n, h, f = _SIZES[size]
    n = 6 if size == "base" else n  # facebook/bart-base: 6 encoder + 6 decoder layers
    return Seq2SeqConfig(family="bart", vocab_size=50265, d_model=d, n_layers=n, n_heads=h, d_ff=f,
                         norm_eps=1e-5, max_positions=1024, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                         decoder_start_token_id=2, attn_dropout=0.0, layernorm_embedding=True,
                         position_offset=2, final_logits_bias=True)


_FAMILY_PRESETS: dict[str, Callable[[str], TransformerConfig]] = {
    "bert": _bert, "roberta": _roberta, "albert": _albert, "electra": _electra,
    "gpt2": _gpt2, "llama": _llama, "t5": _t5, "bart": _bart,
}

#: every preset name, e.g. "bert-tiny", "llama-small", "gpt2-base"
PRESETS: dict[str, Callable[[], TransformerConfig]] = {
    f"{fam}-{size}": (lambda fam=fam, size=size: _FAMILY_PRESETS[fam](size))
    for fam in _FAMILY_PRESETS for size in _SIZES
}


def get_preset(name: str, **overrides) -> TransformerConfig:
    """A fresh, validated config for preset ``name`` (see :data:`PRESETS`), with ``overrides`` applied."""
    if name not in PRESETS:
        raise LmlabError(f"unknown model preset {name!r}", f"choose one of: {', '.join(PRESETS)}")
    cfg = PRESETS[name]()
    fields = {f.name for f in dataclasses.fields(cfg)}
    bad = sorted(set(overrides) - fields)
    if bad:
        raise LmlabError(f"preset {name} has no settings {bad}", f"use fields of {type(cfg).__name__}")
    vocab = overrides.get("vocab_size", cfg.vocab_size)
    for special in ("pad_token_id", "bos_token_id", "eos_token_id"):
        # a smaller vocabulary (your own tokenizer) drops the preset's special ids that no longer fit
        v = getattr(cfg, special, None)
        if special not in overrides and isinstance(v, int) and v >= vocab:
            overrides[special] = None
    return dataclasses.replace(cfg, **overrides).validate()


def config_from_dict(data: dict[str, Any], where: str = "model config") -> TransformerConfig | RNNConfig:
    """Rebuild a config from its dict (read from the file ``where``); the ``family`` field picks
    the class."""
    family = data.get("family")
    if not isinstance(family, str) or family not in FAMILY_CONFIGS:
        raise LmlabError(f"{where}: unknown model family {family!r}",
                         f"expected one of: {', '.join(FAMILY_CONFIGS)}")
    return FAMILY_CONFIGS[family].from_dict(data, where)


# ----------------------------------------------------------------------------- recurrent presets (helper C)
def _elmo_tiny() -> RNNConfig:
    return RNNConfig(family="elmo", vocab_size=1000, d_model=32, d_hidden=64, n_layers=2, residual=True,
                     max_chars=16, char_dim=8, char_filters=[[1, 16], [2, 16], [3, 32], [4, 32]], n_highway=2)


def _lstm_tiny() -> RNNConfig:
    return RNNConfig(family="lstm", vocab_size=1000, d_model=32, d_hidden=64, n_layers=2, tie_embeddings=True)


PRESETS["elmo-tiny"] = _elmo_tiny
PRESETS["lstm-tiny"] = _lstm_tiny
