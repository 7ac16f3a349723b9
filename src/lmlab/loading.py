"""Open any model directory lmlab reads or writes, with one call.

>>> from lmlab.loading import load_model
>>> model = load_model("runs/gpt/checkpoints/step_500")     # doctest: +SKIP

=====================================  ================================================
directory                              read by
=====================================  ================================================
pretraining run (``pretrain --out``)   its newest complete checkpoint, as ``--checkpoint``
                                       reads it (:func:`lmlab.train.checkpoint.run_checkpoint`)
lmlab checkpoint (float weights)       :func:`lmlab.models.load_checkpoint`
lmlab int8 checkpoint                  :func:`lmlab.adapt.quantize.load_quantized`
``lmlab finetune --method adapter``,   :func:`lmlab.adapt.peft_io.load_peft` on the
``prefix`` or ``prompt`` output        ``base/`` model
Hugging Face model directory           :func:`lmlab.interop.hf_import`
=====================================  ================================================

:func:`model_facts` tells what such a directory holds (architecture, family, heads, config) from
its config files alone, and ``load_model(path, check=...)`` runs a command's check of them (the
head it needs, :func:`lmlab.models.heads.require_head`; the input length it will use,
:func:`lmlab.models.config.max_length_for`) before any weight is read.

This module stands above ``models``, ``interop`` and ``adapt`` so that none of them needs to
know the others' formats; code inside those packages opens plain models with
:func:`lmlab.interop.load_plain_model`.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from lmlab.interop import check_model_dir, load_plain_model
from lmlab.models.facts import ModelFacts, facts_of
from lmlab.train.checkpoint import run_checkpoint

__all__ = ["attach_tokenizer", "load_model", "model_facts"]


def model_facts(source) -> ModelFacts | None:
    """What ``source`` is: a model in memory, or any directory :func:`load_model` opens, read from
    its config files without loading a weight. None when only the built model can tell (a Hugging
    Face type whose converter has no ``describe``)."""
    from lmlab.adapt.peft_io import adapter_files, read_peft_config
    from lmlab.interop import hf_facts
    from lmlab.models import checkpoint_facts, facts_from_meta
    from lmlab.models.checkpoint import is_lmlab_checkpoint

    if not isinstance(source, (str, os.PathLike)):
        return facts_of(source)
    p = check_model_dir(run_checkpoint(source))  # a pretraining run: its newest checkpoint
    if _quantized(p):  # the directories in the order _load tries them
        return checkpoint_facts(p)
    if is_lmlab_checkpoint(p):  # a LoRA output's merged model, even beside its base/ (a grown vocabulary)
        return checkpoint_facts(p)
    if (p / "base").is_dir() and adapter_files(p / "adapter") is not None:
        return facts_from_meta(read_peft_config(p / "adapter"), str(p / "adapter"))  # its heads and config
    return hf_facts(p)


def _quantized(p) -> bool:
    from lmlab.models.checkpoint import is_int8_checkpoint

    return is_int8_checkpoint(p)


def load_model(path: str | os.PathLike, map_location="cpu", tokenizer=None,
               check: Callable[[ModelFacts], None] | None = None):
    """The model saved in ``path`` (see the table above), in eval mode, with the directory's
    tokenizer attached when there is one lmlab can read, or with ``tokenizer`` (a tokenizer or its
    path, ``--tokenizer``) once it is checked to fit (:func:`attach_tokenizer`). ``check``: the
    caller's test of the model's :class:`ModelFacts` (raising a one-line
    :class:`~lmlab.errors.LmlabError`), run on the directory's config before any weight is read
    (on the built model when only it can tell)."""
    from lmlab.arguments import callable_argument, path_argument, tokenizer_argument

    path = run_checkpoint(path_argument(path, "load_model's path"))  # a pretraining run: its newest
    if tokenizer is not None:
        tokenizer_argument(tokenizer, "load_model's tokenizer", path=True)
    if check is not None:
        callable_argument(check, "load_model's check")
    facts = model_facts(path) if check is not None else None
    if facts is not None:
        check(facts)
    model = _load(path, map_location)
    if check is not None and facts is None:
        check(facts_of(model))
    return model if tokenizer is None else attach_tokenizer(model, tokenizer)


def attach_tokenizer(model, tokenizer):
    """``model`` with ``tokenizer`` (a tokenizer, or the path of one) attached, once its ids are
    checked to mean the same to the model: the one place a tokenizer from elsewhere meets a model
    (:func:`lmlab.models.checkpoint.check_given_tokenizer`: no id without an embedding, the model's
    own tokenizer when it has one, no id the model can produce that the tokenizer cannot decode)."""
    from lmlab.models.checkpoint import check_given_tokenizer

    name = "the tokenizer"
    if isinstance(tokenizer, (str, os.PathLike)):
        from lmlab.tokenizers import load_tokenizer

        name = f"tokenizer {tokenizer}"
        tokenizer = load_tokenizer(tokenizer)
    check_given_tokenizer(model.config, tokenizer, getattr(model, "tokenizer", None), name)
    model.tokenizer = tokenizer
    return model




def _load(path: str | os.PathLike, map_location):
    p = check_model_dir(path)
    if _quantized(p):
        from lmlab.adapt.quantize import load_quantized

        return load_quantized(p, map_location)
    from lmlab.adapt.peft_io import adapter_files, load_peft, mark_merged_lora
    from lmlab.models.checkpoint import is_lmlab_checkpoint

    if (p / "base").is_dir() and adapter_files(p / "adapter") is not None and not is_lmlab_checkpoint(p):
        model = load_peft(load_plain_model(p / "base", map_location), p / "adapter")
        return model.to(map_location).eval()
    return mark_merged_lora(load_plain_model(p, map_location), p)
