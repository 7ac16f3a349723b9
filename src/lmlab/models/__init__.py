"""lmlab models: one Transformer core wired as encoders, decoders and encoder-decoders (+ RNNs).

>>> from lmlab.models import build_model, get_preset, load_checkpoint
>>> model = build_model(get_preset("bert-tiny", vocab_size=1000))       # EncoderModel with an MLM head
>>> model.save("ck/")                                                   # doctest: +SKIP
>>> model = load_checkpoint("ck/")                                      # doctest: +SKIP

Any model directory (lmlab, Hugging Face, adapters, int8) opens with
:func:`lmlab.loading.load_model`, which sits above this package.

``MODEL_REGISTRY`` maps an architecture name to the class (or builder) that makes it; adding an
architecture is one module plus one line there.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

import torch

from lmlab.errors import LmlabError
from lmlab.fileio import read_json
from lmlab.models.checkpoint import (
    CONFIG_NAME,
    FORMAT_VERSION,
    TOKENIZER_DIR,
    WEIGHTS_NAME,
    LmlabModel,
    check_tokenizer,
    load_state,
    read_safetensors,
    save_checkpoint,
    tokenizer_matches,
)
from lmlab.models.config import (
    PRESETS,
    DecoderConfig,
    EncoderConfig,
    RNNConfig,
    Seq2SeqConfig,
    TransformerConfig,
    config_from_dict,
    get_preset,
)
from lmlab.models.output import ModelOutput

#: architecture -> "module:attribute" of a class or builder called as ``f(config, heads=...)``
MODEL_REGISTRY = {
    "encoder": "lmlab.models.encoder:EncoderModel",
    "decoder": "lmlab.models.decoder:DecoderModel",
    "seq2seq": "lmlab.models.seq2seq:Seq2SeqModel",
    "rnn": "lmlab.models.rnn:build_rnn",
    "xlnet": "lmlab.models.xlnet:XLNetModel",
    "transfo-xl": "lmlab.models.transformer_xl:TransfoXLModel",
}

#: config class -> architecture
CONFIG_ARCHITECTURE = {
    EncoderConfig: "encoder",
    DecoderConfig: "decoder",
    Seq2SeqConfig: "seq2seq",
    RNNConfig: "rnn",
}

# XLNet and Transformer-XL (helper X): their configs live beside their models
from lmlab.models.config import FAMILY_CONFIGS  # noqa: E402
from lmlab.models.transformer_xl import TransfoXLConfig, transfo_xl_tiny  # noqa: E402
from lmlab.models.xlnet import XLNetConfig, xlnet_tiny  # noqa: E402

FAMILY_CONFIGS.update({"xlnet": XLNetConfig, "transfo-xl": TransfoXLConfig})
CONFIG_ARCHITECTURE.update({XLNetConfig: "xlnet", TransfoXLConfig: "transfo-xl"})
PRESETS.update({"xlnet-tiny": xlnet_tiny, "transfo-xl-tiny": transfo_xl_tiny})

__all__ = [
    "MODEL_REGISTRY",
    "PRESETS",
    "DecoderConfig",
    "EncoderConfig",
    "LmlabModel",
    "ModelOutput",
    "RNNConfig",
    "Seq2SeqConfig",
    "TransformerConfig",
    "build_model",
    "config_from_dict",
    "get_preset",
    "load_checkpoint",
    "model_class",
    "save_checkpoint",
]


def model_class(architecture: str):
    """The class (or builder function) registered for ``architecture``."""
    if architecture not in MODEL_REGISTRY:
        raise LmlabError(
            f"unknown model architecture {architecture!r}", f"choose one of: {', '.join(MODEL_REGISTRY)}"
        )
    module, attr = MODEL_REGISTRY[architecture].split(":")
    return getattr(importlib.import_module(module), attr)


def physical_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def check_fits_in_memory(config, architecture: str) -> None:
    """A one-line error, before any allocation, for a model whose float32 weights alone exceed
    this machine's memory (a vocabulary of 10^12, a width of 10^6): an estimate from the config."""
    if architecture == "rnn":
        return
    from lmlab.models.flops import count_parameters

    try:
        n = count_parameters(config, heads=()).total
    except LmlabError:
        return
    total = physical_memory_bytes()
    if total is not None and n * 4 > total:
        family = getattr(config, "family", architecture)
        raise LmlabError(f"a {family} model of this config has about {n:.3g} parameters, "
                         f"{n * 4 / 2**30:,.0f} GiB in float32, more than this machine's "
                         f"{total / 2**30:,.0f} GiB of memory",
                         "choose a smaller vocab_size, d_model, d_ff or n_layers")


def build_model(config, heads=None, architecture: str | None = None):
    """A freshly initialised model for ``config`` (a config object or a preset name).

    ``heads``: names of task heads (see ``models/heads.py``); None = the family's pretraining
    heads, ``()`` = the bare network.
    """
    if isinstance(config, str):
        config = get_preset(config)
    architecture = architecture or CONFIG_ARCHITECTURE.get(type(config))
    if architecture is None:
        raise LmlabError(
            f"cannot build a model from a {type(config).__name__}",
            "pass an EncoderConfig, DecoderConfig, Seq2SeqConfig, RNNConfig or a preset name",
        )
    check_fits_in_memory(config, architecture)
    make = model_class(architecture)
    if architecture == "rnn":
        return make(config)
    return make(config, heads=heads)


def load_checkpoint(directory: str | os.PathLike, map_location: str | torch.device = "cpu") -> LmlabModel:
    """Load an lmlab checkpoint directory written by :func:`save_checkpoint`."""
    directory = Path(directory)
    if not directory.is_dir():
        raise LmlabError(f"checkpoint {directory} does not exist", "check the path")
    meta: Any = read_json(directory / CONFIG_NAME, "model config")
    version = meta.get("lmlab_format_version") if isinstance(meta, dict) else None
    if version != FORMAT_VERSION:
        raise LmlabError(
            f"checkpoint {directory} has format version {version!r}, this lmlab reads version "
            f"{FORMAT_VERSION}",
            "re-save it with a matching lmlab version",
        )
    for key in ("architecture", "family", "config"):
        if key not in meta:
            raise LmlabError(
                f"checkpoint config {directory / CONFIG_NAME} lacks {key!r}", "save the model again"
            )
    if meta.get("quantization"):  # int8 weights: the adapt package reads them, above this layer
        raise LmlabError(f"{directory} holds int8 weights (lmlab compress quantize), which this reader "
                         "does not take",
                         "use the float checkpoint it was quantized from (in Python, "
                         "lmlab.loading.load_model opens int8 checkpoints too)")
    config_dict = dict(meta["config"])
    config_dict.setdefault("family", meta["family"])
    config = config_from_dict(config_dict)
    model = build_model(config, heads=meta.get("heads"), architecture=meta["architecture"])
    state = read_safetensors(directory / WEIGHTS_NAME)
    load_state(model, state, str(directory))
    model.to(map_location)
    tok_dir = directory / TOKENIZER_DIR
    if tok_dir.is_dir():
        from lmlab.tokenizers import load_tokenizer

        model.tokenizer = load_tokenizer(tok_dir)
        check_tokenizer(config, model.tokenizer)
        if not tokenizer_matches(meta, model.tokenizer):
            raise LmlabError(f"{tok_dir} is not the tokenizer this model was saved with (same size, other "
                             "tokens): its ids would mean other words to the model",
                             "restore the checkpoint's own tokenizer/ or save the model with the right one")
    return model.eval()
