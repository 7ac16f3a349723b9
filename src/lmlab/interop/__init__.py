"""Hugging Face interop: read and write ``config.json`` + ``model.safetensors`` model directories.

``hf_import(dir)`` turns a transformers model directory (BERT, RoBERTa, ALBERT, ELECTRA, GPT-2,
Llama, T5, BART) into the equivalent lmlab model; ``hf_export(model, dir)`` writes an lmlab model
so that ``transformers.<Class>.from_pretrained(dir)`` loads it and computes the same logits.
transformers itself is never imported: the converters read and write the JSON and safetensors
files directly, so it stays an optional dependency.

Each converter lives in its model family's folder (``lmlab/models/encoder/hf.py``, ``decoder/hf.py``,
``seq2seq/hf.py``), named by the family's spec (``FamilySpec.hf``), and
exposes ``MODEL_TYPES``, ``from_hf(hf_config, state, architectures) -> model``,
``to_hf(model) -> (hf_config, state)`` and, optionally, ``describe(hf_config) -> (config, heads)``
(what ``from_hf`` would build, told from the config alone: :func:`hf_facts`). A family with a
converter needs nothing here.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
from pathlib import Path

from lmlab.arguments import model_argument, path_argument, tokenizer_argument
from lmlab.errors import LmlabError
from lmlab.fileio import atomic_dir, inside, read_json, write_json

__all__ = ["CONVERTERS", "check_model_dir", "converter", "converters", "hf_export", "hf_facts", "hf_import",
           "load_plain_model", "read_hf_weights"]

#: the fix of a corrupt file of a Hugging Face model folder (another tool wrote it)
HF_REWRITE = "save the model again with transformers (save_pretrained), or download it again"


def converters() -> dict[str, str]:
    """HF ``model_type`` -> the converter module named by its family's spec (each converter lists
    the types it reads in ``MODEL_TYPES``)."""
    from lmlab.models.registry import family_specs

    modules = [spec.hf for spec in family_specs().values() if spec.hf]
    return {t: m for m in modules for t in importlib.import_module(m).MODEL_TYPES}


def converter(model_type: str):
    """The converter module for an HF ``model_type`` (or lmlab family name)."""
    table = converters()
    if model_type not in table:
        raise LmlabError(
            f"Hugging Face model type {model_type!r} is not supported",
            f"lmlab converts: {', '.join(table)}",
        )
    return importlib.import_module(table[model_type])


def __getattr__(name: str):
    """``CONVERTERS`` (HF model type -> converter module), now read from the family specs."""
    if name == "CONVERTERS":
        return converters()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def check_model_dir(path: str | os.PathLike) -> Path:
    """``path`` as a Path, or a one-line error when it is no directory."""
    p = Path(path)
    if not p.exists():
        raise LmlabError(
            f"model {p} does not exist", "pass an lmlab checkpoint or a Hugging Face model directory"
        )
    if not p.is_dir():
        raise LmlabError(f"model path {p} is a file", "pass the directory that holds config.json")
    return p


def load_plain_model(path: str | os.PathLike, map_location="cpu"):
    """A model with no adapters and float weights: an lmlab checkpoint or a Hugging Face model
    directory (converted on the fly). :func:`lmlab.loading.load_model` also opens the adapter
    and int8 directories that ``lmlab finetune`` and ``lmlab compress`` write."""
    from lmlab.models import load_checkpoint
    from lmlab.models.checkpoint import is_lmlab_checkpoint

    p = check_model_dir(path)
    if is_lmlab_checkpoint(p):
        return load_checkpoint(p, map_location)
    return hf_import(p).to(map_location)


def read_hf_weights(directory: str | os.PathLike) -> dict:
    """All tensors of an HF model directory: ``model.safetensors`` or a sharded index of them."""
    from lmlab.models.checkpoint import read_safetensors

    d = Path(directory)
    if (d / "model.safetensors").is_file():
        return read_safetensors(d / "model.safetensors")
    index = d / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(read_json(index, "safetensors index", HF_REWRITE).get("weight_map", {}).values()))
        state = {}
        for f in files:
            state.update(read_safetensors(inside(d, f, f"{index.name} weight_map")))
        return state
    if (d / "pytorch_model.bin").is_file():
        raise LmlabError(
            f"{d} holds only pytorch_model.bin (a pickle, which can run code on load)",
            "convert it to model.safetensors with transformers (save_pretrained) first",
        )
    raise LmlabError(
        f"{d} has no model.safetensors", "pass a Hugging Face model directory with safetensors weights"
    )


class _HFConfig(dict):
    """A parsed HF config.json whose missing required keys are a one-line error, not a KeyError."""

    def __init__(self, data: dict, path: Path):
        super().__init__(data)
        self.path = path

    def __missing__(self, key):
        raise LmlabError(
            f"{self.path} lacks {key!r}", "the config.json is incomplete: re-save it with transformers")


def check_hf_config(hf_config: dict, path: Path) -> None:
    """The keys of a Hugging Face ``config.json`` that lmlab's converters read, checked against
    its model type's file schema (:data:`lmlab.file_schemas.HF_CONFIG_FIELDS`): a string where a
    number belongs (``"layer_norm_epsilon": "1e-5"``), a negative epsilon or a null size is one line
    naming the key, before any weight is read."""
    from lmlab import values
    from lmlab.file_schemas import HF_CONFIG_FIELDS, HFConfigHead

    fix = "correct that value in config.json (or save the model again with transformers)"
    values.check(HFConfigHead, hf_config, where=str(path), fix=fix)
    converter(hf_config["model_type"])  # an unsupported type is named before its keys are judged
    values.check(HF_CONFIG_FIELDS[hf_config["model_type"]], hf_config, where=str(path), fix=fix)


def refuse_lmlab_output(d: Path) -> None:
    """Refuse, before its ``config.json`` is judged as Hugging Face's, a directory that is lmlab's
    own: a checkpoint (a fine-tune, a pretraining checkpoint) or a pretraining run (``checkpoints/``
    and no ``config.json``): lmlab reads it as it is, there is nothing to import."""
    from lmlab.models.checkpoint import is_lmlab_checkpoint

    if (d / "checkpoints").is_dir() and not (d / "config.json").exists():
        what = "an lmlab pretraining run"
    elif is_lmlab_checkpoint(d):
        what = "an lmlab checkpoint"
    else:
        return
    raise LmlabError(f"{d} is {what}, not a Hugging Face model directory: it needs no import",
                     "pass it to lmlab commands as it is (--checkpoint), or give import --hf a "
                     "transformers model directory")


def _read_hf_config(d: Path) -> _HFConfig:
    """A Hugging Face directory's ``config.json``, checked (:func:`check_hf_config`); an lmlab
    output is named as one (:func:`refuse_lmlab_output`)."""
    refuse_lmlab_output(d)
    hf_config = read_json(d / "config.json", "model config", HF_REWRITE)
    model_type = hf_config.get("model_type") if isinstance(hf_config, dict) else None
    if not model_type:
        raise LmlabError(
            f"{d / 'config.json'} has no model_type", "pass an lmlab checkpoint or an HF model dir"
        )
    check_hf_config(hf_config, d / "config.json")
    return _HFConfig(hf_config, d / "config.json")


def hf_facts(directory: str | os.PathLike):
    """The :class:`~lmlab.models.facts.ModelFacts` of the model :func:`hf_import` would build from
    ``directory``, read from its ``config.json`` alone; None when its converter cannot tell them
    without the weights (no ``describe``)."""
    from lmlab.models.facts import ModelFacts
    from lmlab.models.registry import spec_of_config

    hf_config = _read_hf_config(Path(directory))
    describe = getattr(converter(hf_config["model_type"]), "describe", None)
    if describe is None:
        return None
    config, heads = describe(hf_config)
    return ModelFacts(spec_of_config(config).name, config.family, tuple(heads), config)


def hf_import(directory: str | os.PathLike):
    """Load a Hugging Face model directory as an lmlab model (eval mode, float32 as stored)."""
    d = Path(directory)
    hf_config = _read_hf_config(d)
    module = converter(hf_config["model_type"])
    tok = _try_tokenizer(d)  # a corrupt tokenizer is refused before any weight is read
    state = read_hf_weights(d)
    check_hf_weights(state, d)
    model = module.from_hf(hf_config, state, list(hf_config.get("architectures") or []))
    model.tokenizer = tok if tok is not None and tok.vocab_size <= model.config.vocab_size else None
    return model.eval()


def _try_tokenizer(d: Path):
    """The directory's tokenizer; None when it has none or one of a kind lmlab does not read (a
    tokenizer.json model type or normalizer it does not support). A corrupt one (not JSON, damaged
    content) is a one-line error: the model would otherwise come without its tokenizer, silently."""
    if not ((d / "tokenizer.json").is_file() or (d / "vocab.txt").is_file()):
        return None
    from lmlab.errors import UnsupportedInput
    from lmlab.tokenizers import load_tokenizer

    try:
        return load_tokenizer(d)
    except (UnsupportedInput, ImportError):
        return None
    except LmlabError as e:
        raise LmlabError(f"the tokenizer of Hugging Face model {d} cannot be read: {e.problem.rstrip('.')}",
                         "repair or remove its tokenizer files (tokenizer.json, vocab.txt), or download "
                         "the model again") from None


#: integer or boolean tensors that Hugging Face models store besides their weights (position ids,
#: old GPT-2 causal-mask buffers); the converters leave them out
_BUFFER_SUFFIXES = ("position_ids", ".attn.bias", ".attn.masked_bias")


def check_hf_weights(state: dict, d: Path) -> None:
    """The weights of a Hugging Face directory must be floating point and finite: an integer weight
    (a file written wrongly) would be cast silently, and a NaN or infinite one makes every output
    NaN. One line naming the first bad tensor."""
    import torch

    for name, t in state.items():
        if name.endswith(_BUFFER_SUFFIXES):
            continue
        if not t.is_floating_point():
            kind = str(t.dtype).removeprefix("torch.")
            raise LmlabError(f"weight {name} of Hugging Face model {d} holds {kind} values, not floating "
                             "point",
                             "save the model with float32, float16 or bfloat16 weights")
        if not bool(torch.isfinite(t).all()):
            raise LmlabError(f"weight {name} of Hugging Face model {d} holds NaN or infinite values",
                             "the model is damaged: use an earlier checkpoint or download it again")


def hf_export(model, directory: str | os.PathLike, tokenizer=None) -> Path:
    """Write ``model`` as a Hugging Face directory (config.json, model.safetensors, tokenizer files)."""
    from safetensors.torch import save_file

    model = model_argument(model, "hf_export's model")
    directory = path_argument(directory, "hf_export's directory")
    if tokenizer is not None:
        tokenizer_argument(tokenizer, "hf_export's tokenizer")
    if not getattr(model, "architecture", ""):
        raise LmlabError(f"{type(model).__name__} is not an lmlab model",
                         "export models built by lmlab.models")
    module = converter(model.config.family)
    hf_config, state = module.to_hf(model)
    tokenizer = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
    with atomic_dir(directory, marker="config.json", what="Hugging Face model") as tmp:
        save_file(
            {k: v.detach().contiguous().cpu() for k, v in state.items()},
            str(tmp / "model.safetensors"),
            metadata={"format": "pt"},
        )
        write_json(tmp / "config.json", json.loads(json.dumps(hf_config)))
        if tokenizer is not None:
            tokenizer.save(tmp / "_tokenizer")
            for f in (tmp / "_tokenizer").iterdir():
                shutil.move(str(f), str(tmp / f.name))
            (tmp / "_tokenizer").rmdir()
            if getattr(model, "architecture", "") == "decoder":
                _plain_prompts(tmp)
    return directory


def _plain_prompts(directory: Path) -> None:
    """A decoder's exported tokenizer encodes a prompt as its tokens alone: no [CLS] ... [SEP]
    template (an encoder's) and no token_type_ids, so transformers' ``model.generate(**tok(text))``
    and ``pipeline("text-generation")`` continue exactly the ids lmlab's generation does."""
    data = read_json(directory / "tokenizer.json", "tokenizer.json", HF_REWRITE)
    data["post_processor"] = None
    write_json(directory / "tokenizer.json", data)
    config = read_json(directory / "tokenizer_config.json", "tokenizer_config.json", HF_REWRITE)
    config["model_input_names"] = ["input_ids", "attention_mask"]
    write_json(directory / "tokenizer_config.json", config)
