"""Saving and loading lmlab model checkpoints (safetensors + JSON, never pickle).

A checkpoint is a directory, written atomically (a crash leaves the old one untouched)::

    config.json        {"lmlab_format_version": 1, "architecture": "encoder", "family": "bert",
                        "heads": ["mlm"], "config": {...every config field...}}
    model.safetensors  the weights; tied weights (LM head = embeddings) are stored once
    tokenizer/         the tokenizer (``tokenizer.save``), when the model has one

:class:`LmlabModel` is the base class of every lmlab model: ``.config``, ``.heads``,
``.tokenizer``, ``.save(dir)`` and ``.num_parameters()``. Reading a checkpoint back builds a
model, so :func:`lmlab.models.load_checkpoint` lives beside ``build_model`` in the package face.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

from lmlab.arguments import eager_checks, ids_argument, path_argument, tokenizer_argument
from lmlab.errors import LmlabError, a_or_an
from lmlab.fileio import atomic_dir, read_json, write_json
from lmlab.run_dirs import WEIGHTS_NAME  # noqa: F401  (a run's checkpoints hold models)

FORMAT_VERSION = 1
CONFIG_NAME = "config.json"
TOKENIZER_DIR = "tokenizer"


class LmlabModel(nn.Module):
    """What all lmlab models share. Subclasses set ``architecture`` and build from ``config``."""

    architecture: str = ""

    #: "sdpa" (dense masks, every device) or "flex" (block-sparse masks for packed documents);
    #: the trainer sets it from train.attention (lmlab.models.attention_masks)
    attention_backend: str = "sdpa"

    def backend_now(self) -> str:
        """The attention backend for this forward. FlexAttention has no attention dropout (a model
        that trains with some uses the dense path) and, on CPUs, no backward pass (gradients there
        use the dense path; CPU inference may use flex)."""
        if self.attention_backend != "flex":
            return "sdpa"
        if self.training and getattr(self.config, "attn_dropout", 0.0) > 0:
            return "sdpa"
        if torch.is_grad_enabled() and next(self.parameters()).device.type != "cuda":
            return "sdpa"
        return "flex"

    #: the config class the model is built from, and a preset that makes one (for the error)
    config_class: type | None = None
    example_preset: str = ""

    def __init__(self, config):
        super().__init__()
        wanted = type(self).config_class
        if wanted is not None:
            if not isinstance(config, wanted):
                raise LmlabError(
                    f"{type(self).__name__} needs {a_or_an(wanted.__name__)}, got {type(config).__name__}",
                    f"use get_preset({self.example_preset!r}) or {wanted.__name__}(...)",
                )
            config = config.validate()
        self.config = config
        self.head_names: tuple[str, ...] = ()
        self.tokenizer = None

    @property
    def family(self) -> str:
        return self.config.family

    def num_parameters(self, trainable_only: bool = False) -> int:
        """Number of distinct parameters (a tied matrix counts once, as in transformers)."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)

    def save(self, directory: str | os.PathLike, tokenizer=None) -> Path:
        """Write this model (and its tokenizer) as an lmlab checkpoint; see :func:`save_checkpoint`."""
        return save_checkpoint(
            self, directory, tokenizer=tokenizer if tokenizer is not None else self.tokenizer
        )

    def selected_heads(self, heads: tuple[str, ...] | None) -> tuple[str, ...]:
        """The heads a forward pass runs: ``heads`` (checked against the model's) or all of them."""
        if heads is None:
            return self.head_names
        unknown = [h for h in heads if h not in self.head_names]
        if unknown:
            raise LmlabError(f"this model has no head {unknown[0]!r}",
                             f"pick from its heads: {', '.join(self.head_names) or '(none)'}")
        return tuple(heads)

    def check_input_ids(self, input_ids: torch.Tensor) -> None:
        """One-line error for ids that are not a ``[batch, length]`` integer tensor, or lie outside
        the vocabulary (instead of an index error deep inside): :func:`lmlab.arguments.ids_argument`."""
        ids_argument(input_ids, "input_ids", self.config.vocab_size,
                     fix="encode with the tokenizer the model was trained with (or resize vocab_size)")
        if eager_checks() and input_ids.numel() == 0:
            raise LmlabError("input_ids is empty", "pass at least one token")


