"""The configuration every Transformer family builds on: :class:`TransformerConfig`.

A config is plain data (it round-trips through ``config.json``); :meth:`TransformerConfig.validate`
checks it and raises a one-line :class:`LmlabError` naming the bad field and the fix, so an
impossible model fails when it is built, never later with a silently wrong answer.

Each family's own config class and presets live in its folder (``models/encoder/config.py``:
:class:`EncoderConfig`; ``models/decoder/config.py``: :class:`DecoderConfig`; ``seq2seq``,
``rnn``, ``xlnet``, ``transformer_xl`` likewise); :mod:`lmlab.models.registry` lists the families.
The names that used to be defined here (``EncoderConfig``, ``PRESETS``, ``get_preset``,
``config_from_dict``, ``FAMILY_CONFIGS`` ...) are still importable from this module.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from lmlab.errors import LmlabError


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
        """Raise a one-line LmlabError on an impossible setting; return self. Each field's kind and
        range is its file schema's (:func:`check_fields`); the rules between fields are here."""
        check_fields(self)
        if self.head_dim is None and self.d_model % self.n_heads:
            raise LmlabError(f"n_heads {self.n_heads} does not divide d_model {self.d_model}",
                             f"choose n_heads among the divisors of {self.d_model} (e.g. "
                             f"{_divisor_near(self.d_model, self.n_heads)})")
        kv = self.n_kv_heads or self.n_heads
        if self.n_heads % kv:
            raise LmlabError(f"n_kv_heads {kv} does not divide n_heads {self.n_heads}",
                             "choose n_kv_heads that divides n_heads (1 = multi-query)")
        if self.positions == "rotary" and self.dim_head % 2:
            raise LmlabError(f"rotary positions need an even head size, got {self.dim_head}",
                             "change d_model or n_heads")
        from lmlab.models.blocks import get_activation

        get_activation(self.activation)
        check_special_ids(self)
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


def check_special_ids(config) -> None:
    """``config``'s pad, bos and eos ids are None or inside its vocabulary."""
    for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
        v = getattr(config, name)
        if v is not None and not 0 <= v < config.vocab_size:
            raise LmlabError(f"{name} {v} is outside the vocabulary of {config.vocab_size}",
                             f"set {name} below vocab_size or to None")


def check_fields(config) -> None:
    """Every field of the model config ``config`` (a dataclass) checked against its type in the
    config's file schema (:mod:`lmlab.file_schemas`, the one statement of each field's kind and
    range, which a checkpoint's config.json is read by), strictly as every argument of the Python
    API (:func:`lmlab.arguments.number_argument`): ``get_preset(..., d_model=True)``, ``dropout="0.1"``
    or ``norm_eps=nan`` is one line naming the field, e.g. ``d_model must be at least 1 (got 0);
    use a whole number of at least 1``. A field at its default (of the default's kind) is not
    checked again."""
    import typing

    from lmlab import values
    from lmlab.file_schemas import model_config_fields

    hints = typing.get_type_hints(model_config_fields(type(config)), include_extras=True)
    for f in dataclasses.fields(config):
        v = getattr(config, f.name)
        if f.name not in hints or (type(v) is type(f.default) and v == f.default):
            continue
        values.check(hints[f.name], _as_lists(v), f.name, strict=True)


def _as_lists(value):
    """Tuples as lists, nested too (the schema's lists are JSON's; a config may hold tuples)."""
    return [_as_lists(v) for v in value] if isinstance(value, (list, tuple)) else value


def position_limit(config) -> int | None:
    """The longest input (in tokens) a model of ``config`` takes: its ``max_positions`` when its
    positions are a table (learned or sinusoidal; RoBERTa's start after the padding id), None
    when nothing bounds it (rotary, relative as in T5, none; the LSTM)."""
    if getattr(config, "positions", None) not in ("learned", "sinusoidal"):
        return None
    limit = getattr(config, "max_positions", None)
    if not isinstance(limit, int):
        return None
    if getattr(config, "positions_from_padding", False):
        limit -= (getattr(config, "pad_token_id", None) or 0) + 1
    return limit


def max_length_for(config, requested: int | None, default: int, flag: str = "--max-length",
                   reserved: int = 0) -> int:
    """The one decision of how long an input may be for a model of ``config``: ``requested`` (the
    user's ``--max-length``; None: not given) must fit its positions (:func:`position_limit`),
    else a one-line error naming ``flag`` before any work; a ``default`` is cut down to them.
    ``reserved``: positions a fine-tuning method's virtual tokens take in front of every input (a
    soft prompt, :func:`lmlab.adapt.options.check_positions`), which the input cannot use."""
    limit = position_limit(config)
    if limit is not None:
        limit -= reserved
    if requested is None:
        return default if limit is None else min(default, limit)
    if limit is not None and requested > limit:
        room = (f"the {limit} positions the model has after {reserved} virtual tokens" if reserved
                else f"the model's {limit} positions")
        raise LmlabError(f"{flag} {requested} exceeds {room}",
                         f"use {flag} {limit} or less" + (" (or fewer virtual tokens)" if reserved else ""))
    return requested


def _divisor_near(n: int, k: int) -> int:
    return min((d for d in range(1, n + 1) if n % d == 0), key=lambda d: abs(d - k))


#: preset sizes shared by the Transformer families: d_model, n_layers, n_heads, d_ff
PRESET_SIZES = {
    "tiny": (64, 2, 4, 256),
    "small": (256, 4, 4, 1024),
    "base": (768, 12, 12, 3072),
}

#: the built-in families' config classes (importable from here and from lmlab.models as before)
CONFIG_CLASSES = {
    "EncoderConfig": "lmlab.models.encoder.config",
    "DecoderConfig": "lmlab.models.decoder.config",
    "Seq2SeqConfig": "lmlab.models.seq2seq.config",
    "RNNConfig": "lmlab.models.rnn.config",
    "XLNetConfig": "lmlab.models.xlnet.config",
    "TransfoXLConfig": "lmlab.models.transformer_xl.config",
}
#: names defined in the family folders and the registry, importable from here as before
_MOVED = {**CONFIG_CLASSES,
          **dict.fromkeys(("PRESETS", "get_preset", "config_from_dict"), "lmlab.models.registry")}


def __getattr__(name: str):
    """``from lmlab.models.config import EncoderConfig`` (and the other names in ``_MOVED``):
    looked up by name in the family folders, which themselves build on this module."""
    import importlib

    if name in _MOVED:
        return getattr(importlib.import_module(_MOVED[name]), name)
    if name == "FAMILY_CONFIGS":
        return importlib.import_module("lmlab.models.registry").family_configs()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
