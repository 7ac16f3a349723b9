"""lmlab models: one Transformer core wired as encoders, decoders and encoder-decoders (+ RNNs).

>>> from lmlab.models import build_model, get_preset, load_model
>>> model = build_model(get_preset("bert-tiny", vocab_size=1000))       # EncoderModel with an MLM head
>>> model.save("ck/")                                                   # doctest: +SKIP
>>> model = load_model("ck/")         # an lmlab checkpoint or a Hugging Face model dir  # doctest: +SKIP

``MODEL_REGISTRY`` maps an architecture name to the class (or builder) that makes it; adding an
architecture is one module plus one line there.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

from lmlab.errors import LmlabError
from lmlab.models.checkpoint import LmlabModel, is_lmlab_checkpoint, load_checkpoint, save_checkpoint
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
    "load_model",
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


def load_model(path: str | os.PathLike, map_location="cpu"):
    """Load a model from an lmlab checkpoint directory or a Hugging Face model directory.

    Hugging Face directories (``config.json`` with a ``model_type`` + ``model.safetensors``) of
    bert, roberta, albert, electra, gpt2, llama, t5 and bart are converted on the fly; the model
    comes back in eval mode, with the directory's tokenizer attached when lmlab can read it.
    """
    p = Path(path)
    if not p.exists():
        raise LmlabError(
            f"model {p} does not exist", "pass an lmlab checkpoint or a Hugging Face model directory"
        )
    if not p.is_dir():
        raise LmlabError(f"model path {p} is a file", "pass the directory that holds config.json")
    if is_lmlab_checkpoint(p):
        return load_checkpoint(p, map_location)
    if (p / "base").is_dir() and (p / "adapter" / "adapter_config.json").is_file():
        # `lmlab finetune --method adapter|prefix|prompt` output: frozen base + the method's weights.
        # Loaded through the adapt package's plug-in (models never import it at module level).
        import importlib

        peft_io = importlib.import_module("lmlab.adapt.peft_io")
        model = peft_io.load_peft(load_model(p / "base", map_location), p / "adapter")
        return model.to(map_location).eval()
    from lmlab.interop import hf_import

    return hf_import(p).to(map_location)