def check_tokenizer(config, tokenizer) -> None:
    """The tokenizer must not produce ids the model has no embedding for."""
    if tokenizer is not None and tokenizer.vocab_size > config.vocab_size:
        raise LmlabError(
            f"tokenizer has {tokenizer.vocab_size} tokens but the model's vocab_size is {config.vocab_size}",
            f"build the model with vocab_size >= {tokenizer.vocab_size}",
        )


#: an embedding table may be a tokenizer's size rounded up to a multiple of one of these, the
#: padding GPUs like (T5: 32,100 tokens in 32,128 rows; Pythia: 50,277 in 50,304; Phi-2: 50,295 in
#: 51,200); the rows beyond the tokenizer are never trained as targets
PADDING_MULTIPLES = tuple(2 ** k for k in range(3, 11))  # 8, 16, ..., 1024


def padded_sizes(tokens: int) -> set[int]:
    """The embedding-table sizes that hold a tokenizer of ``tokens`` tokens plus padding rows only:
    ``tokens`` itself, or rounded up to a multiple of 8, 16, ..., 1024 (one no larger than ``tokens``)."""
    return {tokens} | {-(-tokens // m) * m for m in PADDING_MULTIPLES if m <= tokens}


def check_given_tokenizer(config, tokenizer, own=None, name: str = "the tokenizer") -> None:
    """The one rule for pairing a model with a tokenizer from elsewhere (``--tokenizer``), before any
    text is encoded or generated. Ids must mean the same on both sides:

    * every id the tokenizer produces, its special tokens' too, has a row of the embedding table
      (the tokenizer has no more tokens than the table has rows);
    * when the model has its own tokenizer (``own``: saved with the checkpoint, which records its
      fingerprint), the one given must be that tokenizer: another of any size would read the model's
      ids as other words, or leave ids the model produces undecodable;
    * when it has none, every id the model can produce must be one the tokenizer decodes: the table
      may be larger than the tokenizer only by padding (:func:`padded_sizes`).
    """
    rows = getattr(config, "vocab_size", None)
    if rows is None:
        return
    tokens = tokenizer.vocab_size
    highest = max([tokens - 1, *tokenizer.special_ids])
    if highest >= rows:
        raise LmlabError(f"{name} has {highest + 1:,} token ids but the model's embedding table has "
                         f"{rows:,} rows: ids {rows:,}..{highest:,} would have no embedding",
                         "pass the tokenizer the model was trained with (none: the checkpoint's own)")
    if own is not None:
        if own is tokenizer or own.fingerprint() == tokenizer.fingerprint():
            return
        sizes = ("the same size, other tokens" if own.vocab_size == tokens
                 else f"{tokens:,} tokens, the model's own {own.vocab_size:,}")
        raise LmlabError(f"{name} is not the tokenizer this model was trained with ({sizes}): the model's "
                         "ids would be read as other words, or not at all",
                         "drop --tokenizer: the checkpoint brings its own")
    if rows not in padded_sizes(tokens):
        raise LmlabError(f"{name} has {tokens:,} tokens but the model's embedding table has {rows:,} rows, "
                         f"more than padding explains: the model can produce ids {tokens:,}..{rows - 1:,}, "
                         f"which {name} cannot decode", "pass the tokenizer the model was trained with")


def _unique_state(model: nn.Module) -> tuple[dict[str, torch.Tensor], list[str]]:
    """State dict without aliases: each shared tensor once (first name wins), plus the dropped names."""
    state, seen, dropped = {}, {}, []
    for name, t in model.state_dict().items():
        key = (t.data_ptr(), t.shape, t.stride(), t.dtype) if t.numel() else None
        if key is not None and key in seen:
            dropped.append(name)
            continue
        if key is not None:
            seen[key] = name
        state[name] = t.detach().contiguous()
    return state, dropped


def save_checkpoint(model: LmlabModel, directory: str | os.PathLike, tokenizer=None) -> Path:
    """Save ``model`` (an :class:`LmlabModel`) to ``directory`` atomically; return the path."""
    from safetensors.torch import save_file

    directory = path_argument(directory, "model.save's directory")
    if not getattr(model, "architecture", ""):
        raise LmlabError(f"{type(model).__name__} is not an lmlab model", "save models built by lmlab.models")
    if tokenizer is not None:
        tokenizer_argument(tokenizer, "model.save's tokenizer")
    check_tokenizer(model.config, tokenizer)
    state, _ = _unique_state(model)
    meta = {
        "lmlab_format_version": FORMAT_VERSION,
        "architecture": model.architecture,
        "family": model.config.family,
        "heads": list(getattr(model, "head_names", ())),
        "config": model.config.to_dict(),
    }
    if tokenizer is not None:
        meta["tokenizer_fingerprint"] = tokenizer.fingerprint()
    with atomic_dir(directory, marker=WEIGHTS_NAME, what="model") as tmp:
        save_file({k: v.cpu() for k, v in state.items()}, str(tmp / WEIGHTS_NAME), metadata={"format": "pt"})
        write_json(tmp / CONFIG_NAME, meta)
        if tokenizer is not None:
            tokenizer.save(tmp / TOKENIZER_DIR)
    return directory


def is_lmlab_checkpoint(directory: str | os.PathLike) -> bool:
    p = Path(directory) / CONFIG_NAME
    if not p.is_file():
        return False
    data = read_json(p, "model config")
    return isinstance(data, dict) and "lmlab_format_version" in data


def is_int8_checkpoint(directory: str | os.PathLike) -> bool:
    """Whether ``directory`` is an lmlab checkpoint of int8 weights (``lmlab compress quantize``:
    its ``config.json`` records a ``quantization``), read from ``config.json`` alone."""
    if not is_lmlab_checkpoint(directory):
        return False
    return bool(read_json(Path(directory) / CONFIG_NAME, "model config").get("quantization"))


def refuse_int8(source, reader: str = "this reader", meta: dict | None = None) -> None:
    """The one refusal of int8 weights by a reader that needs float weights: export, the float
    loader, every command that trains or rewrites weights (fine-tuning, alignment, ``lmlab compress
    prune/quantize``, a distilled student copied from its teacher). ``source``: a checkpoint
    directory, told from its ``config.json`` before any weight is read (``meta``: that file when
    the caller has read it already), or a model in memory (``lmlab compress quantize`` marks it
    with ``quantization``)."""
    if isinstance(source, nn.Module):
        quantized, what = bool(getattr(source, "quantization", None)), "this model"
    else:
        quantized = bool(meta.get("quantization")) if meta is not None else is_int8_checkpoint(source)
        what = str(source)
    if quantized:
        raise LmlabError(f"{what} holds int8 weights (lmlab compress quantize), which {reader} "
                         "does not take",
                         "use the float checkpoint it was quantized from (in Python, "
                         "lmlab.loading.load_model opens int8 checkpoints too)")


def read_safetensors(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """All tensors of a safetensors file; a missing or corrupt file is a one-line LmlabError."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise LmlabError(f"weights file {path} does not exist", "the checkpoint is incomplete; save it again")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        first = str(e).splitlines()[0] if str(e) else e.__class__.__name__
        raise LmlabError(
            f"weights file {path} is corrupt or truncated ({first})", "save or download the checkpoint again"
        ) from None


def tokenizer_matches(meta: dict, tokenizer) -> bool:
    """Whether ``tokenizer`` is the one a checkpoint's ``config.json`` (``meta``) was saved with
    (True when it recorded none: checkpoints from before fingerprints)."""
    saved = meta.get("tokenizer_fingerprint")
    return not saved or tokenizer.fingerprint() == saved


def load_state(model: nn.Module, state: dict[str, torch.Tensor], where: str) -> None:
    """Load ``state`` strictly, except for tied aliases that were stored once; clear errors."""
    _, aliases = _unique_state(model)
    own = model.state_dict()
    missing = [k for k in own if k not in state and k not in aliases]
    unexpected = [k for k in state if k not in own]
    if missing or unexpected:
        raise LmlabError(
            f"weights in {where} do not match the model (missing {missing[:3]}, unexpected {unexpected[:3]})",
            "the config and weights come from different models; save again",
        )
    for k, t in state.items():
        if own[k].shape != t.shape:
            raise LmlabError(
                f"weight {k} in {where} has shape {tuple(t.shape)}, the model expects {tuple(own[k].shape)}",
                "the config and weights come from different models",
            )
    model.load_state_dict(state, strict=False)
