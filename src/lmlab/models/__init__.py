"""lmlab models: one Transformer core wired as encoders, decoders and encoder-decoders (+ RNNs).

>>> from lmlab.models import build_model, get_preset, load_checkpoint
>>> model = build_model(get_preset("bert-tiny", vocab_size=1000))       # EncoderModel with an MLM head
>>> model.save("ck/")                                                   # doctest: +SKIP
>>> model = load_checkpoint("ck/")                                      # doctest: +SKIP

Any model directory (lmlab, Hugging Face, adapters, int8) opens with
:func:`lmlab.loading.load_model`, which sits above this package.

Each model family is a folder here (``encoder/``, ``decoder/``, ``seq2seq/``, ``rnn/``, ``xlnet/``,
``transformer_xl/``) whose ``SPEC`` (:class:`lmlab.models.family.FamilySpec`) names its config,
presets, builder, FLOP counting and Hugging Face converter; :data:`FAMILIES`
(:mod:`lmlab.models.registry`) lists them, so adding a family is one folder plus one line there
(docs/extending.md).
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

import torch

from lmlab.arguments import text_list_argument
from lmlab.budget import require_weights_fit
from lmlab.deprecation import warn_deprecated
from lmlab.errors import LmlabError
from lmlab.fileio import read_json
from lmlab.models.checkpoint import (
    CONFIG_NAME,
    FORMAT_VERSION,
    TOKENIZER_DIR,
    WEIGHTS_NAME,
    LmlabModel,
    check_tokenizer,
    is_int8_checkpoint,
    load_state,
    read_safetensors,
    refuse_int8,
    save_checkpoint,
    tokenizer_matches,
)
from lmlab.models.config import CONFIG_CLASSES, TransformerConfig
from lmlab.models.facts import ModelFacts
from lmlab.models.family import FamilySpec
from lmlab.models.output import ModelOutput
from lmlab.models.registry import (
    FAMILIES,
    PRESETS,
    config_from_dict,
    family_configs,
    family_spec,
    get_preset,
    spec_of_config,
    spec_of_family,
)

__all__ = [
    "FAMILIES",
    "MODEL_REGISTRY",
    "PRESETS",
    "FamilySpec",
    "DecoderConfig",
    "EncoderConfig",
    "LmlabModel",
    "ModelFacts",
    "ModelOutput",
    "RNNConfig",
    "Seq2SeqConfig",
    "TransformerConfig",
    "TransfoXLConfig",
    "XLNetConfig",
    "build_model",
    "checkpoint_facts",
    "config_from_dict",
    "family_configs",
    "family_spec",
    "get_preset",
    "is_int8_checkpoint",
    "load_checkpoint",
    "read_checkpoint_meta",
    "model_class",
    "refuse_int8",
    "save_checkpoint",
    "spec_of_config",
    "spec_of_family",
]


def model_class(architecture: str):
    """The function that builds a model of ``architecture``, called as ``f(config, heads=...)``."""
    return family_spec(architecture).build


def check_fits_in_memory(config, architecture: str = "") -> None:
    """A one-line error, before any allocation, for a model whose float32 weights alone exceed
    this machine's memory (a vocabulary of 10^12, a width of 10^6, 10^12 positions): an estimate
    from the config, checked by :mod:`lmlab.budget` (families that count no parameters from their
    config are not checked). ``architecture`` only names the model in the message."""
    n = weight_count(config)
    if n is None:
        return
    require_weights_fit(n, getattr(config, "family", "") or architecture or spec_of_config(config).name,
                        "choose a smaller vocab_size, d_model, d_ff, n_layers or max_positions")


def weight_count(config) -> int | None:
    """The numbers a model of ``config`` holds in its weights (a fixed sinusoidal table included),
    counted from the config alone; None for a family that counts no parameters from its config."""
    try:
        spec = spec_of_config(config)
        if spec.count_parameters is None:
            return None
        n = spec.count_parameters(config, ()).total
    except LmlabError:
        return None
    table = (getattr(config, "max_positions", 0), getattr(config, "d_model", 0))
    if getattr(config, "positions", None) == "sinusoidal" and all(isinstance(x, int) for x in table):
        n += table[0] * table[1]  # a fixed table, not a parameter
    return n


def build_model(config, heads=None, architecture: str | None = None):
    """A freshly initialised model for ``config`` (a config object or a preset name).

    ``heads``: names of task heads (see ``models/heads.py``); None = the family's pretraining
    heads, ``()`` = the bare network.
    """
    if isinstance(config, str):
        if config not in PRESETS and (os.sep in config or os.path.isdir(config)):
            raise LmlabError(f"build_model's config {config!r} is a path, not a preset name",
                             f"to load a saved model, use load_model({config!r}) (lmlab.loading)")
        config = get_preset(config)
    if heads is not None:
        heads = tuple(text_list_argument(heads, "build_model's heads"))  # "lm" is not ("l", "m")
    spec = family_spec(architecture) if architecture else _spec_to_build(config)
    check_fits_in_memory(config, spec.name)
    return spec.build(config, heads)


def _spec_to_build(config) -> FamilySpec:
    try:
        return spec_of_config(config)
    except LmlabError:
        if isinstance(config, os.PathLike):
            fix = f"to load a saved model, use load_model({os.fspath(config)!r}) (lmlab.loading)"
        elif isinstance(config, dict):
            fix = "turn a dict into a config with config_from_dict(d) (with its 'family'), or use get_preset"
        else:
            fix = ("pass the config of a model family (EncoderConfig, DecoderConfig, Seq2SeqConfig, "
                   "RNNConfig ...) or a preset name")
        raise LmlabError(f"cannot build a model from a {type(config).__name__}", fix) from None


def read_checkpoint_meta(directory: str | os.PathLike) -> dict[str, Any]:
    """A checkpoint's ``config.json``, checked whole against its file schema
    (:func:`lmlab.file_schemas.checkpoint_schema`): a value of the wrong type or range anywhere in
    it is a one-line error naming the file and the key, before any weight is read."""
    from lmlab import values
    from lmlab.file_schemas import checkpoint_schema, model_config_fields
    from lmlab.models.config import FILE_FIX, check_known_fields

    directory = Path(directory)
    path = directory / CONFIG_NAME
    meta: Any = read_json(path, "model config")
    version = meta.get("lmlab_format_version") if isinstance(meta, dict) else None
    if version != FORMAT_VERSION:
        raise LmlabError(
            f"checkpoint {directory} has format version {version!r}, this lmlab reads version "
            f"{FORMAT_VERSION}",
            "re-save it with a matching lmlab version",
        )
    for key in ("architecture", "family", "config"):
        if key not in meta:
            raise LmlabError(f"checkpoint config {path} lacks {key!r}", "save the model again")
    config = meta["config"]
    family = config.get("family", meta["family"]) if isinstance(config, dict) else meta["family"]
    spec = spec_of_family(family if isinstance(family, str) else None, str(path))
    config_class = spec.config_class
    if isinstance(config, dict):  # a newer lmlab's field is named as such, before the types are judged
        check_known_fields(config_class, config, str(path), key="config: ")
    values.check(checkpoint_schema(model_config_fields(config_class)), meta, where=str(path), fix=FILE_FIX)
    architecture = spec.name
    if meta["architecture"] != architecture:
        raise LmlabError(f"{path}: architecture: must be {architecture!r} for a {family} model "
                         f"(got {meta['architecture']!r})", FILE_FIX)
    return meta


def facts_from_meta(meta: dict[str, Any], where: str) -> ModelFacts:
    """The :class:`ModelFacts` of a checkpoint's ``config.json`` (``meta``, already checked by
    :func:`read_checkpoint_meta`; an int8 or adapter directory writes the same keys)."""
    config_dict = dict(meta.get("config") or meta.get("model_config"))
    config_dict.setdefault("family", meta.get("family"))
    config = config_from_dict(config_dict, where=where)
    heads = meta.get("heads")
    if heads is None:
        heads = family_spec(meta["architecture"]).default_heads(config)
    return ModelFacts(meta["architecture"], config.family, tuple(heads), config)


def checkpoint_facts(directory: str | os.PathLike) -> ModelFacts:
    """What the lmlab checkpoint in ``directory`` is (architecture, family, heads, config), read
    from its ``config.json`` alone: no weight is loaded."""
    directory = Path(directory)
    return facts_from_meta(read_checkpoint_meta(directory), str(directory / CONFIG_NAME))


def load_checkpoint(directory: str | os.PathLike, map_location: str | torch.device = "cpu") -> LmlabModel:
    """Load an lmlab checkpoint directory written by :func:`save_checkpoint`."""
    directory = Path(directory)
    if not directory.is_dir():
        raise LmlabError(f"checkpoint {directory} does not exist", "check the path")
    meta = read_checkpoint_meta(directory)
    refuse_int8(directory, meta=meta)  # int8 weights: the adapt package reads them, above this layer
    config_dict = dict(meta["config"])
    config_dict.setdefault("family", meta["family"])
    config = config_from_dict(config_dict, where=str(directory / CONFIG_NAME))
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


def _specs() -> dict[str, FamilySpec]:
    return {arch: family_spec(arch) for arch in FAMILIES}


def __getattr__(name: str):
    """The family classes (``EncoderConfig`` ...) and the views ``MODEL_REGISTRY`` (architecture ->
    builder) and ``CONFIG_ARCHITECTURE`` (config class -> architecture), read from the registry.

    ``lmlab.models.load_model``: the README's path until 0.1, now :func:`lmlab.loading.load_model`
    (which sits above this package). The alias keeps working for one release, with a warning."""
    if name in CONFIG_CLASSES:  # each defined in its family's folder
        return getattr(importlib.import_module(CONFIG_CLASSES[name]), name)
    if name == "MODEL_REGISTRY":  # architecture -> builder, read from the family specs
        return {arch: spec.build for arch, spec in _specs().items()}
    if name == "CONFIG_ARCHITECTURE":  # config class -> the interface objectives train
        return {spec.config_class: spec.kind for spec in _specs().values()}
    if name == "load_model":
        warn_deprecated("lmlab.models.load_model", "import it from lmlab.loading (lmlab.loading.load_model)")
        # looked up by name at call time: a deprecated alias, not a dependency of this package
        return importlib.import_module("lmlab.loading").load_model
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
